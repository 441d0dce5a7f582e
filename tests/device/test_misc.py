"""Threads, processes, pinned memory and torch.neuron conveniences."""

import multiprocessing as mp
import threading

import torch
from torch.utils.data import DataLoader, TensorDataset

from conftest import on_device


def test_threads_on_different_devices_compute_correctly():
    n_dev = torch.neuron.device_count()
    inputs = [torch.randn(64, 64, generator=torch.Generator().manual_seed(i)) for i in range(n_dev)]
    results, errors = {}, []
    barrier = threading.Barrier(n_dev)

    def work(i):
        try:
            torch.neuron.set_device(i)
            barrier.wait()
            x = inputs[i].to("neuron")  # the thread's current device
            acc = x
            for _ in range(20):
                acc = torch.tanh(acc @ x) + 1
            results[i] = (torch.neuron.current_device(), acc.device, on_device(acc, i), acc.cpu())
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_dev)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(n_dev):
        x = inputs[i]
        acc = x
        for _ in range(20):
            acc = torch.tanh(acc @ x) + 1
        cur, dev, in_mem, got = results[i]
        assert cur == i
        assert dev == torch.device("neuron", i)
        assert in_mem
        assert torch.equal(got, acc)
    assert torch.neuron.current_device() == 0  # the main thread's device is untouched


def test_current_device_is_per_thread():
    torch.neuron.set_device(1)
    seen = []
    t = threading.Thread(target=lambda: seen.append((torch.neuron.current_device(),
                                                     torch.empty(1, device="neuron").device.index)))
    t.start()
    t.join()
    assert seen == [(0, 0)]
    assert torch.neuron.current_device() == 1


def test_threads_allocating_on_same_device_keep_stats_consistent():
    import gc
    gc.collect()
    before = torch.neuron.memory_allocated(2)

    def work():
        for _ in range(50):
            a = torch.randn(1000, device="neuron:2")
            (a * 2).sum().item()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert torch.neuron.memory_allocated(2) == before


def _child_make_tensor(q):
    try:
        torch.ones(1, device="neuron")
        q.put("no error")
    except RuntimeError as e:
        q.put("RuntimeError: " + str(e))
    except Exception as e:  # pragma: no cover
        q.put(f"{type(e).__name__}: {e}")


def test_fork_after_use_raises_in_child():
    torch.ones(1, device="neuron").add_(1)  # the parent has used the device
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_make_tensor, args=(q,))
    p.start()
    msg = q.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0
    assert msg.startswith("RuntimeError")
    assert "forked subprocess" in msg and "spawn" in msg
    # the parent is unaffected
    assert torch.equal(torch.ones(2, device="neuron").cpu(), torch.ones(2))


def test_dataloader_fork_workers_after_parent_used_neuron():
    torch.ones(1, device="neuron").sum().item()
    data = torch.arange(40.0).view(20, 2)
    labels = torch.arange(20)
    loader = DataLoader(TensorDataset(data, labels), batch_size=5, num_workers=2,
                        multiprocessing_context="fork")
    got = []
    for x, y in loader:
        xn = x.to("neuron")
        got.append((xn * 2).cpu())
        assert xn.device.type == "neuron"
    assert torch.equal(torch.cat(got), data * 2)


def test_pin_memory():
    p = torch.randn(4).pin_memory()
    assert p.is_pinned()
    assert not torch.randn(4).is_pinned()
    assert torch.empty(3, pin_memory=True).is_pinned()
    n = p.to("neuron", non_blocking=True)
    torch.neuron.synchronize()
    assert on_device(n)
    assert torch.equal(n.cpu(), p)
    back = torch.empty(4).pin_memory()
    back.copy_(n, non_blocking=True)
    torch.neuron.synchronize()
    assert torch.equal(back, p)


def test_dataloader_pin_memory_yields_pinned_batches():
    ds = TensorDataset(torch.arange(12.0).view(6, 2), torch.arange(6))
    loader = DataLoader(ds, batch_size=2, pin_memory=True, pin_memory_device="neuron")
    for x, y in loader:
        assert x.is_pinned() and y.is_pinned()
        xn = x.to("neuron", non_blocking=True)
        assert on_device(xn)
        assert torch.equal(xn.cpu(), x)


def test_dataloader_pin_memory_default_device():
    ds = TensorDataset(torch.arange(12.0).view(6, 2))
    loader = DataLoader(ds, batch_size=3, pin_memory=True)
    batches = list(loader)
    assert all(b[0].is_pinned() for b in batches)


def test_is_neuron_and_neuron_methods():
    assert torch.neuron.is_available()
    c = torch.ones(2)
    assert not c.is_neuron
    n = c.neuron()
    assert n.is_neuron and on_device(n)
    m = torch.nn.Linear(2, 2).neuron(1)
    assert m.weight.is_neuron and m.weight.device.index == 1
    s = torch.ones(3).untyped_storage().neuron()
    assert s.device.type == "neuron"
    assert c.is_neuron is False


def test_is_on_neuron_tells_device_memory_from_host_memory():
    from torchneuron.testing import is_on_neuron, run_python

    x = torch.ones(4, device="neuron:1")
    assert is_on_neuron(x) and is_on_neuron(x, 1) and not is_on_neuron(x, 0)
    assert not is_on_neuron(x.cpu()) and is_on_neuron(x[1:])
    assert is_on_neuron(torch.empty(0, device="neuron"))
    done = run_python("import os; print(os.environ.get('NEURON_RT_VISIBLE_CORES'))",
                      env={"NEURON_RT_VISIBLE_CORES": None})
    assert done.returncode == 0 and done.stdout.strip() == "None"
