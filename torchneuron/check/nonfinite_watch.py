"""``torchneuron check`` notices a loss or a model output that became NaN/Inf.

Without ``--detect-nonfinite`` nothing checks every op (that costs a read of every
output). The check run still looks at two values a training script cares about: each
loss it calls ``backward()`` on, and the output of each outermost module call (a model's
forward). The first non-finite one of each kind is kept with the optimizer step it
happened in and the user's line, and the verdict says so, pointing at
``--detect-nonfinite`` (``TORCHNEURON_DETECT_NONFINITE=1`` for the run), which stops at the
op that first made the NaN/Inf and names it.

Values are read through their CPU alias (:func:`torchneuron.debug.nonfinite.has_nonfinite`),
so the watch adds no device work, copies or host syncs to the report's record. Only
public hooks: ``torch.autograd.backward`` is wrapped for the run (``Tensor.backward``
calls it) and global module forward hooks (``torch.nn.modules.module``) count nesting.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from torchneuron.debug.nonfinite import has_nonfinite, tensor_stats
from torchneuron.profiler.outcome import user_site

__all__ = ["NonFiniteWatch"]


class NonFiniteWatch:
    """Keeps the first non-finite loss and the first non-finite outermost module output."""

    def __init__(self, steps: Callable[[], int]) -> None:
        self._steps = steps  # optimizer steps completed so far
        self.found: dict[str, dict[str, Any]] = {}  # "loss" / "output" -> what and where
        self._depth = 0

    def _note(self, kind: str, tensors: list[torch.Tensor], module: str | None = None) -> None:
        if kind in self.found:
            return
        bad = next((t for t in tensors if has_nonfinite(t)), None)
        if bad is None:
            return
        stats = tensor_stats(bad)
        self.found[kind] = {
            "kind": kind, "step": self._steps(), "site": user_site(traceback.extract_stack()[:-2]),
            "module": module, "shape": list(stats["shape"]), "dtype": stats["dtype"],
            "nan": stats.get("nan", 0), "inf": stats.get("inf", 0),
        }

    # Inside a compiled region (Dynamo traces the hooks) nothing is counted or read: the
    # outermost call, which runs eagerly around the compiled code, is the one checked.
    def _pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling():
            return
        self._depth += 1

    def _hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0 and "output" not in self.found:
            tensors = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
            self._note("output", tensors, type(module).__name__)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Watches while the block runs (the user's script)."""
        original = torch.autograd.backward

        def backward(tensors, *args, **kwargs):
            if "loss" not in self.found:
                roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
                self._note("loss", [t for t in roots if isinstance(t, torch.Tensor)])
            return original(tensors, *args, **kwargs)

        from torch.nn.modules import module as nn_module

        pre = nn_module.register_module_forward_pre_hook(self._pre_hook)
        post = nn_module.register_module_forward_hook(self._hook, always_call=True)
        torch.autograd.backward = backward
        try:
            yield
        finally:
            torch.autograd.backward = original
            pre.remove()
            post.remove()

    def report(self) -> list[dict[str, Any]]:
        """The findings, first found first."""
        return list(self.found.values())
