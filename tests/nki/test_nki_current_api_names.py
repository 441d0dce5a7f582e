"""Names and Python idioms AWS's current kernel library relies on (issue 28, item 7).

``nki.dtype`` (module and annotation), ``nki.typing.mutable_tensor``, ``nki.cpu_simulate(kernel)[lnc]``
(the name its test harness calls), ``nl.NKIObject`` dataclasses whose fields are unannotated
class-level defaults, and ``if tensor:`` as the None check of an optional tensor argument. The
out-of-range ``.ap()`` view checked at access is in test_nki_access_patterns.py.
"""

import importlib
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
import torchneuron.nki.typing as nt


def test_nki_dtype_is_a_module_of_the_nl_dtypes_numpy_accepts():
    dtype = importlib.import_module("nki.dtype")
    assert dtype is nki.dtype
    assert dtype.float8_e4m3 is nl.float8_e4m3 and dtype.bfloat16 is nl.bfloat16
    values = np.zeros((2, 3), dtype=dtype.bfloat16)
    assert values.dtype == ml_dtypes.bfloat16

    def annotated(x: nki.dtype = nl.float32) -> nki.dtype:  # an annotation, as AWS's kernels write it
        return x

    assert annotated() is nl.float32


def test_mutable_tensor_annotates_a_parameter_the_kernel_writes():
    @nki.jit
    def add_one_in_place(in_tensor: nt.mutable_tensor):
        t = nl.load(in_tensor)
        nl.store(in_tensor, value=nl.add(t, 1.0))
        return in_tensor

    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    expected = a + 1
    out = nki.simulate(add_one_in_place, target="trn2")(a)
    np.testing.assert_array_equal(out, expected)
    assert nt.mutable_tensor[128, 512].mutable and not nt.tensor[128, 512].mutable
    assert repr(nt.mutable_tensor[4, 8, nl.bfloat16]) == "nt.mutable_tensor[4, 8, nl.bfloat16]"
    with pytest.raises(TypeError, match="nt.mutable_tensor is an annotation"):
        nt.mutable_tensor()


@nki.jit
def per_core_rows(a):
    """Each core of an LNC2 launch copies its half of the rows."""
    rows = a.shape[0] // nl.num_programs()
    start = nl.program_id(0) * rows
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out[start:start + rows], nl.load(a[start:start + rows]))
    return out


@pytest.mark.parametrize("lnc", [1, 2])
def test_cpu_simulate_launches_with_an_lnc_bracket(lnc):
    a = np.random.default_rng(7).standard_normal((8, 16)).astype(np.float32)
    np.testing.assert_array_equal(nki.cpu_simulate(per_core_rows)[lnc](a=a), a)
    assert per_core_rows.last_run.lnc == lnc


def test_a_launch_takes_its_grid_once():
    with pytest.raises(TypeError, match="already has the launch grid"):
        nki.simulate(per_core_rows[2])[2]


@dataclass
class SectionParams(nl.NKIObject):
    section_idx = None  # unannotated defaults, as AWS's attention kernels declare them
    section_offset = 0
    tile: int = 128


def test_nkiobject_dataclasses_take_their_unannotated_defaults_as_fields():
    params = SectionParams(section_idx=3, section_offset=512)
    assert (params.section_idx, params.section_offset, params.tile) == (3, 512, 128)
    assert SectionParams() == SectionParams(section_idx=None, section_offset=0, tile=128)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sectionidx'"):
        SectionParams(sectionidx=3)


@nki.jit
def optional_bias(a, bias=None):
    t = nl.load(a)
    if bias:  # the None check AWS's kernels write for an optional tensor argument
        t = nl.add(t, nl.load(bias))
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


def test_a_tensor_argument_is_truthy_and_none_is_not():
    a = np.ones((4, 8), dtype=np.float32)
    b = np.full((4, 8), 2.0, dtype=np.float32)
    np.testing.assert_array_equal(nki.simulate(optional_bias, target="trn2")(a), a)
    np.testing.assert_array_equal(nki.simulate(optional_bias, target="trn2")(a, b), a + b)
