"""The NKI ISA enums (``engine``, ``reduce_cmd``, ``dge_mode``, ``oob_mode``, ``matmul_perf_mode``,
``nc_version``, ``dma_engine``), their deprecated engine aliases, the short internal aliases
used where parameters shadow the enum names, and the engine-name tables shared by every
instruction module.
"""

from __future__ import annotations

import enum

import numpy as np

from torchneuron.nki.instruction import Engine


# ============================================================================ enums
class engine(enum.Enum):
    """Neuron device engines (facts 4)."""

    tensor = 1
    vector = 5
    scalar = 2
    gpsimd = 3
    dma = 4
    sync = 6
    unknown = 0


class reduce_cmd(enum.Enum):
    """Engine accumulator-register commands."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):
    """DMA descriptor-generation mode."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):
    """Out-of-bounds handling of indirect DMA."""

    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):
    """TensorE performance mode."""

    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):
    """NeuronCore generation: gen2 = Trn1/Inf2, gen3 = Trn2, gen4 = Trn3; ordered, as AWS's kernels
    compare them (``if nisa.get_nc_version() >= nisa.nc_version.gen3``)."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.Enum):
    """DMA engine used by ``sendrecv``."""

    dma = 1
    gpsimd_dma = 2


# Deprecated aliases kept by current NKI (facts 4).
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown

# Parameters named like the enums shadow them inside functions; these names do not.
EngineKind = engine
ReduceCmd = reduce_cmd
DgeMode = dge_mode
OobMode = oob_mode
PerfMode = matmul_perf_mode

FP32_MIN = float(np.finfo(np.float32).min)

ENGINE_NAME = {EngineKind.tensor: Engine.TENSOR, EngineKind.vector: Engine.VECTOR, EngineKind.scalar: Engine.SCALAR,
                EngineKind.gpsimd: Engine.GPSIMD, EngineKind.dma: Engine.DMA, EngineKind.sync: Engine.SYNC}
ENGINE_TITLE = {short: Engine.title(short) for short in ENGINE_NAME.values()}  # "tensor" -> "TensorE"
