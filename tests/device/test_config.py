"""Device topology from environment variables, each checked in a fresh interpreter.

All configurations start in parallel once per module (subprocesses are slow);
each test then checks one configuration's report.
"""

import json
import os
import subprocess
import sys

import pytest

GiB = 2**30

PROBE = r"""
import json, torch
n = torch.neuron.device_count()
props = [torch.neuron.get_device_properties(i) for i in range(n)]
last = torch.ones(2, device=f"neuron:{n - 1}")
import torchneuron
out = {
    "count": n,
    "accel_count": torch.accelerator.device_count(),
    "names": sorted({p.name for p in props}),
    "memory": sorted({p.total_memory for p in props}),
    "core_ids": [p.core_id for p in props],
    "capacity": torch.neuron.mem_get_info(n - 1)[1],
    "last_ok": last.device.index == n - 1 and torchneuron._C._is_device_memory(last + 1),
}
try:
    torch.ones(1, device=f"neuron:{n}")
    out["past_end"] = "no error"
except RuntimeError as e:
    out["past_end"] = str(e)
print("RESULT" + json.dumps(out))
"""

GOOD = {
    "default": {},
    "lnc1": {"NEURON_LOGICAL_NC_CONFIG": "1"},
    "visible_0-1": {"NEURON_RT_VISIBLE_CORES": "0-1"},
    "visible_2": {"NEURON_RT_VISIBLE_CORES": "2"},
    "visible_0,2": {"NEURON_RT_VISIBLE_CORES": "0,2"},
    "trn3": {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn3"},
    "trn2.48xlarge": {"TORCHNEURON_INSTANCE": "trn2.48xlarge"},
}
BAD = {
    "NEURON_LOGICAL_NC_CONFIG": "3",
    "NEURON_RT_VISIBLE_CORES": "7",
    "NEURON_PLATFORM_TARGET_OVERRIDE": "trn9",
    "TORCHNEURON_INSTANCE": "trn2.bogus",
}
BAD_SCRIPT = r"""
try:
    import torch
    torch.ones(1, device="neuron")
    print("RESULT" + "no error")
except Exception as e:
    chain, err = [], e
    while err is not None:
        chain.append(f"{type(err).__name__}: {err}")
        err = err.__cause__ or err.__context__
    print("RESULT" + " | ".join(chain))
"""

_ENV_KEYS = ("NEURON_PLATFORM_TARGET_OVERRIDE", "NEURON_LOGICAL_NC_CONFIG",
             "NEURON_RT_VISIBLE_CORES", "TORCHNEURON_INSTANCE")


def _spawn(code, extra):
    env = {k: v for k, v in os.environ.items() if k not in _ENV_KEYS}
    env.update(extra)
    return subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def reports():
    procs = {("good", k): _spawn(PROBE, v) for k, v in GOOD.items()}
    procs.update({("bad", k): _spawn(BAD_SCRIPT, {k: v}) for k, v in BAD.items()})
    out = {}
    for key, p in procs.items():
        stdout, stderr = p.communicate(timeout=180)
        line = next((l for l in stdout.splitlines() if l.startswith("RESULT")), None)
        assert line is not None, (key, p.returncode, stderr[-3000:])
        payload = line[len("RESULT"):]
        out[key] = json.loads(payload) if key[0] == "good" else payload
    return out


def test_default_is_trn2_3xlarge_with_4_devices_of_24_gib(reports):
    r = reports[("good", "default")]
    assert r["count"] == r["accel_count"] == 4
    assert r["names"] == ["trn2"]
    assert r["memory"] == [24 * GiB]
    assert r["capacity"] == 24 * GiB
    assert r["last_ok"]


def test_lnc1_gives_8_devices_of_12_gib(reports):
    r = reports[("good", "lnc1")]
    assert r["count"] == 8
    assert r["memory"] == [12 * GiB]
    assert r["last_ok"]


@pytest.mark.parametrize("spec,cores", [("0-1", [0, 1]), ("2", [2]), ("0,2", [0, 2])])
def test_visible_cores_restrict_and_renumber(reports, spec, cores):
    r = reports[("good", f"visible_{spec}")]
    assert r["count"] == len(cores)
    assert r["core_ids"] == cores  # neuron:0.. map onto the listed cores in order
    assert r["memory"] == [24 * GiB]
    assert r["last_ok"]
    assert f"neuron:{len(cores)}" in r["past_end"]


def test_trn3_target_is_trainium3_with_36_gib(reports):
    r = reports[("good", "trn3")]
    assert r["names"] == ["trn3"]
    assert r["memory"] == [36 * GiB]
    assert r["last_ok"]


def test_trn2_48xlarge_gives_64_devices(reports):
    r = reports[("good", "trn2.48xlarge")]
    assert r["count"] == 64
    assert r["names"] == ["trn2"]
    assert r["last_ok"]


@pytest.mark.parametrize("name", ["default", "lnc1", "visible_2", "trn2.48xlarge"])
def test_index_past_the_end_raises(reports, name):
    r = reports[("good", name)]
    assert r["past_end"] != "no error"
    assert f"neuron:{r['count']}" in r["past_end"]


@pytest.mark.parametrize("var", sorted(BAD))
def test_bad_value_gives_clear_error_naming_the_variable(reports, var):
    msg = reports[("bad", var)]
    assert msg != "no error"
    assert var in msg
    assert BAD[var] in msg
