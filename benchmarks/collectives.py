"""Collectives on neuron against plain gloo on CPU tensors, measured and modelled, in one run.

Starts N local ranks with one process group ``cpu:gloo,neuron:neuron``: CPU tensors go to
gloo, neuron tensors to the ``neuron`` backend (gloo over the tensors' device memory), in
the same processes. For each collective and size, rounds alternate neuron and CPU calls
(the order flips every round, so machine noise hits both alike); each side's time is the
median over rounds of the slowest rank's host wall time. The transport is the same, so the
neuron/gloo ratio is the backend's own overhead (target: within 1.2x). Next to it, the
modelled Trainium time of the collective (what ``Event.elapsed_time`` reads on neuron) and
its bus bandwidth (nccom-test's busbw; torchneuron/hardware/collectives.py).

    python benchmarks/collectives.py [--ranks 2 4] [--minbytes 1M] [--maxbytes 256M] [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

OPS = ("all_reduce", "all_gather")


def parse_size(text: str) -> int:
    """``1M``, ``256M``, ``4K``, ``1G`` or a byte count."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text[-1:] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def sizes(minbytes: int, maxbytes: int) -> list[int]:
    """Powers of 4 from ``minbytes`` to ``maxbytes`` (both included)."""
    out, size = [], minbytes
    while size < maxbytes:
        out.append(size)
        size *= 4
    return out + [maxbytes]


def collective(op: str, nbytes: int, world: int, device: torch.device):
    """The call to time and nccom-test's size: the input of all_reduce, the output of all_gather."""
    if op == "all_reduce":
        t = torch.ones(nbytes // 4, device=device)
        return lambda: dist.all_reduce(t)
    output = torch.empty(nbytes // 4, device=device)
    chunk = torch.ones(nbytes // 4 // world, device=device)
    return lambda: dist.all_gather_into_tensor(output, chunk)


def modelled_seconds(run, device: torch.device) -> float:
    """The modelled Trainium time of one call: the neuron stream's clock (Event.elapsed_time)."""
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    with torch.neuron.device(device):
        start.record()
        run()
        end.record()
        end.synchronize()
    return start.elapsed_time(end) / 1e3


def rank_main(rank: int, world: int, store_path: str, byte_sizes: list[int], rounds: int,
              results: str) -> None:
    warnings.simplefilter("ignore")  # c10d's deprecation notes, once per rank
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("cpu:gloo,neuron:neuron", init_method=f"file://{store_path}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    neuron = torch.device("neuron", rank)
    rows = []
    for op in OPS:
        for nbytes in byte_sizes:
            runs = {"neuron": collective(op, nbytes, world, neuron),
                    "gloo_cpu": collective(op, nbytes, world, torch.device("cpu"))}
            for run in runs.values():  # warm-up: first-use paths, gloo's buffers
                run()
            samples: dict[str, list[float]] = {name: [] for name in runs}
            names = list(runs)
            for r in range(rounds):
                for name in names if r % 2 == 0 else reversed(names):
                    start = time.perf_counter()
                    runs[name]()
                    samples[name].append(time.perf_counter() - start)
            measured = {name: statistics.median(s) for name, s in samples.items()}
            slowest = [None] * world
            dist.all_gather_object(slowest, measured)
            modelled = modelled_seconds(runs["neuron"], neuron)
            rows.append((op, nbytes, max(m["gloo_cpu"] for m in slowest),
                         max(m["neuron"] for m in slowest), modelled))
            del runs
    if rank == 0:
        torch.save(rows, results)
    dist.destroy_process_group()


def report(world: int, rows: list[tuple]) -> None:
    from torchneuron import config
    from torchneuron.hardware.collectives import bus_factor

    print(f"\n{world} ranks (host: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}); "
          f"modelled: {config.device_topology().chip.name}")
    print("| op | size | gloo CPU (ms) | neuron (ms) | neuron/gloo | measured busbw (GB/s) "
          "| modelled (us) | modelled busbw (GB/s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for op, nbytes, gloo, neuron, modelled in rows:
        factor = bus_factor(op, world)
        print(f"| {op} | {nbytes >> 20} MiB | {gloo * 1e3:.2f} | {neuron * 1e3:.2f} | {neuron / gloo:.2f}x "
              f"| {nbytes / neuron * factor / 1e9:.2f} | {modelled * 1e6:.1f} "
              f"| {nbytes / modelled * factor / 1e9:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--minbytes", type=parse_size, default=parse_size("1M"))
    parser.add_argument("--maxbytes", type=parse_size, default=parse_size("256M"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.minbytes <= 0 or args.maxbytes < args.minbytes:
        parser.error(f"need 0 < --minbytes <= --maxbytes, got {args.minbytes} and {args.maxbytes}")
    byte_sizes = sizes(args.minbytes, args.maxbytes)
    print(f"collectives, {datetime.date.today()}: neuron vs gloo on CPU tensors in the same processes, "
          f"median of {args.rounds} interleaved rounds, slowest rank")
    for world in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            results = os.path.join(tmp, "rows.pt")
            mp.start_processes(rank_main, args=(world, os.path.join(tmp, "store"), byte_sizes, args.rounds,
                                                results), nprocs=world, start_method="spawn")
            report(world, torch.load(results, weights_only=True))


if __name__ == "__main__":
    main()
