"""What `torchneuron check` changes for its run only, in-process: `x.is_cuda` rewritten to a
device-type test, DataParallel listed, a DataLoader's pin_memory over a dataset check placed on
neuron, and (--migrate) CUDA devices that reach tensors at run time mapped onto neuron."""

import sys
import threading

import torch

from torchneuron.check import cuda_code, run_modes

IS_CUDA = """\
import torch
x = torch.ones(2, device="cuda")
flag = x.is_cuda  # flag
negated = not x.is_cuda
compared = x.is_cuda == True
on_cpu = torch.ones(1, device="cpu").is_cuda
wrapped = model_is_cuda = (
    x
    .is_cuda)  # split
"""


def test_is_cuda_is_rewritten_to_mean_on_the_accelerator_and_keeps_every_line():
    migration = cuda_code.migrate(IS_CUDA, "t.py")
    assert migration.error == "" and len(migration.new.splitlines()) == len(IS_CUDA.splitlines())
    rewritten = [f for f in migration.findings if f.kind == "is_cuda"]
    assert [f.line for f in rewritten] == [3, 4, 5, 6, 8] and all(f.rewritten for f in rewritten)
    assert "flag = (x.device.type == torch.accelerator.current_accelerator().type)  # flag" in migration.new
    names: dict = {}
    exec(compile(migration.new, "t.py", "exec"), names)
    assert (names["flag"], names["negated"], names["compared"], names["on_cpu"], names["wrapped"]) == \
        (True, False, True, False, True)


def test_is_cuda_of_a_users_own_attribute_is_listed_not_rewritten():
    source = ("import torch\nclass Runner:\n    def __init__(self):\n"
              "        self.is_cuda = torch.cuda.is_available()\n    def go(self):\n        return self.is_cuda\n")
    migration = cuda_code.migrate(source, "r.py")
    (read,) = [f for f in migration.findings if f.kind == "is_cuda"]
    assert read.line == 6 and not read.rewritten and "sets an is_cuda attribute of its own" in read.note
    assert "return self.is_cuda" in migration.new  # is_available on line 4 is still rewritten
    assert "self.is_cuda = torch.accelerator.is_available()" in migration.new


def test_data_parallel_is_listed_with_what_to_use_instead():
    source = "import torch\nfrom torch import nn\nm = nn.DataParallel(torch.nn.Linear(2, 2))\n"
    (finding,) = [f for f in cuda_code.scan(source, "t.py") if f.kind == "DataParallel"]
    assert finding.line == 3 and "DistributedDataParallel" in finding.note and not finding.edits


def test_pinning_a_dataset_check_put_on_neuron_returns_it_in_any_thread():
    torch.set_default_device("neuron")
    try:
        data = torch.utils.data.TensorDataset(torch.arange(8.0), torch.arange(8))  # on neuron here
        with run_modes.pinned_on_device():
            loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
            batches = [(x.cpu(), y.cpu()) for x, y in loader]
            device_tensor = torch.ones(3)
            assert device_tensor.pin_memory() is device_tensor
            pinned = []
            worker = threading.Thread(target=lambda: pinned.append(device_tensor.pin_memory()))
            worker.start()
            worker.join()
            assert pinned[0] is device_tensor  # DataLoader pins in its own thread
            assert torch.ones(2, device="cpu").pin_memory().is_pinned()  # CPU tensors still pin
    finally:
        torch.set_default_device(None)
    assert "pin_memory" not in torch.Tensor.__dict__  # restored
    assert torch.equal(torch.cat([x for x, _ in batches]), torch.arange(8.0))
    assert torch.equal(torch.cat([y for _, y in batches]), torch.arange(8))


def _here() -> int:
    return sys._getframe(1).f_lineno


def test_cuda_devices_reaching_tensors_at_run_time_run_on_neuron_and_are_counted():
    cpu = torch.arange(6.0).reshape(2, 3)
    mode = run_modes.CudaDevicesOnNeuron(run_modes.user_call_site)
    with mode:
        moved = cpu.to("cuda:0"); line_to = _here()  # noqa: E702 (one line: one call site)
        made = torch.full((2, 3), 2.0, device=torch.device("cuda")); line_made = _here()  # noqa: E702
        method = cpu.cuda(non_blocking=True)
        indexed = cpu.cuda(1)
        kept = cpu.to("cpu")
        result = (moved * made + method).sum(0)
    assert (moved.device, made.device, method.device, indexed.device, kept.device) == (
        torch.device("neuron", 0), torch.device("neuron", 0), torch.device("neuron", 0),
        torch.device("neuron", 1), torch.device("cpu"))
    assert torch.equal(result.cpu(), (cpu * 2.0 + cpu).sum(0))  # CPU computes the same
    mapped = {(what, site.split(" in ")[0]): n for (what, site), n in mode.mapped.items()}
    assert mapped[(".to('cuda:0')", f"{__file__}:{line_to}")] == 1
    assert mapped[("device=device(type='cuda')", f"{__file__}:{line_made}")] == 1
    assert sum(n for (what, _), n in mode.mapped.items() if what == ".cuda()") == 2
    assert not any("cpu" in what for what, _ in mode.mapped)


POSITIONAL_AUTOCAST = """\
import torch
from torch.cuda.amp import autocast
a = torch.ones(4, 4, device="cuda")
with torch.cuda.amp.autocast(True, torch.bfloat16):
    on = (a @ a).dtype
with autocast( False ):
    off = (a @ a).dtype
"""


def test_cuda_autocast_with_positional_arguments_is_rewritten_with_them_named():
    """torch.cuda.amp.autocast(enabled, dtype) and torch.autocast(device_type, dtype, enabled)
    order their arguments differently: each positional one is named where it stands."""
    migration = cuda_code.migrate(POSITIONAL_AUTOCAST, "amp.py")
    assert migration.error == "" and all(f.rewritten for f in migration.findings)
    assert migration.new.splitlines()[3] == ("with torch.autocast(torch.accelerator.current_accelerator()"
                                             ".type, enabled=True, dtype=torch.bfloat16):")
    names: dict = {}
    exec(compile(migration.new, "amp.py", "exec"), names)
    assert (names["on"], names["off"]) == (torch.bfloat16, torch.float32)


CUSTOM_FWD = """\
import torch
from torch.cuda.amp import custom_bwd
class Cast(torch.autograd.Function):
    @staticmethod
    @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
    def forward(ctx, x):
        return x * 2
    @staticmethod
    @custom_bwd
    def backward(ctx, g):
        return g * 2
class Keep(torch.autograd.Function):
    @staticmethod
    @torch.cuda.amp.custom_fwd
    def forward(ctx, x):
        return x * 2
a = torch.ones(2, 2, device="cuda", dtype=torch.bfloat16)
with torch.cuda.amp.autocast(dtype=torch.bfloat16):
    cast, kept = Cast.apply(a).dtype, Keep.apply(a).dtype
"""


def test_cuda_custom_fwd_and_bwd_decorators_get_the_device_type_and_cast_on_neuron():
    migration = cuda_code.migrate(CUSTOM_FWD, "fn.py")
    assert migration.error == "" and all(f.rewritten for f in migration.findings)
    new = migration.new.splitlines()
    device_type = "device_type=torch.accelerator.current_accelerator().type"
    assert new[4].strip() == f"@torch.amp.custom_fwd({device_type}, cast_inputs=torch.float32)"
    assert new[8].strip() == f"@custom_bwd({device_type})" and new[1] == "from torch.amp import custom_bwd"
    assert new[13].strip() == f"@torch.amp.custom_fwd({device_type})"
    names: dict = {}
    exec(compile(migration.new, "fn.py", "exec"), names)
    assert (names["cast"], names["kept"]) == (torch.float32, torch.bfloat16)  # cast_inputs honoured


DOT_CUDA_DEVICE = """\
import torch
class Args:
    gpu = None
args, x = Args(), torch.arange(3.0, device="cpu")
current = x.cuda(args.gpu, non_blocking=True)
by_keyword = torch.nn.Linear(2, 2, device="cpu").cuda(device=args.gpu).weight
literal_none = x.cuda(None)
args.gpu = 1
indexed = x.cuda(args.gpu)
"""


def test_dot_cuda_of_a_device_that_may_be_none_still_means_the_current_device():
    """`.cuda(None)` is the current device but `.to(None)` does not move: a device given by
    name (`args.gpu`, None unless set) keeps .cuda's meaning in the rewrite."""
    migration = cuda_code.migrate(DOT_CUDA_DEVICE, "gpu.py")
    assert migration.error == ""
    assert migration.new.splitlines()[4] == ("current = x.to(args.gpu if args.gpu is not None else "
                                             "torch.accelerator.current_accelerator(), non_blocking=True)")
    names: dict = {}
    exec(compile(migration.new, "gpu.py", "exec"), names)
    current = torch.device("neuron", torch.accelerator.current_device_index())
    assert [names[n].device for n in ("current", "by_keyword", "literal_none", "indexed")] == [
        current, current, current, torch.device("neuron", 1)]
    assert torch.equal(names["current"].cpu(), torch.arange(3.0))


def test_a_checkpoint_saved_on_a_gpu_and_a_run_time_autocast_type_run_on_neuron(tmp_path, monkeypatch):
    import torch.serialization

    weights = {"w": torch.arange(6.0).reshape(2, 3)}
    with monkeypatch.context() as saving_on_a_gpu:  # the file says its storages were on cuda:0
        saving_on_a_gpu.setattr(torch.serialization, "location_tag", lambda storage: "cuda:1")
        torch.save(weights, tmp_path / "gpu.pt")
    original_load, original_autocast = torch.load, torch.autocast
    mode = run_modes.CudaDevicesOnNeuron(run_modes.user_call_site)
    with run_modes.cuda_names_on_neuron(mode):
        plain = torch.load(tmp_path / "gpu.pt", weights_only=True)
        named = torch.load(tmp_path / "gpu.pt", map_location=torch.device("cuda"))
        kept = torch.load(tmp_path / "gpu.pt", map_location="cpu")
        device_type = torch.device("cuda").type  # e.g. from --device cuda
        with torch.autocast(device_type, dtype=torch.bfloat16):
            product = plain["w"] @ plain["w"].T
    assert (torch.load, torch.autocast, torch.amp.autocast) == (original_load, original_autocast,
                                                                original_autocast)  # restored
    assert (plain["w"].device, named["w"].device, kept["w"].device) == (
        torch.device("neuron", 1), torch.device("neuron", torch.accelerator.current_device_index()),
        torch.device("cpu"))
    assert torch.equal(plain["w"].cpu(), weights["w"]) and torch.equal(kept["w"], weights["w"])
    assert product.dtype == torch.bfloat16  # autocast ran on neuron
    whats = {what for what, _ in mode.mapped}
    assert whats == {"torch.load of storage saved on 'cuda:1'", "torch.load(map_location=device(type='cuda'))",
                     "autocast('cuda')"}
    assert all(site.startswith(f"{__file__}:") for _, site in mode.mapped)


_worker_mark = {"init": None}


def _remember_worker(worker_id):
    _worker_mark["init"] = 100 + worker_id  # in the worker process


class _Augmented(torch.utils.data.Dataset):
    """A CPU dataset whose items draw a random shift, as a torchvision augmentation does."""

    def __init__(self):
        self.x = torch.arange(8.0, device="cpu")

    def __len__(self):
        return 8

    def __getitem__(self, i):
        shift = torch.zeros(1)  # no device: check's default device, unless the worker turns it off
        return self.x[i] + shift, shift.device.type, _worker_mark["init"]


def test_dataloader_workers_make_their_tensors_on_the_host_and_run_the_scripts_init():
    torch.set_default_device("neuron")
    try:
        with run_modes.workers_on_the_host():
            loader = torch.utils.data.DataLoader(_Augmented(), batch_size=4, num_workers=1,
                                                 worker_init_fn=_remember_worker)
            batches = list(loader)
            assert torch.zeros(1).device.type == "neuron"  # this process keeps the default device
    finally:
        torch.set_default_device(None)
    assert torch.utils.data.DataLoader.__init__ is _DATALOADER_INIT  # restored
    assert torch.equal(torch.cat([x for x, _, _ in batches]).flatten(), torch.arange(8.0))
    assert {d for _, devices, _ in batches for d in devices} == {"cpu"}
    assert {int(m) for _, _, marks in batches for m in marks} == {100}  # the script's init ran


_DATALOADER_INIT = torch.utils.data.DataLoader.__init__


def test_a_forked_worker_using_the_device_is_explained_before_the_raw_error():
    from torchneuron.check import analysis

    failed = {"status": "failed", "exception_type": "RuntimeError", "site": "train.py:8 in <module>",
              "exception": "Caught RuntimeError in DataLoader worker process 0.\n... RuntimeError: "
                           "Cannot re-initialize Neuron in forked subprocess. To use Neuron ..."}
    data = {"outcome": failed, "fallbacks": [], "wide_dtypes": [], "steps": 0,
            "compile": {"graph_breaks": 0, "recompiles": 0}, "transfers": {},
            "memory": {"capacity": [], "peak_allocated_bytes": 0, "instance": None},
            "host_syncs": {"total": 0, "by_site": []}}
    first, second = analysis.recommendations(data)[:2]
    assert first["severity"] == "error" and "DataLoader worker process (forked)" in first["text"]
    assert "device='cpu'" in first["text"] and second["text"].startswith("fix the RuntimeError at train.py:8")


AUGMENTED_WORKERS = """\
import torch


class Noisy(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(32, 4, device="cpu")

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        shift = torch.randint(0, 2, (1,))  # a random augmentation, in the worker process
        return self.x[i] + shift, int(shift)


device = torch.accelerator.current_accelerator()
model = torch.nn.Linear(4, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in torch.utils.data.DataLoader(Noisy(), batch_size=8, num_workers=1, pin_memory=True):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
    opt.step()
print("batches made on", x.device)
"""


def test_check_runs_a_dataloader_whose_worker_draws_random_numbers(tmp_path):
    """Plain python runs this script (its worker's torch.randint on the CPU); under check's
    default device the worker used to make it on neuron and fail ('Cannot re-initialize
    Neuron in forked subprocess')."""
    from check_cli_support import run_check

    result, data = run_check(tmp_path, "aug.py", files={"aug.py": AUGMENTED_WORKERS})
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["outcome"]["status"] == "completed" and data["steps"] == 4
    assert "batches made on cpu" in result.stdout  # pinned CPU batches, as in the plain run
