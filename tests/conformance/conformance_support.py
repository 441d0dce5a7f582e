"""Shared helpers for the conformance suites (PyTorch's ModuleInfo / OptimizerInfo vs CPU).

There is deliberately no conftest.py in this directory; the test files import this
module by name (pytest puts the test file's directory on sys.path).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import PackedSequence
from torch.utils import _pytree as pytree

DEVICE = "neuron"


def to_device(obj, device: str = DEVICE):
    """Copies every tensor in ``obj`` (any pytree) to ``device``.

    Tensors become fresh leaves that keep ``requires_grad``; non-tensors are returned
    as they are. A PackedSequence goes through its own ``.to`` (its ``batch_sizes``
    must stay on the CPU). A tensor that appears twice (``FunctionInput(x, x)``) is copied
    once, so the copy aliases as the original does and its grad sums both uses.
    """
    copies: dict[int, torch.Tensor] = {}

    def move(x):
        if isinstance(x, PackedSequence):
            return x.to(device)
        if isinstance(x, torch.Tensor):
            if id(x) not in copies:
                y = x.detach().to(device)
                y.requires_grad_(x.requires_grad)
                copies[id(x)] = y
            return copies[id(x)]
        return x

    return pytree.tree_map(move, obj, is_leaf=lambda x: isinstance(x, PackedSequence))


def tensor_leaves(obj) -> list[torch.Tensor]:
    """Every tensor in ``obj``; a PackedSequence contributes its ``data``."""

    def unpack(x):
        return x.data if isinstance(x, PackedSequence) else x

    leaves = pytree.tree_leaves(
        pytree.tree_map(unpack, obj, is_leaf=lambda x: isinstance(x, PackedSequence)))
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def unique(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` without repeats of the same tensor object, in order."""
    return list({id(t): t for t in tensors}.values())


def assert_on_device(tensors, what: str, device_type: str = DEVICE) -> None:
    """Proves the device path ran: every tensor in ``tensors`` is a ``device_type`` tensor."""
    for i, t in enumerate(tensors):
        assert t.device.type == device_type, f"{what}[{i}] is on {t.device}, expected {device_type}"


def assert_same(actual, expected, *, atol: float, rtol: float, what: str) -> None:
    """assert_close of a device result against the CPU result (moved to CPU first), with context."""
    if isinstance(actual, torch.Tensor):
        actual = actual.detach().cpu()
    if isinstance(expected, torch.Tensor):
        expected = expected.detach()
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def expected_failure(table: dict[str, str], *keys: str) -> str | None:
    """The reason recorded in ``table`` for the first of ``keys`` (most specific first) it has."""
    for key in keys:
        if key in table:
            return table[key]
    return None


def variant_keys(name: str, *parts: str) -> list[str]:
    """Lookup keys from most to least specific: name/a/b, name/a, name/b, name."""
    n = len(parts)
    masks = sorted(range(1 << n), key=lambda m: (-bin(m).count("1"), -m))
    keys = ["/".join([name, *(p for i, p in enumerate(parts) if m & (1 << (n - 1 - i)))])
            for m in masks]
    return list(dict.fromkeys(keys))


def param(values, *, test_id: str, reason: str | None, marks=()):
    """pytest.param with an xfail(strict=True) mark when ``reason`` is set."""
    marks = list(marks)
    if reason is not None:
        marks.append(pytest.mark.xfail(reason=reason, strict=True))
    return pytest.param(*values, id=test_id, marks=marks)


@pytest.fixture(autouse=True)
def one_thread():
    """Runs each test with one intra-op thread (both devices alike), restoring the count after.

    Keeps the reduction order fixed and the runtime stable: on a loaded 2-core machine an
    OpenMP barrier costs a scheduler slice (~8 ms) per op, which made a small LayerNorm take
    8 ms instead of 20 us. CPU and neuron run the same kernels with the same thread count.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
