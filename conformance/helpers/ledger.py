"""The ledger of declared deviations: each declared clause's witness checks are expected to fail.

A declared clause's deterministic checks are marked ``xfail(strict=False)`` (a clause has several witnesses and a
deviation may break only some) and its hypothesis checks skipped (a random search cannot promise to find a known
bug; the witness does). Strictness is per clause at session end: a declared clause none of whose witnesses failed
is "declared but not observed" and fails the run.
"""

from __future__ import annotations

import pytest

from aiayn_conformance.spec.clauses import CLAUSES, NOT_APPLICABLE

from .items import is_hypothesis_test
from .results import report_message

__all__ = ["DeclaredDeviations", "Judgements", "mark_declared"]


def mark_declared(item: pytest.Item, subject_name: str, clause_id: str, why: str) -> None:
    """Mark ``item``, a check of a clause its subject declares as a deviation."""
    if is_hypothesis_test(item):
        item.add_marker(pytest.mark.skip(reason=f"declared deviation {clause_id} ({why}); the witness test checks it"))
        return
    item.add_marker(pytest.mark.xfail(strict=False, raises=AssertionError,
                                      reason=f"declared deviation {clause_id}: {why}"))
    item.user_properties.append(("aiayn_declared", f"{subject_name}::{clause_id}"))


class DeclaredDeviations:
    """Per (subject, clause) outcome of the witness checks of a declared deviation; a pytest plugin object."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.unseen: dict[str, int] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        key = dict(report.user_properties).get("aiayn_declared")
        if not isinstance(key, str) or report.when != "call":
            return
        self.seen.setdefault(key, 0)
        self.unseen.setdefault(key, 0)
        if report.skipped and hasattr(report, "wasxfail"):
            self.seen[key] += 1
        elif report.passed:
            self.unseen[key] += 1

    def not_observed(self) -> list[str]:
        """``NAME::clause`` of each declared clause whose every witness check passed."""
        return [key for key, n in self.seen.items() if n == 0 and self.unseen.get(key, 0) > 0]


class Judgements:
    """Per (subject, clause): whether any check judged it (passed, failed, or a declared deviation's witness ran),
    and otherwise every reason its checks skipped; a pytest plugin object. The terminal summary lists the clauses
    no check judged apart from those that do not apply (``NOT_APPLICABLE``), as ``aiayn audit`` does."""

    def __init__(self) -> None:
        self.judged: set[tuple[str, str]] = set()
        self.reasons: dict[tuple[str, str], list[str]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        subject, clause = props.get("aiayn_subject"), props.get("clause")
        if not isinstance(subject, str) or clause not in CLAUSES:
            return
        key = (subject, clause)
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = report_message(report)
            self.reasons.setdefault(key, [])
            if reason not in self.reasons[key]:
                self.reasons[key].append(reason)
        elif report.failed and (report.when != "call" or props.get("aiayn_status") != "fail"):
            self.reasons.setdefault(key, []).append("error: the check could not run to a judgement")
        elif report.when == "call":
            self.judged.add(key)

    def unjudged(self) -> tuple[list[tuple[str, str, list[str]]], list[tuple[str, str, list[str]]]]:
        """(not judged, not applicable): (subject, clause, reasons) for each clause no check judged."""
        not_judged, not_applicable = [], []
        for key, reasons in self.reasons.items():
            if key in self.judged:
                continue
            if all(r.startswith(NOT_APPLICABLE) for r in reasons):
                not_applicable.append((*key, reasons))
            else:
                not_judged.append((*key, reasons))
        return sorted(not_judged), sorted(not_applicable)
