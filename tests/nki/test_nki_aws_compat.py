"""AWS kernels run unmodified: AWS's module names (torchneuron.nki.aliases) and the legacy and
beta-2 APIs found missing when running aws-neuron/nki-samples (issue 17)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(7)


def simulate(kernel, *args):
    return nki.simulate(kernel, target="trn2", uninitialized="error")(*args)


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT)])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


# ------------------------------------------------------------------------ module names
def test_aws_module_names_are_torchneurons_modules(tmp_path):
    done = run_python("""
        import torchneuron.nki as tn
        import neuronxcc.nki as nki
        import neuronxcc.nki.language as nl
        import neuronxcc.nki.isa as nisa
        import neuronxcc.nki.compiler as ncc
        from neuronxcc import nki as nki2
        from neuronxcc.nki.typing import tensor
        from neuronxcc.nki.isa.constants import oob_mode
        from neuronxcc.nki.language.constants import sizeinbytes
        import nki as current, nki.language as cnl, nki.isa as cisa
        assert nki is tn and nki2 is tn and current is tn
        assert nl is tn.language and cnl is tn.language and nisa is tn.isa and cisa is tn.isa
        assert ncc.sbuf.auto_alloc() is nl.sbuf and oob_mode is tn.isa.oob_mode
        assert sizeinbytes(nl.bfloat16) == 2 and tensor is tn.typing.tensor
        try:
            import neuronxcc.starfish.support.util
        except ModuleNotFoundError as e:
            assert "no counterpart" in str(e)
        else:
            raise AssertionError("compiler internals must not import")
        print("ok")
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_an_installed_nki_or_neuronxcc_is_never_shadowed(tmp_path):
    (tmp_path / "nki").mkdir()
    (tmp_path / "nki" / "__init__.py").write_text("REAL = True\n")
    (tmp_path / "neuronxcc").mkdir()
    (tmp_path / "neuronxcc" / "__init__.py").write_text("REAL = True\n")  # Neuron 2.34: no nki namespace
    done = run_python("""
        import torchneuron.nki
        import nki, neuronxcc
        assert nki.REAL and neuronxcc.REAL
        try:
            import neuronxcc.nki
        except ModuleNotFoundError:
            print("ok")
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_plain_directory_named_nki_does_not_hide_the_aliases(tmp_path):
    # A folder of kernels called nki/ (no __init__.py) in the working directory is a
    # namespace package to Python, not an installed NKI: AWS's names must still resolve.
    (tmp_path / "nki").mkdir()
    done = run_python("""
        import torchneuron.nki
        import nki.language as nl, nki.isa as nisa
        print(nl.__name__, nisa.__name__)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["torchneuron.nki.language", "torchneuron.nki.isa"]


def test_sample_runner_runs_a_legacy_file_unmodified_and_skips_missing_paths(tmp_path):
    kernel = tmp_path / "legacy_add.py"
    kernel.write_text(textwrap.dedent("""
        import numpy as np
        import neuronxcc.nki as nki
        import neuronxcc.nki.language as nl

        @nki.jit
        def add(a, b):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            i_p, i_f = nl.mgrid[0:a.shape[0], 0:a.shape[1]]
            nl.store(out[i_p, i_f], nl.load(a[i_p, i_f]) + nl.load(b[i_p, i_f]))
            return out

        if __name__ == "__main__":
            a = np.ones((128, 64), np.float32)
            print("NKI and NumPy match" if np.array_equal(add(a, a), a + a) else "NKI and NumPy differ")
    """))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "nki_samples.py"), str(kernel),
                           str(tmp_path / "absent")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"pass         {kernel}" in done.stdout
    assert "skipped" in done.stdout and "nothing is fetched" in done.stdout


# -------------------------------------------------------------- legacy entry points
def add_one(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), 1.0))
    return out


def test_baremetal_decorator_and_call_forms():
    a = np.zeros((128, 8), np.float32)
    decorated = nki.baremetal(save_neff_name="k.neff", additional_compile_opt="--x")(add_one)
    np.testing.assert_array_equal(decorated(a), a + 1)
    np.testing.assert_array_equal(nki.baremetal(add_one)(a), a + 1)
    np.testing.assert_array_equal(nki.trace(add_one)(a), a + 1)
    with pytest.raises(TypeError, match="unexpected keyword argument.*platform"):
        nki.baremetal(platform="trn2")


def test_static_cast_of_a_host_array():
    x = np.array([1.0 + 2 ** -10, 3.0], np.float32)  # test code prepares inputs with nl.static_cast
    np.testing.assert_array_equal(nl.static_cast(x, nl.bfloat16), x.astype(ml_dtypes.bfloat16))


def test_nki_dtypes_are_numpy_dtypes():
    assert np.dtype(nl.bfloat16) == ml_dtypes.bfloat16
    assert np.ones(3).astype(nl.uint16).dtype == np.uint16


# ---------------------------------------------------------------- tile-level APIs
@nki.jit
def broadcast_column(x, col):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    nl.store(out, nl.multiply(tile, nl.load(col).broadcast_to(x.shape)))
    return out


def test_tile_broadcast_to_method():
    x = RNG.standard_normal((128, 16)).astype(np.float32)
    col = RNG.standard_normal((128, 1)).astype(np.float32)
    np.testing.assert_array_equal(simulate(broadcast_column, x, col), x * col)


@nki.jit
def pool_sum(x, pool):
    """Legacy average-pool idiom: sum over non-trailing free axes of a 5-D affine view."""
    p, h, w = x.shape
    out = nl.ndarray((p, h // pool, w // pool), dtype=x.dtype, buffer=nl.shared_hbm)
    i0, i1, i2, i3, i4 = nl.mgrid[0:p, 0:h // pool, 0:pool, 0:w // pool, 0:pool]
    tile = nl.load(x)
    nl.store(out, nl.sum(tile[i0, pool * i1 + i2, pool * i3 + i4], axis=[2, 4]))
    return out


def test_sum_over_non_trailing_free_axes():
    x = RNG.standard_normal((8, 12, 6)).astype(np.float32)
    expected = x.reshape(8, 6, 2, 3, 2).astype(np.float64).sum(axis=(2, 4))
    np.testing.assert_allclose(simulate(pool_sum, x, 2), expected, rtol=1e-6, atol=1e-6)


@nki.jit
def copy_with_dtype(x):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    psum = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=psum, stationary=nl.shared_identity_matrix(128, nl.float32), moving=nl.load(x))
    res = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=psum, dtype=nl.bfloat16)  # as AWS's matmul tutorial writes it
    nl.store(out, res)
    return out


def test_dst_first_call_with_a_dtype_keeps_dsts_dtype():
    x = RNG.standard_normal((128, 64)).astype(np.float32)
    with pytest.warns(UserWarning, match="dtype=bfloat16 differs from dst .* is ignored"):
        out = simulate(copy_with_dtype, x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x)  # identity matmul in fp32, copied without a bf16 rounding


@nki.jit
def fill_and_mask(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, 0.0)  # a scalar value: an HBM fill
    tile = nl.full(x.shape, 2.0, dtype=x.dtype, lazy_initialization=True)
    nl.add(tile, 1.0, mask=False)  # a constant-False mask: nothing happens
    scalar = nl.load(x[1, 2])  # 0-d HBM access
    nl.store(out[0:1, 0:1], scalar)
    return out


def test_scalar_store_lazy_full_false_mask_and_0d_load():
    x = RNG.standard_normal((4, 4)).astype(np.float32)
    out = simulate(fill_and_mask, x)
    expected = np.zeros_like(x)
    expected[0, 0] = x[1, 2]
    np.testing.assert_array_equal(out, expected)


@nki.jit
def reorder_scope(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    with nki.compiler.no_reorder():
        nl.store(out, nl.load(x))
    return out


def test_compiler_no_reorder_is_the_language_barrier():
    x = np.ones((128, 4), np.float32)
    np.testing.assert_array_equal(simulate(reorder_scope, x), x)
    assert all("no_reorder" in i.attrs for i in reorder_scope.last_run.instructions)
