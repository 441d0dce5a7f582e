"""``torch.neuron.get_dynamo_metrics()`` counts every graph break Dynamo reports (data-dependent
control flow included) and tags graph breaks and recompiles with the user's call site."""


import torch
import torchneuron  # noqa: F401


def _line(function, marker: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if marker in line)


def branchy(t):
    t = t.sin()
    if t.sum() > 0:  # data-dependent branch
        t = t + 1
    return t.cos()


def doubled(t):
    return t * 2


def test_a_data_dependent_branch_is_a_graph_break_with_its_call_site():
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    compiled = torch.compile(branchy, backend="neuron")
    t = torch.ones(3, device="neuron")
    assert torch.equal(compiled(t).cpu(), branchy(t.cpu()))
    metrics = torch.neuron.get_dynamo_metrics()
    assert metrics["graph_breaks"] == 1
    (reason,) = metrics["graph_break_reasons"]
    assert reason.startswith("Data-dependent branching")
    site = f"{__file__}:{_line(branchy, 'data-dependent branch')} in branchy"
    assert metrics["graph_break_sites"] == [{"site": site, "reason": reason, "count": 1}]
    compiled(t)  # cached: no new break
    assert torch.neuron.get_dynamo_metrics()["graph_breaks"] == 1


def test_a_recompile_names_the_compiled_frame():
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    compiled = torch.compile(doubled, backend="neuron")
    for n in (3, 4):
        compiled(torch.ones(n, device="neuron"))
    metrics = torch.neuron.get_dynamo_metrics()
    assert metrics["recompiles"] == 1
    (row,) = metrics["recompile_sites"]
    assert row["site"] == f"{__file__}:{doubled.__code__.co_firstlineno} in doubled"
    assert "size mismatch" in row["reason"] and row["count"] == 1
    torch.neuron.reset_dynamo_metrics()
    assert torch.neuron.get_dynamo_metrics()["recompile_sites"] == []
