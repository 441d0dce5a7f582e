"""A planned rank equals a real one: the same script run for real on 2 ranks under torchrun
and planned as a 2-rank job give each step the same modelled time, compute, collectives,
FLOPs and peak memory on rank 0 (FSDP2, and tensor parallelism)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from plan_scripts import FSDP_TP_LLAMA

from torchneuron.plan import plan

_COMPARED = ("seconds", "compute_seconds", "collective_seconds", "exposed_collective_seconds", "flops",
             "tokens", "peak_bytes")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _real_rank0(script: str, args: list[str], tmp_path) -> dict:
    """The script on 2 real ranks under torchrun, each measured by the planning worker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHNEURON_DATALESS", "TORCHNEURON_SIM"))}
    env.update(TORCHNEURON_INSTANCE="trn2.3xlarge", OMP_NUM_THREADS="1")
    result = str(tmp_path / "real-{rank}.json")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(_free_port()), "-m", "torchneuron.plan.worker", result, "0", script, *args],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "real-0.json") as f:
        return json.load(f)


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)], ids=["fsdp2", "tensor-parallel"])
def test_a_planned_two_rank_job_equals_the_real_one(tp, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(FSDP_TP_LLAMA)
    args = ["--tp", str(tp)]
    real = _real_rank0(str(script), args, tmp_path)
    assert real["outcome"]["status"] == "completed", real["outcome"]
    (planned,) = plan([str(script), *args], instances=["trn2.3xlarge"], nproc_per_node=2)
    assert planned.status == "completed", planned.rank["outcome"]
    assert len(planned.rank["steps"]) == len(real["steps"]) == 2
    for mine, theirs in zip(planned.rank["steps"], real["steps"]):
        assert {k: mine[k] for k in _COMPARED} == {k: theirs[k] for k in _COMPARED}
    assert planned.rank["collectives"] == real["collectives"]
    kinds = {c["name"].split()[0] for c in real["collectives"]}
    assert kinds >= ({"all_gather", "reduce_scatter"} if tp == 1 else {"all_reduce"})
    # The loss the script prints was never computed: the plan lists the read, with its line.
    (read,) = planned.rank["data_reads"]
    assert read["what"] == "item" and read["site"].startswith(f"{script}:") and read["calls"] == 2
    assert real["data_reads"] == []


def test_the_collective_launch_assumption_adds_to_every_collective(tmp_path):
    """TORCHNEURON_COLLECTIVE_LAUNCH_US (AWS publishes no figure: 0 by default) adds its
    microseconds to each collective's modelled time, and the sweep can vary it."""
    script = tmp_path / "train.py"
    script.write_text(FSDP_TP_LLAMA)
    plans = plan([str(script)], instances=["trn2.3xlarge"], nproc_per_node=2,
                 sweep="l=0,100", env={"TORCHNEURON_COLLECTIVE_LAUNCH_US": "{l}"})
    by_launch = {dict(p.configuration.values)["l"]: p for p in plans}
    base, launched = by_launch["0"].rank["collectives"], by_launch["100"].rank["collectives"]
    assert [c["name"] for c in base] == [c["name"] for c in launched] and base
    for without, with_launch in zip(base, launched):
        assert with_launch["seconds"] == pytest.approx(without["seconds"] + with_launch["calls"] * 100e-6)


def test_the_non_finite_check_skips_what_holds_no_values(tmp_path):
    """TORCHNEURON_DETECT_NONFINITE=1 in a planned FSDP2 job: DTensor parameters and tensors
    without values are not read (a DTensor's wrapper has no memory: reading it crashed the rank)."""
    script = tmp_path / "train.py"
    script.write_text(FSDP_TP_LLAMA)
    (result,) = plan([str(script)], instances=["trn2.3xlarge"], nproc_per_node=2,
                     env={"TORCHNEURON_DETECT_NONFINITE": "1"})
    assert result.status == "completed", result.rank["outcome"]
    assert result.rank["settings"]["TORCHNEURON_DETECT_NONFINITE"] == "1"
