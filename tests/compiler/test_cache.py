"""The persistent compile cache: hits across processes, keyed on flags, robust to damage."""

import pytest
from compile_support import _fresh_compile_state, run_child  # noqa: F401

from torchneuron import config
from torchneuron.compiler import cache, cache_store

CHILD = """
    import json, time, torch
    def f(x, w):
        return torch.nn.functional.silu(x @ w).softmax(-1) * 3
    x = torch.randn(16, 32, device="neuron"); w = torch.randn(32, 32, device="neuron")
    started = time.perf_counter()
    out = torch.compile(f, backend="neuron")(x, w)
    seconds = time.perf_counter() - started
    # eager, same flags; Inductor sums in its own order: first-order bounds as compile_support's
    from torchneuron.testing import (accumulation_tolerance, assert_close_to_reference, matmul_tolerance,
                                     unit_roundoff)
    u = unit_roundoff(torch.float32)
    z = x.cpu().double() @ w.cpu().double()
    z_err = 1.1 * matmul_tolerance(x, w) + 8 * u * (x.cpu().double().abs() @ w.cpu().double().abs() + 1)
    p = torch.nn.functional.silu(z).softmax(-1)  # silu's slope <= 1.1; softmax: 2 max error + its sum
    rel = 2 * z_err.amax(-1, keepdim=True) + accumulation_tolerance(1.0, 32, torch.float32) + 16 * u
    assert_close_to_reference(out, f(x, w), 3 * p * rel + 4 * u * out.cpu().double().abs())
    print(json.dumps({**torch.neuron.compile_metrics(), "seconds": seconds}))
"""


def compile_in_child(directory, **env):
    return run_child(CHILD, {"NEURON_COMPILE_CACHE_URL": str(directory),
                             "TORCHNEURON_COMPILE_CACHE_KEY_FILE": f"{directory}.key", **env})


def cold_then_warm(directory):
    """Compiles in a fresh process into an empty cache, then hits it from another."""
    cold = compile_in_child(directory)
    assert cold["cache_misses"] == 1 and cold["cache_hits"] == 0
    entries = directory / cache_store.SUBDIR / cache_store.ENTRIES
    assert (directory / cache_store.SUBDIR / cache_store.MARKER).read_bytes() == cache_store.MARKER_TEXT
    assert any(p.is_file() for p in entries.rglob("*"))
    warm = compile_in_child(directory)
    assert warm["cache_hits"] == 1 and warm["cache_misses"] == 0
    return entries


def test_cache_across_processes(tmp_path):
    """Cold compile, then a warm hit in a second process. (Damaged, planted and foreign
    entries are misses: test_cache_security.py, and the slow test below.)"""
    cold_then_warm(tmp_path)


def test_key_covers_the_compiler_flags_and_the_target(monkeypatch):
    """What a compile depends on outside the graph is in Inductor's key: an entry compiled
    under other flags or for another chip is never served (across processes: the next test)."""
    from torchneuron.hardware.topology import topology_from_env

    base = cache.NeuronCacheKey().uuid()
    assert cache.NeuronCacheKey().uuid() == base  # the same settings give the same key
    with config.override(NEURON_CC_FLAGS="--auto-cast matmult"):
        assert cache.NeuronCacheKey().uuid() != base
    with config.override(TORCHNEURON_COST_MODEL="0"):
        assert cache.NeuronCacheKey().uuid() != base
    trn3 = topology_from_env({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn3"})
    monkeypatch.setattr(cache._core, "topology", lambda: trn3)
    assert cache.NeuronCacheKey().uuid() != base


@pytest.mark.slow  # five compiling processes; the key's coverage is tested in-process above
def test_other_flags_target_and_damaged_entries_miss_across_processes(tmp_path):
    entries = cold_then_warm(tmp_path)
    other_flags = compile_in_child(tmp_path, NEURON_CC_FLAGS="--auto-cast matmult")
    assert other_flags["cache_misses"] == 1 and other_flags["cache_hits"] == 0
    other_target = compile_in_child(tmp_path, NEURON_PLATFORM_TARGET_OVERRIDE="trn3")
    assert other_target["cache_misses"] == 1 and other_target["cache_hits"] == 0
    damaged = 0
    for path in entries.rglob("*"):
        if path.is_file():
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
            damaged += 1
    assert damaged
    again = compile_in_child(tmp_path)  # would crash or compute garbage if it loaded them
    assert again["cache_misses"] == 1 and again["cache_hits"] == 0


def test_cache_dir_setting():
    with config.override(NEURON_COMPILE_CACHE_URL="s3://bucket/cache"):
        with pytest.raises(ValueError, match="only local directories"):
            cache.cache_dir()
    with config.override(NEURON_COMPILE_CACHE_URL=None, XDG_CACHE_HOME="/tmp/xdg"):
        assert str(cache.cache_dir()) == "/tmp/xdg/torchneuron/compile"
