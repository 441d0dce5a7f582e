"""nki.isa's shared machinery (torchneuron/nki/isa/core.py, enums.py): enums, instruction handles,
call-style detection and the operand rules every instruction checks (partitions, buffers, sizes)."""

from __future__ import annotations

import numpy as np
import pytest

import torchneuron.nki.isa as nisa
from torchneuron.nki.errors import NkiValidationError
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor

from nki_isa_support import fails as _fails, put as _put, run as _run, tile as _tile

SBUF, PSUM, HBM = Buffer.sbuf, Buffer.psum, Buffer.shared_hbm


# ---------------------------------------------------------------------------- enums and handles
def test_enums_match_the_documented_values_and_aliases():
    assert nisa.engine.tensor.value == 1 and nisa.engine.vector.value == 5 and nisa.engine.unknown.value == 0
    assert nisa.tensor_engine is nisa.engine.tensor and nisa.vector_engine is nisa.engine.vector
    assert nisa.scalar_engine is nisa.engine.scalar and nisa.gpsimd_engine is nisa.engine.gpsimd
    assert nisa.unknown_engine is nisa.engine.unknown
    assert [m.name for m in nisa.reduce_cmd] == ["idle", "reset", "reduce", "reset_reduce", "load_reduce"]
    assert {m.name for m in nisa.dge_mode} == {"unknown", "swdge", "hwdge", "none"}
    assert {m.name for m in nisa.oob_mode} == {"error", "skip"}
    assert {m.name for m in nisa.matmul_perf_mode} == {"none", "double_row"}
    assert nisa.nc_version.gen3.value == 3 and {m.name for m in nisa.dma_engine} == {"dma", "gpsimd_dma"}
    assert nisa.NkiValidationError is NkiValidationError


def test_raw_ints_for_enums_are_members_only_when_equal_to_a_value():
    """Issue 28 item 5 (test_nki_enum_ints.py): ``engine=5`` is ``engine.vector``; 7 is no member."""
    seen = {}

    def kernel():
        t = _tile((4, 4))
        seen["engine"] = nisa.memset(dst=t, value=0.0, engine=5).instruction.engine

    _run(kernel)
    assert seen["engine"] == "vector"

    def bad():
        t = _tile((4, 4))
        nisa.memset(dst=t, value=0.0, engine=7)
    with pytest.raises(TypeError, match=r"nisa.engine.*the int 7 is no member's value"):
        _run(bad)


def test_instruction_handle_records_depends_on_edges():
    handles = []

    def kernel():
        a = _tile((4, 8))
        b = _tile((4, 8))
        h1 = nisa.memset(dst=a, value=1.0)
        h2 = nisa.memset(dst=b, value=2.0)
        h3 = nisa.tensor_tensor(dst=a, data1=a, data2=b, op=np.add)
        handles.extend([h1, h2, h3.depends_on(h1).depends_on(h2, h1)])
    run = _run(kernel)
    h1, h2, h3 = handles
    assert isinstance(h3, nisa.NkiInstruction) and h3.index == 2
    assert run.instructions[2].attrs["depends_on"] == [h1.index, h2.index]
    with pytest.raises(TypeError):
        h3.depends_on("not an instruction")


def test_outside_a_kernel_is_an_error():
    with pytest.raises(NkiValidationError, match="only inside a kernel"):
        nisa.get_nc_version()


# ---------------------------------------------------------------------------- operand rules (section 6)
def test_start_partition_rule():
    def kernel(start, count):
        def body():
            t = _tile((128, 8))
            nisa.memset(dst=t[start:start + count], value=1.0)
        return body
    _run(kernel(32, 32))
    _run(kernel(64, 64))
    _run(kernel(96, 16))
    _fails(kernel(16, 16), "starts at partition 16 and spans 16 partitions", "0, 32, 64 or 96",
           "start-partition rule")
    _fails(kernel(32, 64), "starts at partition 32 and spans 64 partitions", "0 or 64")


def test_start_partition_rule_large_spans():
    def body():
        t = _tile((128, 8))
        nisa.memset(dst=t[1:128], value=1.0)
    _fails(body, "starts at partition 1 and spans 127 partitions", "more than 64 partitions must start at "
           "partition 0")


def test_operands_span_contiguous_partitions():
    def body():
        t = _tile((128, 8))
        nisa.memset(dst=t[0:128:2], value=1.0)
    _fails(body, "strides over partitions", "contiguous partitions")


def test_compute_engines_do_not_read_hbm():
    def body():
        src = _tile((4, 8), "float32", HBM, "hbm_in")
        nisa.tensor_copy(dst=_tile((4, 8)), src=src)
    _fails(body, "src 'hbm_in' is in shared_hbm", "only on-chip memory", "nisa.dma_copy")


def test_partition_dimension_limit_is_checked_at_allocation():
    def body():
        import torchneuron.nki.language as nl
        nl.ndarray((256, 8), nl.float32, buffer=nl.sbuf, name="too_tall")
    _fails(body, "size of partition dimension 256 exceeds architecture limitation of 128", "too_tall")


def test_vector_and_scalar_free_size_limits():
    def psum_limit():
        t = _tile((2, 8192), "bfloat16", PSUM, "wide_psum")
        nisa.memset(dst=t, value=0.0)
    _fails(psum_limit, "8192 elements per partition", "VectorE's limit of 4096 for PSUM operands")

    def sbuf_limit():
        t = _tile((1, 65600), "uint8", SBUF, "wide_sbuf")
        nisa.memset(dst=t, value=0)
    _fails(sbuf_limit, "65600 elements per partition", "limit of 65536 for SBUF operands")


def test_call_style_detection():
    got = {}

    def kernel():
        a = _put(np.full((4, 8), 2.0, np.float32))
        out = _tile((4, 8))
        got["current_positional"] = nisa.tensor_scalar(out, a, np.multiply, 3.0)
        got["current_keyword"] = nisa.tensor_scalar(dst=out, data=a, op0=np.add, operand0=1.0)
        got["legacy"] = nisa.tensor_scalar(a, np.multiply, 3.0)
        got["legacy_kw"] = nisa.tensor_scalar(data=a, op0=np.multiply, operand0=5.0, dtype="bfloat16")
        got["out"] = out.values().copy()
    _run(kernel)
    assert isinstance(got["current_positional"], nisa.NkiInstruction)
    assert isinstance(got["current_keyword"], nisa.NkiInstruction)
    assert isinstance(got["legacy"], NkiTensor) and got["legacy_kw"].dtype.name == "bfloat16"
    np.testing.assert_array_equal(got["out"], np.full((4, 8), 3.0))


def test_unmatched_arguments_name_both_signatures():
    def kernel():
        a = _put(np.ones((4, 8), np.float32))
        nisa.tensor_tensor(_tile((4, 8)), a, 3.0, np.add)
    with pytest.raises(TypeError, match="dst-first signature .* legacy one"):
        _run(kernel)
