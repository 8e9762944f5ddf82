"""``aiayn audit``: folding test records into statuses, verdicts, exit codes and the four report formats."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from aiayn_conformance.audit import AuditResult, ClauseResult, SubjectResult, fold, report
from aiayn_conformance.cli import main
from aiayn_conformance.spec import CLAUSES
from aiayn_conformance.spec.clauses import NOT_APPLICABLE

ROOT = Path(__file__).resolve().parents[1]


def rec(clause: str, outcome: str, message: str = "") -> dict:
    return {"nodeid": f"t::{clause}::{outcome}", "subject": "impl:x", "clause": clause, "outcome": outcome,
            "declared": False, "message": message, "detail": message + "\nmore", "duration": 0.1}


# -- folding ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("outcomes, declared, status", [
    (["passed", "passed"], False, "pass"),
    (["passed", "failed"], False, "fail"),
    (["passed", "error"], False, "error"),
    (["failed", "error"], True, "deviation"),  # a finding stands beside an error
    (["failed", "error"], False, "fail"),
    (["error", "skipped"], False, "error"),
    (["skipped", "skipped"], False, "not-judged"),
    (["passed", "skipped"], False, "pass"),
    (["xfailed", "xpassed"], True, "deviation"),
    (["xpassed", "passed"], True, "unexpected-pass"),
    (["skipped"], True, "not-judged"),
])
def test_fold_gives_one_status_per_clause(outcomes, declared, status):
    records = [rec("attention.scale", o, f"msg {o}") for o in outcomes]
    got = fold(records, {"attention.scale": "divides by sqrt(d_model)"} if declared else {})
    assert got["attention.scale"].status == status, (outcomes, declared, got)
    assert got["attention.scale"].tests == len(outcomes)


def test_a_clause_every_check_of_which_skipped_is_not_judged_with_every_reason_or_not_applicable():
    na = NOT_APPLICABLE + "x has no generate"
    got = fold([rec("decode.beam", "skipped", na), rec("decode.beam", "skipped", na)], {})["decode.beam"]
    assert got.status == "not-applicable" and got.message == "x has no generate", got
    got = fold([rec("decode.beam", "skipped", na), rec("decode.beam", "skipped", "no end symbol finishes")],
               {})["decode.beam"]
    assert got.status == "not-judged" and got.message == "no end symbol finishes", got
    assert "x has no generate" in got.detail and "no end symbol finishes" in got.detail, got.detail


def test_fold_keeps_the_message_of_the_finding_and_ignores_unknown_clauses():
    got = fold([rec("mask.causal", "passed"), rec("mask.causal", "failed", "position 2 saw token 3"),
                rec(None, "failed"), rec("no.such", "failed")], {})
    assert list(got) == ["mask.causal"]
    assert got["mask.causal"].message == "position 2 saw token 3"
    dev = fold([rec("mask.causal", "xfailed", "leak")], {"mask.causal": "fills with 1e-9"})["mask.causal"]
    assert "fills with 1e-9" in dev.message and "leak" in dev.detail


def subject(name: str, statuses: dict[str, str], kind: str = "implementation") -> SubjectResult:
    s = SubjectResult(name, kind, source=f"{name}.py", summary=f"the {name} model")
    s.clauses = {c: ClauseResult(st, f"{c} message" if st != "pass" else "", "detail line")
                 for c, st in statuses.items()}
    return s


def test_verdict_counts_broken_must_and_should_clauses():
    assert subject("a", {"attention.scale": "pass", "device.parity": "not-judged"}).verdict == "conforming"
    s = subject("b", {"attention.scale": "fail", "mask.causal": "deviation", "device.portable": "error",
                      "norm.post-norm": "unexpected-pass"})
    assert CLAUSES["device.portable"].severity == "should"
    assert s.verdict == "nonconforming (2 must, 0 should)"  # an error is no finding
    assert not s.conforming and sorted(s.bad) == ["attention.scale", "device.portable", "norm.post-norm"]


@pytest.mark.parametrize("status", ["not-judged", "error"])
def test_a_must_clause_no_check_judged_is_never_a_pass_nor_a_departure(status):
    s = subject("d", {"attention.scale": "pass", "norm.post-norm": status, "mask.finite": "fail"})
    assert not s.conforming and s.verdict == "not judged (1 must; 1 should broken)", s.verdict
    assert s.to_json()["not_judged"] == {"must": 1, "should": 0} and s.to_json()["broken"]["must"] == 0
    s = subject("e", {"attention.scale": "fail", "norm.post-norm": status})
    assert s.verdict == "nonconforming (1 must, 0 should; 1 must not judged)", s.verdict


def test_a_clause_that_does_not_apply_leaves_the_verdict_alone():
    s = subject("f", {"attention.scale": "pass", "decode.beam": "not-applicable"})
    assert CLAUSES["decode.beam"].severity == "must"
    assert s.conforming and s.verdict == "conforming"
    assert s.to_json()["clauses"]["decode.beam"]["outcome"] == "not applicable"


def test_should_clauses_alone_do_not_make_a_subject_nonconforming():
    """A model that computes the paper's function is conforming whatever its robustness and portability results."""
    assert CLAUSES["mask.finite"].severity == CLAUSES["device.portable"].severity == "should"
    s = subject("c", {"attention.scale": "pass", "mask.finite": "deviation", "device.portable": "fail"})
    assert s.conforming and s.verdict == "conforming (0 must, 2 should)"
    assert s.to_json()["conforming"] is True and s.to_json()["broken"] == {"must": 0, "should": 2}
    assert sorted(s.bad) == ["device.portable"]  # an undeclared failure still fails the audit's exit status


@pytest.mark.parametrize("statuses, code", [
    ({"attention.scale": "pass"}, 0),
    ({"attention.scale": "deviation", "mask.causal": "not-judged"}, 0),  # only declared deviations: exit 0
    ({"attention.scale": "fail"}, 1),
    ({"attention.scale": "error"}, 1),
    ({"attention.scale": "unexpected-pass"}, 1),
])
def test_exit_code(statuses, code):
    assert AuditResult([subject("ok", {"mask.causal": "pass"}), subject("x", statuses)]).exit_code == code


# -- renderers ---------------------------------------------------------------------------------------------------
def fake_result() -> AuditResult:
    good = subject("good", {c: "pass" for c in CLAUSES} | {"device.parity": "not-judged"})
    bad = subject("bad<impl>", {"attention.scale": "fail", "mask.causal": "deviation", "model.shape": "pass"})
    comp = subject("attention:kernel", {"attention.scale": "pass"}, kind="component")
    return AuditResult([good, bad, comp], seconds=3.0, command="aiayn audit")


def test_text_matrix_lists_subjects_verdicts_and_failures():
    out = report.text(fake_result(), color=False)
    assert "\033[" not in out
    lines = out.splitlines()
    row = next(ln for ln in lines if ln.startswith("bad<impl>"))
    assert "F" in row and "D" in row and "nonconforming (2 must, 0 should)" in row
    assert any(ln.startswith("good") and ln.endswith("conforming") for ln in lines)
    assert any("FAIL bad<impl> attention.scale (§3.2.1, Eq. (1)): attention.scale message" in ln for ln in lines)
    assert "2 of 3 conforming" in out
    colored = report.text(fake_result(), color=True)
    assert "\033[1;31mF\033[0m" in colored


def test_no_color_environment_variable_is_respected(monkeypatch):
    class Tty:
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert report.use_color(Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not report.use_color(Tty())
    monkeypatch.delenv("NO_COLOR")
    assert not report.use_color(Tty(), no_color=True)
    with open(os.devnull, "w") as devnull:
        assert not report.use_color(devnull)


def test_markdown_is_a_table_and_a_failure_list():
    md = report.markdown(fake_result())
    rows = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert len(rows) == 4  # header + 3 subjects
    assert all(r.count("|") == rows[0].count("|") for r in rows)
    assert "- **bad<impl>** `attention.scale` (§3.2.1, Eq. (1)) fail: attention.scale message" in md
    assert "- **bad<impl>** `mask.causal`" in md.split("## Declared deviations")[1]


def test_json_follows_schema_3():
    data = json.loads(report.as_json(fake_result()))
    assert data["schema"] == 3 and data["exit_code"] == 1
    assert set(data["implementations"]) == {"good", "bad<impl>"} and set(data["components"]) == {"attention:kernel"}
    bad = data["implementations"]["bad<impl>"]
    assert bad["verdict"] == "nonconforming (2 must, 0 should)" and bad["source"] == "bad<impl>.py"
    scale = bad["clauses"]["attention.scale"]
    assert scale == {"status": "fail", "outcome": "failed", "severity": "must", "section": "§3.2.1, Eq. (1)",
                     "message": "attention.scale message", "detail": "detail line", "tests": 0}


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in ("meta", "img", "br"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()


def parse_html(text: str) -> _Collect:
    p = _Collect()
    p.feed(text)
    p.close()
    assert p.stack == [], f"unclosed tags {p.stack}"
    return p


def test_html_is_well_formed_self_contained_and_escaped():
    result = fake_result()
    result.subjects[1].figures = {"a picture": "iVBORw0KGgo="}
    text = report.as_html(result)
    parsed = parse_html(text)
    assert "bad&lt;impl&gt;" in text and "bad<impl>" not in text
    srcs = [a.get("src", "") for t, a in parsed.tags if t in ("img", "script", "link")]
    assert srcs == ["data:image/png;base64,iVBORw0KGgo="], "only inline images; nothing fetched from a network"
    cells = [a["class"] for t, a in parsed.tags if t == "td" and "class" in a]
    assert cells.count("fail") == 1 and cells.count("deviation") == 1


# -- the pictures ------------------------------------------------------------------------------------------------
def test_figures_measure_the_implementation(tmp_path):
    """The causal picture shows the +1e-9 mask fill of annotated-notebook as future leaks, none for the reference."""
    pytest.importorskip("matplotlib")
    import torch

    from aiayn_conformance.audit.figures import draw, target_influence
    from aiayn_conformance.implementations import get_registry
    from aiayn_conformance.spec.config import TINY as CONFIG

    reg = get_registry()
    ref = target_influence(reg.get("reference"), CONFIG)
    leaky = target_influence(reg.get("annotated-notebook"), CONFIG)
    future = ~torch.tril(torch.ones_like(ref, dtype=torch.bool))
    assert float(ref[future].max()) == 0.0 and float(ref.diagonal().min()) > 0
    assert float(leaky[future].max()) > 1e-6
    index = draw("sections-notebook", tmp_path, [])
    assert set(index["figures"]) == {"position.png", "causal.png", "encoder.png"}, index["errors"]
    assert all((tmp_path / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in index["figures"])


# -- the command -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--impl", "no-such-impl"], "unknown implementation 'no-such-impl'"),
    (["--component", "no-such"], "unknown component 'no-such'"),
    (["--impl", "reference", "--clause", "attention.nope"], "unknown clause 'attention.nope'"),
    (["--impl", "reference", "--jobs", "0"], "--jobs must be at least 1"),
])
def test_usage_errors_exit_2_with_one_line(capsys, argv, needle):
    assert main(["audit", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def test_unwritable_output_is_refused_before_the_run(capsys, tmp_path):
    assert main(["audit", "--impl", "reference", "--output", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """One real audit: the reference (conforming) and prenorm (declares three deviations)."""
    out = tmp_path_factory.mktemp("audit") / "audit.json"
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance",
                          "audit", "--impl", "reference,prenorm", "--format", "json",
                          "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    return res, json.loads(out.read_text())


@pytest.mark.slow
def test_end_to_end_audit_statuses(audited):
    res, data = audited
    assert res.returncode == 0, res.stderr[-3000:]
    ref, pre = data["implementations"]["reference"], data["implementations"]["prenorm"]
    assert ref["verdict"] == "conforming"
    assert {c for c, r in ref["clauses"].items() if r["status"] != "pass"} <= {"device.parity", "export.onnx"}
    assert ref["clauses"]["device.parity"]["status"] in ("not-judged", "pass")
    deviations = {c for c, r in pre["clauses"].items() if r["status"] == "deviation"}
    assert deviations == {"norm.post-norm", "norm.no-extra-norm", "model.reference-equivalence",
                          "config.parameters"}
    assert pre["verdict"] == "nonconforming (4 must, 0 should; 1 must not judged)"
    assert pre["clauses"]["attention.scale"]["status"] == "pass"
    assert "1 of 2 conforming" in res.stderr


def test_one_clause_with_full_detail():
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance",
                          "audit", "--impl", "prenorm", "--clause", "norm.post-norm"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "prenorm norm.post-norm (§" in res.stdout and "DEVIATION" in res.stdout
    assert "observed:" in res.stdout and "[norm.post-norm]" in res.stdout
    assert "test_norm.py" in res.stdout  # the suite's own verbose output came through


@pytest.mark.slow
def test_html_report_has_the_pictures_and_renders_in_a_browser(tmp_path):
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    out = tmp_path / "audit.html"
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance",
                          "audit", "--impl", "annotated-notebook", "--clause",
                          "mask.causal,train.learns", "--format", "html", "--output", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    parsed = parse_html(out.read_text())
    imgs = [a for t, a in parsed.tags if t == "img"]
    assert len(imgs) == 4 and all(a["src"].startswith("data:image/png;base64,") for a in imgs)
    assert any(a["alt"].startswith("train.learns") for a in imgs)  # the learning curves of the check
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no headless Chromium on this machine (Debian: apt-get install chromium)")
    shot = Path(os.environ.get("AIAYN_ARTIFACTS", tmp_path)) / "audit-report.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    # No network here and none needed: the page is self-contained, and these flags stop Chromium's own calls home.
    res = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--screenshot={shot}",
                          "--window-size=1280,1600", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.exists() and shot.read_bytes()[:4] == b"\x89PNG", \
        f"no screenshot written to {shot} (chromium exit {res.returncode}): {res.stderr[-1500:]}"


@pytest.mark.slow
def test_an_implementation_that_kills_its_process_costs_only_its_own_clauses(tmp_path):
    """Grouped into one suite process with the reference (--jobs 1), the dying implementation takes the
    group down; the audit re-runs each alone: the reference passes, the other is all errors."""
    out = tmp_path / "audit.json"
    res = subprocess.run([sys.executable, "-m", "aiayn_conformance",
                          "audit", "--plugin", "tests/fixtures/exiting_plugin.py",
                          "--impl", "hard-exit,reference", "--jobs", "1", "--clause", "model.shape,attention.scale",
                          "--format", "json", "--output", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "re-running each alone" in res.stderr
    data = json.loads(out.read_text())["implementations"]
    assert {r["status"] for r in data["reference"]["clauses"].values()} == {"pass"}
    assert set(data["reference"]["clauses"]) == {"model.shape", "attention.scale"}
    dead = data["hard-exit"]["clauses"]
    assert dead and {r["status"] for r in dead.values()} == {"error"}
    assert "exit status 3" in next(iter(dead.values()))["message"]


def test_pytest_lists_the_clauses_no_check_judged_apart_from_those_that_do_not_apply():
    """The suite's own summary shows the four outcomes apart, as aiayn audit does: a clause whose every check
    skipped is listed as not judged (with each reason) or, when each check says so, not applicable."""
    res = subprocess.run([sys.executable, "-m", "pytest", "conformance/", "--impl=torch-nn", "-q", "-p", "no:randomly",
                          "--clause=train.equivalence,decode.beam,model.shape", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:]
    not_judged = res.stdout.split("clauses not judged", 1)[1].split("clauses not applicable", 1)[0]
    not_applicable = res.stdout.split("clauses not applicable", 1)[1]
    assert "impl:torch-nn train.equivalence" in not_judged and "decode.beam" not in not_judged, res.stdout[-3000:]
    assert "impl:torch-nn decode.beam: torch-nn has no generate(" in not_applicable, res.stdout[-3000:]
    assert "model.shape" not in not_judged + not_applicable, res.stdout[-3000:]
