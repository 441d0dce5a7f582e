"""Memory history and snapshots (torch.neuron.memory._record_memory_history / _snapshot),
what OOM messages say fills the device, and memory in torch.profiler.

The snapshot format is PyTorch's own: the oracle is torch.cuda._memory_viz (which
reads CUDA snapshots) and the allocator's own statistics (memory_stats).
"""

import gc
import os
import pickle
import pickletools
import subprocess
import sys

import pytest
import torch
from torch.cuda import _memory_viz
from torch.profiler import ProfilerActivity, profile

MiB = 2**20
THIS_FILE = os.path.abspath(__file__)
memory = torch.neuron.memory


@pytest.fixture(autouse=True)
def _history_off_after():
    """Every test starts and ends with history off and no events kept."""
    memory._record_memory_history(None)
    yield
    memory._record_memory_history(None)


def _quiet_device(dev=0):
    """Drops garbage and cached blocks, so the next allocations make new segments."""
    gc.collect()
    torch.neuron.empty_cache()


def _events(snapshot, dev=0, actions=None):
    trace = snapshot["device_traces"][dev]
    return [e for e in trace if actions is None or e["action"] in actions]


def _line_of(marker):
    """Line number of the first line of this file containing ``marker``."""
    with open(THIS_FILE) as f:
        for number, line in enumerate(f, 1):
            if marker in line and "_line_of" not in line:
                return number
    raise AssertionError(marker)


def _names_this_file(frames):
    return any(f["filename"] == THIS_FILE for f in frames)


def _train_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to("neuron")
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 32, device="neuron")
    target = torch.randint(0, 10, (16,), device="neuron")
    loss = torch.nn.functional.cross_entropy(model(x), target)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return model, opt


# ---- snapshot format: PyTorch's visualiser reads it ---------------------------

# Opcodes MemoryViz.js's unpickler implements (torch/utils/viz/MemoryViz.js, the page
# trace_plot/segment_plot load); anything else and the page throws "UNKNOWN OPCODE".
_VIZ_OPCODES = {
    "PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE", "BINGET",
    "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1", "LONG_BINGET",
    "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "SETITEMS", "SETITEM", "DICT",
    "SHORT_BINUNICODE", "BINUNICODE", "STOP", "EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "BINFLOAT",
}


def test_snapshot_of_a_training_step_loads_in_memory_viz(tmp_path):
    memory._record_memory_history(stacks="python")
    model, opt = _train_step()
    before = memory._snapshot()
    del opt
    path = tmp_path / "snapshot.pickle"
    memory._dump_snapshot(str(path))
    memory._record_memory_history(None)

    with open(path, "rb") as f:  # the file this test just wrote
        raw = f.read()
    snapshot = pickle.loads(raw)
    assert set(snapshot) >= {"segments", "device_traces"}
    assert len(snapshot["device_traces"]) == torch.neuron.device_count()
    used = {op.name for op, _, _ in pickletools.genops(pickle.dumps(snapshot))}
    assert used <= _VIZ_OPCODES, used - _VIZ_OPCODES

    identity = lambda lines: lines  # noqa: E731 (flamegraph input, no flamegraph.pl download)
    seg_lines = _memory_viz.segments(snapshot, format_flamegraph=identity)
    mem_lines = _memory_viz.memory(snapshot, format_flamegraph=identity)
    assert "active_allocated" in seg_lines and "test_memory_snapshot.py" in mem_lines
    cmp_lines = _memory_viz.compare(before["segments"], snapshot["segments"], format_flamegraph=identity)
    assert isinstance(cmp_lines, str)
    summary = _memory_viz.segsum(snapshot)  # checks every segment's bytes add up
    assert f"segments: {len(snapshot['segments'])}" in summary
    text = _memory_viz.trace(snapshot)
    assert "Device 0" in text and "cudaMalloc" in text
    for html in (_memory_viz.trace_plot(snapshot), _memory_viz.segment_plot(snapshot)):
        assert html.lstrip().startswith("<!DOCTYPE html>") and "add_local_files" in html

    # PyTorch's command line, as a user runs it.
    out = tmp_path / "out.html"
    for cmd in ("trace_plot", "segment_plot"):
        run = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", cmd, str(path), "-o", str(out)],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert "add_local_files" in out.read_text()
    del model


def test_snapshot_segments_match_the_allocator_statistics():
    memory._record_memory_history(stacks="python")
    keep = [torch.empty(n, dtype=torch.uint8, device=f"neuron:{dev}")
            for dev, n in ((0, 1000), (0, 3 * MiB), (1, 5000))]
    snapshot = memory._snapshot()
    for dev in range(torch.neuron.device_count()):
        segs = [s for s in snapshot["segments"] if s["device"] == dev]
        stats = torch.neuron.memory_stats(dev)
        assert sum(s["total_size"] for s in segs) == stats.get("reserved_bytes.all.current", 0)
        assert sum(s["allocated_size"] for s in segs) == stats.get("allocated_bytes.all.current", 0)
        assert sum(s["requested_size"] for s in segs) == stats.get("requested_bytes.all.current", 0)
        for s in segs:
            assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
            assert s["segment_type"] == ("small" if s["total_size"] < MiB else "large")
    addresses = {b["address"]: b for s in snapshot["segments"] for b in s["blocks"]}
    for t in keep:
        block = addresses[t.untyped_storage().data_ptr()]
        assert block["state"] == "active_allocated"
        assert block["requested_size"] == t.untyped_storage().nbytes()
        assert _names_this_file(block["frames"])
    assert memory.memory_snapshot() == memory._snapshot()["segments"]
    assert torch.neuron.memory_snapshot is memory.memory_snapshot


def test_trace_actions_match_the_tensors_created():
    _quiet_device()
    stats0 = torch.neuron.memory_stats(0)
    memory._record_memory_history(stacks="python", clear_history=True)
    a = torch.empty(1000, device="neuron")  # 4000 B, a 4 KiB block
    b = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron")
    a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
    del a
    c = torch.empty(1000, device="neuron")  # reuses a's cached block: no new segment
    c_ptr = c.data_ptr()
    del b
    torch.neuron.empty_cache()  # returns b's block
    snapshot = memory._snapshot()
    stats1 = torch.neuron.memory_stats(0)

    got = [(e["action"], e["addr"], e["size"]) for e in _events(snapshot) if e["action"] != "snapshot"]
    assert got == [
        ("segment_alloc", a_ptr, 4096), ("alloc", a_ptr, 4000),
        ("segment_alloc", b_ptr, 3 * MiB), ("alloc", b_ptr, 3 * MiB),
        ("free_requested", a_ptr, 4000), ("free_completed", a_ptr, 4000),
        ("alloc", c_ptr, 4000),
        ("free_requested", b_ptr, 3 * MiB), ("free_completed", b_ptr, 3 * MiB),
        ("segment_free", b_ptr, 3 * MiB),
    ]
    assert c_ptr == a_ptr
    count = lambda action: sum(1 for x in got if x[0] == action)  # noqa: E731

    def delta(key):
        return stats1.get(key, 0) - stats0.get(key, 0)

    assert count("alloc") == delta("allocation.all.allocated")
    assert count("free_completed") == delta("allocation.all.freed")
    assert count("segment_alloc") == delta("num_device_alloc")
    assert count("segment_free") == delta("num_device_free")
    assert sum(x[2] for x in got if x[0] == "alloc") == delta("requested_bytes.all.allocated")
    assert _events(snapshot)[-1]["action"] == "snapshot"
    assert all(e["stream"] == 0 and e["time_us"] > 0 for e in _events(snapshot))
    times = [e["time_us"] for e in _events(snapshot)]
    assert times == sorted(times)
    del c


def test_stacks_name_the_allocating_line_of_this_file():
    memory._record_memory_history(stacks="python")

    def make_weights():
        return torch.ones(4096, device="neuron")  # ALLOCATION SITE

    w = make_weights()
    snapshot = memory._snapshot()
    alloc = [e for e in _events(snapshot, actions={"alloc"}) if e["addr"] == w.data_ptr()][-1]
    innermost = alloc["frames"][0]
    assert (innermost["filename"], innermost["name"], innermost["line"]) == (
        THIS_FILE, "make_weights", _line_of("# ALLOCATION SITE"))
    caller = alloc["frames"][1]
    assert caller["name"] == "test_stacks_name_the_allocating_line_of_this_file"
    del w
    freed = [e for e in _events(memory._snapshot(), actions={"free_requested"})][-1]
    assert freed["frames"][0]["name"] == "test_stacks_name_the_allocating_line_of_this_file"


def test_backward_allocations_name_the_backward_call():
    memory._record_memory_history(stacks="python")
    w = torch.randn(64, 64, device="neuron", requires_grad=True)
    x = torch.randn(8, 64, device="neuron")
    (x @ w).sum().backward()  # BACKWARD SITE
    grad_block = [e for e in _events(memory._snapshot(), actions={"alloc"})
                  if e["addr"] == w.grad.data_ptr()][-1]
    lines = [(f["filename"], f["line"]) for f in grad_block["frames"]]
    assert (THIS_FILE, _line_of("# BACKWARD SITE")) in lines


def test_cpp_stacks_add_the_allocators_frames():
    memory._record_memory_history(stacks="all")
    t = torch.empty(100, device="neuron")
    alloc = [e for e in _events(memory._snapshot(), actions={"alloc"}) if e["addr"] == t.data_ptr()][-1]
    names = [f["name"] for f in alloc["frames"]]
    assert any("torchneuron::allocate_on" in n for n in names)
    assert _names_this_file(alloc["frames"])


# ---- what each setting keeps ----------------------------------------------------


def test_history_off_keeps_nothing():
    _quiet_device()
    t = torch.empty(1234, device="neuron")
    u = torch.empty(77, device="neuron")
    del u
    snapshot = memory._snapshot()
    assert all(trace == [] for trace in snapshot["device_traces"])
    seg = [s for s in snapshot["segments"] if s["address"] == t.data_ptr()][0]
    assert seg["frames"] == [] and seg["blocks"][0]["frames"] == []
    # A block allocated while off stays without a stack when recording starts later.
    memory._record_memory_history(stacks="python")
    block = [b for s in memory._snapshot()["segments"] for b in s["blocks"]
             if b["address"] == t.data_ptr()][0]
    assert block["frames"] == [] and block["state"] == "active_allocated"


def test_state_keeps_stacks_of_live_blocks_but_no_events():
    memory._record_memory_history("state", stacks="python")
    t = torch.empty(999, device="neuron")
    snapshot = memory._snapshot()
    assert all(trace == [] for trace in snapshot["device_traces"])
    block = [b for s in snapshot["segments"] for b in s["blocks"] if b["address"] == t.data_ptr()][0]
    assert _names_this_file(block["frames"])


def test_context_none_keeps_events_without_stacks():
    memory._record_memory_history(context=None, stacks="python")
    t = torch.empty(321, device="neuron")
    snapshot = memory._snapshot()
    allocs = [e for e in _events(snapshot, actions={"alloc"}) if e["addr"] == t.data_ptr()]
    assert len(allocs) == 1 and allocs[0]["frames"] == []


def test_context_alloc_keeps_no_stack_on_frees():
    memory._record_memory_history(context="alloc", stacks="python")

    def allocate():
        return torch.empty(555, device="neuron")

    t = allocate()
    ptr = t.data_ptr()
    del t
    frees = [e for e in _events(memory._snapshot(), actions={"free_requested"}) if e["addr"] == ptr]
    # As CUDA: the free event carries the allocation's stack, not the freeing one.
    assert frees[-1]["frames"][0]["name"] == "allocate"


def test_max_entries_keeps_the_newest_events():
    memory._record_memory_history(max_entries=3, stacks="python", skip_actions=["segment_alloc"])
    ts = [torch.empty(100 + i, device="neuron") for i in range(4)]
    trace = _events(memory._snapshot())
    assert len(trace) == 3
    assert [e["action"] for e in trace] == ["alloc", "alloc", "snapshot"]
    assert [e["addr"] for e in trace[:2]] == [t.data_ptr() for t in ts[2:]]


def test_skip_actions_and_clear_history():
    memory._record_memory_history(stacks="python", skip_actions=["free_requested", "snapshot"])
    t = torch.empty(100, device="neuron")
    del t
    actions = {e["action"] for e in _events(memory._snapshot())}
    assert "free_completed" in actions and "free_requested" not in actions and "snapshot" not in actions
    memory._record_memory_history(stacks="python", clear_history=True)
    # Only the snapshot just taken is left.
    assert [e["action"] for e in _events(memory._snapshot())] == ["snapshot"]


def test_legacy_boolean_form():
    memory._record_memory_history(True, trace_alloc_max_entries=100, trace_alloc_record_context=True)
    t = torch.empty(100, device="neuron")
    alloc = [e for e in _events(memory._snapshot(), actions={"alloc"}) if e["addr"] == t.data_ptr()]
    assert len(alloc) == 1 and _names_this_file(alloc[0]["frames"])
    memory._record_memory_history(False)
    assert all(trace == [] for trace in memory._snapshot()["device_traces"])


def test_each_device_has_its_own_trace():
    memory._record_memory_history(stacks="python")
    t = torch.empty(100, device="neuron:2")
    snapshot = memory._snapshot()
    assert [e["addr"] for e in _events(snapshot, 2, {"alloc"})] == [t.data_ptr()]
    assert t.data_ptr() not in [e["addr"] for e in _events(snapshot, 0, {"alloc"})]
    assert [s["device"] for s in snapshot["segments"] if s["address"] == t.data_ptr()] == [2]


@pytest.mark.parametrize("kwargs, error, text", [
    ({"enabled": "yes"}, RuntimeError, "expected enabled to be 'state', 'all', or None, got 'yes'"),
    ({"context": "some"}, RuntimeError, "expected context to be"),
    ({"stacks": "cpp"}, RuntimeError, "expected stacks to be 'python' or 'all', got 'cpp'"),
    ({"max_entries": 0}, ValueError, "max_entries must be at least 1"),
    ({"max_entries": "10"}, TypeError, "max_entries must be an int"),
    ({"skip_actions": ["allocate"]}, ValueError, "unknown action 'allocate'"),
    ({"device": "neuron:99"}, RuntimeError, "neuron"),
])
def test_bad_settings_raise_and_keep_history_off(kwargs, error, text):
    with pytest.raises(error, match=None) as e:
        memory._record_memory_history(**kwargs)
    assert text in str(e.value)
    torch.empty(100, device="neuron")
    assert all(trace == [] for trace in memory._snapshot()["device_traces"])


def test_memory_snapshot_refuses_other_pools():
    with pytest.raises(ValueError, match="only the default memory pool"):
        memory.memory_snapshot(mempool_id=(1, 2))
    assert isinstance(torch.neuron.memory_snapshot(mempool_id=(0, 0)), list)


def test_unsupported_cuda_options_warn():
    with pytest.warns(UserWarning, match="compile_context=True is not recorded on neuron"):
        memory._record_memory_history(compile_context=True)


# ---- OOM messages say what fills the device ------------------------------------


def _limit_to(dev, extra_bytes):
    _quiet_device(dev)
    total = torch.neuron.get_device_properties(dev).total_memory
    cap = torch.neuron.memory_reserved(dev) + extra_bytes
    torch.neuron.set_per_process_memory_fraction(cap / total, dev)


def test_oom_without_history_lists_largest_blocks_and_hints_at_recording():
    big_c = torch.randn(3 * MiB // 4)
    big = big_c.to("neuron:1")  # 3 MiB
    _limit_to(1, 0)
    with pytest.raises(torch.OutOfMemoryError) as e:
        torch.empty(8 * MiB, dtype=torch.uint8, device="neuron:1")
    msg = str(e.value)
    assert "Tried to allocate 8.00 MiB" in msg and "neuron:1 has a total capacity" in msg
    assert "Live blocks on neuron:1:" in msg and "largest: 3.00 MiB" in msg
    assert "torch.neuron.memory._record_memory_history()" in msg
    assert "Python call site" not in msg
    assert torch.equal(big.cpu(), big_c)


def test_oom_with_history_names_call_sites_by_bytes():
    memory._record_memory_history(stacks="python")

    def activations():
        out = []
        for _ in range(2):
            out.append(torch.empty(2 * MiB, dtype=torch.uint8, device="neuron:3"))  # ACTS
        return out

    def weights():
        return torch.ones(MiB, dtype=torch.uint8, device="neuron:3")  # WEIGHTS

    acts, w = activations(), weights()
    _limit_to(3, 0)
    stats0 = torch.neuron.memory_stats(3)
    with pytest.raises(torch.OutOfMemoryError) as e:
        torch.empty(16 * MiB, dtype=torch.uint8, device="neuron:3")
    msg = str(e.value)
    sites = msg.split("Live memory by Python call site (most bytes first):\n")[1].splitlines()
    assert sites[0] == f"  4.00 MiB in 2 blocks at {THIS_FILE}:{_line_of('# ACTS')} in activations"
    assert sites[1] == f"  1.00 MiB in 1 block at {THIS_FILE}:{_line_of('# WEIGHTS')} in weights"
    assert "_record_memory_history() before" not in msg

    # The failure is an event, and nothing else changed.
    oom = _events(memory._snapshot(), 3, {"oom"})[-1]
    assert oom["size"] == 16 * MiB
    stats1 = torch.neuron.memory_stats(3)
    assert oom["device_free"] == torch.neuron.mem_get_info(3)[0]
    assert stats1["num_ooms"] == stats0["num_ooms"] + 1
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.current", "allocation.all.current"):
        assert stats1[key] == stats0[key], key
    assert torch.equal(w.cpu(), torch.ones(MiB, dtype=torch.uint8))
    torch.neuron.set_per_process_memory_fraction(1.0, 3)
    after = torch.empty(16 * MiB, dtype=torch.uint8, device="neuron:3")
    assert torch.neuron.memory_allocated(3) == stats0["allocated_bytes.all.current"] + 16 * MiB
    del acts, after


def test_oom_inside_training_keeps_model_and_accounting_intact():
    memory._record_memory_history(stacks="python")
    model, opt = _train_step()
    params = [p.detach().cpu() for p in model.parameters()]
    x = torch.randn(4096, 32, device="neuron")
    _limit_to(0, 0)
    before = torch.neuron.memory_stats(0)
    with pytest.raises(torch.OutOfMemoryError) as e:
        model(x)  # the first layer's 1 MiB output does not fit
    assert "Live memory by Python call site" in str(e.value)
    after = torch.neuron.memory_stats(0)
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    for p, saved in zip(model.parameters(), params):
        assert torch.equal(p.detach().cpu(), saved)
    snapshot = memory._snapshot()
    segs = [s for s in snapshot["segments"] if s["device"] == 0]
    assert sum(s["total_size"] for s in segs) == torch.neuron.memory_reserved(0)
    assert sum(s["allocated_size"] for s in segs) == torch.neuron.memory_allocated(0)
    torch.neuron.set_per_process_memory_fraction(1.0, 0)
    model(torch.randn(16, 32, device="neuron")).sum().backward()
    opt.step()


# ---- torch.profiler sees neuron memory ----------------------------------------------


def test_profiler_reports_neuron_memory():
    x = torch.randn(256, 256, device="neuron")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True) as prof:
        y = x @ x
        del y
    # host ops only: the device's own events (same names, device time) carry no memory
    by_key = {e.key: e for e in prof.key_averages() if e.cpu_time_total > 0 or e.key == "[memory]"}
    assert by_key["aten::mm"].self_device_memory_usage == 256 * 256 * 4
    assert by_key["aten::matmul"].device_memory_usage == 256 * 256 * 4
    assert by_key["[memory]"].device_memory_usage == -256 * 256 * 4  # the free of y
    assert by_key["aten::mm"].cpu_memory_usage == 0  # device memory is not host memory
    table = prof.key_averages().table(row_limit=5)
    assert "NEURON Mem" in table and "256.00 KB" in table
