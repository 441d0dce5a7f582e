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


def test_a_library_in_a_site_packages_directory_is_not_the_users_call_site(tmp_path):
    """Third-party code (a venv's or the user's site-packages, not only the system Python's)
    is library code: the site named is the user's line that called into it."""
    import os
    import subprocess
    import sys
    import sysconfig

    import site

    if not site.ENABLE_USER_SITE:  # a venv without system packages has no user site-packages
        import pytest

        pytest.skip("this interpreter has no user site-packages directory to install into")
    user_base = tmp_path / "userbase"
    packages = user_base / sysconfig.get_path("purelib", "posix_user", {"userbase": ""}).lstrip(os.sep)
    packages.mkdir(parents=True)
    (packages / "thirdparty_helper.py").write_text("def double(t):\n    return t * 2\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, torchneuron, thirdparty_helper\n"
        "from torchneuron.device import fallback\n"
        "x = torch.ones(3, dtype=torch.float64, device='neuron')\n"
        "thirdparty_helper.double(x)\n"
        "print(fallback.call_site_counts('aten::mul.Tensor', ('float64',)))\n")
    env = dict(os.environ, PYTHONUSERBASE=str(user_base))
    env.pop("PYTHONNOUSERSITE", None)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"{script}:4 in <module>" in out.stdout, out.stdout
    assert "thirdparty_helper.py" not in out.stdout
