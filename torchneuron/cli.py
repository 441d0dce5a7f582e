"""The ``torchneuron`` command: ``info`` shows the modelled target, ``demo`` trains on it.

Run as ``python -m torchneuron info|demo`` or through the ``torchneuron`` script.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table

import torchneuron
from torchneuron import config
from torchneuron.profiler.interleaved import time_interleaved

GiB = 2**30
TOLERANCE = 1e-5  # neuron and CPU must agree to this (they run the same kernels)
LOGGED_STEPS = (0, 50, 100, 150, 199)


def _target_line() -> str:
    """One line naming the modelled chip, instance, LNC and device count."""
    topo = config.device_topology()
    instance = topo.instance.name if topo.instance else "single chip"
    props = torch.neuron.get_device_properties(0)
    return (
        f"{props.chip} ({instance}, family {props.name}), LNC={topo.lnc}: "
        f"{torch.neuron.device_count()} neuron "
        f"devices of {props.total_memory / GiB:.0f} GiB HBM, "
        f"{props.tensor_bf16_flops_per_second / 1e12:.0f} BF16 TFLOPS each"
    )


def _settings_table() -> Table:
    """Every declared setting with its value and meaning."""
    env = Table(title="settings (environment variables)")
    # Names are what users copy: never wrapped; long values (paths) fold instead.
    env.add_column("variable", no_wrap=True, min_width=max(map(len, config.ENV_VARS)))
    env.add_column("value", overflow="fold", max_width=24)
    env.add_column("meaning")
    for name, var in config.ENV_VARS.items():
        value = config.get(name)
        env.add_row(name, "(unset)" if value is None else value, var.doc)
    return env


def info(console: Console) -> int:
    """Prints the modelled target: devices, the settings that select them, versions.

    Returns 1 after naming each bad setting (the device part only if the device ones are good).
    """
    problems = config.problems()
    if not config.problems("device"):
        _print_target(console)
    console.print(_settings_table())
    for problem in problems:
        console.print(f"[bold red]bad setting:[/bold red] {problem}", highlight=False)
    return 1 if problems else 0


def _print_target(console: Console) -> None:
    """The modelled chip, instance and devices."""
    topo = config.device_topology()
    summary = Table(title="torchneuron target", show_header=False)
    summary.add_row("chip", f"{topo.chip.marketing_name} (NeuronCore-{topo.chip.neuroncore_version})")
    summary.add_row("instance", topo.instance.name if topo.instance else "single chip (no instance)")
    per_chip = topo.chip.physical_cores_per_chip // topo.lnc
    summary.add_row("chips x logical cores per chip", f"{topo.num_chips} x {per_chip}")
    summary.add_row("LNC (physical cores per device)", str(topo.lnc))
    summary.add_row("visible devices", str(torch.neuron.device_count()))
    summary.add_row("torch", torch.__version__)
    summary.add_row("torchneuron", torchneuron.__version__)
    console.print(summary)

    devices = Table(title="neuron devices (torch.neuron.get_device_properties)")
    for column in ("index", "name", "core id", "chip", "HBM", "physical cores", "BF16 TensorE peak"):
        devices.add_column(column, justify="right" if column != "name" else "left")
    for i in range(torch.neuron.device_count()):
        p = torch.neuron.get_device_properties(i)
        devices.add_row(
            f"neuron:{i}", p.name, str(p.core_id), str(p.chip_index),
            f"{p.total_memory / GiB:.0f} GiB", str(p.physical_core_count),
            f"{p.tensor_bf16_flops_per_second / 1e12:.0f} TFLOPS",
        )
    console.print(devices)


def make_dataset(n: int = 512, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two interleaved spirals (CPU tensors): ``n`` 2-D points and their 0/1 labels."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0.25, 3.0 * torch.pi, n // 2)
    arm = torch.stack([t * torch.cos(t), t * torch.sin(t)], dim=1) / (3.0 * torch.pi)
    x = torch.cat([arm, -arm]) + 0.02 * torch.randn(n, 2, generator=g)
    y = torch.cat([torch.zeros(n // 2), torch.ones(n // 2)]).long()
    return x, y


def make_model(seed: int = 0) -> torch.nn.Module:
    """A small MLP classifier (2 -> 64 -> 64 -> 2), initialised on the CPU from ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(2, 64), torch.nn.Tanh(),
        torch.nn.Linear(64, 64), torch.nn.Tanh(),
        torch.nn.Linear(64, 2),
    )


def train_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], torch.Tensor]:
    """One full-batch AdamW step on the device of ``model``, as a function returning the loss."""
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> dict:
    """Full-batch AdamW on the device of ``model``; returns logged losses and accuracy."""
    step = train_step(model, x, y)
    losses: dict[int, float] = {}
    for i in range(steps):
        loss = step()
        if i in LOGGED_STEPS:
            losses[i] = loss.item()
    device = next(model.parameters()).device
    with torch.no_grad():
        accuracy = (model(x.to(device)).argmax(dim=1) == y.to(device)).float().mean().item()
    return {"losses": losses, "accuracy": accuracy}


def time_per_step(cpu_model: torch.nn.Module, neuron_model: torch.nn.Module, x: torch.Tensor,
                  y: torch.Tensor, rounds: int = 21) -> dict[str, float]:
    """Seconds per training step on each device: copies of the models train, CPU and neuron
    alternating round by round, medians, on one intra-op thread (as benchmarks/eager_overhead.py);
    timing one device after the other made the ratio swing between 0.8x and 2x from run to run."""
    runs = {"neuron": train_step(copy.deepcopy(neuron_model), x, y),
            "cpu": train_step(copy.deepcopy(cpu_model), x, y)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a parallel region waits for its slowest thread: noise on a shared machine
    try:
        medians = time_interleaved(runs, rounds=rounds, sample_ns=2e7)
    finally:
        torch.set_num_threads(threads)
    return {device: us / 1e6 for device, us in medians.items()}


def _print_modelled_step(console: Console, model: torch.nn.Module, x: torch.Tensor,
                         y: torch.Tensor) -> None:
    """What one training step would take on Trainium, and what it did on the device."""
    import torchneuron

    xn, yn = x.to("neuron"), y.to("neuron")

    def step() -> None:  # forward and backward; the trained weights stay as they are
        torch.nn.functional.cross_entropy(model(xn), yn).backward()
        model.zero_grad(set_to_none=True)

    torchneuron.metrics.reset()
    est = torchneuron.estimate(step)
    table = Table(title="one training step, modelled (torchneuron.estimate)")
    for column in ("target", "modelled time", "MFU", "ops", "CPU fallbacks"):
        table.add_column(column)
    counters = torchneuron.metrics.counters()
    for t in est.targets.values():
        table.add_row(f"{t.target} LNC={t.lnc}", f"{t.seconds * 1e6:.1f} us", f"{t.mfu:.2%}",
                      str(counters["ops"]), str(counters["cpu_fallbacks"]))
    console.print(table)


def demo(console: Console, steps: int = 200) -> int:
    """Trains the same MLP on neuron and on CPU and checks that they agree."""
    console.print(f"[bold]target:[/bold] {_target_line()}")
    x, y = make_dataset()
    cpu_model = make_model()
    neuron_model = copy.deepcopy(cpu_model).to("neuron")
    torch.neuron.reset_peak_memory_stats()

    neuron = train(neuron_model, x, y, steps)
    cpu = train(cpu_model, x, y, steps)
    seconds = time_per_step(cpu_model, neuron_model, x, y)
    weight_diff = max(
        (a.detach().cpu() - b.detach()).abs().max().item()
        for a, b in zip(neuron_model.parameters(), cpu_model.parameters())
    )
    on_neuron = all(p.device.type == "neuron" for p in neuron_model.parameters())

    table = Table(title=f"spiral classifier, MLP 2-64-64-2, AdamW, {steps} full-batch steps")
    table.add_column("")
    table.add_column("neuron", justify="right")
    table.add_column("cpu", justify="right")
    for step in LOGGED_STEPS:
        if step < steps:
            table.add_row(f"loss @ step {step}", f"{neuron['losses'][step]:.6f}", f"{cpu['losses'][step]:.6f}")
    table.add_row("final accuracy", f"{neuron['accuracy']:.1%}", f"{cpu['accuracy']:.1%}")
    table.add_row("time per step", f"{seconds['neuron'] * 1e3:.3f} ms", f"{seconds['cpu'] * 1e3:.3f} ms")
    table.add_row("max |w_neuron - w_cpu|", f"{weight_diff:.2e}", "")
    console.print(table)

    mem = Table(title="neuron:0 memory (caching allocator)")
    mem.add_column("statistic")
    mem.add_column("bytes", justify="right")
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved"):
        mem.add_row(f"torch.neuron.{name}()", f"{getattr(torch.neuron, name)():,}")
    console.print(mem)

    _print_modelled_step(console, neuron_model, x, y)

    autocast_ok = True
    try:
        with torch.autocast("neuron", dtype=torch.bfloat16):
            logits = neuron_model(x[:8].to("neuron"))
        console.print(f"autocast('neuron', bfloat16) forward: output dtype {logits.dtype}, "
                      f"device {logits.device}")
    except RuntimeError as e:  # reported, not hidden: the demo then exits non-zero
        autocast_ok = False
        console.print(f"[bold red]autocast('neuron', bfloat16) forward failed:[/bold red] {e}")

    losses_agree = all(
        abs(neuron["losses"][s] - cpu["losses"][s]) <= TOLERANCE for s in neuron["losses"]
    )
    if not (on_neuron and losses_agree and weight_diff <= TOLERANCE):
        console.print(f"[bold red]FAIL[/bold red]: neuron and CPU disagree beyond {TOLERANCE:g} "
                      f"(weights {weight_diff:.2e}, losses agree: {losses_agree}, on neuron: {on_neuron})")
        return 1
    console.print(f"[bold green]OK[/bold green]: neuron matches CPU within {TOLERANCE:g}")
    return 0 if autocast_ok else 1


def _plan(console: Console, args: argparse.Namespace) -> int:
    """``torchneuron plan``: 0 if some configuration fits, 3 if none does, 2 on bad input."""
    import json

    from torchneuron.plan import plan, report

    if not console.is_terminal:  # a log or a pipe: the table's columns, not 80 characters of them
        console = Console(width=max(console.width, 160))
    command = args.command_args[1:] if args.command_args[:1] == ["--"] else args.command_args
    try:
        env = dict(item.split("=", 1) for item in args.env)
    except ValueError:
        console.print(f"[bold red]error[/bold red]: --env takes NAME=VALUE, got {args.env!r}", highlight=False)
        return 2
    try:
        nodes = [int(n) for n in args.nodes.split(",")]
        plans = plan(command, instances=args.instance.split(","), nodes=nodes, lnc=args.lnc,
                     nproc_per_node=args.nproc_per_node, sweep=args.sweep,
                     env=env, steps=args.steps, jobs=args.jobs, tokens_per_step=args.tokens_per_step)
    except (ValueError, FileNotFoundError) as e:
        console.print(f"[bold red]error[/bold red]: {e}", highlight=False)
        return 2
    report.print_table(console, plans)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(plans), f, indent=1)
        console.print(f"JSON: {args.json}", highlight=False)
    if args.html:
        report.write_html(args.html, plans)
        console.print(f"HTML: {args.html}", highlight=False)
    return 0 if any(p.fits for p in plans) else 3


def main(argv: list[str] | None = None) -> int:
    """Parses ``argv`` (``sys.argv[1:]`` if ``None``) and runs a subcommand."""
    parser = argparse.ArgumentParser(
        prog="torchneuron", description="PyTorch's neuron device as a software Trainium."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="show the modelled Trainium target and its devices")
    demo_parser = sub.add_parser("demo", help="train a small model on neuron and compare with CPU")
    demo_parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    check_parser = sub.add_parser(
        "check", help="run a script on neuron and report what would not run well on Trainium",
        usage="torchneuron check [options] (script.py | -m module | test.py::test) [args ...]")
    check_parser.add_argument("-m", dest="module", help="run a module as `python -m` does")
    check_parser.add_argument("--json", default="torchneuron-check.json", help="JSON report path")
    check_parser.add_argument("--html", default="torchneuron-check.html", help="HTML report path")
    check_parser.add_argument("--strict", action="store_true",
                              help="exit 3 naming each CPU fallback and repeated host sync")
    check_parser.add_argument("--target", choices=("trn2", "trn3"), help="chip to model")
    check_parser.add_argument("--lnc", type=int, choices=(1, 2), help="logical core size")
    check_parser.add_argument("--instance", help="instance to size against, e.g. trn2.48xlarge")
    check_parser.add_argument("--steps", type=int, default=0,
                              help="stop after N optimizer steps (default: run to the end)")
    check_parser.add_argument("--migrate", action="store_true",
                              help="run CUDA code (.cuda(), torch.cuda.*, device='cuda', ...) on neuron "
                                   "unedited and write its device-generic rewrite as a diff")
    check_parser.add_argument("--diff", default="torchneuron-migrate.diff",
                              help="where --migrate writes the rewrite (a unified diff)")
    check_parser.add_argument("--detect-nonfinite", action="store_true",
                              help="stop at the first op whose output holds a NaN or Inf and name it "
                                   "(TORCHNEURON_DETECT_NONFINITE=1 for the run)")
    check_parser.add_argument("command_args", nargs=argparse.REMAINDER,
                              help="the script and its arguments (or the module's arguments)")
    plan_parser = sub.add_parser(
        "plan", help="size and time a full-scale job from a dataless run of its script",
        usage="torchneuron plan [options] -- (train.py | -m module) [args ...]")
    plan_parser.add_argument("--instance", default="trn2.48xlarge",
                             help="instance type(s), comma-separated (default trn2.48xlarge)")
    plan_parser.add_argument("--nodes", default="1", help="instance count(s), comma-separated (default 1)")
    plan_parser.add_argument("--lnc", type=int, choices=(1, 2), help="logical core size (default: the chip's)")
    plan_parser.add_argument("--nproc-per-node", type=int,
                             help="ranks per instance, as torchrun's (default: one per logical core)")
    plan_parser.add_argument("--sweep", help='placeholder values, e.g. "tp=1,2,4 pp=1,2": the script\'s '
                                             "arguments (and --env values) name them as {tp}")
    plan_parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                             help="an environment variable for the script (may hold placeholders)")
    plan_parser.add_argument("--steps", type=int, default=0, help="stop each run after N optimizer steps")
    plan_parser.add_argument("--jobs", type=int, help="configurations planned at once (default: cores)")
    plan_parser.add_argument("--tokens-per-step", type=int,
                             help="the job's tokens per step (default: from the embedding lookups)")
    plan_parser.add_argument("--json", help="write the plan as JSON (schema torchneuron-plan/1)")
    plan_parser.add_argument("--html", help="write a self-contained HTML report")
    plan_parser.add_argument("command_args", nargs=argparse.REMAINDER,
                             help="-- then the script and its arguments")
    from torchneuron.distributed import nccom_test

    nccom_test.add_arguments(sub.add_parser(
        "nccom-test", help="collective bandwidth across sizes on N local ranks, measured and modelled"))
    args = parser.parse_args(argv)
    console = Console()
    if args.command == "info":
        return info(console)
    if args.command == "nccom-test":
        return nccom_test.main(
            args, print_line=lambda line: console.print(line, highlight=False, soft_wrap=True))
    if args.command == "plan":
        return _plan(console, args)
    if args.command == "check":
        from torchneuron.check import run_check

        try:
            return run_check(console, args.command_args, module=args.module, json_path=args.json,
                             html_path=args.html, strict=args.strict, target=args.target,
                             lnc=args.lnc, steps=args.steps, instance=args.instance,
                             migrate=args.migrate, diff_path=args.diff,
                             detect_nonfinite=args.detect_nonfinite)
        except (ValueError, FileNotFoundError) as e:
            console.print(f"[bold red]error[/bold red]: {e}", highlight=False)
            return 2
    return demo(console, steps=args.steps)
