"""What a collected check is about: its clause, its subject (an implementation or a component), its kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

__all__ = ["CONFORMANCE_DIR", "LONGEST_FILES", "component_kind", "is_conformance_item", "is_hypothesis_test",
           "item_clause", "longest_files_first", "params", "subject_of"]

CONFORMANCE_DIR = Path(__file__).resolve().parents[1]


def item_clause(item: pytest.Item) -> str | None:
    marks = list(item.iter_markers("clause"))
    return marks[0].args[0] if marks and marks[0].args else None


def params(item: pytest.Item) -> dict[str, Any]:
    callspec = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec is not None else {}


def subject_of(item: pytest.Item) -> str | None:
    """The implementation or component under test (``NAME`` or ``KIND:NAME``), as recorded at collection."""
    subject = dict(item.user_properties).get("aiayn_subject")
    return subject.split(":", 1)[1] if isinstance(subject, str) else None


def component_kind(item: pytest.Item) -> str | None:
    """The kind a check taking ``component`` audits (its ``component_kind`` marker), None when missing or unknown."""
    from aiayn_conformance.implementations import COMPONENT_KINDS

    mark = item.get_closest_marker("component_kind")
    kind = mark.args[0] if mark is not None and mark.args else None
    return kind if kind in COMPONENT_KINDS else None


def is_conformance_item(item: pytest.Item) -> bool:
    """A test in conformance/, or any test run against an implementation or a component."""
    if {"impl", "component"} & set(getattr(item, "fixturenames", ())):
        return True
    try:
        return Path(str(item.path)).resolve().is_relative_to(CONFORMANCE_DIR)
    except (AttributeError, ValueError):
        return False


def is_hypothesis_test(item: pytest.Item) -> bool:
    """A ``@given`` test (hypothesis's own ``hypothesis`` marker is added after the suite's collection hook)."""
    return hasattr(getattr(item, "obj", None), "hypothesis")


# The suite's test files that take longest to run at the sizes where ``aiayn audit`` splits a run over
# pytest-xdist workers, one file at a time (measured at base, one implementation, one thread a worker: decode 42 s,
# model 28, mask 23, train 21, dropout 17, export 14, norm 12; the others 7 s or less). A worker asks for the next
# file when it finishes one, so the longest go out first and the short ones fill in at the end; xdist's own order
# (most tests first) sent export's two tests, 14 s, last, to one worker while the other stood idle.
LONGEST_FILES = ("test_decode.py", "test_model.py", "test_mask.py", "test_train.py", "test_dropout.py",
                 "test_export.py", "test_norm.py")


def longest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the conformance files of ``LONGEST_FILES`` first, in that order, then every other file in its
    collected order; each file's items stay together and in their order (a stable sort by file)."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}

    def key(item: pytest.Item) -> int:
        return rank.get(item.path.name, len(rank)) if item.path.parent == CONFORMANCE_DIR else len(rank)

    return sorted(items, key=key)
