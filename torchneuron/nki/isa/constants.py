"""``nki.isa.constants``: the ISA enums as AWS's module of that name exports them
(``from neuronxcc.nki.isa.constants import oob_mode``)."""

from torchneuron.nki.isa.enums import dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd

__all__ = ["dge_mode", "dma_engine", "engine", "matmul_perf_mode", "nc_version", "oob_mode", "reduce_cmd"]
