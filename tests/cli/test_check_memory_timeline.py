"""`torchneuron check`'s memory timeline follows every allocation and free (scripts without
an optimizer get one too), with the optimizer steps marked when there are steps."""

from check_cli_support import run_check

INFERENCE = """\
import torch
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
with torch.no_grad():
    for _ in range(5):
        out = model(torch.randn(8, 32))
"""

TRAINING = """\
import torch
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_an_inference_script_has_a_memory_timeline(tmp_path):
    result, data = run_check(tmp_path, "infer.py", files={"infer.py": INFERENCE})
    assert result.returncode == 0, result.stdout + result.stderr
    memory = data["memory"]
    assert data["steps"] == 0 and memory["timeline"] == [] and memory["step_marks"] == []
    points = memory["samples"]["0"]
    assert len(points) > 10
    assert [p[0] for p in points] == sorted(p[0] for p in points)  # work items only grow
    assert max(p[1] for p in points) == memory["peak_allocated_bytes"]
    page = (tmp_path / "torchneuron-check.html").read_text()
    assert "<h2>Device memory over the run</h2><img id='plot-memory'" in page


def test_a_training_scripts_timeline_marks_each_step(tmp_path):
    result, data = run_check(tmp_path, "train.py", files={"train.py": TRAINING})
    assert result.returncode == 0, result.stdout + result.stderr
    memory = data["memory"]
    marks = memory["step_marks"]
    assert data["steps"] == 3 and len(marks) == 3 and marks == sorted(marks) and marks[0] > 0
    assert marks[-1] <= memory["samples"]["0"][-1][0]
    assert max(p[1] for p in memory["samples"]["0"]) == memory["peak_allocated_bytes"]
