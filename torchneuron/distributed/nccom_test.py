"""``torchneuron nccom-test``: collective bandwidth across sizes, measured here and modelled.

In the style of AWS's ``nccom-test`` (and nccl-tests, whose columns it prints; see
trainium-facts.md "Topology and collectives"): starts N local ranks on one ``neuron``
process group, runs one collective at sizes from ``--minbytes`` to ``--maxbytes``, and
prints per size the host-measured time (median over ``--iters`` of the slowest rank:
gloo over host memory, this machine's figure) and the modelled Trainium time on the
configured target (the rank's stream clock, as ``Event.elapsed_time`` reads it), each
with algbw and busbw. Ranks are placed as torchrun places them (``LOCAL_WORLD_SIZE`` =
N: one instance), on the target chosen by the usual settings (``TORCHNEURON_INSTANCE``,
``NEURON_PLATFORM_TARGET_OVERRIDE``, ``NEURON_LOGICAL_NC_CONFIG``).

Results come back from rank 0 as JSON (nothing is unpickled).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass

# nccom-test's operation names -> the collective model's kinds.
OPERATIONS = {"allr": "all_reduce", "allg": "all_gather", "redsct": "reduce_scatter",
              "alltoall": "all_to_all", "sendrecv": "send_recv"}
DATATYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class Row:
    """One size: nccom-test's size (bytes of one rank's buffer) and the two timings."""

    nbytes: int
    count: int  # elements of that buffer
    measured_seconds: float
    modeled_seconds: float
    algorithm: str = ""  # the modelled algorithm (hardware/collectives.py: the runtime's rule)


def parse_size(text: str) -> int:
    """``64``, ``4K``, ``1M``, ``2G`` (binary units) as bytes.

    Raises:
        argparse.ArgumentTypeError: for anything else, naming the accepted forms.
    """
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    word = text.strip().upper().removesuffix("B")
    number, unit = (word[:-1], units[word[-1]]) if word[-1:] in units else (word, 1)
    if not number.isdigit() or int(number) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: use bytes or a number with K, M or G")
    return int(number) * unit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """nccom-test's options (the subset torchneuron models)."""
    parser.add_argument("operation", choices=sorted(OPERATIONS), help="collective to run")
    parser.add_argument("-r", "--nworkers", type=int, default=2, help="ranks to start (default 2)")
    parser.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8K"),
                        help="smallest size, e.g. 1K (default 8K)")
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("1M"),
                        help="largest size, e.g. 256M (default 1M)")
    parser.add_argument("-f", "--stepfactor", type=int, default=2, help="size multiplier (default 2)")
    parser.add_argument("-n", "--iters", type=int, default=5, help="timed runs per size (default 5)")
    parser.add_argument("-w", "--warmup_iters", type=int, default=1, help="untimed runs first (default 1)")
    parser.add_argument("-d", "--datatype", choices=sorted(DATATYPES), default="fp32",
                        help="element type (default fp32)")


def sizes(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """``minbytes``, ``minbytes * factor``, ... up to ``maxbytes``."""
    out, size = [], minbytes
    while size <= maxbytes:
        out.append(size)
        size *= factor
    return out


def check(args: argparse.Namespace) -> None:
    """Raises ValueError naming a bad combination of options."""
    if args.nworkers < 2:
        raise ValueError(f"--nworkers {args.nworkers}: a collective needs at least 2 ranks")
    if args.minbytes > args.maxbytes:
        raise ValueError(f"--minbytes ({args.minbytes}) is larger than --maxbytes ({args.maxbytes})")
    if args.stepfactor < 2:
        raise ValueError(f"--stepfactor {args.stepfactor}: use 2 or more")
    if args.iters < 1 or args.warmup_iters < 0:
        raise ValueError("--iters must be >= 1 and --warmup_iters >= 0")


def run(args: argparse.Namespace) -> list[Row]:
    """Starts the ranks, runs every size, returns rank 0's rows."""
    import torch.multiprocessing as mp

    check(args)
    with tempfile.TemporaryDirectory(prefix="torchneuron-nccom-") as tmp:
        results = pathlib.Path(tmp) / "rows.json"
        mp.start_processes(_rank_main, nprocs=args.nworkers, start_method="spawn",
                           args=(args.nworkers, tmp, OPERATIONS[args.operation], DATATYPES[args.datatype],
                                 sizes(args.minbytes, args.maxbytes, args.stepfactor),
                                 args.iters, args.warmup_iters))
        return [Row(**row) for row in json.loads(results.read_text())]


def format_table(operation: str, ranks: int, datatype: str, rows: list[Row], target: str) -> list[str]:
    """nccom-test's columns, measured then modelled."""
    from torchneuron.hardware.collectives import bus_factor

    factor = bus_factor(OPERATIONS[operation], ranks)
    lines = [f"# nccom-test {operation} on {ranks} ranks, {datatype}; measured on this host "
             f"(gloo over host memory), modelled for {target}",
             f"{'size(B)':>12} {'count(elems)':>12} {'type':>6} | {'time(us)':>10} {'algbw(GB/s)':>11} "
             f"{'busbw(GB/s)':>11} | {'model(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} algorithm"]
    for row in rows:
        cells = []
        for seconds in (row.measured_seconds, row.modeled_seconds):
            algbw = row.nbytes / seconds / 1e9 if seconds > 0 else 0.0
            cells.append(f"{seconds * 1e6:>10.2f} {algbw:>11.3f} {algbw * factor:>11.3f}")
        lines.append(f"{row.nbytes:>12} {row.count:>12} {datatype:>6} | {cells[0]} | {cells[1]} "
                     f"{row.algorithm}")
    return lines


def main(args: argparse.Namespace, print_line=print) -> int:
    """The subcommand: prints the table; 2 with a message for bad options."""
    from torchneuron import config

    try:
        rows = run(args)
    except ValueError as e:
        print_line(f"error: {e}")
        return 2
    topology = config.device_topology()
    target = f"{topology.chip.name}" + (f" ({topology.instance.name})" if topology.instance else "")
    for line in format_table(args.operation, args.nworkers, args.datatype, rows, target):
        print_line(line)
    return 0


# ---- each rank -------------------------------------------------------------------

def _call(kind: str, nbytes: int, world: int, rank: int, dtype, device):
    """The collective to time at nccom-test's size ``nbytes`` (one rank's buffer)."""
    import torch
    import torch.distributed as dist

    count = nbytes // torch.empty((), dtype=dtype).element_size()
    if kind == "all_reduce":
        t = torch.ones(count, dtype=dtype, device=device)
        return count, lambda: dist.all_reduce(t)
    if kind == "all_gather":  # size: the gathered output
        out, chunk = torch.empty(count, dtype=dtype, device=device), torch.ones(count // world, dtype=dtype,
                                                                                device=device)
        return count, lambda: dist.all_gather_into_tensor(out, chunk)
    if kind == "reduce_scatter":  # size: the input
        inp, out = torch.ones(count, dtype=dtype, device=device), torch.empty(count // world, dtype=dtype,
                                                                              device=device)
        return count, lambda: dist.reduce_scatter_tensor(out, inp)
    if kind == "all_to_all":
        inp, out = torch.ones(count, dtype=dtype, device=device), torch.empty(count, dtype=dtype, device=device)
        return count, lambda: dist.all_to_all_single(out, inp)
    send, recv = torch.ones(count, dtype=dtype, device=device), torch.empty(count, dtype=dtype, device=device)

    def ring() -> None:  # each rank sends to the next and receives from the previous
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return count, ring


def _rank_main(rank: int, world: int, tmp: str, kind: str, dtype_name: str, byte_sizes: list[int],
               iters: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist

    from torchneuron.device import accounting
    from torchneuron.distributed import charging

    warnings.simplefilter("ignore")  # c10d's deprecation notes
    from torchneuron import config

    config.set_value("LOCAL_RANK", str(rank))  # as torchrun sets them (placement, device)
    config.set_value("LOCAL_WORLD_SIZE", str(world))
    dist.init_process_group("neuron", init_method=f"file://{tmp}/store", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    device, dtype = torch.device("neuron", rank), getattr(torch, dtype_name)
    rows = []
    for nbytes in byte_sizes:
        usable = nbytes - nbytes % (world * torch.empty((), dtype=dtype).element_size())
        count, call = _call(kind, usable, world, rank, dtype, device)
        for _ in range(warmup):
            call()
        samples, modeled = [], []
        for _ in range(iters):
            clock = accounting.stream_clock(rank)
            start = time.perf_counter()
            call()
            samples.append(time.perf_counter() - start)
            modeled.append(accounting.stream_clock(rank) - clock)
        slowest: list = [None] * world
        dist.all_gather_object(slowest, statistics.median(samples))
        peer = (rank + 1) % world if kind == "send_recv" else None
        algorithm = charging.modelled_cost(kind, usable, dist.group.WORLD, peer).algorithm
        rows.append(asdict(Row(usable, count, max(slowest), statistics.median(modeled), algorithm)))
    if rank == 0:
        (pathlib.Path(tmp) / "rows.json").write_text(json.dumps(rows))
    dist.destroy_process_group()
