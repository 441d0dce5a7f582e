"""NeuronCore version queries (``get_nc_version``, ``get_nc_sub_version``), virtual
registers (``VirtualRegister``, ``register_alloc/move/load/store``) and the unsimulated
multi-core instructions (``core_barrier``, ``sendrecv``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from torchneuron.nki.cost import formulas as F
from torchneuron.nki.errors import fail
from torchneuron.nki.instruction import Engine
from torchneuron.nki.isa.core import NkiInstruction, as_tensor, instruction, record, run_and_version, store_values
from torchneuron.nki.isa.enums import dma_engine, engine, nc_version
from torchneuron.nki.tensor import NkiTensor


# ============================================================================ versions, registers, multi-core
def get_nc_version() -> nc_version:
    """The NeuronCore generation of the run's target (gen2 = trn1, gen3 = trn2, gen4 = trn3)."""
    _run, version = run_and_version()
    return nc_version(version)


def get_nc_sub_version() -> int:
    """Silicon revision within the generation; the simulator models the first (0)."""
    run_and_version()
    return 0


class VirtualRegister:
    """An engine-sequencer register (``nisa.register_alloc``); its value exists only on the device."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        self.value = int(value)

    def _no_python(self) -> None:
        raise TypeError("a register's value is known only on the device: it cannot drive Python control flow "
                        "(if/while/int()/range()); use nl.fori_loop / nl.while_loop")

    def __bool__(self) -> bool:
        self._no_python()
        return False

    def __int__(self) -> int:
        self._no_python()
        return 0

    __index__ = __int__

    def __repr__(self) -> str:
        return f"VirtualRegister({self.value})"


@instruction("register_alloc", {Engine.SYNC: F.sync_free})
def register_alloc(x: int | None = None) -> VirtualRegister:
    """A new register, initialised to ``x`` (0 by default)."""
    if x is not None and (isinstance(x, bool) or not isinstance(x, (int, np.integer))):
        raise TypeError(f"register_alloc takes an int initial value, got {x!r}")
    return VirtualRegister(0 if x is None else int(x))


@instruction("register_move", {Engine.SYNC: F.sync_free})
def register_move(dst: VirtualRegister, src: VirtualRegister) -> None:
    """Copy register ``src`` into ``dst`` (``src`` must be a register since NKI 0.3.0)."""
    if not isinstance(dst, VirtualRegister) or not isinstance(src, VirtualRegister):
        raise TypeError("register_move(dst, src) takes two registers (an immediate needs register_alloc(value))")
    dst.value = src.value


@instruction("register_load", {Engine.SYNC: F.sync_free})
def register_load(dst: VirtualRegister, src: NkiTensor) -> NkiInstruction:
    """Load a 1x1 on-chip tile's integer value into a register."""
    instr = "register_load"
    run, _version = run_and_version()
    if not isinstance(dst, VirtualRegister):
        raise TypeError(f"{instr}: dst must be a register from nisa.register_alloc()")
    src = as_tensor(instr, "src", src)
    if src.size != 1 or not src.on_chip:
        fail(instr, f"src must be a 1x1 SBUF/PSUM tile, got {src.buffer.value} shape {list(src.shape)}")
    dst.value = int(np.asarray(src.read(instr)).reshape(-1)[0])
    return record(run, instr, Engine.SYNC, [src], [])


@instruction("register_store", {Engine.SYNC: F.sync_free})
def register_store(dst: NkiTensor, src: VirtualRegister) -> NkiInstruction:
    """Store a register's value into a 1x1 on-chip tile."""
    instr = "register_store"
    run, _version = run_and_version()
    if not isinstance(src, VirtualRegister):
        raise TypeError(f"{instr}: src must be a register from nisa.register_alloc()")
    dst = as_tensor(instr, "dst", dst)
    if dst.size != 1 or not dst.on_chip:
        fail(instr, f"dst must be a 1x1 SBUF/PSUM tile, got {dst.buffer.value} shape {list(dst.shape)}")
    store_values(dst, np.asarray(src.value))
    return record(run, instr, Engine.SYNC, [], [dst])


def _multicore(instr: str) -> None:
    run, version = run_and_version()
    if version < 3:
        fail(instr, f"{instr} needs NeuronCore-v3 or newer (trn2/trn3)")
    if run.lnc < 2:
        fail(instr, f"{instr} synchronises the two cores of an LNC2 launch; launch the kernel as kernel[2](...)")
    fail(instr, "is not simulated: the simulator runs the programs of an LNC2 launch one after another, so a "
         "cross-core barrier or exchange cannot be honoured")


@instruction("core_barrier", {Engine.GPSIMD: F.gpsimd_per_input, Engine.SYNC: F.sync_free}, simulated=False)
def core_barrier(data: NkiTensor, cores: Sequence[int], engine: engine = engine.gpsimd,
                 name: str | None = None) -> NkiInstruction:
    """Cross-core barrier of an LNC2 launch (not simulated, decision 16)."""
    _multicore("core_barrier")
    raise AssertionError  # unreachable


@instruction("sendrecv", {Engine.DMA: F.dma_transfer}, simulated=False)
def sendrecv(src: NkiTensor, dst: NkiTensor, send_to_rank: int, recv_from_rank: int, pipe_id: int,
             dma_engine: dma_engine = dma_engine.dma, name: str | None = None) -> NkiInstruction:
    """Exchange tiles between the cores of an LNC2 launch (not simulated, decision 16)."""
    _multicore("sendrecv")
    raise AssertionError  # unreachable
