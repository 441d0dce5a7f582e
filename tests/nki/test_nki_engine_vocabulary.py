"""NKI speaks of the chip's engines by one set of names: hardware/engines.py's Engine enum.

Instruction records keep NKI's short names ("tensor", "gpsimd"); every display name
("TensorE"), track order and the engine a kernel's record carries come from the enum.
"""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
from torchneuron.device import accounting
from torchneuron.hardware.engines import TRACK_ORDER, Engine
from torchneuron.nki.instruction import ENGINES
from torchneuron.nki.instruction import Engine as RecordEngine
from torchneuron.profiler.nki_trace import ENGINE_TRACKS

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "torchneuron"


def test_record_names_map_onto_the_hardware_enum():
    for engine in Engine:
        assert RecordEngine.hardware(engine.short) is engine
        assert RecordEngine.title(engine.short) == engine.value
    assert set(ENGINES) <= {e.short for e in Engine}
    with pytest.raises(ValueError, match="unknown engine 'pool'.*tensor, vector"):
        Engine.from_short("pool")


def test_trace_tracks_follow_the_enum_order_and_names():
    compute = [e for e in TRACK_ORDER if e is not Engine.DMA]
    assert [ENGINE_TRACKS[e.short] for e in compute] == [(i + 1, e.value) for i, e in enumerate(compute)]


def test_no_engine_name_is_spelled_outside_the_enum():
    # A string constant equal to an engine's display name is a second copy of the names.
    names = {e.value for e in Engine} - {"DMA"}  # "DMA" is also the English word
    spelled = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "hardware" / "engines.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                spelled.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
    assert not spelled, spelled


@nki.jit
def _double(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.add(nl.load(a), nl.load(a)))
    return out


def test_an_nki_kernels_record_names_its_busiest_engine_by_the_enum():
    x = torch.randn(128, 64, device="neuron")
    _double(x)
    with accounting.recording() as events:
        _double(x)
    [kernel] = [e for e in events if e.kind == "nki_kernel"]
    assert kernel.engine in {e.value for e in Engine}, kernel
