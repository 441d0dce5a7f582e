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


for _ in range(2):
    step(cpu_model, cpu_opt, x)
    step(model, opt, x.to("neuron"))


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t.device.type == "neuron")


expected = {
    "parameters": nbytes(model.parameters()),
    "gradients": nbytes(p.grad for p in model.parameters()),
    "optimizer state": nbytes(t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)),
}
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
torch.neuron.set_per_process_memory_fraction(1.0)
step(cpu_model, cpu_opt, x)
step(model, opt, x.to("neuron"))
same = all(torch.equal(a.detach().cpu(), b.detach()) for a, b in zip(model.parameters(), cpu_model.parameters()))
print(json.dumps({
    "message": message, "explanation": explanation, "expected": expected, "again": again,
    "allocated_before": allocated_before, "allocated_after": allocated_after,
    "counters_same_after_error": counters_before == counters_after_error,
    "counters_same_after_breakdown": counters_after_error == counters_after_breakdown,
    "trains_on_after_oom_as_cpu": same,
}))
