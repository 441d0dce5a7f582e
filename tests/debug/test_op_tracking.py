"""TorchNeuron's op-tracking names on torch.neuron read the one accounting record."""

import torch

import torchneuron


def test_fallback_and_executed_ops_and_clearing():
    torch.neuron.clear_op_tracking()
    assert torch.neuron.get_fallback_ops() == [] and torch.neuron.get_executed_ops() == []
    x = torch.tensor([0.0, 2.0, 3.0], device="neuron")
    torch.nonzero(x)  # real Trainium runs this on the host
    (x * 2).relu()
    assert torch.neuron.get_fallback_ops() == ["aten::nonzero"]
    executed = torch.neuron.get_executed_ops()
    assert {"aten::mul.Tensor", "aten::relu"} <= set(executed)
    assert "aten::nonzero" not in executed
    # the same record as torchneuron.metrics
    assert {c.op for c in torchneuron.metrics.fallbacks()} == {"aten::nonzero"}
    torch.neuron.clear_op_tracking()
    assert torch.neuron.get_fallback_ops() == [] and torch.neuron.get_executed_ops() == []
    assert torchneuron.metrics.counters()["ops"] == 0


def test_dynamo_metrics_are_the_compile_counters():
    torch.neuron.reset_dynamo_metrics()
    assert torch.neuron.get_dynamo_metrics()["compiles"] == 0
    compiled = torch.compile(lambda t: t.sin() + 1, backend="neuron")
    compiled(torch.ones(3, device="neuron"))
    metrics = torch.neuron.get_dynamo_metrics()
    assert metrics == torch.neuron.compile_metrics() and metrics["compiles"] >= 1
    torch.neuron.reset_dynamo_metrics()
    assert torch.neuron.get_dynamo_metrics()["compiles"] == 0
