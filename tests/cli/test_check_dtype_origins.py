"""`torchneuron check` names where wide-dtype use starts: a float64 buffer's allocation line is
the first recommendation, and each on-device INT64 op has the user's call site."""

from check_cli_support import run_check

FP64_BUFFER = """\
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.register_buffer("scale", torch.ones(8, dtype=torch.float64))  # FP64 buffer

    def forward(self, x):
        return self.lin(x * self.scale.float())  # the float32 copy

model = Model()
for step in range(3):
    out = model(torch.randn(2, 8))
    target = torch.tensor([0, 1])  # int64 targets
    loss = nn.functional.cross_entropy(out, target)  # nll_loss on int64
    positive = (target > 0).sum()  # int64 compare
"""


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(FP64_BUFFER.splitlines(), 1) if marker in line)


def test_the_float64_buffer_origin_is_the_first_recommendation(tmp_path):
    result, data = run_check(tmp_path, "train.py", files={"train.py": FP64_BUFFER})
    assert result.returncode == 0, result.stdout + result.stderr
    buffer_site = f"train.py:{_line('FP64 buffer')} in __init__"
    (origin,) = data["wide_dtype_origins"]
    assert origin["kind"] == "buffer" and origin["name"] == "Model.scale"
    assert origin["dtype"] == "float64" and origin["bytes"] == 8 * 8
    assert origin["site"].endswith(buffer_site)
    first = data["recommendations"][0]["text"]
    assert first.startswith("cast this float64 buffer `Model.scale` (64 bytes) to float32 at ")
    assert buffer_site in first
    # the copy's own fallback row is still listed, after the origin
    texts = [r["text"] for r in data["recommendations"]]
    assert any(f"train.py:{_line('the float32 copy')} in forward" in t for t in texts[1:])


def test_each_on_device_int64_op_has_the_users_call_site(tmp_path):
    result, data = run_check(tmp_path, "train.py", files={"train.py": FP64_BUFFER})
    assert result.returncode == 0, result.stdout + result.stderr
    wide = {w["op"]: w for w in data["wide_dtypes"] if w["on_device"]}
    assert wide["aten::gt.Scalar"]["call_site"].endswith(f"train.py:{_line('int64 compare')} in <module>")
    assert wide["aten::nll_loss_forward"]["call_site"].endswith(
        f"train.py:{_line('nll_loss on int64')} in <module>")
    assert all(w["call_site"] for w in data["wide_dtypes"])
