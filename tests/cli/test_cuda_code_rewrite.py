"""CUDA-only code found by parsing (file:line and the device-generic replacement), and the
rewrite --migrate runs and writes as a diff: exact text, same lines, runs on neuron."""

import ast
import sys
import textwrap

import pytest
import torch

from torchneuron.check import cuda_code, migrate, outputs, run_modes

CUDA_SCRIPT = textwrap.dedent("""\
    import torch
    import torch.backends.cudnn as cudnn
    from torch.cuda.amp import GradScaler, autocast

    cudnn.benchmark = True  # cudnn
    use_cuda = torch.cuda.is_available()  # is_available
    device = torch.device("cuda" if use_cuda else "cpu")  # device string
    torch.cuda.manual_seed(0)  # seed
    model = torch.nn.Linear(4, 2).cuda()  # module cuda
    x = torch.randn(3, 4).cuda(non_blocking=True)  # tensor cuda
    y = torch.ones(3, 2, device="cuda:0")  # indexed string
    rank = 0
    z = torch.zeros(3, 2).to(f"cuda:{rank}")  # f-string
    scaler = GradScaler()  # scaler
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with autocast(dtype=torch.bfloat16):  # autocast
        loss = (model(x).float() - y).square().mean() + z.sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    torch.cuda.synchronize()  # synchronize
    name = torch.cuda.get_device_name(0)  # device module
    result = {"loss": loss.detach(), "weight": model.weight.detach(), "device": x.device,
              "count": torch.cuda.device_count(), "name": name}  # count
    """)


def line_of(marker: str, source: str = CUDA_SCRIPT) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if f"# {marker}" in line)


def test_every_cuda_use_is_found_at_its_line_with_its_replacement():
    found = {(f.line, f.code): f for f in cuda_code.scan(CUDA_SCRIPT, "train.py")}
    expected = {
        ("cudnn", "cudnn.benchmark", ""),
        ("is_available", "torch.cuda.is_available", "torch.accelerator.is_available"),
        ("device string", '"cuda"', "torch.accelerator.current_accelerator().type"),
        ("seed", "torch.cuda.manual_seed", "torch.get_device_module().manual_seed"),
        ("module cuda", "torch.nn.Linear(4, 2).cuda()", ".to(torch.accelerator.current_accelerator())"),
        ("indexed string", '"cuda:0"', 'f"{torch.accelerator.current_accelerator().type}:0"'),
        ("f-string", 'f"cuda:{rank}"', "f'{torch.accelerator.current_accelerator().type}:{rank}'"),
        ("synchronize", "torch.cuda.synchronize", "torch.accelerator.synchronize"),
        ("device module", "torch.cuda.get_device_name", "torch.get_device_module().get_device_name"),
        ("count", "torch.cuda.device_count", "torch.accelerator.device_count"),
    }
    for marker, code, replacement in expected:
        finding = found[(line_of(marker), code)]
        assert finding.replacement == replacement and finding.file == "train.py", (marker, finding)
    imports = [f for f in found.values() if f.kind == "cuda amp import"]
    assert [(f.line, f.replacement) for f in imports] == [(3, "from torch.amp import ...")]
    assert found[(line_of("cudnn"), "cudnn.benchmark")].note.startswith("no effect off CUDA")


def test_the_rewrite_keeps_every_line_and_changes_only_the_cuda_uses():
    migration = cuda_code.migrate(CUDA_SCRIPT, "train.py")
    assert migration.error == "" and migration.changed
    old, new = CUDA_SCRIPT.splitlines(), migration.new.splitlines()
    assert len(old) == len(new)  # tracebacks and reports keep naming the user's lines
    ast.parse(migration.new)
    changed = {i + 1: line for i, (a, line) in enumerate(zip(old, new)) if a != line}
    accelerator = "torch.accelerator.current_accelerator()"
    assert changed[3] == "from torch.amp import GradScaler, autocast"
    assert changed[line_of("module cuda")] == f"model = torch.nn.Linear(4, 2).to({accelerator})  # module cuda"
    assert changed[line_of("tensor cuda")] == \
        f"x = torch.randn(3, 4).to({accelerator}, non_blocking=True)  # tensor cuda"
    assert changed[line_of("scaler")] == f"scaler = GradScaler({accelerator}.type)  # scaler"
    assert changed[line_of("autocast")] == f"with autocast({accelerator}.type, dtype=torch.bfloat16):  # autocast"
    assert line_of("cudnn") not in changed  # reported, left as it is (no effect off CUDA)
    for line in changed.values():
        code = line.split("#")[0]
        assert not any(cuda in code for cuda in ("torch.cuda", ".cuda(", '"cuda', "cuda:")), line
    assert all(f.rewritten for f in migration.findings if f.edits)


def _backend_flags_as_in_a_script():
    """PyTorch's test harness (torch.testing._internal.common_utils, imported when the
    conformance tests are collected) freezes the torch.backends flags for the session, so
    the script's `cudnn.benchmark = True` would raise; a user's script runs unfrozen.
    Private torch API, checked on torch 2.13.0."""
    return getattr(torch.backends, "__allow_nonbracketed_mutation")()


def test_the_rewritten_script_runs_on_neuron_as_cpu_computes_it():
    namespace = {}
    torch.manual_seed(1)  # the model and inputs are made on the CPU, then moved
    with _backend_flags_as_in_a_script():
        exec(compile(cuda_code.migrate(CUDA_SCRIPT, "train.py").new, "train.py", "exec"), namespace)
    result = namespace["result"]
    assert result["device"] == torch.device("neuron", 0)
    assert result["count"] == torch.neuron.device_count() and result["name"] == torch.neuron.get_device_name(0)
    assert namespace["scaler"].is_enabled()  # torch.amp.GradScaler("neuron"), not a disabled CUDA one
    # The same step on the CPU (the scale is a power of two: unscaled gradients are exact).
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 2)
    x, y, z = torch.randn(3, 4), torch.ones(3, 2), torch.zeros(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = (model(x).float() - y).square().mean() + z.sum()
    loss.backward()
    opt.step()
    assert torch.equal(result["loss"].cpu(), loss.detach())
    assert torch.equal(result["weight"].cpu(), model.weight.detach())


def test_nothing_is_rewritten_where_the_result_would_be_wrong():
    no_torch_name = "from torch import cuda\nok = cuda.is_available()\n"
    finding, = cuda_code.scan(no_torch_name)
    assert finding.edits == [] and "import torch" in finding.note
    assert not cuda_code.migrate(no_torch_name).changed
    in_annotation = 'import torch\ndef f(d: "cuda" = "cpu"):\n    return d\nmatch 1:\n    case "cuda":\n        pass\n'
    assert cuda_code.scan(in_annotation) == []  # annotations and match patterns stay strings
    untouched = 'import torch\nbackend = "cpu:gloo,cuda:nccl"\nx = "cud" "a"\n'
    mixed, concatenated = cuda_code.scan(untouched)
    assert mixed.kind == "NCCL backend" and mixed.edits == [] and "neuron:neuron" in mixed.note
    assert cuda_code.migrate(untouched).new.splitlines()[1:] == [  # the whole literal, or nothing
        'backend = "cpu:gloo,cuda:nccl"', "x = torch.accelerator.current_accelerator().type"]
    starred = "from torch.cuda.amp import autocast\nimport torch\nwith autocast(*options):\n    pass\n"
    assert not cuda_code.migrate(starred).changed  # torch.autocast's second argument is dtype
    assert [f.kind for f in cuda_code.scan(starred)] == ["cuda amp import", "cuda amp"]
    with pytest.raises(SyntaxError):
        cuda_code.scan("import torch\nx = (\n")


def test_cuda_only_libraries_and_settings_are_listed_with_what_to_use():
    source = ("import torch\nimport apex\nfrom flash_attn import flash_attn_func\n"
              "torch.backends.cuda.matmul.allow_tf32 = True\ng = torch.cuda.CUDAGraph()\n"
              "dist_backend = torch.distributed.Backend.NCCL\n")
    found = {f.line: f for f in cuda_code.scan(source)}
    assert "torch.amp" in found[2].note and "scaled_dot_product_attention" in found[3].note
    assert "set_float32_matmul_precision" in found[4].note
    assert "torch.compile" in found[5].note and not found[5].edits
    assert found[6].replacement == ("torch.distributed.get_default_backend_for_device("
                                    "torch.accelerator.current_accelerator())")
    migrated = cuda_code.migrate(source).new
    namespace = {}
    exec(compile(migrated.split("\n", 5)[-1], "x.py", "exec"), {"torch": torch}, namespace)
    assert namespace["dist_backend"] == "neuron"


def test_migrate_session_runs_a_script_and_its_local_module_from_their_rewrite(tmp_path, monkeypatch):
    (tmp_path / "gpu_helpers_h16c.py").write_text("import torch\n\ndef place(t):\n    return t.cuda()\n")
    script = tmp_path / "main.py"
    script.write_text("import torch\nfrom gpu_helpers_h16c import place\n"
                      "out = place(torch.ones(2, device='cpu')) * torch.cuda.device_count()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # the hook itself must write none
    monkeypatch.delitem(sys.modules, "gpu_helpers_h16c", raising=False)
    with migrate.Session(str(tmp_path), migrate=True) as session:
        result = session.run_path(str(script))
    assert session._finder not in sys.meta_path
    assert result["out"].device.type == "neuron"
    assert torch.equal(result["out"].cpu(), torch.full((2,), float(torch.neuron.device_count())))
    assert not (tmp_path / "__pycache__").exists()  # a later plain run must not load migrated code
    report = session.report([str(script)], str(tmp_path))
    assert report["files_scanned"] == ["main.py", "gpu_helpers_h16c.py"]
    assert [(f["file"], f["line"], f["rewritten"]) for f in report["findings"]] == [
        ("main.py", 3, True), ("gpu_helpers_h16c.py", 4, True)]
    diff = report["diff"]
    assert diff.startswith(migrate.DIFF_MARKER + "\n") and "--- a/gpu_helpers_h16c.py" in diff
    assert "+    return t.to(torch.accelerator.current_accelerator())" in diff
    written = outputs.write_text(tmp_path / "main.py", diff)  # a user's file is never replaced
    assert written == tmp_path / "main-1.py" and "place(" in script.read_text()
    assert outputs.write_text(written, diff) == written  # check's own diff is


def test_a_cpu_generator_keeps_its_factory_on_the_cpu_under_the_default_device():
    """check runs scripts under torch.set_default_device("neuron"): DataLoader(shuffle=True)'s
    randperm with a CPU generator must stay on the CPU (neuron refuses a CPU generator)."""
    data = torch.utils.data.TensorDataset(torch.arange(8.0))
    torch.set_default_device("neuron")
    try:
        with run_modes.generator_follows_device():
            g = torch.Generator().manual_seed(0)
            assert torch.randperm(5, generator=g).device.type == "cpu"
            assert torch.randperm(5).device.type == "neuron"
            loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
            assert sorted(int(v) for (batch,) in loader for v in batch) == list(range(8))
    finally:
        torch.set_default_device(None)
