"""docs/debugging.md's Python examples run as written and print what the page says."""

import os
import pathlib
import re

from torchneuron import config

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "debugging.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_debugging_examples_run(capsys):
    old = os.environ.get("TORCHNEURON_SYNC_DEBUG")
    try:
        for index, block in enumerate(BLOCKS):
            exec(compile(block, f"{DOC.name}[{index}]", "exec"), {})
    finally:
        config.set_value("TORCHNEURON_SYNC_DEBUG", old)
    out = capsys.readouterr().out
    assert "called a synchronizing neuron operation: a scalar read of neuron:0" in out
    assert "aten::nonzero on neuron:0: its output shape depends on the data" in out
    assert "aten::sqrt" in out and "input 0: float32[3]" in out
    assert "['aten::nonzero']" in out and "'aten::mul.Tensor'" in out
    assert re.search(r"^2 debugging\.md\[\d+\]:5 in step\ndebugging\.md\[\d+\]:3 in step$", out, re.M)
    assert "What fills neuron:0" in out and "optimizer state" in out and "trn3 LNC=2:" in out
    assert re.search(r"By allocation site and category .*\n +48\.00 MiB in 3 blocks +activations and other tensors +at ", out)
    assert "activations and other tensors 48 3" in out
    assert "train.py:2 torch.nn.Linear(4, 2).cuda() -> .to(torch.accelerator.current_accelerator())" in out
    assert "train.py:3 torch.cuda.device_count -> torch.accelerator.device_count" in out
    assert ("train.py:4 model.weight.is_cuda -> (model.weight.device.type == "
            "torch.accelerator.current_accelerator().type)\n4\nTrue\n") in out
    assert re.search(r"\('debugging\.md\[\d+\]:\d+ in <module>', 3\), \('debugging\.md\[\d+\]:\d+ in <module>', 1\)", out)
    block = next(i for i, b in enumerate(BLOCKS) if "call_site_stacks" in b)  # whole stacks
    line = {marker: next(n for n, text in enumerate(BLOCKS[block].splitlines(), 1) if marker in text)
            for marker in ("fallback's site", "one caller", "    step(x)", "another caller")}
    where = f"debugging.md[{block}]"
    helper_line = line["fallback's site"]
    site = f"{where}:{helper_line} in halve"
    first = f"{site} <- {where}:{line['one caller']} in step <- {where}:{line['    step(x)']} in <module>"
    second = f"{site} <- {where}:{line['another caller']} in <module>"  # (then this test's frame)
    assert re.search(re.escape(first) + r".* \(1\)\n" + re.escape(second) + r".* \(1\)\n", out)
