"""nki.language data movement (torchneuron/nki/language/movement.py): load/store/copy, load_transpose2d,
matmul and transpose against NumPy, and the ISA instructions they lower to."""

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki.language as nl
from torchneuron.nki import NkiValidationError
from torchneuron.testing import (assert_close_to_reference, matmul_tolerance)
from nki_language_support import run, opcodes

BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32, low=-2.0, high=2.0):
    return RNG.uniform(low, high, shape).astype(dtype)


# --------------------------------------------------------------------- data movement
def test_load_store_copy_and_shapes():
    a = rand(300, 64, dtype=BF16)

    def kernel(x):
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        for i in range(3):
            rows = min(128, x.shape[0] - i * 128)
            t = nl.load(x[i * 128:i * 128 + rows, :], dtype=nl.float32)
            assert t.buffer is nl.sbuf and t.shape == (rows, 64) and t.dtype is nl.float32
            nl.store(out[i * 128:i * 128 + rows, :], nl.copy(t))
        return out

    out, r = run(kernel, a)
    assert np.array_equal(out, a.astype(np.float32))
    assert opcodes(r).count("dma_copy") == 6 and opcodes(r).count("tensor_copy") == 3


def test_load_rejects_on_chip_and_oversized_tiles():
    def kernel(x):
        nl.load(nl.load(x))

    with pytest.raises(NkiValidationError, match="already on chip"):
        run(kernel, rand(128, 4))

    def tall(x):
        nl.load(x)

    with pytest.raises(NkiValidationError, match="partition dimension 256 exceeds"):
        run(tall, rand(256, 4))


def test_load_transpose2d_records_a_transposing_dma():
    a = rand(64, 128)

    def kernel(x):
        t = nl.load_transpose2d(x)
        out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    out, r = run(kernel, a)
    assert np.array_equal(out, a.T)
    assert r.instructions[0].opcode == "dma_copy" and r.instructions[0].attrs.get("transpose") is True


def test_matmul_and_transpose():
    x, y = rand(64, 128, dtype=BF16), rand(128, 512, dtype=BF16)
    ref = x.astype(np.float32) @ y.astype(np.float32)

    def kernel(a, b, transpose_x):
        at, bt = nl.load(a), nl.load(b)
        p = nl.matmul(at, bt, transpose_x=transpose_x)
        assert p.buffer is nl.psum and p.dtype is nl.float32
        out = nl.ndarray(p.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(p))
        return out

    out, r = run(kernel, np.ascontiguousarray(x.T), y, True)
    tol = matmul_tolerance(x, y)  # K = 128 exact bf16 products summed in fp32, in some order
    assert_close_to_reference(out, ref, tol)
    assert opcodes(r).count("nc_matmul") == 1 and "nc_transpose" not in opcodes(r)
    mm = next(i for i in r.instructions if i.opcode == "nc_matmul")
    assert mm.flops == 2 * 128 * 64 * 512
    out, r = run(kernel, x, y, False)  # x [M, K]: a transpose is inserted
    assert_close_to_reference(out, ref, tol)
    assert opcodes(r).count("nc_transpose") == 1 and opcodes(r).count("nc_matmul") == 1

    def transpose_kernel(a):
        t = nl.transpose(nl.load(a))
        assert t.buffer is nl.psum
        out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)  # PSUM value: copied to SBUF first
        return out

    a = rand(32, 96)
    out, _ = run(transpose_kernel, a)
    assert np.array_equal(out, a.T)


def test_matmul_limits_come_from_isa():
    def kernel(a, b):
        nl.matmul(nl.load(a), nl.load(b), transpose_x=True)

    with pytest.raises(NkiValidationError, match="moving free size is 1024"):
        run(kernel, rand(128, 64), rand(128, 1024))
