"""Published Trainium chip and instance figures, as data.

Every figure comes from ``/work/shared/trainium-facts.md`` (cited per field as
``trainium-facts.md: <section>``). A field is ``None`` when that sheet publishes
no figure for the chip; ``None`` never means zero. Device detection does not
live here: this module is a table, :mod:`torchneuron.hardware.topology` picks
rows from it.

Units are in the field names: bytes are exact binary sizes (GiB = 2**30), rates
are decimal SI per second (1 TB/s = 1e12 B/s, 1 TFLOPS = 1e12 FLOP/s).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ChipSpec",
    "InstanceSpec",
    "CHIPS",
    "INSTANCES",
    "TARGET_ALIASES",
    "get_chip",
    "get_instance",
]

_KiB = 2**10
_MiB = 2**20
_GiB = 2**30
_GB = 1e9  # decimal giga, for B/s and B/ns (1 B/ns == 1e9 B/s)
_TB = 1e12
_TFLOPS = 1e12
_GHz = 1e9


@dataclass(frozen=True, kw_only=True)
class ChipSpec:
    """One Trainium generation. Per-core figures are per *physical* NeuronCore."""

    name: str
    marketing_name: str
    neuroncore_version: str
    physical_cores_per_chip: int
    supported_lnc: tuple[int, ...]
    default_lnc: int

    hbm_bytes_per_chip: int
    hbm_bytes_per_second: float

    # TensorE peak per physical core. bf16 also covers fp16/tf32; mx is microscaling FP8/FP4.
    tensor_fp32_flops_per_second: float
    tensor_bf16_flops_per_second: float
    tensor_fp8_flops_per_second: float | None
    tensor_mx_flops_per_second: float | None

    # Dense per-chip figures as AWS quotes them; not equal to cores x per-core peak.
    chip_fp32_flops_per_second: float
    chip_bf16_flops_per_second: float
    chip_fp8_flops_per_second: float | None
    chip_mx_flops_per_second: float | None

    sbuf_partitions: int | None
    sbuf_bytes_per_partition: int | None
    sbuf_bytes_per_core: int
    psum_bytes_per_core: int
    psum_banks: int | None

    tensor_clock_hz: float
    vector_clock_hz: float
    scalar_clock_hz: float
    gpsimd_clock_hz: float

    dma_engines_per_core: int
    dma_bytes_per_second_per_engine: float

    chip_link_name: str
    chip_link_bytes_per_second: float

    native_dtypes: tuple[str, ...]
    # Native only when the compiler flag is on; otherwise computed as 32-bit.
    flag_gated_dtypes: tuple[str, ...]
    has_fp64: bool = False

    @property
    def dma_bytes_per_second_per_core(self) -> float:
        """Aggregate DMA bandwidth of one physical core (engines x per-engine rate)."""
        return self.dma_engines_per_core * self.dma_bytes_per_second_per_engine

    def tensor_flops_per_second(self, dtype: str) -> float | None:
        """TensorE peak per physical core for ``dtype``; None if unpublished or unsupported."""
        precision = _DTYPE_PRECISION.get(dtype)
        if precision is None or dtype not in self.native_dtypes:
            return None
        return getattr(self, f"tensor_{precision}_flops_per_second")


# Which TensorE peak applies to a dtype. fp16/tf32 share the bf16 rate: the
# facts sheet quotes "BF16/FP16/TF32" as one figure.
_DTYPE_PRECISION: dict[str, str] = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "bf16",
    "tfloat32": "bf16",
    "cfp8": "fp8",
    "float8_e4m3": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "mxfp8": "mx",
    "mxfp4": "mx",
}

# trainium-facts.md: Data types. Trn1 lists FP32, FP16, BF16, TF32, FP8 (cFP8),
# UINT8, INT32, UINT32; Trn2 FP8 is IEEE-style E4M3 (deliberately not the OCP
# "e4m3fn" name); Trn3 adds MX FP8/FP4. INT64/UINT64 sit behind a compiler flag.
_COMMON_DTYPES = ("float32", "float16", "bfloat16", "tfloat32")
_INT_DTYPES = ("uint8", "int32", "uint32")
_TRN1_DTYPES = _COMMON_DTYPES + ("cfp8",) + _INT_DTYPES
# float8_e5m2 (v3+) and OCP float8_e4m3fn (v4) are TensorE input types in
# nki-api-facts.md: 3.8 Data types / 4.1 Tensor Engine; the facts sheet names only E4M3.
_TRN2_DTYPES = _COMMON_DTYPES + ("float8_e4m3", "float8_e5m2") + _INT_DTYPES
_TRN3_DTYPES = _TRN2_DTYPES + ("float8_e4m3fn", "mxfp8", "mxfp4")
_INT64_DTYPES = ("int64", "uint64")


TRN1 = ChipSpec(
    name="trn1",
    marketing_name="Trainium",
    neuroncore_version="v2",
    physical_cores_per_chip=2,  # trainium-facts.md: Chips table
    supported_lnc=(1,),  # the sheet gives LNC only for Trn2/Trn3
    default_lnc=1,
    hbm_bytes_per_chip=32 * _GiB,  # trainium-facts.md: Chips table
    hbm_bytes_per_second=0.82 * _TB,  # trainium-facts.md: Chips table
    tensor_fp32_flops_per_second=23 * _TFLOPS,  # trainium-facts.md: Chips table, per physical core
    tensor_bf16_flops_per_second=92 * _TFLOPS,  # trainium-facts.md: Chips table, per physical core
    tensor_fp8_flops_per_second=None,  # no per-core FP8 figure for Trn1 in the sheet
    tensor_mx_flops_per_second=None,  # no MX on Trn1
    chip_fp32_flops_per_second=47.5 * _TFLOPS,  # trainium-facts.md: Chips table
    chip_bf16_flops_per_second=190 * _TFLOPS,  # trainium-facts.md: Chips table
    chip_fp8_flops_per_second=190 * _TFLOPS,  # trainium-facts.md: Chips table ("190 ... FP8")
    chip_mx_flops_per_second=None,
    sbuf_partitions=128,  # trainium-facts.md: Chips table (128 x 192 KiB)
    sbuf_bytes_per_partition=192 * _KiB,  # trainium-facts.md: Chips table
    sbuf_bytes_per_core=24 * _MiB,  # trainium-facts.md: Chips table
    psum_bytes_per_core=2 * _MiB,  # trainium-facts.md: Chips table (128 x 16 KiB)
    psum_banks=8,  # trainium-facts.md: Chips table (8 banks x 2 KiB)
    tensor_clock_hz=2.8 * _GHz,  # trainium-facts.md: Chips table
    vector_clock_hz=1.12 * _GHz,  # trainium-facts.md: Chips table
    scalar_clock_hz=1.4 * _GHz,  # trainium-facts.md: Chips table
    gpsimd_clock_hz=1.4 * _GHz,  # trainium-facts.md: Chips table
    dma_engines_per_core=16,  # trainium-facts.md: Chips table
    dma_bytes_per_second_per_engine=17 * _GB,  # trainium-facts.md: Chips table (17 B/ns)
    chip_link_name="NeuronLink-v2",  # trainium-facts.md: Chips table
    chip_link_bytes_per_second=384 * _GB,  # trainium-facts.md: Chips table
    native_dtypes=_TRN1_DTYPES,  # trainium-facts.md: Data types
    flag_gated_dtypes=(),
)

TRN2 = ChipSpec(
    name="trn2",
    marketing_name="Trainium2",
    neuroncore_version="v3",
    physical_cores_per_chip=8,  # trainium-facts.md: Chips table
    supported_lnc=(1, 2),  # trainium-facts.md: Chips table (LNC=2 default, LNC=1)
    default_lnc=2,  # trainium-facts.md: Chips table
    hbm_bytes_per_chip=96 * _GiB,  # trainium-facts.md: Chips table (4 x 24 GiB)
    # trainium-facts.md: Chips table; main figure kept, "one guide says 3".
    hbm_bytes_per_second=2.9 * _TB,
    tensor_fp32_flops_per_second=20 * _TFLOPS,  # trainium-facts.md: Chips table, per physical core
    tensor_bf16_flops_per_second=79 * _TFLOPS,  # trainium-facts.md: Chips table, per physical core
    tensor_fp8_flops_per_second=158 * _TFLOPS,  # trainium-facts.md: Chips table, per physical core
    tensor_mx_flops_per_second=None,  # MX arrives with Trn3
    chip_fp32_flops_per_second=181 * _TFLOPS,  # trainium-facts.md: Chips table
    chip_bf16_flops_per_second=667 * _TFLOPS,  # trainium-facts.md: Chips table
    chip_fp8_flops_per_second=1299 * _TFLOPS,  # trainium-facts.md: Chips table
    chip_mx_flops_per_second=None,
    sbuf_partitions=128,  # trainium-facts.md: Chips table (128 x 224 KiB)
    sbuf_bytes_per_partition=224 * _KiB,  # trainium-facts.md: Chips table
    sbuf_bytes_per_core=28 * _MiB,  # trainium-facts.md: Chips table
    psum_bytes_per_core=2 * _MiB,  # trainium-facts.md: Chips table
    psum_banks=None,  # the sheet gives banks for Trn1 only
    tensor_clock_hz=2.4 * _GHz,  # trainium-facts.md: Chips table
    vector_clock_hz=0.96 * _GHz,  # trainium-facts.md: Chips table
    scalar_clock_hz=1.2 * _GHz,  # trainium-facts.md: Chips table
    gpsimd_clock_hz=1.2 * _GHz,  # trainium-facts.md: Chips table
    dma_engines_per_core=16,  # trainium-facts.md: Chips table
    dma_bytes_per_second_per_engine=23 * _GB,  # trainium-facts.md: Chips table (23 B/ns)
    chip_link_name="NeuronLink-v3",  # trainium-facts.md: Chips table (4x4 2-D torus)
    chip_link_bytes_per_second=1.28 * _TB,  # trainium-facts.md: Chips table
    native_dtypes=_TRN2_DTYPES,  # trainium-facts.md: Data types
    flag_gated_dtypes=_INT64_DTYPES,  # trainium-facts.md: Data types
)

TRN3 = ChipSpec(
    name="trn3",
    marketing_name="Trainium3",
    neuroncore_version="v4",
    physical_cores_per_chip=8,  # trainium-facts.md: Chips table
    supported_lnc=(1, 2),  # trainium-facts.md: Chips table note (LNC=2: 36 GiB on Trn3)
    default_lnc=2,  # as Trn2; the sheet states the default only for Trn2
    hbm_bytes_per_chip=144 * _GiB,  # trainium-facts.md: Chips table
    # trainium-facts.md: Chips table; main figure kept, "one guide says 4.7".
    hbm_bytes_per_second=4.9 * _TB,
    tensor_fp32_flops_per_second=20 * _TFLOPS,  # trainium-facts.md: Chips table, per physical core
    tensor_bf16_flops_per_second=79 * _TFLOPS,  # trainium-facts.md: Chips table, per physical core
    tensor_fp8_flops_per_second=None,  # the sheet quotes only MX for Trn3 8-bit
    tensor_mx_flops_per_second=315 * _TFLOPS,  # trainium-facts.md: Chips table, per physical core
    chip_fp32_flops_per_second=183 * _TFLOPS,  # trainium-facts.md: Chips table
    chip_bf16_flops_per_second=671 * _TFLOPS,  # trainium-facts.md: Chips table
    chip_fp8_flops_per_second=None,
    chip_mx_flops_per_second=2517 * _TFLOPS,  # trainium-facts.md: Chips table (MXFP8/MXFP4)
    sbuf_partitions=None,  # the sheet gives only the 32 MiB total
    sbuf_bytes_per_partition=None,
    sbuf_bytes_per_core=32 * _MiB,  # trainium-facts.md: Chips table
    psum_bytes_per_core=2 * _MiB,  # trainium-facts.md: Chips table
    psum_banks=None,
    tensor_clock_hz=2.4 * _GHz,  # trainium-facts.md: Chips table
    vector_clock_hz=1.2 * _GHz,  # trainium-facts.md: Chips table
    scalar_clock_hz=1.2 * _GHz,  # trainium-facts.md: Chips table
    gpsimd_clock_hz=1.2 * _GHz,  # trainium-facts.md: Chips table
    dma_engines_per_core=16,  # trainium-facts.md: Chips table
    dma_bytes_per_second_per_engine=33 * _GB,  # trainium-facts.md: Chips table (33 B/ns)
    chip_link_name="NeuronLink-v4",  # trainium-facts.md: Chips table
    chip_link_bytes_per_second=2.56 * _TB,  # trainium-facts.md: Chips table
    native_dtypes=_TRN3_DTYPES,  # trainium-facts.md: Data types
    flag_gated_dtypes=_INT64_DTYPES,  # trainium-facts.md: Data types
)

CHIPS: dict[str, ChipSpec] = {chip.name: chip for chip in (TRN1, TRN2, TRN3)}


@dataclass(frozen=True, kw_only=True)
class InstanceSpec:
    """A named EC2 instance: which chip it carries and how many."""

    name: str
    chip: str
    num_chips: int
    # The chip family TorchNeuron reports as torch.neuron.get_device_properties().name
    # (trainium-facts.md: TorchNeuron names): trn1, trn1n, trn2, trn2u, trn3u ...
    family: str
    efa_gbps: float | None = None  # the instance's EFA, where the facts sheet gives it (None: none given)


# trainium-facts.md: Instances. Only instances the sheet names; Trn2 UltraServers are groups
# of trn2u.48xlarge instances (listed as those), Trn3 UltraServers are listed as one unit each. Trn1 instances are
# for comparing generations (TorchNeuron itself targets Trn2/Trn3). EFA: trn2.48xlarge and
# trn2u.48xlarge EFAv3 3,200 Gbps; trn1.32xlarge 800 Gbps, trn1n.32xlarge 1,600 Gbps;
# trn1.2xlarge has none; trn2.3xlarge's is not on the sheet.
INSTANCES: dict[str, InstanceSpec] = {
    spec.name: spec
    for spec in (
        InstanceSpec(name="trn2.3xlarge", chip="trn2", family="trn2", num_chips=1),
        InstanceSpec(name="trn2.48xlarge", chip="trn2", family="trn2", num_chips=16, efa_gbps=3200),
        InstanceSpec(name="trn2u.48xlarge", chip="trn2", family="trn2u", num_chips=16, efa_gbps=3200),
        InstanceSpec(name="trn1.2xlarge", chip="trn1", family="trn1", num_chips=1),
        InstanceSpec(name="trn1.32xlarge", chip="trn1", family="trn1", num_chips=16, efa_gbps=800),
        InstanceSpec(name="trn1n.32xlarge", chip="trn1", family="trn1n", num_chips=16, efa_gbps=1600),
        # AWS names no Trn3 instance type; the sheet gives its UltraServers (Instances,
        # Topology): Gen1 64 chips, EFA 12,800 Gbps; Gen2 144 chips through NeuronSwitch-v1,
        # EFA 28,800 Gbps. Each is planned as one unit under these names (ours, not AWS's),
        # family trn3u (an UltraServer, as trn2u; assumption: the sheet names no Trn3 instance).
        InstanceSpec(name="trn3-ultraserver-gen1", chip="trn3", family="trn3u", num_chips=64, efa_gbps=12800),
        InstanceSpec(name="trn3-ultraserver-gen2", chip="trn3", family="trn3u", num_chips=144, efa_gbps=28800),
    )
}

# Spellings NEURON_PLATFORM_TARGET_OVERRIDE accepts. trainium-facts.md lists
# trn2/gen3 and trn3/gen4; trn1/inf2/gen2 are the NeuronCore-v2 spellings.
TARGET_ALIASES: dict[str, str] = {
    "trn1": "trn1",
    "inf2": "trn1",
    "gen2": "trn1",
    "trn2": "trn2",
    "gen3": "trn2",
    "trn3": "trn3",
    "gen4": "trn3",
}


def target_family(target: str) -> str:
    """The chip family a ``NEURON_PLATFORM_TARGET_OVERRIDE`` spelling names (no instance given).

    ``inf2`` stays ``inf2`` (Inferentia2's NeuronCore-v2); ``gen2``/``gen3``/``gen4`` are
    ``trn1``/``trn2``/``trn3``.
    """
    key = target.strip().lower()
    return "inf2" if key == "inf2" else get_chip(key).name


def _valid_targets() -> str:
    groups: dict[str, list[str]] = {}
    for alias, chip in TARGET_ALIASES.items():
        groups.setdefault(chip, []).append(alias)
    return ", ".join("|".join(aliases) for aliases in groups.values())


def get_chip(name: str) -> ChipSpec:
    """Look up a chip by any spelling ``NEURON_PLATFORM_TARGET_OVERRIDE`` accepts.

    Args:
        name: ``trn1|inf2|gen2``, ``trn2|gen3`` or ``trn3|gen4``; case-insensitive.

    Raises:
        ValueError: if ``name`` is not one of those spellings.
    """
    key = name.strip().lower() if isinstance(name, str) else None
    if key not in TARGET_ALIASES:
        raise ValueError(
            f"unknown Neuron target {name!r}; NEURON_PLATFORM_TARGET_OVERRIDE accepts "
            f"{_valid_targets()} (case-insensitive)"
        )
    return CHIPS[TARGET_ALIASES[key]]


def get_instance(name: str) -> InstanceSpec:
    """Look up an instance type by name (case-insensitive), e.g. ``"trn2.48xlarge"``.

    Raises:
        ValueError: if the instance is not in :data:`INSTANCES`.
    """
    key = name.strip().lower() if isinstance(name, str) else None
    if key not in INSTANCES:
        raise ValueError(
            f"unknown instance type {name!r} (TORCHNEURON_INSTANCE); "
            f"known instances: {', '.join(INSTANCES)}"
        )
    return INSTANCES[key]
