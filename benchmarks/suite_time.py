"""Wall time of the conformance suite per implementation (``pytest conformance/ --impl=NAME``), one at a time.

Targets: under 30 s for the reference on CPU (the checks issue); at most 20 s, ONNX export excluded, for each
model of ``tests/shape_limited_models.py``, which accept only some shapes (the shape-contract issue: a model
that rejects shapes must cost about what a conforming one costs). Each run is a fresh process with the default
(``ci``) hypothesis profile, as a user runs it; the figure includes interpreter and torch start-up.

Usage: ``python -m benchmarks.suite_time [--impl reference,fused,torch-nn] [--repeats N] [--skip-shape-limited]``.

``--test-command`` times the README's test command instead (the pytest part of its second code block, run as
written from the checkout): the project's whole test run, target at most 10 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
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
    command = blocks[1].strip().split("&&")[-1].split()
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


def run_once(impl: str, *extra: str, timeout: float = 1800) -> tuple[float, str, int]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "pytest", "conformance/", f"--impl={impl}", "-q",
                          "-p", "no:cacheprovider", *extra], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - t0
    summary = (res.stdout.strip().splitlines() or ["no output"])[-1].strip("= ")
    return seconds, summary, res.returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite_time", description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="reference,fused,torch-nn")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--skip-shape-limited", action="store_true", help="leave out the shape-limited models")
    p.add_argument("--test-command", action="store_true",
                   help="time the README's test command (the whole test run) instead, target <= 600 s")
    args = p.parse_args(argv)
    if args.test_command:
        return time_test_command()
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


if __name__ == "__main__":
    raise SystemExit(main())
