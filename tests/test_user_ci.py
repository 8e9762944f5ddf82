"""The suite in a user's own CI, run from outside this checkout: ``pytest --pyargs aiayn_conformance.conformance``
on the installed package, and ``parametrize_with_checks`` in a test file of the user's.

Each test runs pytest in a fresh temporary directory with its own empty ``pytest.ini`` (``-c``), so
neither this repository's configuration nor its root conftest.py is seen: the suite's options come
from the installed package's pytest11 entry point alone, as in a project that pip-installed it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from aiayn_conformance.audit.results import ClauseResult, SubjectResult
from aiayn_conformance.checks import ClauseCheck, _SuiteRun, parametrize_with_checks

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "fixtures" / "ci_plugin.py"


def outside(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """pytest run in tmp_path with an empty ini; the outcome of each test case from its JUnit XML, by
    ``classname::name``."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    junit = tmp_path / "junit.xml"
    res = subprocess.run([sys.executable, "-m", "pytest", "-c", "pytest.ini", "--rootdir", ".", "-p",
                          "no:cacheprovider", f"--junitxml={junit}", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=900)
    assert junit.exists(), res.stdout[-3000:] + res.stderr[-2000:]
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tags = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[f"{case.attrib['classname']}::{case.attrib['name']}"] = tags[0] if tags else "passed"
    return res, outcomes


def test_the_suite_runs_from_the_installed_package(tmp_path):
    res, outcomes = outside(tmp_path, "--pyargs", "aiayn_conformance.conformance", f"--plugin={PLUGIN}",
                            "--impl=reference,ci-unscaled", "--clause=embedding.scale")
    assert res.returncode == 1, res.stdout[-3000:]
    assert {name.split("::")[0].rsplit(".", 1)[-1] for name in outcomes} == {"test_embedding"}, outcomes
    by_impl = {impl: {o for name, o in outcomes.items() if f"[{impl}" in name} for impl in ("reference", "ci-unscaled")}
    assert by_impl == {"reference": {"passed"}, "ci-unscaled": {"failure"}}, outcomes


@pytest.mark.slow
def test_parametrize_with_checks_gives_one_test_per_clause(tmp_path):
    (tmp_path / "test_mine.py").write_text(textwrap.dedent(f"""
        from aiayn_conformance.checks import parametrize_with_checks

        @parametrize_with_checks(["reference", "ci-unscaled"], plugins=[{str(PLUGIN)!r}],
                                 clauses=["model.shape", "attention.scale", "embedding.scale"])
        def test_paper(check):
            check()
    """))
    res, outcomes = outside(tmp_path, "test_mine.py", "-rA", "-n", "2", "--dist", "loadgroup")
    assert res.returncode == 1, res.stdout[-3000:]
    assert {name.split("::")[0] for name in outcomes} == {"test_mine"}, outcomes
    assert {name.split("::")[1]: o for name, o in outcomes.items()} == {
        "test_paper[reference-model.shape]": "passed", "test_paper[reference-attention.scale]": "passed",
        "test_paper[reference-embedding.scale]": "passed", "test_paper[ci-unscaled-model.shape]": "passed",
        "test_paper[ci-unscaled-attention.scale]": "failure",  # declared, not observed
        "test_paper[ci-unscaled-embedding.scale]": "failure",
    }, res.stdout[-3000:]
    assert "ci-unscaled embedding.scale (§3.4, must) fail:" in res.stdout
    assert "ci-unscaled attention.scale (§3.2.1, Eq. (1), must) unexpected-pass: declared but not observed" \
        in res.stdout
    assert "[embedding.scale]" in res.stdout and "measured:" in res.stdout  # the suite's diagnostic, not a status


def checked(status: str | None, *, unavailable: str = "") -> tuple[str, str]:
    """(outcome, message) of a ClauseCheck whose suite run gave ``status`` (None: no check ran)."""
    run = _SuiteRun("x", (), ("attention.scale",), 1.0)
    subject = SubjectResult("x", "implementation", unavailable=unavailable)
    if status is not None:
        subject.clauses["attention.scale"] = ClauseResult(status, f"the {status} message", "the detail")
    run._subjects = {"x": subject}
    try:
        ClauseCheck("x", "attention.scale", run)()
    except BaseException as exc:  # pytest's outcomes are BaseExceptions
        return type(exc).__name__, str(exc)
    return "passed", ""


@pytest.mark.parametrize("status, outcome, needle", [
    ("pass", "passed", ""),
    ("fail", "Failed", "x attention.scale (§3.2.1, Eq. (1), must) fail: the fail message\nthe detail"),
    ("error", "Failed", "error: the error message"),
    ("unexpected-pass", "Failed", "unexpected-pass: the unexpected-pass message"),
    ("deviation", "XFailed", "x attention.scale (§3.2.1, Eq. (1), must): the deviation message"),
    ("not-judged", "Skipped", "not-judged: the not-judged message"),
    ("not-applicable", "Skipped", "not-applicable: the not-applicable message"),
    (None, "Skipped", "no check of this clause ran for this implementation"),
])
def test_each_status_becomes_its_pytest_outcome(status, outcome, needle):
    got, message = checked(status)
    assert got == outcome and needle in message, (got, message)


def test_an_unavailable_implementation_skips_every_clause():
    assert checked("pass", unavailable="pip install lib") == ("Skipped", "x is unavailable here: pip install lib")


def test_parametrize_with_checks_refuses_unknown_names_at_once():
    with pytest.raises(LookupError, match="unknown implementation 'no-such'"):
        parametrize_with_checks("no-such")
    with pytest.raises(ValueError, match="unknown clause 'attention.nope'"):
        parametrize_with_checks("reference", clauses=["attention.nope"])
    mark = parametrize_with_checks("reference", clauses="attention.scale,mask.causal")
    argname, params = mark.args
    assert argname == "check" and [p.id for p in params] == ["reference-attention.scale", "reference-mask.causal"]
    assert all(isinstance(p.values[0], ClauseCheck) for p in params)
