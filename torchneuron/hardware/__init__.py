"""Software model of Trainium hardware: published chip figures and device topology.

Pure data and arithmetic, no torch import, so the cost model and config code can
use it before (or without) the device backend loading.
"""

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
