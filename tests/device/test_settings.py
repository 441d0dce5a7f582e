"""Settings: each declared once, parsed and checked in Python, settable through the override;
a bad one is a clear error naming the variable, never a process exit or a broken
``import torch``."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import torchneuron
import torchneuron.nki as nki
import torchneuron.nki.language as nl
from torchneuron import cli
from torchneuron import config
from torchneuron.device import numerics
from torchneuron.nki.errors import NkiUninitializedReadError

PACKAGE = Path(torchneuron.__file__).parent
REPO = PACKAGE.parent

# ------------------------------------------------------------------ in fresh interpreters
PROBE = r"""
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
out = {"warnings": [str(w.message) for w in caught if "torchneuron" in str(w.message)],
       "cpu_ok": (torch.ones(2) + 1).tolist() == [2.0, 2.0],
       "available": torch.neuron.is_available(), "count": torch.neuron.device_count()}
try:
    n = torch.neuron.device_count()
    out["last"] = (torch.ones(2, device=f"neuron:{max(n - 1, 0)}") + 1).cpu().tolist()
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print("RESULT" + json.dumps(out))
"""

CASES = {
    "cc_abbrev": {"NEURON_CC_FLAGS": "--auto"},
    "128_devices": {"TORCHNEURON_INSTANCE": "trn2.48xlarge", "NEURON_LOGICAL_NC_CONFIG": "1"},
    "127_devices": {"TORCHNEURON_INSTANCE": "trn2.48xlarge", "NEURON_LOGICAL_NC_CONFIG": "1",
                    "NEURON_RT_VISIBLE_CORES": "0-126"},
    "nki_garbage": {"NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE": "banana"},
}


def _child_env(extra):
    env = {k: v for k, v in os.environ.items() if k not in config.ENV_VARS}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**env, **extra}


@pytest.fixture(scope="module")
def children():
    """Every case's probe, plus `python -m torchneuron info` with a bad NKI setting, in parallel."""
    procs = {name: subprocess.Popen([sys.executable, "-c", PROBE], env=_child_env(extra), text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name, extra in CASES.items()}
    procs["info"] = subprocess.Popen([sys.executable, "-m", "torchneuron", "info"],
                                     env=_child_env({**CASES["nki_garbage"], "COLUMNS": "400"}),
                                     text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        out[name] = (p.returncode, stdout, stderr)
    return out


def _report(children, name):
    code, stdout, stderr = children[name]
    assert code == 0, (name, code, stdout, stderr[-3000:])
    line = next((l for l in stdout.splitlines() if l.startswith("RESULT")), None)
    assert line is not None, (name, stdout, stderr[-3000:])
    return json.loads(line[len("RESULT"):])


def test_ambiguous_cc_flag_does_not_exit_import_torch(children):
    r = _report(children, "cc_abbrev")  # the process lived on: status 0, a RESULT line
    assert "usage:" not in children["cc_abbrev"][2]  # no argparse usage line
    assert r["cpu_ok"] and not r["available"] and r["count"] == 0
    for text in (r["warnings"][0], r["error"]):
        assert "NEURON_CC_FLAGS='--auto'" in text
        assert "abbreviates --auto-cast or --auto-cast-type" in text
        assert "--auto-cast {none,matmult,all}" in text  # the accepted forms
    assert r["error"].startswith("RuntimeError: The neuron device is unavailable")


def test_128_logical_cores_name_the_variables_and_the_fix(children):
    r = _report(children, "128_devices")
    assert r["cpu_ok"] and not r["available"]
    for text in (r["warnings"][0], r["error"]):
        assert "TORCHNEURON_INSTANCE='trn2.48xlarge', NEURON_LOGICAL_NC_CONFIG='1' give 128" in text
        assert "at most 127" in text and "c10::DeviceIndex" in text
        assert "NEURON_RT_VISIBLE_CORES" in text


def test_127_devices_is_the_limit_and_works(children):
    r = _report(children, "127_devices")
    assert r["available"] and r["count"] == 127
    assert r["last"] == [2.0, 2.0] and r["warnings"] == []


def test_bad_nki_setting_warns_at_import_but_leaves_the_device(children):
    r = _report(children, "nki_garbage")
    assert r["available"] and r["count"] == 4 and r["last"] == [2.0, 2.0]
    assert len(r["warnings"]) == 1
    assert "NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE='banana' is not valid" in r["warnings"][0]


def test_info_names_the_bad_setting_and_fails(children):
    code, stdout, stderr = children["info"]
    assert code == 1, stdout + stderr
    assert "Trainium2" in stdout  # the device settings are fine: the target is shown
    assert re.search(r"bad setting: NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE='banana' is not valid: "
                     r"use 1 \(or true\) for on, or 0 \(or false\) for off", stdout)


# ------------------------------------------------------------------ NEURON_CC_FLAGS
@pytest.mark.parametrize("flags, match", [
    ("--auto", "'--auto' abbreviates --auto-cast or --auto-cast-type"),
    ("--auto-cast-t bf16", "'--auto-cast-t' abbreviates --auto-cast-type"),
    ("--auto-cast", "--auto-cast needs a value"),
    ("--auto-cast --auto-cast-type bf16", "--auto-cast needs a value"),
    ("--auto-cast=", "--auto-cast '' is not valid"),
    ("--auto-cast 'matmult", "does not split into words"),
])
def test_bad_cc_flags_raise_naming_variable_value_and_forms(flags, match):
    # Refused when set (the numerics switches reach the C++ core at once); on Python 3.11
    # argparse called sys.exit(2) for "--auto"
    with pytest.raises(ValueError, match=re.escape(match)) as info:
        with config.override(NEURON_CC_FLAGS=flags):
            numerics.current()
    message = str(info.value)
    assert f"NEURON_CC_FLAGS={flags!r}" in message
    assert "--auto-cast {none,matmult,all}" in message or "use one of none, matmult, all" in message


@pytest.mark.parametrize("flags, expected", [
    ("-h", ("none", "bf16")),
    ("--help --version", ("none", "bf16")),
    ("-O1 --auto-cast=matmult --model-type transformer", ("matmult", "bf16")),
    ("--auto-cast all --auto-cast-type fp16 --auto-casting", ("all", "fp16")),
])
def test_other_compiler_flags_are_ignored(flags, expected):
    with config.override(NEURON_CC_FLAGS=flags):
        n = numerics.current()
    assert (n.auto_cast, n.auto_cast_type) == expected


# ------------------------------------------------------------------ device limit
def test_device_limit_is_checked_before_cpp():
    with config.override(TORCHNEURON_INSTANCE="trn2.48xlarge", NEURON_LOGICAL_NC_CONFIG="1",
                         NEURON_RT_VISIBLE_CORES="0-127"):
        with pytest.raises(ValueError, match=r"NEURON_RT_VISIBLE_CORES='0-127' give 128 neuron "
                                             r"devices .* at most 127"):
            config.device_topology()
        assert any("give 128" in p for p in config.problems("device"))
    with config.override(TORCHNEURON_INSTANCE="trn2.48xlarge", NEURON_LOGICAL_NC_CONFIG="1",
                         NEURON_RT_VISIBLE_CORES="1-127"):
        assert config.device_topology().device_count == config.MAX_DEVICES == 127


def test_device_topology_is_resolved_once_per_setting_values(monkeypatch):
    """Every collective charges its modelled time with the topology: resolved again only when a
    topology setting changes, by any route (override, the environment itself)."""
    first = config.device_topology()
    assert config.device_topology() is first  # unchanged settings: the same resolved topology
    with config.override(TORCHNEURON_INSTANCE="trn2.48xlarge", NEURON_RT_VISIBLE_CORES="0-3"):
        assert config.device_topology().device_count == 4
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "2")
    assert config.device_topology().device_count == 1
    assert config.device_topology().devices[0].core_id == 2
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES")
    assert config.device_topology() == first


# ------------------------------------------------------------------ one place, validated
def _environment_reads(path: Path) -> list[tuple[int, str]]:
    """(line, source) of every os.environ / os.getenv use in a Python file."""
    tree = ast.parse(path.read_text(), str(path))
    lines = path.read_text().splitlines()
    hits = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv")
                and isinstance(node.value, ast.Name) and node.value.id == "os"):
            hits.append((node.lineno, lines[node.lineno - 1].strip()))
        if isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "environb", "getenv") for a in node.names):
            hits.append((node.lineno, lines[node.lineno - 1].strip()))
    return hits


# Uses that are not torchneuron settings: a child's environment built from ours, and
# Inductor's own variable, which Inductor's temporary_cache_dir sets (compiler/cache.py).
_NOT_SETTINGS = {
    ("torchneuron/testing.py", "full_env = {k: v for k, v in os.environ.items() if k not in _DEVICE_ENV}"),
    ("torchneuron/compiler/cache.py", 'if os.environ.get("TORCHINDUCTOR_CACHE_DIR") == str(directory):'),
    ("torchneuron/check/__init__.py", "env = dict(os.environ)  # the script's child: our environment, plus the target"),
    ("torchneuron/plan/planner.py",
     "env = {**os.environ, **world.environment(rank), **dict(configuration.env)}  # the worker's: ours, plus the rank's"),
}


def test_only_the_config_module_reads_the_environment():
    config_file = Path(config.__file__).resolve()
    found = []
    for root in (PACKAGE, REPO / "torch_neuronx"):
        for path in sorted(root.rglob("*.py")):
            if path.resolve() == config_file:
                continue
            for line, source in _environment_reads(path):
                if (str(path.relative_to(REPO)), source) not in _NOT_SETTINGS:
                    found.append(f"{path.relative_to(REPO)}:{line}: {source}")
    assert found == []


def test_info_lists_every_declared_setting():
    console = Console(record=True, width=400)
    assert cli.info(console) == 0
    text = console.export_text()
    assert {"TORCHNEURON_NKI_UNINITIALIZED", "NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE"} <= set(config.ENV_VARS)
    for name in config.ENV_VARS:
        assert name in text


BOOLEANS = ["NEURON_LAUNCH_BLOCKING", "NEURON_RT_STOCHASTIC_ROUNDING_EN", "NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "NKI_PRECISE_FP",
            "TORCHNEURON_COMPILE_CACHE_ALLOW_SHARED", "TORCHNEURON_COST_MODEL", "TORCHNEURON_CPU_FALLBACK",
            "TORCHNEURON_DATALESS",
            "TORCHNEURON_DETECT_NONFINITE", "TORCHNEURON_INT64_AS_INT32",
            "TORCHNEURON_NATIVE_INT64", "TORCHNEURON_SIMULATED_WORLD", "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION",
            "TORCH_NEURONX_ENABLE_STACK_TRACE"]


def test_the_booleans_are_the_documented_ones():
    assert sorted(n for n, v in config.ENV_VARS.items() if v.parse is config.parse_flag) == BOOLEANS


@pytest.mark.parametrize("name", BOOLEANS)
def test_every_boolean_rejects_garbage(name, monkeypatch):
    message = r"is not valid: use 1 \(or true\) for on, or 0 \(or false\) for off"
    for garbage in ("banana", "yes", "2", "on"):
        monkeypatch.setenv(name, garbage)  # as exported before start
        with pytest.raises(ValueError, match=rf"{name}='{garbage}' {message}"):
            config.get_flag(name)
        assert any(name in p for p in config.problems())
        monkeypatch.delenv(name)
        # set at run time, it is refused at once when the C++ core holds it, else when read
        try:
            with config.override(**{name: garbage}):
                config.get_flag(name)
        except ValueError as refused:
            assert f"{name}='{garbage}'" in str(refused)
        else:
            raise AssertionError(f"{name}={garbage!r} was accepted")
    for text, meaning in (("1", True), ("TRUE", True), (" true ", True), ("0", False), ("False", False)):
        with config.override(**{name: text}):
            assert config.get_flag(name) is meaning


def test_pe_transpose_garbage_is_an_error_not_false(monkeypatch):
    monkeypatch.setenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "banana")  # was silently 8 banks
    with pytest.raises(ValueError, match="NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE='banana' is not valid"):
        nl.tile_size.psum_num_banks


def _reads_uninitialised_memory(a):
    t = nl.ndarray((128, 4), nl.float32, buffer=nl.sbuf)
    out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=t)  # t was never written
    return out


def test_nki_settings_are_settable_through_the_override():
    with config.override(NEURON_PLATFORM_TARGET_OVERRIDE="trn2", NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE="1"):
        assert nl.tile_size.psum_num_banks == 7
    with config.override(NEURON_PLATFORM_TARGET_OVERRIDE="trn2", NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE="0"):
        assert nl.tile_size.psum_num_banks == 8
    kernel = nki.jit(_reads_uninitialised_memory)
    with config.override(TORCHNEURON_NKI_UNINITIALIZED="error"):
        with pytest.raises(NkiUninitializedReadError, match="no instruction wrote"):
            nki.simulate(kernel)(np.zeros(1, np.float32))
    with config.override(TORCHNEURON_NKI_UNINITIALIZED="loud"):
        with pytest.raises(ValueError, match="TORCHNEURON_NKI_UNINITIALIZED='loud' is not valid: "
                                             "use 'warn' .* or 'error' .* or 'ignore'"):
            nki.simulate(kernel)(np.zeros(1, np.float32))


def test_override_none_means_the_default():
    with config.override(TORCHNEURON_CPU_FALLBACK="0"):
        with config.override(TORCHNEURON_CPU_FALLBACK=None):
            assert config.get("TORCHNEURON_CPU_FALLBACK") == "1"
            assert config.get_flag("TORCHNEURON_CPU_FALLBACK") is True


def test_override_takes_text_only():
    with pytest.raises(TypeError, match="settings are text"):
        with config.override(TORCHNEURON_CPU_FALLBACK=True):
            pass


def test_config_module_loads_without_torch():
    """config.py stands alone: loaded from its file, it imports no torch (the torchneuron
    package itself always does, since importing it registers the device)."""
    code = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("standalone_config", {str(config.__file__)!r})
config = sys.modules["standalone_config"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(config)
with config.override(NEURON_CC_FLAGS="--auto-cast matmult", TORCHNEURON_CPU_FALLBACK="0"):
    assert config.value("NEURON_CC_FLAGS") == ("matmult", "bf16")
    assert config.get_flag("TORCHNEURON_CPU_FALLBACK") is False
    assert config.problems("nki") == []
print("torch" in sys.modules, "torchneuron" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=_child_env({}))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
