"""``python3 -m aiayn_conformance.conformance.helpers.catalogue > docs/clauses.md``: the clause catalogue, with
its checks.

The file is the catalogue ``python3 -m aiayn_conformance.spec`` prints (ids, sections, severities, statements, tolerance
policy) followed by a section that lists, per clause, the checks of the suite: read from pytest's own
collection of ``conformance/`` (``--impl=reference --component=all``, so the model-level checks and the
component checks of every kind are collected), never from a hand-kept list. tests/test_docs.py keeps the file
in sync with both.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

import pytest

from aiayn_conformance.spec.__main__ import catalogue_markdown
from aiayn_conformance.spec.clauses import CLAUSES

__all__ = ["Check", "collected_checks", "checks_markdown", "clauses_markdown"]

CONFORMANCE_DIR = Path(__file__).resolve().parents[1]
COLLECT_ARGS = ("--impl=reference", "--component=all")


@dataclass(frozen=True)
class Check:
    """One check (a test function, whatever its parametrization) of one clause."""

    clause: str
    module: str  # "conformance/test_mask.py"
    name: str  # "test_causal_witness"
    component_kind: str | None  # the kind of component it audits, None for a model-level check
    canonical_weights: str = ""  # why it needs the suite's own weights (skipped under --weights), "" if it does not


class _Collector:
    def __init__(self) -> None:
        self.items: list[pytest.Item] = []

    @pytest.hookimpl(trylast=True)  # after the conformance plugin has dropped the checks with nothing to check
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.items = list(items)


def collected_checks() -> dict[str, list[Check]]:
    """clause id -> its checks, in collection order (every clause of the catalogue, possibly with none)."""
    collector = _Collector()
    with contextlib.redirect_stdout(io.StringIO()) as out:  # --collect-only prints the items
        code = pytest.main([str(CONFORMANCE_DIR), "--collect-only", "-q", "-p", "no:cacheprovider",
                            *COLLECT_ARGS], plugins=[collector])
    if code != 0:
        raise RuntimeError(f"collecting conformance/ failed (pytest exit code {code}):\n{out.getvalue()[-3000:]}")
    found: dict[str, list[Check]] = {clause_id: [] for clause_id in CLAUSES}
    for item in collector.items:
        mark = item.get_closest_marker("clause")
        if mark is None or not mark.args:
            continue
        kind = item.get_closest_marker("component_kind")
        canonical = item.get_closest_marker("canonical_weights")
        check = Check(clause=mark.args[0], module=Path(str(item.path)).relative_to(CONFORMANCE_DIR.parent).as_posix(),
                      name=getattr(item, "originalname", item.name),
                      component_kind=kind.args[0] if "component" in getattr(item, "fixturenames", ()) and kind
                      else None, canonical_weights=str(canonical.args[0]) if canonical and canonical.args else "")
        if check not in found.setdefault(check.clause, []):
            found[check.clause].append(check)
    return found


def checks_markdown(checks: dict[str, list[Check]] | None = None) -> str:
    """The "Checks per clause" section."""
    checks = collected_checks() if checks is None else checks
    lines = [
        "## Checks per clause",
        "",
        "Every check of a clause lives in the module of its area (`conformance/test_<area>.py`). Checks marked "
        "*component: KIND* audit a component alone (`--component`); the others run against each implementation "
        "(`--impl`). Listed from the suite's own collection (`pytest conformance/ --collect-only "
        + " ".join(COLLECT_ARGS) + "`).",
        "",
        "On the user's trained weights (`--weights PATH`, one implementation; README, Auditing): every model-level "
        "check runs, except those marked *needs canonical weights*, which are skipped with their reason. A model a "
        "check builds at the audit configuration (`--config`, up to dropout) holds the user's weights; a check that "
        "loads its own probe weights into the model (`load_reference_state`: the transplant checks, which compare "
        "the model with the reference holding the same weights) or builds another configuration (another "
        "vocabulary, width or max_len) runs on those instead, so its finding is about the code, whatever the "
        "weights.",
        "",
        "| clause | module | checks |",
        "|---|---|---|",
    ]
    for clause_id, found in checks.items():
        modules = ", ".join(f"`{m}`" for m in dict.fromkeys(c.module for c in found)) or "none"
        names = ", ".join(f"`{c.name}`" + (f" *(component: {c.component_kind})*" if c.component_kind else "")
                          + (f" *(needs canonical weights: {c.canonical_weights})*" if c.canonical_weights else "")
                          for c in found) or "none"
        lines.append(f"| `{clause_id}` | {modules} | {names} |")
    return "\n".join(lines) + "\n"


def clauses_markdown() -> str:
    """docs/clauses.md: the catalogue, then each clause's checks."""
    return catalogue_markdown() + "\n" + checks_markdown()


if __name__ == "__main__":
    print(clauses_markdown(), end="")
