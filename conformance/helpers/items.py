"""What a collected check is about: its clause, its subject (an implementation or a component), its kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

__all__ = ["CONFORMANCE_DIR", "component_kind", "is_conformance_item", "is_hypothesis_test", "item_clause",
           "params", "subject_of"]

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
