"""NKI entry points refuse keywords they would otherwise drop without a word (issue 28, item 1).

Each case passes a keyword that used to be accepted and ignored; it must now raise naming the
keyword, or (for legacy masks) act as the mask says.
"""

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.language as nl


def simulate(kernel, *args):
    return nki.simulate(kernel, target="trn2", uninitialized="error")(*args)


def test_jit_rejects_an_unknown_option_naming_it():
    with pytest.raises(TypeError, match="grid_size"):
        nki.jit(lambda a: a, grid_size=4)


def test_jit_still_takes_the_deprecated_mode_and_compiler_artifact_options():
    kernel = nki.jit(lambda a: a, mode="simulation", additional_compile_opt="-O1", save_neff_name="k.neff")
    assert isinstance(kernel, nki.Kernel)


@pytest.mark.parametrize("name", ["affine_range", "sequential_range", "static_range"])
def test_loop_ranges_reject_an_unknown_keyword_naming_it(name):
    @nki.jit
    def kernel(a):
        for _ in getattr(nl, name)(2, unroll=4):
            pass
        return a

    with pytest.raises(TypeError, match="unroll"):
        simulate(kernel, np.zeros((2, 2), dtype=np.float32))


@nki.jit
def loop_with_scheduling_hints(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.sequential_range(2, directives=nki.compiler.no_reorder()):
        nl.store(out[i], nl.load(a[i]))
    for _ in nl.affine_range(1, precise_schedule=True):
        pass
    return out


def test_loop_scheduling_hints_of_aws_kernels_still_run():
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(simulate(loop_with_scheduling_hints, a), a)


def test_legacy_compiler_hints_reject_unknown_keywords():
    with pytest.raises(TypeError, match="verbose"):
        nki.compiler.enable_stack_allocator(verbose=True)
    with pytest.raises(TypeError, match="log_level"):
        nki.compiler.force_auto_alloc(log_level=10)


@nki.jit
def masked_gather(data, indices):
    d = nl.load(data)
    ix = nl.load(indices)
    i_p = nl.arange(d.shape[0])[:, None]
    return nl.gather_flattened(d, ix, mask=(i_p < 2))


def test_gather_flattened_refuses_the_mask_it_used_to_ignore():
    data = np.arange(32, dtype=np.float32).reshape(4, 8)
    indices = np.zeros((4, 8), dtype=np.uint32)
    with pytest.raises(TypeError, match="gather_flattened: a legacy mask= is not simulated"):
        simulate(masked_gather, data, indices)


@nki.jit
def masked_print(a):
    t = nl.load(a)
    i_p = nl.arange(a.shape[0])[:, None]
    nl.device_print("rows:", t, mask=(i_p < 1))
    return a


def test_device_print_prints_only_the_masked_region(capsys):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    simulate(masked_print, a)
    printed = capsys.readouterr().out
    assert "rows:" in printed and "3." not in printed and "2." in printed


def _rand_after_seed(seed_mask):
    def kernel(a):
        seed = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        seed[...] = 1234
        if seed_mask != "none":
            nl.random_seed(seed, mask=seed_mask)
        out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.rand((4, 8), dtype=nl.float32))
        return out

    return nki.jit(kernel)


def test_random_seed_honours_a_constant_mask():
    a = np.zeros((1, 1), dtype=np.float32)
    unseeded = simulate(_rand_after_seed("none"), a)
    assert np.array_equal(simulate(_rand_after_seed(False), a), unseeded)  # masked off: no seed set
    assert not np.array_equal(simulate(_rand_after_seed(True), a), unseeded)
