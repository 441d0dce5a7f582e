"""Runs the long test suites the default run leaves out, and summarises them.

``--suite conformance`` (the default): PyTorch's own OpInfo, ModuleInfo and OptimizerInfo
databases and real models, each comparing ``neuron`` against CPU (tests/conformance,
``pytest -m conformance``). ``--suite slow``: the tests marked ``slow`` across tests/
(more ranks, more models, more interpreters than the default run's one test of each
behaviour). Both take longer than the default test run, so they sit behind their markers.
This script splits them into shards run by parallel worker processes (one per
core by default), then prints and writes a table: suite, passed, failed,
expected failures, skipped.

    python scripts/conformance.py                 # the conformance suites, one worker per core
    python scripts/conformance.py --suite slow    # the slow tests
    python scripts/conformance.py --jobs 1 -k add # a subset, in one process
    python scripts/conformance.py --write docs/conformance.md

Sharding is deterministic (a hash of each test id), so shard i of n always runs
the same tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Each suite: the marker expression that selects it and where its tests are.
SUITES = {"conformance": ("conformance", "tests/conformance"),
          "slow": ("slow and not conformance", "tests")}
OUTCOMES = ("passed", "failed", "xfailed", "xpassed", "skipped", "error")


class ShardPlugin:
    """pytest plugin: keeps shard `index` of `count` and records each test's outcome."""

    def __init__(self, index: int, count: int, progress: Path) -> None:
        self.index, self.count, self.progress = index, count, progress
        self.outcomes: dict[str, str] = {}
        self.failures: dict[str, str] = {}
        self.seconds: dict[str, float] = {}

    def pytest_collection_modifyitems(self, config, items) -> None:  # noqa: ANN001 (pytest hook)
        keep, drop = [], []
        for item in items:
            shard = zlib.crc32(item.nodeid.encode()) % self.count
            (keep if shard == self.index else drop).append(item)
        items[:] = keep
        config.hook.pytest_deselected(items=drop)

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:  # noqa: ANN001 (pytest hook)
        self.progress.write_text(nodeid)  # names the culprit if the process dies in this test

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001 (pytest hook)
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.outcomes[report.nodeid] = _outcome(report)
            self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
            if report.failed:
                self.failures[report.nodeid] = str(report.longrepr).splitlines()[-1][:300]


def _outcome(report) -> str:  # noqa: ANN001 (pytest TestReport)
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.when == "setup" and report.failed:
        return "error"
    return report.outcome


def run_shard(suite: str, index: int, count: int, pytest_args: list[str], out: Path) -> int:
    """Runs one shard of ``suite`` in this process and writes its outcomes as JSON to `out`."""
    import pytest

    marker, directory = SUITES[suite]
    plugin = ShardPlugin(index, count, out.with_suffix(".current"))
    code = pytest.main(["-q", "-m", marker, "-p", "no:cacheprovider", directory, *pytest_args],
                       plugins=[plugin])
    out.write_text(json.dumps(
        {"outcomes": plugin.outcomes, "failures": plugin.failures, "seconds": plugin.seconds}))
    return int(code)


def run_shard_to_end(suite: str, index: int, count: int, pytest_args: list[str], tmp: Path,
                     quiet: bool) -> dict:
    """Runs shard `index` in worker processes until it completes.

    A test that kills its process (a crash in native code) is recorded as failed,
    and the shard restarts without it, so one crash does not hide the rest.
    """
    merged: dict = {"outcomes": {}, "failures": {}, "seconds": {}}
    crashed: list[str] = []
    while True:
        out = tmp / f"shard{index}-{len(crashed)}.json"
        deselect = [arg for nodeid in crashed for arg in ("--deselect", nodeid)]
        code = subprocess.call(
            [sys.executable, __file__, "--suite", suite, "--shard", f"{index}/{count}:{out}", *pytest_args,
             *deselect],
            stdout=subprocess.DEVNULL if quiet else None)
        if out.exists():
            data = json.loads(out.read_text())
            for key in merged:
                merged[key].update(data[key])
            return merged
        current = out.with_suffix(".current")
        culprit = current.read_text() if current.exists() else None
        if culprit is None or culprit in crashed:
            raise RuntimeError(f"{suite} shard {index} died (exit {code}) outside any test")
        crashed.append(culprit)
        merged["outcomes"][culprit] = "failed"
        merged["failures"][culprit] = f"the test process died (exit code {code}): a crash in native code"


def suite_of(nodeid: str) -> str:
    """Suite name of a test id: its file without the test_ prefix (ops, modules ...)."""
    return Path(nodeid.split("::")[0]).stem.removeprefix("test_")


def summarise(outcomes: dict[str, str]) -> dict[str, Counter]:
    table: dict[str, Counter] = defaultdict(Counter)
    for nodeid, outcome in outcomes.items():
        table[suite_of(nodeid)][outcome] += 1
    return dict(sorted(table.items()))


def markdown(table: dict[str, Counter], seconds: float, jobs: int) -> str:
    lines = ["| suite | passed | failed | expected failures | skipped |", "|---|---:|---:|---:|---:|"]
    total: Counter = Counter()
    for suite, counts in table.items():
        total.update(counts)
        lines.append(f"| {suite} | {counts['passed']} | {counts['failed'] + counts['error'] + counts['xpassed']}"
                     f" | {counts['xfailed']} | {counts['skipped']} |")
    lines.append(f"| **total** | {total['passed']} | {total['failed'] + total['error'] + total['xpassed']}"
                 f" | {total['xfailed']} | {total['skipped']} |")
    lines.append("")
    lines.append(f"{time.strftime('%Y-%m-%d')}, {jobs} worker(s), {seconds / 60:.1f} min. "
                 "Failed counts errors and unexpected passes of expected failures.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="conformance",
                        help="which long suite (default: conformance)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: cores)")
    parser.add_argument("--slowest", type=int, default=10, help="list this many slowest tests")
    parser.add_argument("--write", type=Path, help="also write the summary table to this markdown file")
    parser.add_argument("--shard", help=argparse.SUPPRESS)  # "i/n:out.json": run by the workers
    args, pytest_args = parser.parse_known_args(argv)

    if args.shard:
        spec, out = args.shard.split(":", 1)
        index, count = (int(x) for x in spec.split("/"))
        return run_shard(args.suite, index, count, pytest_args, Path(out))

    os.chdir(ROOT)
    start = time.monotonic()
    outcomes: dict[str, str] = {}
    failures: dict[str, str] = {}
    durations: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        shards = [pool.submit(run_shard_to_end, args.suite, i, args.jobs, pytest_args, Path(tmp), args.jobs > 1)
                  for i in range(args.jobs)]
        for shard in shards:
            data = shard.result()
            outcomes.update(data["outcomes"])
            failures.update(data["failures"])
            durations.update(data["seconds"])
    seconds = time.monotonic() - start

    print("slowest tests:")
    for nodeid, took in sorted(durations.items(), key=lambda kv: -kv[1])[: args.slowest]:
        print(f"  {took:7.2f} s  {nodeid}")
    for nodeid, message in sorted(failures.items()):
        print(f"FAILED {nodeid}: {message}")
    table = markdown(summarise(outcomes), seconds, args.jobs)
    print(table)
    if args.write:
        args.write.write_text(table + "\n")
    bad = sum(1 for o in outcomes.values() if o in ("failed", "error", "xpassed"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
