"""Traceability both ways: every clause has a conformance test, every test names a known clause."""

import subprocess
import sys
from pathlib import Path

import pytest

from aiayn_conformance.spec import CLAUSES

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


def test_every_check_lives_in_the_module_of_its_area(monkeypatch):
    """One room per clause area: every check of clause AREA.NAME, model-level or component, is in
    conformance/test_AREA.py, so one module holds all the checks of a clause."""
    monkeypatch.chdir(ROOT)
    misplaced = [f"{item.nodeid} checks {clause}" for item in collect("--impl=reference", "--component=all")
                 for clause in [item.get_closest_marker("clause").args[0]]
                 if Path(str(item.path)).name != f"test_{CLAUSES[clause].area}.py"]
    assert not misplaced, "checks outside the module of their clause's area:\n  " + "\n  ".join(misplaced)


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


@pytest.mark.parametrize("marker", ["", '@pytest.mark.component_kind("attn")'])
def test_a_component_check_without_a_known_kind_is_rejected_at_collection(tmp_path, marker):
    bad = tmp_path / "test_meta.py"
    bad.write_text(f'import pytest\n\n\n@pytest.mark.clause("mask.causal")\n{marker}\n'
                   "def test_something(component):\n    assert component\n")
    res = subprocess.run([sys.executable, "-m", "pytest", str(bad), "--component=all", "-q", "-p",
                          "no:cacheprovider", f"--rootdir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 4, res.stdout + res.stderr
    assert "needs @pytest.mark.component_kind(KIND)" in res.stderr
