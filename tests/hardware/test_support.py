"""Op and dtype placement: each rule, its user-facing reason, caching and bad input."""

import pytest

from torchneuron.hardware.dtypes import TORCH_DTYPE_ITEMSIZE, Treatment, dtype_support, dtype_table
from torchneuron.hardware.opname import parse_op_name
from torchneuron.hardware.support import Category, Device, _placement, op_category, placement


def test_parse_op_name_strips_inplace_and_overload():
    op = parse_op_name("aten::add_.Tensor")
    assert (op.namespace, op.name, op.overload, op.base, op.inplace) == ("aten", "add_", "Tensor", "add", True)
    assert parse_op_name("__and__").base == "__and__"
    assert parse_op_name("linalg_eigh").qualified == "aten::linalg_eigh"


def test_plain_float_ops_run_on_device():
    p = placement("aten::add.Tensor", ("float32", "bfloat16"))
    assert p.on_device and p.device is Device.DEVICE and p.category is Category.DEVICE
    assert p.reason == "" and p.notes == ()


@pytest.mark.parametrize("dtype", ["float64", "complex64", "complex128", "qint8", "uint4", "bits8"])
def test_non_trainium_dtypes_fall_back(dtype):
    p = placement("aten::mul.Tensor", ("float32", dtype))
    assert p.device is Device.CPU_FALLBACK
    assert p.category is Category.UNSUPPORTED_DTYPE
    assert dtype in p.reason and "trainium-facts.md: Data types" in p.reason


def test_float64_reason_tells_the_user_what_to_do():
    reason = placement("aten::add.Tensor", ("float64", "float64")).reason
    assert "no FP64 on any generation" in reason
    assert "cast to float32 or bfloat16" in reason
    assert reason.startswith("aten::add.Tensor runs on CPU")


def test_dtype_argument_counts():
    # _to_copy(self, dtype=float64): the dtype= value is appended to the tensor dtypes.
    assert not placement("aten::_to_copy", ("float32", "float64")).on_device


@pytest.mark.parametrize(
    "op, dtypes",
    [
        ("aten::nonzero", ("float32",)),
        ("aten::argwhere", ("float32",)),
        ("aten::masked_select", ("float32", "bool")),
        ("aten::_unique2", ("int32",)),
        ("aten::unique_consecutive", ("int32",)),
        ("aten::bincount", ("int32",)),
        ("aten::repeat_interleave.Tensor", ("int32",)),
        ("aten::index.Tensor", ("float32", "bool")),
    ],
)
def test_data_dependent_shapes_fall_back(op, dtypes):
    p = placement(op, dtypes)
    assert p.category is Category.DATA_DEPENDENT_SHAPE
    assert "static shapes" in p.reason


def test_static_shape_relatives_stay_on_device():
    assert placement("aten::nonzero_static", ("float32",)).on_device
    assert placement("aten::repeat_interleave.self_int", ("float32",)).on_device
    # Integer (gather) indexing has a static size; a bool *self* is not a mask.
    assert placement("aten::index.Tensor", ("float32", "int32")).on_device
    assert placement("aten::index.Tensor", ("bool", "int32")).on_device


@pytest.mark.parametrize(
    "op",
    ["aten::linalg_eigh", "aten::linalg_svd", "aten::_linalg_svd", "aten::linalg_qr", "aten::linalg_cholesky_ex",
     "aten::linalg_lu_factor_ex", "aten::linalg_solve", "aten::linalg_inv", "aten::linalg_det", "aten::linalg_lstsq",
     "aten::linalg_pinv", "aten::svd", "aten::cholesky_solve", "aten::triangular_solve", "aten::inverse",
     "aten::logdet", "aten::geqrf", "aten::matrix_exp"],
)
def test_linalg_decompositions_fall_back(op):
    p = placement(op, ("float32",))
    assert p.category is Category.LINALG_DECOMPOSITION
    assert "LAPACK" in p.reason


@pytest.mark.parametrize(
    "op", ["aten::mm", "aten::bmm", "aten::addmm", "aten::linalg_vector_norm", "aten::linalg_matrix_norm",
           "aten::linalg_vecdot", "aten::linalg_cross", "aten::_linalg_check_errors"]
)
def test_matmul_family_and_norms_stay_on_device(op):
    assert placement(op, ("float32", "float32")).on_device


@pytest.mark.parametrize("op", ["aten::fft_fft", "aten::fft_rfftn", "aten::_fft_r2c", "aten::stft", "aten::istft"])
def test_fft_falls_back(op):
    p = placement(op, ("float32",))
    assert p.category is Category.FFT and "no complex types" in p.reason


def test_fft_helpers_are_not_ffts():
    assert placement("aten::fft_fftshift", ("float32",)).on_device
    assert placement("aten::fft_fftfreq", ("float32",)).on_device


@pytest.mark.parametrize(
    "op", ["aten::to_sparse", "aten::_to_sparse_csr", "aten::sparse_coo_tensor", "aten::_sparse_mm",
           "aten::coalesce", "aten::_values", "aten::crow_indices", "aten::_nnz"]
)
def test_sparse_falls_back(op):
    assert placement(op, ("float32",)).category is Category.SPARSE


def test_op_rule_wins_over_dtype_rule():
    assert placement("aten::linalg_eigh", ("float64",)).category is Category.LINALG_DECOMPOSITION
    assert op_category("aten::fft_fft", ("complex64",)) is Category.FFT


def test_custom_namespaces_are_not_aten_rules():
    assert placement("mylib::nonzero", ("float32",)).on_device


def test_int64_is_computed_as_int32_unless_native():
    p = placement("aten::add.Tensor", ("int64", "int64"))
    assert p.on_device
    assert len(p.notes) == 1 and "computed as int32" in p.notes[0]
    assert placement("aten::add.Tensor", ("int64",), native_int64=True).notes == ()
    trn1 = placement("aten::add.Tensor", ("int64",), target="trn1")
    assert "no native INT64 on trn1" in trn1.notes[0]


def test_native_int64_on_trn1_is_rejected():
    with pytest.raises(ValueError, match="native_int64=True is not available on trn1"):
        placement("aten::add.Tensor", ("int64",), target="trn1", native_int64=True)


def test_integer_matmul_note():
    assert any("through FP32" in note for note in placement("aten::mm", ("int32", "int32")).notes)
    assert placement("aten::mm", ("float32", "float32")).notes == ()


def test_fp8_encodings_per_generation():
    trn2 = placement("aten::mul.Tensor", ("float8_e4m3fn",), target="trn2")
    assert trn2.on_device and "not OCP e4m3fn" in trn2.notes[0]
    assert placement("aten::mul.Tensor", ("float8_e4m3fn",), target="trn3").notes == ()
    assert placement("aten::mul.Tensor", ("float8_e5m2",), target="trn2").notes == ()
    assert not placement("aten::mul.Tensor", ("float4_e2m1fn_x2",), target="trn2").on_device
    assert placement("aten::mul.Tensor", ("float4_e2m1fn_x2",), target="gen4").on_device


def test_results_are_cached_and_lists_share_the_tuple_entry():
    _placement.cache_clear()
    first = placement("aten::add.Tensor", ("float32", "float32"))
    assert placement("aten::add.Tensor", ["float32", "float32"]) is first
    info = _placement.cache_info()
    assert (info.hits, info.misses) == (1, 1)


def test_torch_prefixed_dtype_names_are_accepted():
    assert not placement("aten::add.Tensor", ("torch.float64",)).on_device


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: placement("aten::add.Tensor", ("float128",)), ValueError, "unknown dtype 'float128'"),
        (lambda: placement("aten::add.Tensor", "float32"), TypeError, "sequence of dtype names"),
        (lambda: placement("aten::add.Tensor", (1,)), TypeError, "dtype must be a dtype name"),
        (lambda: placement(42, ()), TypeError, "op name must be a str"),
        (lambda: placement("aten::add..Tensor", ()), ValueError, "cannot parse op name"),
        (lambda: placement("aten::add", (), target="trn9"), ValueError, "NEURON_PLATFORM_TARGET_OVERRIDE"),
    ],
)
def test_bad_input_names_the_problem(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_dtype_table_covers_every_torch_dtype_on_every_target():
    for target in ("trn1", "trn2", "trn3"):
        table = dtype_table(target)
        assert set(table) == set(TORCH_DTYPE_ITEMSIZE)
        for name, support in table.items():
            assert support.reason
            assert (support.device_dtype is None) == (support.treatment is Treatment.UNSUPPORTED), name


def test_dtype_table_follows_the_facts_sheet():
    trn1, trn2, trn3 = (dtype_table(t) for t in ("trn1", "trn2", "trn3"))
    for name in ("float32", "float16", "bfloat16", "uint8", "int32", "uint32"):
        assert all(t[name].treatment is Treatment.NATIVE for t in (trn1, trn2, trn3))
    assert all(t["float64"].treatment is Treatment.UNSUPPORTED for t in (trn1, trn2, trn3))
    assert trn2["int64"].device_dtype == "int32"
    assert dtype_support("int64", "trn2", native_int64=True).device_dtype == "int64"
    assert trn2["float8_e4m3fn"].device_dtype == "bfloat16"
    assert trn3["float8_e4m3fn"].treatment is Treatment.NATIVE
    assert trn1["float8_e5m2"].device_dtype == "bfloat16"
    assert trn2["bool"].device_dtype == "uint8"
    assert trn3["float8_e8m0fnu"].treatment is Treatment.NATIVE
