"""The decode area reaches every audit format: a column in the terminal and Markdown matrices, its clause
ids in JSON, one column per decode clause in HTML; and the README lists the decode clauses."""

from __future__ import annotations

import json
from pathlib import Path

from aiayn_conformance.audit import report
from aiayn_conformance.audit.results import AuditResult, ClauseResult, SubjectResult
from aiayn_conformance.spec import AREAS, CLAUSES

ROOT = Path(__file__).resolve().parents[1]
DECODE = [c for c in CLAUSES if c.startswith("decode.")]


def result() -> AuditResult:
    statuses = {"model.shape": "pass", "decode.incremental": "pass", "decode.greedy": "not-applicable",
                "decode.beam": "fail", "decode.max-length": "deviation"}
    s = SubjectResult("x", "implementation", source="x.py", summary="a model")
    s.clauses = {c: ClauseResult(st, "" if st == "pass" else f"{c} message", "detail") for c, st in statuses.items()}
    return AuditResult([s], seconds=1.0, command="aiayn audit --impl x")


def test_the_catalogue_has_the_decode_area():
    assert "decode" in AREAS
    assert DECODE == ["decode.incremental", "decode.greedy", "decode.beam", "decode.max-length"]
    assert {c: CLAUSES[c].severity for c in DECODE} == {"decode.incremental": "must", "decode.greedy": "should",
                                                        "decode.beam": "must", "decode.max-length": "must"}


def test_terminal_and_markdown_show_a_decode_column():
    text = report.text(result())
    header = text.splitlines()[0].split()
    assert "decode" in header
    row = next(ln for ln in text.splitlines() if ln.startswith("x "))
    assert ".-FD" in row  # incremental pass, greedy not applicable, beam fail, max-length deviation, in catalogue order
    md = report.markdown(result())
    head = next(ln for ln in md.splitlines() if ln.startswith("| subject |"))
    assert "| decode |" in head and "`.-FD`" in md


def test_json_and_html_carry_the_decode_clauses():
    data = json.loads(report.as_json(result()))
    clauses = data["implementations"]["x"]["clauses"]
    assert [c for c in clauses if c.startswith("decode.")] == DECODE
    assert clauses["decode.beam"]["severity"] == "must" and clauses["decode.beam"]["section"] == "§6.1"
    page = report.as_html(result())
    for c in DECODE:
        assert f">{c}</th>" in page


def test_readme_lists_the_decode_clauses():
    readme = (ROOT / "README.md").read_text()
    for c in DECODE:
        assert f"`{c}`" in readme, f"README.md does not list {c}"
