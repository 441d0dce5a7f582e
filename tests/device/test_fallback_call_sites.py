"""Every distinct user call site of a CPU-fallback op is counted (capped), and counts restart
with the record (torchneuron.metrics.reset)."""

import torch

import torchneuron
from torchneuron.device import fallback


def times_two(t):
    return t * 2  # a helper's site


def test_each_call_site_is_counted_and_reset_with_the_record():
    x = torch.ones(3, dtype=torch.float64, device="neuron")
    torchneuron.metrics.reset()
    for _ in range(4):
        times_two(x)
    x * 2  # a second site
    line = times_two.__code__.co_firstlineno + 1
    second = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1)
                  if text.strip() == "x * 2  # a second site")
    sites = fallback.call_site_counts("aten::mul.Tensor", ("float64",))
    assert [(s.rsplit("/", 1)[-1], n) for s, n in sites] == [
        (f"test_fallback_call_sites.py:{line} in times_two", 4),
        (f"test_fallback_call_sites.py:{second} in test_each_call_site_is_counted_and_reset_with_the_record", 1),
    ]
    mul = next(c for c in torchneuron.metrics.fallbacks() if c.op == "aten::mul.Tensor")
    assert sum(n for _, n in sites) == mul.calls
    torchneuron.metrics.reset()
    assert fallback.call_site_counts("aten::mul.Tensor", ("float64",)) == []


def test_sites_beyond_the_cap_are_counted_together(monkeypatch):
    monkeypatch.setattr(fallback, "MAX_CALL_SITES", 2)
    x = torch.ones(3, dtype=torch.float64, device="neuron")
    torchneuron.metrics.reset()
    x + 1
    x + 2
    x + 3
    x + 4
    counts = dict(fallback.call_site_counts("aten::add.Tensor", ("float64",)))
    assert len(counts) == 3 and counts[fallback.OTHER_SITES] == 2



def test_the_metrics_report_lists_every_call_site_with_its_calls():
    x = torch.ones(3, dtype=torch.float64, device="neuron")
    torchneuron.metrics.reset()
    # Short file names keep each site on one line of the report's table.
    exec(compile("for _ in range(3):\n    x * 2\n", "a.py", "exec"), {"x": x})
    exec(compile("x * 2\n", "b.py", "exec"), {"x": x})
    report = torchneuron.metrics.report()
    assert "a.py:2 in <module> (3)" in report
    assert "b.py:1 in <module> (1)" in report


def calls_times_two(t):
    return times_two(t)  # the helper's caller


def test_whole_stacks_are_kept_per_site_only_with_stack_traces_on():
    import inspect

    from torchneuron import config

    x = torch.ones(3, dtype=torch.float64, device="neuron")
    torchneuron.metrics.reset()
    times_two(x)
    assert fallback.call_site_stacks("aten::mul.Tensor", ("float64",)) == {}  # off: nothing kept
    helper = f"{__file__}:{times_two.__code__.co_firstlineno + 1} in times_two"
    caller = f"{__file__}:{calls_times_two.__code__.co_firstlineno + 1} in calls_times_two"
    test = inspect.currentframe().f_code.co_name
    with config.override(TORCH_NEURONX_ENABLE_STACK_TRACE="1"):
        first = inspect.currentframe().f_lineno + 1
        for _ in range(2):
            calls_times_two(x)
        times_two(x)
    stacks = fallback.call_site_stacks("aten::mul.Tensor", ("float64",))
    assert list(stacks) == [helper]
    mine = [(tuple(f for f in s if f.startswith(__file__)), n) for s, n in stacks[helper]]
    assert mine == [((helper, caller, f"{__file__}:{first + 1} in {test}"), 2),  # most calls first,
                    ((helper, f"{__file__}:{first + 2} in {test}"), 1)]  # innermost frame first
    torchneuron.metrics.reset()
    assert fallback.call_site_stacks("aten::mul.Tensor", ("float64",)) == {}
