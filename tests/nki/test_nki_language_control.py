"""nki.language control (torchneuron/nki/language/control.py): loops are Python ranges, SPMD grid dims,
program ids, control flow and device_print."""

import numpy as np
import pytest

import torchneuron.nki.language as nl
from torchneuron.nki import NkiValidationError
from nki_language_support import run


# ---------------------------------------------------------------- control flow / misc
def test_control_flow_program_ids_and_device_print(capsys):
    seen = {}

    def kernel(a):
        t = nl.load(a)
        acc = nl.zeros((128, 8), nl.float32)

        def body(i):
            acc[...] = nl.add(acc, t)

        nl.fori_loop(0, 3, body)
        nl.device_print("acc:", acc[0:1, 0:2])
        with nl.no_reorder():
            x = nl.exp(t)
            with nl.no_reorder():
                y = nl.exp(x)
        with pytest.raises(NkiValidationError, match="not allowed inside nl.no_reorder"):
            with nl.no_reorder():
                nl.fori_loop(0, 1, body)
        seen.update(pid=nl.program_id(0), n=nl.num_programs(), nd=nl.program_ndim())
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, acc)
        del x, y
        return out

    a = np.ones((128, 8), np.float32)
    out, r = run(kernel, a)
    assert (out == 3).all()
    assert "acc: [[3. 3.]]" in capsys.readouterr().out
    assert seen == {"pid": 0, "n": 1, "nd": 1}
    tagged = [i.attrs.get("no_reorder") for i in r.instructions if "no_reorder" in i.attrs]
    assert len(tagged) == 2 and isinstance(tagged[0], int) and isinstance(tagged[1], tuple)


def test_loops_are_python_ranges():
    assert list(nl.affine_range(3)) == [0, 1, 2]
    assert list(nl.sequential_range(1, 7, 2)) == [1, 3, 5]
    assert list(nl.static_range(2, 4)) == [2, 3]
    with pytest.warns(DeprecationWarning, match="fori_loop"):
        assert list(nl.dynamic_range(3)) == [0, 1, 2]

    total = 0
    for _ in nl.affine_range(8):  # legacy traced the body once; we run Python (total == 8)
        total += 1
    assert total == 8


def test_spmd_grid_dims():
    assert nl.nc(2) == 2 and nl.nc(2).lnc_degree == 2
    assert nl.spmd_dim(nl.nc(2), 2) == 4 and nl.nc(2) * 2 == 4 and 2 * nl.nc(2) == 4
