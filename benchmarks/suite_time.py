"""Wall time of the conformance suite per implementation (``pytest conformance/ --impl=NAME``), one at a time.

Targets: under 30 s for the reference on CPU (the checks issue); at most 20 s, ONNX export excluded, for each
model of ``tests/shape_limited_models.py``, which accept only some shapes (the shape-contract issue: a model
that rejects shapes must cost about what a conforming one costs). Each run is a fresh process with the default
(``ci``) hypothesis profile, as a user runs it; the figure includes interpreter and torch start-up.

``--test-command`` times the README's test command instead (the pytest part of its second code block, run as
written from the checkout): the project's whole test run, target at most 10 minutes on a 2-core machine.
``--area decode`` times one area alone (``pytest conformance/test_decode.py``, so every clause ``decode.*``) per
implementation, against that area's budget (the decode area: 10 s per implementation, the long-horizon issue);
the shape-limited models are then left out.

``--config base --config big`` times ``aiayn audit --impl NAME --config SPEC`` (the time to a verdict as a user gets it:
the audit splits one implementation's run over pytest-xdist workers where the CPUs and memory allow) at those sizes
(Table 3's presets, or any ``--config`` the audit takes) beside TINY's in the same run, per implementation, with the
peak resident memory of all its processes together and of the largest, against the size targets (base at most
120 s, big at most 300 s on a 2-core CPU).

Usage: ``python -m benchmarks.suite_time [--impl reference,fused,torch-nn] [--repeats N] [--skip-shape-limited]
[--area AREA] [--test-command] [--config SPEC ...]``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 30.0
SHAPE_LIMITED_PLUGIN = ROOT / "tests" / "shape_limited_models.py"
SHAPE_LIMITED = ("shape-fixed-length", "shape-max-length-4", "shape-batch-of-one")
SHAPE_LIMITED_TARGET_S = 20.0
TEST_COMMAND_TARGET_S = 600.0


def readme_test_command() -> list[str]:
    """The pytest command of the README's second code block (after its ``pip install ... &&``), as argv."""
    blocks = (ROOT / "README.md").read_text().split("```")[1::2]
    command = shlex.split(blocks[1].strip().split("&&")[-1])
    if command[:3] != ["python3", "-m", "pytest"]:
        raise SystemExit(f"the README's second code block is not a pytest command: {' '.join(command)}")
    return [sys.executable, *command[1:]]


def time_test_command(timeout: float = 3600) -> int:
    """Run the README's test command once and print its wall time against the target."""
    cmd = readme_test_command()
    print(f"README test command: {' '.join(['python3', *cmd[1:]])}")
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - t0
    summary = (res.stdout.strip().splitlines() or ["no output"])[-1].strip("= ")
    verdict = "met" if seconds <= TEST_COMMAND_TARGET_S else f"missed by {seconds - TEST_COMMAND_TARGET_S:.0f} s"
    print(f"| wall s | target | result |\n|---|---|---|\n| {seconds:.0f} | <= {TEST_COMMAND_TARGET_S:.0f} s: {verdict} "
          f"| {summary} |")
    return res.returncode
AREA_TARGET_S = {"decode": 10.0}  # seconds per implementation for one area alone, where an issue set one


def run_once(impl: str, *extra: str, timeout: float = 1800, target: str = "conformance/") -> tuple[float, str, int]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "pytest", target, f"--impl={impl}", "-q",
                          "-p", "no:cacheprovider", *extra], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - t0
    summary = (res.stdout.strip().splitlines() or ["no output"])[-1].strip("= ")
    return seconds, summary, res.returncode


SIZE_TARGET_S = {"base": 120.0, "big": 300.0}


def _tree_rss(root: int) -> tuple[int, int]:
    """(the summed, the largest) resident set in bytes of process ``root`` and its descendants, read from /proc
    (0, 0 where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total = largest = 0
    todo = [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            rss = int((Path("/proc") / str(pid) / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
        total, largest = total + rss, max(largest, rss)
    return total, largest


def run_at(impl: str, config: str | None, timeout: float = 7200) -> tuple[float, float, float, int, str]:
    """(wall s, peak resident GiB of all its processes together, of the largest one, exit status, the audit's
    summary line) of ``aiayn audit --impl IMPL [--config CONFIG]``: the time to a verdict as a user gets it (with
    the audit's own choice of processes, ``audit.runner.split_workers``). Memory is sampled every 0.2 s."""
    with tempfile.TemporaryDirectory(prefix="suite-time-") as tmp:
        cmd = [sys.executable, "-m", "aiayn_conformance", "audit", "--impl", impl, "--format", "json",
               "--output", str(Path(tmp) / "audit.json"), *(["--config", config] if config else [])]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        reader = threading.Thread(target=lambda: setattr(proc, "captured", proc.communicate()), daemon=True)
        reader.start()
        total = largest = 0
        while reader.is_alive():
            now = _tree_rss(proc.pid)
            total, largest = max(total, now[0]), max(largest, now[1])
            reader.join(0.2)
            if time.perf_counter() - t0 > timeout:
                proc.kill()
        seconds = time.perf_counter() - t0
        _, err = getattr(proc, "captured", ("", ""))
    lines = [ln for ln in (err or "").splitlines() if ln.strip()]
    summary = next((ln for ln in reversed(lines) if "conforming" in ln), lines[-1] if lines else "no output")
    return seconds, total / 2**30, largest / 2**30, proc.returncode, summary.strip()


def time_sizes(impls: list[str], configs: list[str]) -> int:
    """Each implementation at TINY and at each of ``configs``, one after the other, in fresh processes."""
    print("| implementation | configuration | wall s | peak memory GiB, all processes (largest) | target | result |")
    print("|---|---|---|---|---|---|")
    worst = 0
    for impl in impls:
        for config in [None, *configs]:
            seconds, peak, largest, code, summary = run_at(impl, config)
            budget = SIZE_TARGET_S.get(config or "")
            verdict = "" if budget is None else ("met" if seconds <= budget else
                                                 f"missed by {seconds - budget:.0f} s")
            print(f"| {impl} | {config or 'tiny (default)'} | {seconds:.0f} | {peak:.2f} ({largest:.2f}) | "
                  f"{f'<= {budget:g} s: {verdict}' if budget else ''} | {summary} |", flush=True)
            worst = max(worst, code)
    return worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite_time", description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="reference,fused,torch-nn")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--skip-shape-limited", action="store_true", help="leave out the shape-limited models")
    p.add_argument("--test-command", action="store_true",
                   help="time the README's test command (the whole test run) instead, target <= 600 s")
    p.add_argument("--area", help="time this area alone (conformance/test_AREA.py), e.g. decode")
    p.add_argument("--config", action="append", metavar="SPEC",
                   help="time the suite at these sizes beside TINY's (repeatable: --config base --config big; any "
                        "--config the audit takes, e.g. base,N=2)")
    args = p.parse_args(argv)
    if args.config:
        return time_sizes([s.strip() for s in args.impl.split(",") if s.strip()], args.config)
    if args.test_command:
        return time_test_command()
    if args.area:
        return time_area(args.area, [s.strip() for s in args.impl.split(",") if s.strip()], args.repeats)
    print("| implementation | wall s (median) | without ONNX export s | result |")
    print("|---|---|---|---|")
    for impl in [s.strip() for s in args.impl.split(",") if s.strip()]:
        runs = [run_once(impl) for _ in range(args.repeats)]
        no_onnx = run_once(impl, "--ignore=conformance/test_export.py")[0]
        med = statistics.median(r[0] for r in runs)
        flag = "" if impl != "reference" else (" (target < 30 s: met)" if med < TARGET_S else
                                               f" (target < 30 s: missed by {med - TARGET_S:.1f} s)")
        print(f"| {impl} | {med:.1f}{flag} | {no_onnx:.1f} | {runs[-1][1]} |")
    if args.skip_shape_limited or not SHAPE_LIMITED_PLUGIN.exists():
        return 0
    print()
    print(f"Models that accept only some shapes (target: at most {SHAPE_LIMITED_TARGET_S:g} s each, without the ONNX "
          "export):")
    print()
    print("| implementation | wall s (median) | result |")
    print("|---|---|---|")
    for impl in SHAPE_LIMITED:
        runs = [run_once(impl, f"--plugin={SHAPE_LIMITED_PLUGIN}", "--ignore=conformance/test_export.py")
                for _ in range(args.repeats)]
        med = statistics.median(r[0] for r in runs)
        verdict = "met" if med <= SHAPE_LIMITED_TARGET_S else f"missed by {med - SHAPE_LIMITED_TARGET_S:.1f} s"
        print(f"| {impl} | {med:.1f} (target: {verdict}) | {runs[-1][1]} |")
    return 0


def time_area(area: str, impls: list[str], repeats: int) -> int:
    """One area's checks alone, per implementation: wall time (median of ``repeats`` fresh processes)."""
    target = ROOT / "conformance" / f"test_{area}.py"
    if not target.exists():
        areas = sorted(f.stem.removeprefix("test_") for f in (ROOT / "conformance").glob("test_*.py"))
        print(f"error: unknown area {area!r}; accepted: {', '.join(areas)}", file=sys.stderr)
        return 2
    budget = AREA_TARGET_S.get(area)
    print(f"Area {area} alone (pytest conformance/test_{area}.py)" + (f", target at most {budget:g} s each" if budget
                                                                      else "") + ":")
    print()
    print("| implementation | wall s (median) | result |")
    print("|---|---|---|")
    for impl in impls:
        runs = [run_once(impl, target=f"conformance/test_{area}.py") for _ in range(repeats)]
        med = statistics.median(r[0] for r in runs)
        verdict = "" if budget is None else (" (target: met)" if med <= budget else
                                             f" (target: missed by {med - budget:.1f} s)")
        print(f"| {impl} | {med:.1f}{verdict} | {runs[-1][1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
