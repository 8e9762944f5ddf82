"""Wall time of the conformance suite per implementation (``pytest conformance/ --impl=NAME``), one at a time.

Target (the checks issue): under 30 s for the reference on CPU. Each run is a fresh process with the
default (``ci``) hypothesis profile, as a user runs it; the figure includes interpreter and torch start-up.

Usage: ``python -m benchmarks.suite_time [--impl reference,fused,torch-nn] [--repeats N]``.
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
    args = p.parse_args(argv)
    print("| implementation | wall s (median) | without ONNX export s | result |")
    print("|---|---|---|---|")
    for impl in [s.strip() for s in args.impl.split(",") if s.strip()]:
        runs = [run_once(impl) for _ in range(args.repeats)]
        no_onnx = run_once(impl, "--ignore=conformance/test_export.py")[0]
        med = statistics.median(r[0] for r in runs)
        flag = "" if impl != "reference" else (" (target < 30 s: met)" if med < TARGET_S else
                                               f" (target < 30 s: missed by {med - TARGET_S:.1f} s)")
        print(f"| {impl} | {med:.1f}{flag} | {no_onnx:.1f} | {runs[-1][1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
