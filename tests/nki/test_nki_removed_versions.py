"""Refused or deprecated NKI features name the NKI version that changed them and the replacement (issue 17)."""

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.language as nl
from torchneuron.nki import NkiValidationError


def _run(body):
    @nki.jit
    def kernel(a):
        body(a)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(a))
        return out

    return nki.simulate(kernel, target="trn2")(np.zeros((4, 4), np.float32))


@pytest.mark.parametrize("call, replacement", [
    (lambda a: nl.loop_reduce(None, op=np.add, loop_indices=[0]), "nisa.tensor_tensor"),
    (lambda a: nl.atomic_rmw(None, None, np.add), "dma_compute"),
    (lambda a: nl.all_reduce(None), "nki.collectives"),
    (lambda a: nki.compiler.sbuf.mod_alloc(base_addr=0), "address="),
    (lambda a: nki.compiler.psum.alloc(lambda *i: 0), "address="),
])
def test_beta1_only_apis_name_nki_0_2_0(call, replacement):
    with pytest.raises(NkiValidationError, match=r"removed in NKI 0\.2\.0 \(Beta 2, Neuron 2\.27\)") as info:
        _run(call)
    assert replacement in str(info.value) and "neuronxcc.nki" in str(info.value)


def test_unknown_compiler_name_lists_what_exists():
    with pytest.raises(AttributeError, match=r"no_such_directive is not provided.*skip_middle_end_transformations"):
        nki.compiler.no_such_directive


def test_hbm_output_names_nki_0_3_0():
    @nki.jit
    def private_output(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.hbm)
        nl.store(out, value=nl.load(a))
        return out

    with pytest.raises(NkiValidationError, match=r"nl\.shared_hbm \(since NKI 0\.3\.0 an output in nl\.hbm"):
        nki.simulate(private_output, target="trn2")(np.zeros((4, 4), np.float32))


def test_platform_target_names_nki_0_3_0():
    with pytest.raises(ValueError, match=r"removed in NKI 0\.3\.0.*NEURON_PLATFORM_TARGET_OVERRIDE"):
        nki.jit(lambda a: a, platform_target="trn2")


def test_spmd_grid_names_its_deprecation_version():
    @nki.jit
    def copy(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(a))
        return out

    with pytest.warns(DeprecationWarning, match=r"deprecated since NKI 0\.5\.0.*kernel\[1\] or kernel\[2\]"):
        nki.simulate(copy[2, 2], target="trn2")(np.zeros((4, 4), np.float32))
