"""docs/nki.md's Python examples run as written (and use our NKI, not something else)."""

from __future__ import annotations

import pathlib
import re

import pytest

import torchneuron.nki as nki

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "nki.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


@pytest.mark.parametrize("index", range(1, len(BLOCKS)), ids=lambda i: f"block{i}")
def test_doc_example_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nki.reset_kernel_stats()
    namespace: dict = {}
    exec(compile(BLOCKS[index], f"{DOC.name}[{index}]", "exec"), namespace)
    assert nki.kernel_stats(), "the example should call an NKI kernel on torch tensors"
