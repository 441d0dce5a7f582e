"""A model that runs out of neuron memory (run by test_oom_explainer.py in a fresh process, so
no other test's tensors are on the device); prints what the test compares, as JSON."""

import copy
import json

import torch

import torchneuron
from torchneuron.device import oom

MiB = 2**20
torch.neuron.set_per_process_memory_fraction(64 * MiB / torch.neuron.get_device_properties(0).total_memory)
torch.manual_seed(0)
cpu_model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
model = copy.deepcopy(cpu_model).to("neuron")
cpu_opt = torch.optim.Adam(cpu_model.parameters())
opt = torch.optim.Adam(model.parameters())
x = torch.randn(256, 1024)


def step(m, o, inputs):
    o.zero_grad()
    m(inputs).square().mean().backward()
    o.step()


def mismatches() -> dict[str, float]:
    """Parameter name -> largest absolute difference from CPU's, for those not bitwise equal."""
    found = {}
    for (name, on_device), on_cpu in zip(model.named_parameters(), cpu_model.parameters()):
        copied = on_device.detach().cpu()
        if not torch.equal(copied, on_cpu.detach()):
            found[name] = (copied - on_cpu.detach()).abs().max().item()
    return found


for _ in range(2):
    step(cpu_model, cpu_opt, x)
    step(model, opt, x.to("neuron"))
mismatches_before_oom = mismatches()


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t.device.type == "neuron")


expected = {
    "parameters": nbytes(model.parameters()),
    "gradients": nbytes(p.grad for p in model.parameters()),
    "optimizer state": nbytes(t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)),
}


def device_state() -> dict[str, torch.Tensor]:
    """CPU copies of every neuron tensor training needs: parameters, gradients, Adam's state."""
    found = {}
    for name, p in model.named_parameters():
        found[name] = p.detach().cpu()
        found[f"{name}.grad"] = p.grad.cpu()
        for key, t in opt.state[p].items():
            found[f"{name}.{key}"] = t.cpu()
    return found


state_before = device_state()
allocated_before = torch.neuron.memory_allocated()
counters_before = torchneuron.metrics.counters()
try:
    too_big = torch.empty(40 * MiB, dtype=torch.uint8, device="neuron")
    raise SystemExit("no OOM")
except torch.neuron.OutOfMemoryError as e:
    message = str(e)
    explanation = e.memory_explanation.as_dict()
    again = str(type(e)(*e.args))  # rebuilt from its args (pickling, copying): explained once
counters_after_error = torchneuron.metrics.counters()
allocated_after = torch.neuron.memory_allocated()
# Reading the breakdown adds nothing to the record.
oom.memory_breakdown(0)
counters_after_breakdown = torchneuron.metrics.counters()
state_after = device_state()
changed = sorted(name for name in state_before if not torch.equal(state_before[name], state_after[name]))
# One more step each, from the same state (CPU's made the device's), to see training go on.
torch.neuron.set_per_process_memory_fraction(1.0)
cpu_model.load_state_dict(model.state_dict())
cpu_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # its step counters are shared otherwise
step(cpu_model, cpu_opt, x)
step(model, opt, x.to("neuron"))
mismatches_after_oom = mismatches()
try:
    for a, b in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach())
    not_close = ""
except AssertionError as error:
    not_close = str(error)
print(json.dumps({
    "message": message, "explanation": explanation, "expected": expected, "again": again,
    "allocated_before": allocated_before, "allocated_after": allocated_after,
    "counters_same_after_error": counters_before == counters_after_error,
    "counters_same_after_breakdown": counters_after_error == counters_after_breakdown,
    "changed_by_the_error": changed,
    "step_after_oom_not_close_to_cpu": not_close,
    "mismatches": {"before the OOM": mismatches_before_oom, "after": mismatches_after_oom},
}))
