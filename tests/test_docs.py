"""Docs generated from code stay in sync with it."""

import shlex
from pathlib import Path

import pytest

from aiayn_conformance.conformance.helpers.catalogue import clauses_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_clause_catalogue_doc_is_current(monkeypatch):
    monkeypatch.chdir(ROOT)
    doc = (ROOT / "docs" / "clauses.md").read_text()
    assert doc == clauses_markdown(), \
        "docs/clauses.md is stale: regenerate it with " \
        "`python3 -m aiayn_conformance.conformance.helpers.catalogue > docs/clauses.md`"


def test_readme_names_every_suite_option():
    readme = (ROOT / "README.md").read_text()
    for option in ("--impl", "--plugin", "--component", "--check-timeout", "--hypothesis-profile", "--clause",
                   "--results-json"):
        assert option in readme, f"README.md does not document {option}"


def test_readme_audit_section_names_every_audit_option():
    from aiayn_conformance.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    audit = sub.choices["audit"]
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Audit reports", 1)[1].split("\n## ", 1)[0]
    options = [o for a in audit._actions for o in a.option_strings if o.startswith("--") and o != "--help"]
    assert "--shard" in options and "--merge" in options
    missing = [o for o in options if o not in section]
    assert not missing, f"README.md's Audit reports section does not document {missing}"


def readme_commands() -> list[str]:
    blocks = (ROOT / "README.md").read_text().split("```")[1::2]
    return [b.strip() for b in blocks]


def test_readme_opens_with_the_two_commands():
    main_job, tests = readme_commands()[:2]
    assert main_job.endswith("aiayn audit") and "torch==2.13.0" in main_job
    assert "pytest" in tests and "torch==2.13.0" in tests


def test_ci_does_what_a_newcomer_does():
    """.ci/run makes a fresh venv, runs the README's two commands in it verbatim, installs nothing else,
    then runs ruff and mypy in that venv."""
    main_job, tests = readme_commands()[:2]
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    code = [ln for ln in ci if ln and not ln.startswith("#")]
    venv = next((i for i, ln in enumerate(code) if ln.startswith("python3 -m venv ")), None)
    assert venv is not None, ".ci/run must create a fresh virtual environment with `python3 -m venv`"
    activate = next((i for i, ln in enumerate(code) if ln.startswith(". ") and ln.endswith("/bin/activate\"")), None)
    assert activate is not None and activate > venv, ".ci/run must activate the venv it created"
    for command in (main_job, tests):
        assert command in code, f".ci/run must run the README's command verbatim: {command}"
        assert code.index(command) > activate, f".ci/run runs {command!r} before activating its venv"
    assert code.index(main_job) < code.index(tests)
    installs = [ln for ln in code if "pip install" in ln or "pip3 install" in ln]
    assert installs == [main_job, tests], f".ci/run installs something by hand: {installs}"
    assert code[-2:] == ["ruff check .", "python3 -m mypy"], ".ci/run must end with ruff and mypy, in its venv"
    assert '-m "not slow"' in tests, f"the README's test command leaves the slow tier out: {tests}"
    assert SLOW_TIER in code and code.index(SLOW_TIER) > code.index(tests), \
        f".ci/run must run the slow tier the README's test command leaves out, after it: {SLOW_TIER}"


SLOW_TIER = "python3 -m pytest tests/ -m slow -n auto --dist loadscope"


def test_the_slow_tier_is_named_where_the_readme_says():
    """The README and docs/contributing.md name the command of the tier the test command leaves out."""
    for doc in ("README.md", "docs/contributing.md"):
        assert SLOW_TIER in (ROOT / doc).read_text(), f"{doc} does not name the slow tier's command {SLOW_TIER!r}"


def test_dev_extra_holds_the_ci_tools():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {req.split(">")[0].split("=")[0].split("[")[0].strip() for req in extras["dev"]}
    assert {"ruff", "mypy"} <= names, f"the dev extra must provide ruff and mypy for .ci/run: {extras['dev']}"


def test_audits_doc_is_current():
    """docs/audits.md is generated from the registrations: every summary, source, note and deviation reason."""
    from aiayn_conformance.implementations.__main__ import audits_markdown

    doc = (ROOT / "docs" / "audits.md").read_text()
    assert doc == audits_markdown(), \
        "docs/audits.md is stale: regenerate it with `python3 -m aiayn_conformance.implementations > docs/audits.md`"


def test_audits_doc_covers_every_builtin_and_each_declared_deviation():
    from aiayn_conformance.implementations.registry import Registry

    doc = (ROOT / "docs" / "audits.md").read_text()
    sections = {chunk.split("\n", 1)[0].strip(): chunk for chunk in doc.split("\n## ")[1:]}
    for impl in Registry(entry_points=False, env={}).load().implementations.values():
        if impl.name == "reference" or "+" in impl.name:
            continue  # the oracle itself; compositions are audited through their components
        assert impl.name in sections, f"docs/audits.md has no section '## {impl.name}'"
        missing = [c for c in impl.deviations if f"**{c}**" not in sections[impl.name]]
        assert not missing, f"docs/audits.md, section {impl.name}: declared deviations not explained: {missing}"


def test_readme_matrix_matches_the_declared_deviations():
    """The README's audit matrix (pasted from `aiayn audit --format md`) shows a D exactly where each
    built-in declares a deviation, and no unexpected result."""
    from aiayn_conformance.audit.report import AREA_CLAUSES
    from aiayn_conformance.implementations.registry import Registry

    impls = Registry(entry_points=False, env={}).load().implementations
    lines = (ROOT / "README.md").read_text().splitlines()
    header = next((ln for ln in lines if ln.startswith("| subject | ")), None)
    assert header, "README.md has no audit matrix (paste `aiayn audit --format md`)"
    areas = [c.strip() for c in header.strip("|").split("|")][1:-1]
    rows = {}
    for ln in lines[lines.index(header) + 2:]:
        if not ln.startswith("| "):
            break
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows[cells[0]] = dict(zip(areas, (c.strip("`") for c in cells[1:-1])))
    assert set(rows) >= set(impls), f"README matrix lacks {sorted(set(impls) - set(rows))}"
    for name, impl in impls.items():
        shown = {c for area, cell in rows[name].items() for c, ch in zip(AREA_CLAUSES[area], cell) if ch == "D"}
        assert shown == set(impl.deviations), f"README matrix row {name}: D at {sorted(shown)}, declared " \
            f"{sorted(impl.deviations)}"
        bad = {ch for cell in rows[name].values() for ch in cell} & set("FEU")
        assert not bad, f"README matrix row {name} shows unexpected results {bad}"


def test_suite_time_times_the_readme_test_command():
    """benchmarks.suite_time --test-command prints the figure of the command the README gives, not another."""
    from benchmarks.suite_time import readme_test_command

    assert ["python3", *readme_test_command()[1:]] == shlex.split(readme_commands()[1].split("&&")[-1])
