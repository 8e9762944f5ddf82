"""``python -m benchmarks`` rewrites BENCHMARKS.md: the sections it does not write (measurements recorded by hand)
are kept, a section it writes replaces the old one, and a heading inside a code block is not a heading."""

from __future__ import annotations

from pathlib import Path

from benchmarks.__main__ import keep_notes

OLD = """# Benchmarks

Measured yesterday.

## Throughput

old figures

### Targets

old verdicts

### Notes by hand

a measurement

## Suite time

```
## not a heading: the suite's output
```

### The test command's history

| run | s |

## Interleaved decoding (by hand)

grid 1

### An earlier grid

grid 0
"""

NEW = """# Benchmarks

Measured today.

## Throughput

new figures

### Targets

new verdicts

## Suite time

```
## not a heading: the suite's new output
```
"""


def test_sections_the_run_does_not_write_are_kept_and_written_ones_replaced():
    text, kept = keep_notes(OLD, NEW)
    assert kept == 3  # two subsections and one section
    assert "Measured today." in text and "Measured yesterday." not in text
    assert "new figures" in text and "old figures" not in text
    assert "new verdicts" in text and "old verdicts" not in text  # a written subsection replaces the old one
    assert text.index("new verdicts") < text.index("### Notes by hand") < text.index("## Suite time")
    assert "the suite's new output" in text and "the suite's output\n" not in text
    assert text.index("## Suite time") < text.index("### The test command's history") < text.index("grid 1")
    assert text.index("## Interleaved decoding (by hand)") < text.index("### An earlier grid") < text.index("grid 0")


def test_rerunning_on_its_own_output_keeps_nothing_twice():
    once, _ = keep_notes(OLD, NEW)
    twice, kept = keep_notes(once, NEW)
    assert twice == once and kept == 3


def test_the_projects_benchmarks_file_loses_no_heading_to_a_rerun():
    """What a re-run of every generated section would leave of BENCHMARKS.md: every heading is still there."""
    old = (Path(__file__).resolve().parents[1] / "BENCHMARKS.md").read_text()
    generated = "# Benchmarks\n\n## Training and inference throughput (cpu)\n\nfigures\n"
    text, _ = keep_notes(old, generated)
    headings = [ln for ln in old.splitlines() if ln.startswith(("## ", "### "))]
    assert [ln for ln in text.splitlines() if ln in headings] == headings
