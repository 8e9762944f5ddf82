"""Docs generated from code stay in sync with it."""

from pathlib import Path

from spec.__main__ import catalogue_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_clause_catalogue_doc_is_current():
    doc = (ROOT / "docs" / "clauses.md").read_text()
    assert doc == catalogue_markdown(), "docs/clauses.md is stale: regenerate it with `python -m spec > docs/clauses.md`"


def test_readme_names_every_suite_option():
    readme = (ROOT / "README.md").read_text()
    for option in ("--impl", "--plugin", "--component", "--check-timeout", "--hypothesis-profile"):
        assert option in readme, f"README.md does not document {option}"
