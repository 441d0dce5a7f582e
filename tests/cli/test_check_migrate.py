"""`torchneuron check` on a CUDA-only project (a script and a local module): each CUDA use
listed at its file:line with its device-generic replacement; `--migrate` runs the project
on neuron unedited and writes the rewrite as a diff that applies and runs on its own."""

import json
import os
import subprocess
import sys

import pytest

from check_cli_support import run_check

HELPERS = """\
import torch


def loader():
    data = torch.utils.data.TensorDataset(torch.randn(32, 8, device="cpu"),
                                          torch.randint(0, 3, (32,), device="cpu"))
    return torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)


def to_device(batch):
    return [t.cuda(non_blocking=True) for t in batch]  # helpers cuda
"""

TRAIN = """\
import torch
import torch.backends.cudnn as cudnn
from helpers import loader, to_device

cudnn.benchmark = True
assert torch.cuda.is_available(), "this script needs a GPU"  # is_available
model = torch.nn.Linear(8, 3).cuda()  # model cuda
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.cuda.amp.GradScaler()  # scaler
for x, y in loader():
    x, y = to_device((x, y))
    with torch.autocast("cuda", dtype=torch.bfloat16):  # autocast
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
torch.cuda.synchronize()
print("final loss on", loss.device)
"""

FILES = {"train.py": TRAIN, "helpers.py": HELPERS}


def line_of(source: str, marker: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if f"# {marker}" in line)


def test_cuda_code_is_listed_at_its_lines_and_strict_names_it(tmp_path):
    result, data = run_check(tmp_path, "--strict", "train.py", files=FILES)
    assert result.returncode == 1, result.stdout + result.stderr  # it fails: no CUDA here
    assert data["outcome"]["site"] == f"train.py:{line_of(TRAIN, 'is_available')} in <module>"
    cuda = data["cuda"]
    assert cuda["files_scanned"] == ["train.py", "helpers.py"] and not cuda["migrated"]
    sites = {(f["file"], f["line"]): f for f in cuda["findings"]}
    assert sites[("train.py", line_of(TRAIN, "model cuda"))]["replacement"] == \
        ".to(torch.accelerator.current_accelerator())"
    assert sites[("train.py", line_of(TRAIN, "is_available"))]["replacement"] == "torch.accelerator.is_available"
    assert sites[("helpers.py", line_of(HELPERS, "helpers cuda"))]["kind"] == ".cuda()"
    assert sites[("train.py", 5)]["kind"] == "cudnn" and sites[("train.py", 5)]["replacement"] == ""
    assert not any(f["rewritten"] for f in cuda["findings"])
    assert data["recommendations"][0]["severity"] == "cuda"
    assert "torchneuron check --migrate" in data["recommendations"][0]["text"]
    assert f"CUDA-only code at train.py:{line_of(TRAIN, 'scaler')}: torch.cuda.amp.GradScaler" in \
        data["strict_offenders"]
    assert "CUDA-only code" in result.stdout and "--strict: refused" not in result.stdout  # it failed first
    assert not (tmp_path / "torchneuron-migrate.diff").exists()  # only --migrate writes one
    html = (tmp_path / "torchneuron-check.html").read_text()
    assert "id='cuda'" in html and "helpers.py:" in html


@pytest.mark.slow  # three interpreters (~25 s); the rewrite and the import hook are tested in-process
def test_migrate_runs_the_project_on_neuron_and_its_diff_applies_and_runs(tmp_path):
    (tmp_path / "torchneuron-migrate.diff").write_text("my own patch\n")  # never overwritten
    result, data = run_check(tmp_path, "--migrate", "train.py", files=FILES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["outcome"]["status"] == "completed" and data["steps"] == 4
    assert "final loss on neuron:0" in result.stdout
    cuda = data["cuda"]
    assert cuda["migrated"] and cuda["diff_path"] == "torchneuron-migrate-1.diff"
    rewritten = {(f["file"], f["line"]) for f in cuda["findings"] if f["rewritten"]}
    assert {("train.py", line_of(TRAIN, m)) for m in ("model cuda", "scaler", "autocast")} <= rewritten
    assert ("helpers.py", line_of(HELPERS, "helpers cuda")) in rewritten  # the imported module too
    assert (tmp_path / "torchneuron-migrate.diff").read_text() == "my own patch\n"
    for name, text in FILES.items():  # nothing of the user's is edited, no bytecode left behind
        assert (tmp_path / name).read_text() == text
    assert not (tmp_path / "__pycache__").exists()

    patch = (tmp_path / "torchneuron-migrate-1.diff").read_text()
    assert patch.startswith("# generator: torchneuron-check-migrate\n")
    assert "+    return [t.to(torch.accelerator.current_accelerator(), non_blocking=True) for t in batch]" in patch
    applied = subprocess.run(["git", "apply", "torchneuron-migrate-1.diff"], cwd=tmp_path,
                             capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    migrated = (tmp_path / "train.py").read_text()
    assert "torch.cuda" not in migrated and len(migrated.splitlines()) == len(TRAIN.splitlines())
    run = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "final loss on neuron:0"  # plain python: the migrated code on neuron
    again = json.loads((tmp_path / "torchneuron-check.json").read_text())
    assert again["cuda"]["findings"] == cuda["findings"]


RUNTIME_DEVICE = """\
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--device", required=True)
device = torch.device(parser.parse_args().device)
data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
model = torch.nn.Linear(4, 2).to(device)  # model to device
model.load_state_dict(torch.load("gpu.pt", weights_only=True))  # saved on a GPU
for x, y in torch.utils.data.DataLoader(data, batch_size=8, pin_memory=True, num_workers=1):
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # batch to device
    assert x.is_cuda, "expected the batch on the GPU"
    with torch.autocast(device.type, dtype=torch.bfloat16):  # autocast
        logits = model(x)
    torch.nn.functional.cross_entropy(logits.float(), y).backward()
print("ran on", x.device, logits.dtype)
"""


def test_migrate_runs_a_device_given_on_the_command_line_and_names_where_it_arrived(tmp_path, monkeypatch):
    """`--device cuda:0` is not in the source, so the rewrite cannot see it: --migrate maps it
    onto neuron where it reaches a tensor, a checkpoint saved on a GPU or autocast, and names
    those lines. The dataset stays on the CPU, as on a GPU, so a DataLoader worker process
    (forked: it cannot use the device) and pin_memory work; `x.is_cuda` is true on neuron."""
    import torch
    import torch.serialization

    with monkeypatch.context() as saving_on_a_gpu:  # the file says its storages were on cuda:0
        saving_on_a_gpu.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(torch.nn.Linear(4, 2).state_dict(), tmp_path / "gpu.pt")
    result, data = run_check(tmp_path, "--migrate", "run.py", "--device", "cuda:0",
                             files={"run.py": RUNTIME_DEVICE})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ran on neuron:0 torch.bfloat16" in result.stdout
    mapped = {(r["site"], r["what"]): r["calls"] for r in data["cuda"]["runtime_mapped"]}
    where = line_of(RUNTIME_DEVICE, "batch to device")
    assert mapped[(f"run.py:{where} in <module>", ".to(device(type='cuda', index=0))")] == 4
    assert mapped[(f"run.py:{line_of(RUNTIME_DEVICE, 'model to device')} in <module>",
                   ".to(device(type='cuda', index=0))")] == 2  # weight and bias
    assert any(f["kind"] == "is_cuda" and f["rewritten"] for f in data["cuda"]["findings"])
    saved = f"run.py:{line_of(RUNTIME_DEVICE, 'saved on a GPU')} in <module>"
    assert mapped[(saved, "torch.load of storage saved on 'cuda:0'")] == 2
    assert mapped[(f"run.py:{line_of(RUNTIME_DEVICE, 'autocast')} in <module>", "autocast('cuda')")] == 2
    assert f"a CUDA device at run time at run.py:{where} in <module>" in " ".join(data["strict_offenders"])
    assert "CUDA devices at run time" in result.stdout
    assert "id='cuda-runtime'" in (tmp_path / "torchneuron-check.html").read_text()
