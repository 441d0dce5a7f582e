"""Software model of Trainium hardware: published chip figures, device topology,
op/dtype placement (support.py, dtypes.py) and the roofline cost model (flops.py, cost.py).

Pure data and arithmetic, no torch import, so the cost model and config code can
use it before (or without) the device backend loading.
"""

from torchneuron.hardware.cost import CostTarget, Engine, OpCost, cost_target, is_matmul, op_cost, runs_on_tensor_engine
from torchneuron.hardware.dtypes import DtypeSupport, Treatment, dtype_support, dtype_table
from torchneuron.hardware.support import Category, Device, Placement, placement
from torchneuron.hardware.specs import (
    CHIPS,
    INSTANCES,
    TARGET_ALIASES,
    ChipSpec,
    InstanceSpec,
    get_chip,
    get_instance,
)
from torchneuron.hardware.topology import (
    DEFAULT_INSTANCE,
    INSTANCE_ENV,
    LNC_ENV,
    TARGET_ENV,
    VISIBLE_CORES_ENV,
    LogicalDevice,
    Topology,
    resolve_topology,
    topology_from_env,
)

__all__ = [
    "Category",
    "CostTarget",
    "Device",
    "DtypeSupport",
    "Engine",
    "OpCost",
    "Placement",
    "Treatment",
    "cost_target",
    "dtype_support",
    "dtype_table",
    "is_matmul",
    "runs_on_tensor_engine",
    "op_cost",
    "placement",
    "CHIPS",
    "INSTANCES",
    "TARGET_ALIASES",
    "ChipSpec",
    "InstanceSpec",
    "get_chip",
    "get_instance",
    "DEFAULT_INSTANCE",
    "INSTANCE_ENV",
    "LNC_ENV",
    "TARGET_ENV",
    "VISIBLE_CORES_ENV",
    "LogicalDevice",
    "Topology",
    "resolve_topology",
    "topology_from_env",
]
