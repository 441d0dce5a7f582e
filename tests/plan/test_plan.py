"""torchneuron plan: configurations, placement, sweeps, fit, reports and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from plan_scripts import CHECKPOINT, GLOO_GROUPS, RESUME

from torchneuron.plan import World, parse_sweep, plan, substitutions

TRAIN = textwrap.dedent('''
    import argparse, torch
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--huge", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(1000, args.width), torch.nn.Linear(args.width, 1000)).to("neuron")
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 1000, (4, 64), device="neuron")
    if args.huge:
        ballast = torch.empty(40 * 2**30, dtype=torch.uint8, device="neuron")  # more than a device holds
    for step in range(3):
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward(); opt.step(); opt.zero_grad()
        if loss.item() > 1e6:  # a divergence guard: control flow on a value the plan never computes
            break
''')


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


def test_ranks_are_placed_as_torchrun_places_them():
    world = World("trn2.48xlarge", nodes=2)
    assert world.world_size == 128 and world.ranks_per_instance == 64
    env = world.environment(70)
    assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == \
        ("70", "6", "1", "128", "64")
    assert env["TORCHNEURON_DATALESS"] == env["TORCHNEURON_SIMULATED_WORLD"] == "1"
    assert World("trn2.48xlarge", lnc=1).world_size == 128  # LNC=1: eight logical cores per chip
    assert World("trn1.32xlarge", nodes=2).world_size == 64  # Trn1: two NeuronCore-v2 per chip, for comparison
    # More logical cores than a process can number (127): each rank sees its own core only.
    ultraserver = World("trn3-ultraserver-gen1")
    assert ultraserver.world_size == 256 and ultraserver.environment(200)["NEURON_RT_VISIBLE_CORES"] == "200"
    assert "NEURON_RT_VISIBLE_CORES" not in world.environment(70)
    with pytest.raises(ValueError, match="nproc-per-node 5: a trn2.3xlarge has 4 logical cores"):
        World("trn2.3xlarge", nproc_per_node=5)
    with pytest.raises(ValueError, match="unknown instance type 'trn9.huge'"):
        World("trn9.huge")


def test_sweeps_substitute_placeholders_and_refuse_typos():
    sweep = parse_sweep("tp=1,2 ac=none,full")
    configs = substitutions(sweep, ["train.py", "--tp", "{tp}", "--ac={ac}"], {"LAYERS": "{tp}0"})
    assert [c.args for c in configs][:2] == [("train.py", "--tp", "1", "--ac=none"), ("train.py", "--tp", "1", "--ac=full")]
    assert len(configs) == 4 and dict(configs[-1].env) == {"LAYERS": "20"}
    with pytest.raises(ValueError, match=r"--sweep names pp but no script argument .* contains \{pp\}"):
        substitutions(parse_sweep("pp=1,2"), ["train.py", "--tp", "{tp}"], {})
    for bad in ("tp", "tp=", "tp=1,,2", "1tp=2"):
        with pytest.raises(ValueError, match="--sweep"):
            parse_sweep(bad)


def test_a_plan_times_each_step_and_lists_the_values_it_never_computed(script):
    (result,) = plan([str(script)], instances=["trn2.3xlarge"], nproc_per_node=1)
    assert result.status == "completed" and result.fits
    steps = result.rank["steps"]
    assert len(steps) == 3
    step = result.steady_step
    # Without collectives the step is its compute (two sums of one set of charges: a last-bit difference).
    assert step["seconds"] == pytest.approx(step["compute_seconds"], rel=1e-9) and step["compute_seconds"] > 0
    assert step["collective_seconds"] == 0
    assert step["flops"] > 0 and 0 < step["mfu"] < 1
    assert step["tokens"] == 4 * 64 and result.tokens_per_second == pytest.approx(256 / step["seconds"])
    memory = step["memory_at_peak"]
    assert memory["parameters"] >= (1000 * 256 + 256 * 1000 + 1000) * 4 and memory["optimizer state"] > 0
    (read,) = result.rank["data_reads"]
    assert read["what"] == "item" and read["calls"] == 3 and read["site"] == f"{script}:16 in <module>"


def test_control_flow_on_a_placeholder_is_visible_in_the_plan(tmp_path):
    path = tmp_path / "early_stop.py"
    path.write_text(TRAIN.replace("loss.item() > 1e6", "loss.item() < 0.01"))  # 0.0 stops the loop
    (result,) = plan([str(path)], instances=["trn2.3xlarge"], nproc_per_node=1)
    assert len(result.rank["steps"]) == 1  # the real run would go on: the read says where it differs
    (read,) = result.rank["data_reads"]
    assert read["site"] == f"{path}:16 in <module>" and read["placeholder"] == 0.0 and not read["known"]


def test_a_configuration_that_cannot_fit_names_the_allocation_that_breaks_it(script):
    (result,) = plan([str(script), "--huge"], instances=["trn2.3xlarge"], nproc_per_node=1)
    assert not result.fits and result.status == "failed"
    assert result.out_of_memory is not None
    assert result.rank["outcome"]["site"] == f"{script}:12 in <module>"
    assert "Tried to allocate 40.00 GiB" in result.rank["outcome"]["exception"]


def test_the_cli_plans_a_sweep_and_writes_json_and_html(script, tmp_path):
    out_json, out_html = tmp_path / "plan.json", tmp_path / "plan.html"
    done = subprocess.run(
        [sys.executable, "-m", "torchneuron", "plan", "--instance", "trn2.3xlarge", "--nproc-per-node", "1",
         "--sweep", "w=64,512", "--json", str(out_json), "--html", str(out_html), "--", str(script), "--width", "{w}"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out_json.read_text())
    assert report["schema"] == "torchneuron-plan/1"
    configs = report["configurations"]
    assert [c["configuration"]["values"] for c in configs] == [{"w": "64"}, {"w": "512"}]  # faster first
    assert configs[0]["tokens_per_second"] > configs[1]["tokens_per_second"] > 0
    page = out_html.read_text()
    assert "data:image/png;base64," in page and "w=512" in page
    # One planned step per configuration as a Perfetto trace beside the page, linked from it.
    trace = json.loads((tmp_path / "plan.0.trace.json").read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "thread_name"}
    assert tracks <= {"TensorE", "VectorE", "ScalarE", "GpSimd", "DMA", "collectives"} and tracks
    assert "plan.0.trace.json" in page
    work = [e for e in trace if e["ph"] == "X"]
    assert work and all(e["dur"] >= 0 and e["ts"] >= 0 for e in work)
    assert any(e["name"] == "aten::mm" or e["name"] == "aten::addmm" for e in work)


def test_the_cli_refuses_a_missing_script_and_a_bad_sweep(tmp_path):
    for args, message in ((["--", str(tmp_path / "nope.py")], "no script"),
                          (["--sweep", "tp", "--", sys.executable], "--sweep")):
        done = subprocess.run([sys.executable, "-m", "torchneuron", "plan", *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and message in done.stdout, done.stdout


def test_a_planned_job_saves_and_resumes_distributed_checkpoints_without_touching_the_disk(tmp_path):
    import hashlib

    import torch
    import torch.distributed.checkpoint as dcp

    script = tmp_path / "save.py"
    script.write_text(CHECKPOINT)
    (result,) = plan([str(script), str(tmp_path / "ckpt")], instances=["trn2.3xlarge"], nproc_per_node=4)
    assert result.status == "completed", result.rank["outcome"]
    assert len(result.rank["steps"]) == 2
    assert not (tmp_path / "ckpt").exists()  # a plan's values are placeholders: nothing is written
    saves = {w["path"]: w for w in result.rank["skipped_writes"]}
    assert set(saves) == {str(tmp_path / "ckpt" / step) for step in ("0", "1")}
    assert all(w["what"] == "dcp.save" and w["bytes"] > 0 and w["site"].startswith(str(script))
               for w in saves.values())
    assert {c["function"] for c in result.rank["object_collectives"]} >= {"gather_object", "scatter_object_list"}

    # Resuming from a real checkpoint (unsharded, written by one process): the planned FSDP job
    # loads its shards' metadata, reads no data, and leaves the files as they were.
    real = tmp_path / "real"
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    dcp.save({"model": model.state_dict()}, checkpoint_id=real)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in real.iterdir()}
    resume = tmp_path / "resume.py"
    resume.write_text(RESUME)
    (result,) = plan([str(resume), str(real)], instances=["trn2.3xlarge"], nproc_per_node=4)
    assert result.status == "completed", result.rank["outcome"]
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in real.iterdir()} == before
    # A checkpoint of another shape fails the plan as it would fail the job.
    dcp.save({"model": torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8)).state_dict()},
             checkpoint_id=tmp_path / "other")
    (result,) = plan([str(resume), str(tmp_path / "other")], instances=["trn2.3xlarge"], nproc_per_node=4)
    assert result.status != "completed" and "Size mismatch" in str(result.rank["outcome"])


TIMED = textwrap.dedent('''
    import torch, torchneuron
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 256, device="neuron")
    for step in range(2):
        start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
        start.record()
        model(x).pow(2).mean().backward(); opt.step(); opt.zero_grad()
        end.record(); end.synchronize()
        print(f"event {start.elapsed_time(end):.9f}")
    estimate = torchneuron.estimate(lambda: model(x).sum().backward(), targets=("trn2",))
    print(f"estimate {estimate.targets['trn2'].seconds:.12f}")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.PrivateUse1]) as prof:
        model(x).sum().backward()
    print("device events", sum(e.device_type == torch.autograd.DeviceType.PrivateUse1 for e in prof.events()))
''')


def test_a_script_that_times_itself_reports_planned_times(tmp_path):
    script = tmp_path / "timed.py"
    script.write_text(TIMED)
    (result,) = plan([str(script)], instances=["trn2.3xlarge"], nproc_per_node=1)
    lines = dict(line.split(" ", 1) if " " in line else (line, "") for line in result.rank["stdout_tail"].splitlines()
                 if line.startswith(("event", "estimate", "device")))
    events = [float(line.split()[1]) for line in result.rank["stdout_tail"].splitlines() if line.startswith("event")]
    assert events[1] == pytest.approx(result.rank["steps"][1]["seconds"] * 1e3, rel=1e-6)  # the same clock
    assert float(lines["estimate"]) > 0
    assert int(lines["device"].split()[-1]) > 0  # torch.profiler's device rows in a planned run


def test_a_trn3_ultraserver_is_planned_as_one_unit(script):
    (result,) = plan([str(script)], instances=["trn3-ultraserver-gen1"])
    assert result.status == "completed", result.rank["outcome"]
    assert result.configuration.world.world_size == 256
    assert result.capacity_bytes == 36 * 2**30  # a Trn3 logical core at LNC=2 (trainium-facts.md: Chips)
    assert result.rank["settings"]["NEURON_RT_VISIBLE_CORES"] == "0"


def test_gloo_groups_of_a_planned_job_complete_instead_of_waiting_for_absent_peers(tmp_path):
    script = tmp_path / "gloo.py"
    script.write_text(GLOO_GROUPS)
    (result,) = plan([str(script)], instances=["trn2.3xlarge"], nproc_per_node=4)
    assert result.status == "completed", result.rank["outcome"]
    # Only the neuron tensor's all-reduce is device work; the CPU ones cost the device nothing.
    (collective,) = result.rank["collectives"]
    assert collective["calls"] == 1 and collective["bytes"] == 4096
