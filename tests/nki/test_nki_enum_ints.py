"""Enum arguments given as their int values (issue 28, item 5).

AWS's production kernels pass ``nisa.dma_copy(..., dge_mode=3)``: an int equal to a member's
value means that member (checked against what the member itself does); any other int raises
naming the members and their values.
"""

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


def simulate(kernel, *args):
    return nki.simulate(kernel, target="trn2", uninitialized="error")(*args)


def _copy_kernel(dge, engine, reduce):
    @nki.jit
    def kernel(a):
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a, dge_mode=dge)
        u = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=u, src=t, engine=engine)
        total = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        v = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.activation(dst=v, op=nl.copy, data=u, reduce_op=nl.add, reduce_res=total, reduce_cmd=reduce)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        sums = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=v)
        nisa.dma_copy(dst=sums, src=total)
        return out, sums

    return kernel


def test_ints_equal_to_member_values_act_as_the_members():
    a = np.random.default_rng(5).standard_normal((16, 8)).astype(np.float32)
    by_member = nki.simulate(_copy_kernel(nisa.dge_mode.none, nisa.engine.vector, nisa.reduce_cmd.reset_reduce),
                             target="trn2")
    by_int = nki.simulate(_copy_kernel(3, 5, 3), target="trn2")
    for got, want in zip(by_int(a), by_member(a)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(by_int(a)[1][:, 0], a.sum(axis=1), rtol=1e-6)
    member_run, int_run = by_member.kernel.last_run, by_int.kernel.last_run
    pick = lambda run: [(i.opcode, i.engine, i.attrs.get("dge_mode")) for i in run.instructions]  # noqa: E731
    assert pick(int_run) == pick(member_run)


@pytest.mark.parametrize("args, param", [((7, 5, 3), "dge_mode"), ((3, 9, 3), "engine"),
                                         ((3, 5, 8), "reduce_cmd"), ((True, 5, 3), "dge_mode")])
def test_other_ints_raise_naming_the_members(args, param):
    with pytest.raises(TypeError, match=rf"{param} must be a member of nisa\.\w+ \(.*= 0.*\) or its int value"):
        simulate(_copy_kernel(*args), np.zeros((16, 8), dtype=np.float32))
