"""``python -m benchmarks``: every benchmark in one run; prints the tables and writes BENCHMARKS.md.

The sections and subsections of the existing file that this run does not write (measurements recorded by hand,
such as the interleaved decoding grids of ``benchmarks.decode_interleaved``) are kept (``keep_notes``).

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


def _sections(text: str) -> tuple[list[str], list[tuple[str, list[str], list[tuple[str, list[str]]]]]]:
    """Markdown split by its headings outside code fences: (the lines before the first ``## ``, then per ``## ``
    section: its heading, the lines before its first ``### ``, and its ``### `` subsections as (heading, lines))."""
    head: list[str] = []
    sections: list[tuple[str, list[str], list[tuple[str, list[str]]]]] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            sections.append((line, [], []))
        elif not fenced and line.startswith("### ") and sections:
            sections[-1][2].append((line, []))
        elif not sections:
            head.append(line)
        elif sections[-1][2]:
            sections[-1][2][-1][1].append(line)
        else:
            sections[-1][1].append(line)
    return head, sections


def keep_notes(old: str, new: str) -> tuple[str, int]:
    """``new`` (this run's BENCHMARKS.md) with what only ``old`` (the file it replaces) has: each ``## `` section
    this run does not write, at the end in its old order, and each ``### `` subsection a written section lacks, at
    the end of that section. The hand-written measurements (the interleaved decoding grids, the test command's
    history) survive a re-run; a section or subsection this run writes replaces the old one. Returns the text and
    how many sections and subsections were kept."""
    head, sections = _sections(new)
    _, old_sections = _sections(old)
    by_heading = {heading: subs for heading, _, subs in sections}
    kept = 0
    for heading, intro, subs in old_sections:
        if heading not in by_heading:
            sections.append((heading, intro, subs))
            kept += 1
            continue
        present = {h for h, _ in by_heading[heading]}
        for sub in subs:
            if sub[0] not in present:
                by_heading[heading].append(sub)
                kept += 1
    lines = list(head)
    for heading, intro, subs in sections:
        lines += [heading, *intro]
        for sub_heading, sub_lines in subs:
            if lines and lines[-1].strip():
                lines.append("")
            lines += [sub_heading, *sub_lines]
        if lines and lines[-1].strip():
            lines.append("")
    return "\n".join(lines).rstrip() + "\n", kept


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
    text, output = "\n".join(sections), Path(args.output)
    if output.exists():  # the notes written by hand below the generated figures are kept, not lost
        text, kept = keep_notes(output.read_text(), text)
        if kept:
            print(f"{output}: kept {kept} section(s) this run does not write (hand-written measurements)",
                  file=sys.stderr)
    output.write_text(text)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
