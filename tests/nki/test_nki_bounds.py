"""Every index form of an NKI tensor is bounds-checked and fails at the kernel's own line.

NumPy clamps slices silently; on hardware a DMA past the end of a tensor reads or
overwrites its neighbour. Integer indices, slices, ``nl.ds`` and legacy affine indices
are all checked, on HBM and on chip; a legacy index may run past the end of an HBM
tensor only when its instruction's ``mask=`` keeps the access inside.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
from torchneuron.nki import NkiValidationError

RNG = np.random.default_rng(7)


def _by_kernel(cases):
    """``pytest.param`` per (kernel, expectation) case, named after the kernel."""
    return [pytest.param(kernel, expected, id=kernel.name) for kernel, expected in cases]


def _line_of(fn, marker: str) -> int:
    """Line number of the first source line of ``fn`` containing ``marker``."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if marker in line)


def _raises_at(kernel, args, marker, *needles, **options):
    """Simulating ``kernel`` raises NkiValidationError naming the marked kernel line and every needle."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an out-of-bounds access must not get as far as an uninitialised read
        with pytest.raises(NkiValidationError) as info:
            nki.simulate(kernel, **options)(*args)
    text = str(info.value)
    line = _line_of(kernel.fn if isinstance(kernel, nki.Kernel) else kernel, marker)
    assert f"test_nki_bounds.py:{line} in " in text, text
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"
    return text


# ------------------------------------------------------------------- loads past the end of HBM
@nki.jit
def load_slice_past_end(a):
    t = nl.load(a[:, 32:96])  # MARK
    out = nl.ndarray(t.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=t)
    return out


@nki.jit
def load_slice_starting_at_end(a):
    t = nl.load(a[:, 64:128])  # MARK
    out = nl.ndarray(t.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=t)
    return out


@nki.jit
def load_ds_past_end(a):
    t = nl.load(a[nl.ds(0, 128), nl.ds(48, 32)])  # MARK
    out = nl.ndarray(t.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=t)
    return out


@nki.jit
def load_affine_past_end(a):
    i_p, i_f = nl.mgrid[0:128, 0:64]
    t = nl.load(a[i_p, 32 + i_f])  # MARK
    out = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out[i_p, i_f], value=t)
    return out


@nki.jit
def load_negative_slice_past_start(a):
    t = nl.load(a[:, -96:])  # MARK
    out = nl.ndarray(t.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=t)
    return out


@nki.jit
def load_int_past_end(a):
    t = nl.load(a[128, 0:64])  # MARK
    out = nl.ndarray(t.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=t)
    return out


@pytest.mark.parametrize("kernel, needles", _by_kernel([
    (load_slice_past_end, ["index: slice 32:96 is out of bounds for dimension 1 of 'arg0' with size 64"]),
    (load_slice_starting_at_end, ["index: slice 64:128 is out of bounds for dimension 1 of 'arg0' with size 64"]),
    (load_ds_past_end, ["index: nl.ds(48, 32) is out of bounds for dimension 1 of 'arg0' with size 64",
                        "reaches element 79"]),
    (load_affine_past_end, ["dma_copy: src 'arg0' is indexed out of bounds",
                            "dimension 1 spans 64 elements but only 32 lie inside the tensor", "mask="]),
    (load_negative_slice_past_start, ["slice -96: is out of bounds for dimension 1 of 'arg0' with size 64"]),
    (load_int_past_end, ["index: index 128 is out of bounds for dimension 0 of 'arg0' with size 128"]),
]))
def test_loads_past_the_end_of_an_hbm_tensor_fail_at_the_kernel_line(kernel, needles):
    a = RNG.standard_normal((128, 64)).astype(np.float32)
    text = _raises_at(kernel, (a,), "# MARK", *needles)
    assert "every dimension must be positive" not in text
    assert "nl.load(" in text  # the kernel's own code line is quoted


# ------------------------------------------------------------------ stores past the end of HBM
@nki.jit
def store_slice_past_end(a, b):
    nl.store(b[:, 32:96], value=nl.load(a))  # MARK
    return b


@nki.jit
def store_ds_past_end(a, b):
    nl.store(b[nl.ds(64, 128), :], value=nl.load(a))  # MARK
    return b


@nki.jit
def store_affine_past_end(a, b):
    i_p, i_f = nl.mgrid[0:128, 0:64]
    nl.store(b[i_p, 32 + i_f], value=nl.load(a[i_p, i_f]))  # MARK
    return b


@nki.jit
def assign_affine_past_end(a, b):
    i_p, i_f = nl.mgrid[0:128, 0:64]
    b[i_p, 32 + i_f] = nl.load(a[i_p, i_f])  # MARK
    return b


@pytest.mark.parametrize("kernel, needle", _by_kernel([
    (store_slice_past_end, "slice 32:96 is out of bounds for dimension 1 of 'arg1' with size 64"),
    (store_ds_past_end, "nl.ds(64, 128) is out of bounds for dimension 0 of 'arg1' with size 128"),
    (store_affine_past_end, "dst 'arg1' is indexed out of bounds"),
    (assign_affine_past_end, "dst 'arg1' is indexed out of bounds"),
]))
def test_stores_past_the_end_of_an_hbm_tensor_are_rejected_and_write_nothing(kernel, needle):
    a = RNG.standard_normal((128, 64)).astype(np.float32)
    b = RNG.standard_normal((128, 64)).astype(np.float32)
    before = b.copy()
    _raises_at(kernel, (a, b), "# MARK", needle)
    np.testing.assert_array_equal(b, before)  # the simulated HBM argument is untouched


def test_a_store_past_the_end_of_a_neuron_tensor_leaves_it_and_its_neighbour_intact():
    a = torch.randn(128, 64)
    pair = torch.randn(2, 128, 64)
    on_device = pair.to("neuron")
    with pytest.raises(NkiValidationError, match="out of bounds"):
        store_slice_past_end(a.to("neuron"), on_device[0])  # on hardware: would overwrite on_device[1]
    assert torch.equal(on_device.cpu(), pair)


# ------------------------------------------------------------------------- on-chip tiles
@nki.jit
def tile_slice_past_end(a):
    t = nl.load(a)
    u = nl.copy(t[:, 32:96])  # MARK
    out = nl.ndarray(u.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=u)
    return out


@nki.jit
def tile_ds_past_end(a):
    t = nl.load(a)
    u = nl.copy(t[nl.ds(96, 64), :])  # MARK
    out = nl.ndarray(u.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=u)
    return out


@nki.jit
def tile_affine_past_end(a):
    t = nl.load(a)
    i_p, i_f = nl.mgrid[0:128, 0:64]
    u = nl.copy(t[i_p, 16 + i_f])  # MARK
    out = nl.ndarray(u.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=u)
    return out


@pytest.mark.parametrize("kernel, needle", _by_kernel([
    (tile_slice_past_end, "slice 32:96 is out of bounds for dimension 1 of 'load@test_nki_bounds.py"),
    (tile_ds_past_end, "nl.ds(96, 64) is out of bounds for dimension 0 of 'load@test_nki_bounds.py"),
    (tile_affine_past_end, "the legacy index 16 + i (i < 64) is out of bounds for dimension 1"),
]))
def test_on_chip_views_past_the_end_fail_at_the_kernel_line(kernel, needle):
    _raises_at(kernel, (RNG.standard_normal((128, 64)).astype(np.float32),), "# MARK", needle)


# ----------------------------------------------------------------- in-bounds forms still work
@nki.jit
def copy_in_bounds_views(a):
    out = nl.ndarray((128, 96), dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out[:, 0:32], value=nl.load(a[:, 32:64]))           # slice ending at the edge
    nl.store(out[:, 32:64], value=nl.load(a[:, -32:]))           # negative slice
    nl.store(out[nl.ds(0, 128), nl.ds(64, 16)], value=nl.load(a[nl.ds(0, 128), nl.ds(48, 16)]))
    i_p, i_f = nl.mgrid[0:128, 0:16]
    tile = nl.load(a[i_p, 0 + i_f])
    nl.store(out[i_p, 80 + i_f], value=tile[:, 0:16])
    return out


def test_in_bounds_slices_ds_and_affine_indices_match_numpy():
    a = RNG.standard_normal((128, 64)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = nki.simulate(copy_in_bounds_views)(a)
    expected = np.concatenate([a[:, 32:64], a[:, -32:], a[:, 48:64], a[:, 0:16]], axis=1)
    np.testing.assert_array_equal(out, expected)


@nki.jit
def masked_tail(a):
    n = a.shape[0]
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:8]
    for t in range((n + 127) // 128):
        tile = nl.load(a[t * 128 + i_p, i_f], mask=(t * 128 + i_p < n))
        nl.store(out[t * 128 + i_p, i_f], value=tile, mask=(t * 128 + i_p < n))
    return out


@nki.jit
def mask_too_loose(a):
    n = a.shape[0]
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:8]
    for t in range((n + 127) // 128):
        tile = nl.load(a[t * 128 + i_p, i_f], mask=(t * 128 + i_p < n + 8))  # MARK
        nl.store(out[t * 128 + i_p, i_f], value=tile, mask=(t * 128 + i_p < n))
    return out


def test_a_legacy_index_past_the_end_is_legal_only_inside_its_mask():
    a = RNG.standard_normal((200, 8)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(nki.simulate(masked_tail)(a), a)
    _raises_at(mask_too_loose, (a,), "# MARK", "src 'arg0' is indexed out of bounds",
               "dimension 0 spans 80 elements but only 72 lie inside the tensor")


@nki.jit
def reshape_clipped_view(a):
    i_p, i_f = nl.mgrid[0:128, 0:8]
    view = a[100 + i_p, i_f].reshape((128, 2, 4))  # MARK
    out = nl.ndarray((128, 2, 4), dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(view))
    return out


@nki.jit
def transpose_load_clipped_view(a):
    i_p, i_f = nl.mgrid[0:128, 0:8]
    t = nl.load_transpose2d(a[100 + i_p, i_f])  # MARK
    out = nl.ndarray(t.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=t)
    return out


@pytest.mark.parametrize("kernel, needle", _by_kernel([
    (reshape_clipped_view, "reshape: 'arg0' is indexed out of bounds: dimension 0 spans 128 elements but only 100"),
    (transpose_load_clipped_view, "load_transpose2d: src 'arg0' is indexed out of bounds"),
]))
def test_other_uses_of_a_clipped_legacy_view_fail_too(kernel, needle):
    a = RNG.standard_normal((200, 8)).astype(np.float32)
    _raises_at(kernel, (a,), "# MARK", needle)


@nki.jit
def double_buffered_tail(a):
    """AWS's double-buffered legacy kernels load tiles in pairs; the second tile of the last
    pair may start at (or beyond) the end of the tensor, and its mask is then constant False."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:a.shape[1]]
    for i in nl.affine_range((a.shape[0] // 128 + 1) // 2):
        for g in nl.affine_range(2):
            row = (2 * i + g) * 128
            tile = nl.load(a[row + i_p, i_f], mask=(row < a.shape[0]))
            nl.store(out[row + i_p, i_f], value=tile, mask=(row < a.shape[0]))
    return out


@nki.jit
def wholly_past_end_unmasked(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:a.shape[1]]
    tile = nl.load(a[128 + i_p, i_f])  # MARK
    nl.store(out[i_p, i_f], value=tile)
    return out


@nki.jit
def wholly_past_end_masked_by_iterator(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:a.shape[1]]
    tile = nl.load(a[128 + i_p, i_f], mask=(i_p < 64))  # MARK
    nl.store(out[i_p, i_f], value=tile)
    return out


def test_a_legacy_tile_wholly_past_the_end_is_legal_under_a_false_mask():
    a = RNG.standard_normal((128, 16)).astype(np.float32)  # one tile: the pair's second is past the end
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(nki.simulate(double_buffered_tail)(a), a)
    b = RNG.standard_normal((384, 16)).astype(np.float32)  # three tiles: the fourth is masked off
    np.testing.assert_array_equal(nki.simulate(double_buffered_tail)(b), b)
    _raises_at(wholly_past_end_unmasked, (a,), "# MARK", "src 'arg0' is indexed out of bounds",
               "dimension 0 spans 128 elements but only 0 lie inside the tensor")
    _raises_at(wholly_past_end_masked_by_iterator, (a,), "# MARK", "src 'arg0' is indexed out of bounds",
               "dimension 0 spans 64 elements but only 0 lie inside the tensor")


SLICED_TAIL = '''
{imports}


@nki.jit
def sliced_tail(a):
    """A last partial block read and written through plain slices, bounded by mask= (AWS's legacy
    adaptive_avg_pool2d tiles its N*C rows this way)."""
    n = a.shape[0]
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range((n + 127) // 128):
        i_p = t * 128 + nl.arange(128)[:, None]
        tile = nl.ndarray((128, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(src=a[t * 128:(t + 1) * 128, :], dst=tile, mask=(i_p < n))
        nl.store(out[t * 128:(t + 1) * 128, :], value=tile, mask=(i_p < n))
    return out


@nki.jit
def sliced_tail_unmasked(a):
    out = nl.ndarray((128, a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(a[128:256, :]))
    return out
'''


def _kernel_module(tmp_path, name, imports):
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(SLICED_TAIL.format(imports=imports))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_legacy_slice_past_the_end_of_hbm_is_legal_only_inside_its_mask(tmp_path):
    legacy = _kernel_module(tmp_path, "legacy_sliced_tail", "import neuronxcc.nki as nki\n"
                            "import neuronxcc.nki.language as nl\nimport neuronxcc.nki.isa as nisa")
    current = _kernel_module(tmp_path, "current_sliced_tail", "import nki\nimport nki.language as nl\n"
                             "import nki.isa as nisa")
    a = RNG.standard_normal((200, 8)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(nki.simulate(legacy.sliced_tail)(a), a)
    with pytest.raises(NkiValidationError, match="dimension 0 spans 128 elements but only 72 lie inside"):
        nki.simulate(legacy.sliced_tail_unmasked)(a)
    with pytest.raises(NkiValidationError, match=r"slice 128:256 is out of bounds"):
        nki.simulate(current.sliced_tail)(a)  # current NKI: slices stay strictly inside the tensor
