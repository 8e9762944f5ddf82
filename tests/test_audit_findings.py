"""``aiayn audit``'s terminal findings: under the matrix, each unexpected result's measured and expected values
and hint (``--brief``: one line each, as before)."""

from __future__ import annotations

import pytest

from aiayn_conformance.audit import AuditResult, ClauseResult, SubjectResult, report
from aiayn_conformance.conformance.helpers.harness import ClauseViolation, checking, violation


def a_violation(**fields: str) -> str:
    """The diagnostic the suite writes for a violation of norm.post-norm with ``fields``."""
    with checking("norm.post-norm"), pytest.raises(ClauseViolation) as exc:
        violation(**fields)  # type: ignore[arg-type]
    return str(exc.value)


def result_with(detail: str, status: str = "fail") -> AuditResult:
    first = detail.splitlines()[0]
    clauses = {"norm.post-norm": ClauseResult(status, first, detail, 2), "attention.scale": ClauseResult("pass")}
    return AuditResult([SubjectResult("mine", "implementation", clauses=clauses)], seconds=1.0)


def test_findings_show_measured_expected_and_hint_under_the_matrix():
    detail = a_violation(measured="pre-norm: LayerNorm before each sub-layer", expected="LayerNorm(x + Sublayer(x))",
                         call="forward(src [3, 7], tgt [3, 5])", hint="move the norm after the residual sum")
    out = report.text(result_with(detail))
    matrix, findings = out.split("Findings:")
    assert "mine" in matrix and "nonconforming" in matrix
    lines = findings.splitlines()
    assert lines[1].startswith("  FAIL mine norm.post-norm (") and "[norm.post-norm]" in lines[1]
    assert lines[2].split() == ["measured:", "pre-norm:", "LayerNorm", "before", "each", "sub-layer"]
    assert lines[3].strip() == "expected: LayerNorm(x + Sublayer(x))"
    assert lines[4].strip() == "call:     forward(src [3, 7], tgt [3, 5])"
    assert lines[5].strip() == "hint:     move the norm after the residual sum"


def test_brief_keeps_one_line_per_unexpected_result():
    detail = a_violation(measured="beta2 0.999", expected="beta2 0.98", hint="Adam(betas=(0.9, 0.98))")
    out = report.render(result_with(detail), "text", brief=True)
    assert "Unexpected results:" in out and "Findings:" not in out
    assert "beta2 0.999" not in out and "FAIL mine norm.post-norm" in out


def test_an_error_without_measured_values_shows_its_message_only():
    detail = "[norm.post-norm] (§3.1) could not be checked: forward raised\n  Traceback: ..."
    out = report.text(result_with(detail, status="error"))
    finding = out.split("Findings:")[1].splitlines()
    assert finding[1].startswith("  ERROR mine norm.post-norm") and "could not be checked" in finding[1]
    assert finding[2].startswith("Re-run one with full detail")


def test_continued_lines_join_their_field():
    detail = "[x] head\n  measured: a long value\n    that goes on\n  expected: b\nnot a field: c"
    assert report.finding_fields(detail) == [("measured", "a long value that goes on"), ("expected", "b")]


def test_other_formats_are_unchanged_by_brief():
    detail = a_violation(measured="m", expected="e", hint="h")
    res = result_with(detail)
    for fmt in ("md", "json", "junit", "github"):
        assert report.render(res, fmt) == report.render(res, fmt, brief=True)
