"""Collectives on neuron against plain gloo on CPU tensors, measured and modelled, in one run.

Starts N local ranks with one process group ``cpu:gloo,neuron:neuron``: CPU tensors go to
gloo, neuron tensors to the ``neuron`` backend (gloo over the tensors' device memory), in
the same processes. For each collective and size, rounds alternate neuron and CPU calls
(the order flips every round, so machine noise hits both alike). A round starts on all ranks
together and times several back-to-back calls of small sizes; each side's time is the median
over rounds of the slowest rank's time per call, and the spread of the per-round ratio is shown.
Rendezvous is through a TCPStore, as under torchrun. The transport is the same, so the
neuron/gloo ratio is the backend's own overhead (target: within 1.2x). Next to it, the
modelled Trainium time of the collective (what ``Event.elapsed_time`` reads on neuron) and
its bus bandwidth (nccom-test's busbw; torchneuron/hardware/collectives.py).

    python benchmarks/collectives.py [--ranks 2 4] [--minbytes 1M] [--maxbytes 256M] [--rounds 15]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
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


def calls_per_round(nbytes: int) -> int:
    """Back-to-back calls timed together: about 8 MiB of payload per round, 1 to 16 calls, so a
    round of small collectives lasts long enough for the clock and for scheduling noise to
    average out."""
    return max(1, min(16, (8 << 20) // nbytes))


def rank_main(rank: int, world: int, port: int, byte_sizes: list[int], rounds: int,
              results: str) -> None:
    warnings.simplefilter("ignore")  # c10d's deprecation notes, once per rank
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    # A TCPStore, as torchrun's rendezvous gives: the neuron backend talks to the store at
    # every collective (torchneuron/distributed/progress.py), gloo on CPU tensors does not.
    dist.init_process_group("cpu:gloo,neuron:neuron", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    neuron = torch.device("neuron", rank)
    together = torch.zeros(1)  # a CPU all_reduce before each round: the ranks start it together
    rows = []
    for op in OPS:
        for nbytes in byte_sizes:
            runs = {"neuron": collective(op, nbytes, world, neuron),
                    "gloo_cpu": collective(op, nbytes, world, torch.device("cpu"))}
            for run in runs.values():  # warm-up: first-use paths, gloo's buffers
                run()
            calls = calls_per_round(nbytes)
            samples: dict[str, list[float]] = {name: [] for name in runs}
            names = list(runs)
            for r in range(rounds):
                for name in names if r % 2 == 0 else reversed(names):
                    dist.all_reduce(together)
                    start = time.perf_counter()
                    for _ in range(calls):
                        runs[name]()
                    samples[name].append((time.perf_counter() - start) / calls)
            every_rank = [None] * world
            dist.all_gather_object(every_rank, samples)
            modelled = modelled_seconds(runs["neuron"], neuron)
            # Each round's time is its slowest rank's (a collective ends when its last rank does).
            slowest = {name: [max(ranks) for ranks in zip(*(s[name] for s in every_rank))] for name in runs}
            rows.append((op, nbytes, slowest["gloo_cpu"], slowest["neuron"], modelled))
            del runs
    if rank == 0:
        torch.save(rows, results)
    dist.destroy_process_group()


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def size_text(nbytes: int) -> str:
    """``1 MiB``, ``64 KiB`` or ``512 B``."""
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):g} MiB"
    return f"{nbytes / (1 << 10):g} KiB" if nbytes >= 1 << 10 else f"{nbytes} B"


def report(world: int, rows: list[tuple]) -> None:
    from torchneuron import config
    from torchneuron.hardware.collectives import bus_factor

    print(f"\n{world} ranks (host: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}); "
          f"modelled: {config.device_topology().chip.name}")
    print("| op | size | gloo CPU (ms) | neuron (ms) | neuron/gloo | ratio p25-p75 | measured busbw (GB/s) "
          "| modelled (us) | modelled busbw (GB/s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for op, nbytes, gloo_rounds, neuron_rounds, modelled in rows:
        factor = bus_factor(op, world)
        gloo, neuron = statistics.median(gloo_rounds), statistics.median(neuron_rounds)
        # Round r of each side ran back to back: their ratio cancels the slow drift of the machine.
        ratios = sorted(n / g for n, g in zip(neuron_rounds, gloo_rounds))
        low, high = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
        print(f"| {op} | {size_text(nbytes)} | {gloo * 1e3:.2f} | {neuron * 1e3:.2f} | {neuron / gloo:.2f}x "
              f"| {low:.2f}-{high:.2f}x | {nbytes / neuron * factor / 1e9:.2f} | {modelled * 1e6:.1f} "
              f"| {nbytes / modelled * factor / 1e9:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--minbytes", type=parse_size, default=parse_size("1M"))
    parser.add_argument("--maxbytes", type=parse_size, default=parse_size("256M"))
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if args.minbytes <= 0 or args.maxbytes < args.minbytes:
        parser.error(f"need 0 < --minbytes <= --maxbytes, got {args.minbytes} and {args.maxbytes}")
    byte_sizes = sizes(args.minbytes, args.maxbytes)
    print(f"collectives, {datetime.date.today()}: neuron vs gloo on CPU tensors in the same processes, "
          f"median of {args.rounds} interleaved rounds, slowest rank per round")
    for world in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            results = os.path.join(tmp, "rows.pt")
            mp.start_processes(rank_main, args=(world, free_port(), byte_sizes, args.rounds, results),
                               nprocs=world, start_method="spawn")
            report(world, torch.load(results, weights_only=True))


if __name__ == "__main__":
    main()
