"""``python -m benchmarks``: every benchmark in one run; prints the tables and writes BENCHMARKS.md.

Options: ``--quick`` (the ``small`` preset of ``benchmarks.perf`` only, for a smoke run), ``--repeats N``,
``--skip-suite``, ``--skip-onnx``, ``--skip-decode``, ``--output PATH`` (default BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import io
import platform
import sys
from contextlib import redirect_stdout
from pathlib import Path

from . import cpu_name, perf


def machine() -> str:
    import torch

    cpu = cpu_name()
    import os

    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"
    return (f"{cpu}, {os.cpu_count()} logical cores, torch threads {torch.get_num_threads()}{gpu}; "
            f"Python {platform.python_version()}, torch {torch.__version__}, {platform.system()} {platform.release()}")


def optional_section(module: str, title: str, argv: list[str], *, fenced: bool = True) -> str:
    """Run another benchmark module's main() if it exists, capturing what it prints (as a code block, or
    as Markdown when ``fenced`` is False)."""
    try:
        mod = importlib.import_module(f"benchmarks.{module}")
    except ImportError as exc:
        return f"## {title}\n\n(not run: {exc})\n"
    buf = io.StringIO()
    try:
        with redirect_stdout(buf):
            mod.main(argv)
    except SystemExit:
        pass
    except Exception as exc:  # a failing optional benchmark must not lose the others' figures
        return f"## {title}\n\n(failed: {type(exc).__name__}: {exc})\n\n```\n{buf.getvalue()}```\n"
    print(buf.getvalue())
    if not fenced:
        return f"## {title}\n\n{buf.getvalue().strip()}\n"
    return f"## {title}\n\n```\n{buf.getvalue().strip()}\n```\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-suite", action="store_true")
    parser.add_argument("--skip-onnx", action="store_true")
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--output", default="BENCHMARKS.md")
    args = parser.parse_args(argv)

    started = datetime.datetime.now(datetime.timezone.utc)
    device = "cuda" if perf._cuda() else "cpu"
    dtypes = ("float32", "bfloat16") if device == "cuda" else ("float32",)
    workloads = perf.WORKLOADS[:1] if args.quick else perf.WORKLOADS
    results, peak = perf.run_all(perf.IMPLS, workloads, repeats=args.repeats, device=device, dtypes=dtypes,
                                 progress=lambda m: print(m, file=sys.stderr))
    throughput = perf.table(results, peak)
    print(throughput)
    verdicts = perf.targets(results, peak)
    print("\n".join(verdicts))
    sections = [
        "# Benchmarks",
        "",
        f"Measured {started:%Y-%m-%d %H:%M} UTC with `python -m benchmarks{' --quick' if args.quick else ''}`.",
        f"Machine: {machine()}.",
        "",
        "Timings on a shared machine are noisy: each figure is the median of the repeats with the spread "
        "(half the max-min range over the median); compare implementations by the ratios, measured in the same run.",
        "",
        f"## Training and inference throughput ({device})",
        "",
        f"Matmul peak measured in this run: {peak / 1e9:.1f} GFLOP/s (float32 {2048}x{2048} matmul, best of 15). "
        "Tokens count source plus target tokens; GFLOP/s are model FLOPs (counted on the reference) per second.",
        "",
        throughput,
        "",
        "### Targets (issue: benchmarks)",
        "",
        *verdicts,
        "",
    ]
    if not args.skip_suite:
        sections.append(optional_section("suite_time", "Conformance suite wall time", []))
    if not args.skip_onnx:
        sections.append(optional_section("onnx_bench", "ONNX export and onnxruntime", []))
    if not args.skip_decode:
        decode_argv = ["--repeats", str(args.repeats)] + (["--preset", "small", "--batches", "1"] if args.quick else [])
        sections.append(optional_section("decode_bench", "Decoding (§6.1): cached, recomputed, onnxruntime, "
                                         "CTranslate2", decode_argv, fenced=False))
    Path(args.output).write_text("\n".join(sections))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
