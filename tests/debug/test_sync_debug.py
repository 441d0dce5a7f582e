"""torch.neuron.set_sync_debug_mode: every host synchronisation warns or raises at the
caller's line, as torch.cuda.set_sync_debug_mode does; off, nothing happens."""

import inspect
import os
import warnings

import pytest
import torch

import torchneuron
from torchneuron import config
from torchneuron.device import sync_debug


@pytest.fixture
def restore_mode():
    """The test may change the mode (an environment setting); the old value comes back."""
    old = os.environ.get("TORCHNEURON_SYNC_DEBUG")
    yield
    config.set_value("TORCHNEURON_SYNC_DEBUG", old)


def _syncs(fn):
    """The warnings fn raises in warn mode, as (message, filename, lineno)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [(str(w.message), w.filename, w.lineno) for w in caught
            if "synchronizing neuron operation" in str(w.message)]


def test_modes_are_torch_cudas_names_and_numbers(restore_mode):
    assert torch.neuron.get_sync_debug_mode() == 0
    for mode, number in (("warn", 1), ("error", 2), ("default", 0), (1, 1), (2, 2), (0, 0)):
        torch.neuron.set_sync_debug_mode(mode)
        assert torch.neuron.get_sync_debug_mode() == number
    with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
        torch.neuron.set_sync_debug_mode("loud")
    with pytest.raises(TypeError, match="int or a str"):
        torch.neuron.set_sync_debug_mode(1.5)
    assert torch.neuron.get_sync_debug_mode() == 0  # a bad value leaves the mode as it was


def test_the_setting_is_declared_and_checked():
    assert "TORCHNEURON_SYNC_DEBUG" in config.ENV_VARS
    with config.override(TORCHNEURON_SYNC_DEBUG="warn"):
        assert torch.neuron.get_sync_debug_mode() == 1
    assert torch.neuron.get_sync_debug_mode() == 0
    with pytest.raises(ValueError, match="TORCHNEURON_SYNC_DEBUG"):
        with config.override(TORCHNEURON_SYNC_DEBUG="sometimes"):
            pass
    assert torch.neuron.get_sync_debug_mode() == 0


def test_warn_mode_points_at_the_callers_line_for_each_kind_of_sync(restore_mode):
    x = torch.arange(6.0, device="neuron")
    torch.neuron.set_sync_debug_mode("warn")
    cases = {
        "scalar read": lambda: x.sum().item(),
        "to the host": lambda: x.cpu(),
        "tolist": lambda: x.tolist(),
        "bool": lambda: bool(x[1] > 0),
        "printing": lambda: repr(x),
        "synchronize": lambda: torch.neuron.synchronize(),
        "nonzero": lambda: torch.nonzero(x > 2),
        "masked_select": lambda: x[x > 2],
    }
    expected_words = {"scalar read": "scalar read", "to the host": "copy from neuron:0 to the host",
                      "tolist": "to the host", "bool": "scalar read", "printing": "printing a tensor",
                      "synchronize": "torch.neuron.synchronize()", "nonzero": "aten::nonzero",
                      "masked_select": "output shape depends on the data"}
    for name, fn in cases.items():
        line = fn.__code__.co_firstlineno  # the warning points at the lambda's line
        found = _syncs(fn)
        assert found, f"{name}: no warning"
        message, filename, lineno = found[0]
        assert expected_words[name] in message, (name, message)
        assert filename == __file__ and lineno == line, (name, filename, lineno)


def test_error_mode_raises_before_the_sync_and_leaves_tensors_intact(restore_mode):
    x = torch.arange(4.0, device="neuron")
    out = torch.full((4,), -1.0)
    before = torchneuron.metrics.counters()
    torch.neuron.set_sync_debug_mode("error")
    with pytest.raises(RuntimeError, match="copy from neuron:0 to the host.*test_sync_debug.py"):
        out.copy_(x)
    with pytest.raises(RuntimeError, match="scalar read"):
        x[0].item()
    with pytest.raises(RuntimeError, match="aten::nonzero"):
        torch.nonzero(x)
    with pytest.raises(RuntimeError, match=r"torch.neuron.synchronize\(\)"):
        torch.neuron.synchronize()
    torch.neuron.set_sync_debug_mode("default")
    assert torch.equal(out, torch.full((4,), -1.0))  # the refused copy wrote nothing
    after = torchneuron.metrics.counters()
    assert after["host_syncs"] == before["host_syncs"]  # nor was anything counted
    assert after["copies_to_host"] == before["copies_to_host"]
    assert torch.equal(x.cpu(), torch.arange(4.0))  # and the mode is off again


def test_device_work_does_not_warn(restore_mode):
    x = torch.randn(8, 8, device="neuron")
    torch.neuron.set_sync_debug_mode("warn")
    assert _syncs(lambda: (x @ x).relu_().sum(0).add(1)) == []
    torch.neuron.set_sync_debug_mode("error")
    (x @ x).softmax(-1)  # raises nothing: no sync


def test_default_mode_is_silent_and_uninstalls_the_watcher(restore_mode):
    x = torch.ones(3, device="neuron")
    assert not sync_debug.watching()
    assert _syncs(lambda: x.sum().item()) == []


def test_listeners_see_syncs_with_call_sites_without_a_mode():
    x = torch.ones(3, device="neuron")
    seen = []
    with sync_debug.listening(seen.append):
        line = inspect.currentframe().f_lineno + 1
        x.sum().item()
    assert [s.kind for s in seen] == ["item"]
    assert seen[0].site.startswith(f"{__file__}:{line} ")
    assert not sync_debug.watching()


def read_scalar(t):
    return t.sum().item()  # the helper's sync


def test_listeners_see_the_whole_user_stack_innermost_first():
    x = torch.ones(3, device="neuron")
    seen = []
    with sync_debug.listening(seen.append):
        line = inspect.currentframe().f_lineno + 1
        read_scalar(x)
    helper = f"{__file__}:{read_scalar.__code__.co_firstlineno + 1} in read_scalar"
    test = f"{__file__}:{line} in test_listeners_see_the_whole_user_stack_innermost_first"
    assert seen[0].site == helper and seen[0].stack[:2] == (helper, test)
