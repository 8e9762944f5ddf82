"""Traceability both ways: every clause has a conformance test, every test names a known clause."""

import subprocess
import sys
from pathlib import Path

import pytest

from spec import CLAUSES

ROOT = Path(__file__).resolve().parents[1]


class Collector:
    def __init__(self):
        self.items = []

    def pytest_collection_modifyitems(self, items):
        self.items = list(items)


def collect(*args):
    collector = Collector()
    code = pytest.main(["conformance/", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                       plugins=[collector])
    assert code == 0, f"collecting the conformance suite failed with exit code {code}"
    return collector.items


def clauses_of(items):
    found = {}
    for item in items:
        marks = [m.args[0] for m in item.iter_markers("clause")]
        assert len(marks) == 1, f"{item.nodeid} carries {len(marks)} clause markers"
        found.setdefault(marks[0], []).append(item.nodeid)
    return found


def test_every_clause_has_a_model_level_test(monkeypatch):
    monkeypatch.chdir(ROOT)
    found = clauses_of(collect("--impl=reference"))
    missing = sorted(set(CLAUSES) - set(found))
    assert not missing, f"clauses without a conformance test: {missing}"
    assert set(found) <= set(CLAUSES)


def test_component_checks_carry_known_clauses(monkeypatch):
    monkeypatch.chdir(ROOT)
    found = clauses_of(collect("--component=all"))
    assert found and set(found) <= set(CLAUSES)


@pytest.mark.parametrize("marker, message", [
    ('@pytest.mark.clause("attention.scaling")', "unknown clause 'attention.scaling'"),
    ("", "no @pytest.mark.clause(...) marker"),
    ('@pytest.mark.clause("mask.causal")\n@pytest.mark.clause("mask.finite")', "exactly one clause marker"),
])
def test_bad_markers_are_rejected_at_collection(tmp_path, marker, message):
    # Outside conformance/ (a file there would race with parallel runs of the suite): a test that takes
    # the `impl` fixture is a conformance test wherever it lives.
    bad = tmp_path / "test_meta.py"
    bad.write_text(f"import pytest\n\n\n{marker}\ndef test_something(impl):\n    assert impl\n")
    res = subprocess.run([sys.executable, "-m", "pytest", str(bad), "--impl=reference", "-q", "-p",
                          "no:cacheprovider", f"--rootdir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 4, res.stdout + res.stderr
    assert message in res.stderr
