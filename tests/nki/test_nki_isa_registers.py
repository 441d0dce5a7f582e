"""nki.isa registers, versions and synchronisation (torchneuron/nki/isa/registers.py): NeuronCore versions,
virtual registers moving values between tiles, and the instructions that are recognised but not simulated
(core_barrier) saying so."""

from __future__ import annotations

import numpy as np
import pytest

import torchneuron.nki.isa as nisa
from torchneuron.nki.memory import Buffer

from nki_isa_support import put as _put
from nki_isa_support import fails as _fails, hbm as _hbm, run as _run, tile as _tile

SBUF, PSUM, HBM = Buffer.sbuf, Buffer.psum, Buffer.shared_hbm



@pytest.mark.parametrize("target, version", [("trn1", nisa.nc_version.gen2), ("trn2", nisa.nc_version.gen3),
                                             ("trn3", nisa.nc_version.gen4)])
def test_get_nc_version_follows_the_target(target, version):
    seen = []
    _run(lambda: seen.append((nisa.get_nc_version(), nisa.get_nc_sub_version())), target=target)
    assert seen == [(version, 0)]


# ---------------------------------------------------------------------------- registers, multi-core, stubs
def test_registers_move_values_between_tiles():
    got = {}

    def kernel():
        reg, other = nisa.register_alloc(), nisa.register_alloc(7)
        nisa.register_load(reg, _put(np.array([[42]], np.int32)))
        nisa.register_move(other, reg)
        out = _tile((1, 1), "int32")
        nisa.register_store(out, other)
        got["v"], got["reg"] = int(out.values()[0, 0]), other
    _run(kernel)
    assert got["v"] == 42 and got["reg"].value == 42
    with pytest.raises(TypeError, match="known only on the device"):
        bool(got["reg"])


def test_unsimulated_instructions_say_so():
    def barrier():
        nisa.core_barrier(data=_hbm(np.zeros((2, 2), np.float32)), cores=(0, 1))
    _fails(barrier, "launch the kernel as kernel[2]")
    _fails(barrier, "needs NeuronCore-v3", target="trn1")
