"""Machine-readable results of a suite run: ``--results-json PATH``.

One record per test, written when the session ends (on the controller under
pytest-xdist, which forwards every report)::

    {"nodeid": ..., "subject": "impl:NAME" | "component:KIND:NAME" | null,
     "clause": "attention.scale" | null, "outcome": OUTCOME, "declared": bool,
     "message": "first line of the diagnostic or skip reason", "detail": "the full diagnostic",
     "duration": seconds}

and, only when a check recorded them, ``"note"`` (a finding worth reporting on a pass, e.g. the
label-smoothing convention found) and ``"data"`` (measurements for the reports, e.g.
``{"learning_curve": {...}}`` from ``train.learns``: see ``conformance.helpers.learning.LearningCurve``).
A check records them in ``request.node.user_properties`` as ``aiayn_note`` and ``aiayn_data``.

OUTCOME is one of ``passed``, ``failed`` (a clause violation; a wrong output
type, shape or dtype is one in model.shape's own checks), ``error`` (the
implementation could not be checked: it crashed, returned something unusable
such as the wrong shape or NaN, or timed out; or the test errored in setup),
``skipped``, ``xfailed`` (a declared deviation observed),
``xpassed`` (a declared deviation's witness passed). ``aiayn audit`` folds these
per (subject, clause) into the statuses of its matrix.

While the run goes on, ``PATH.progress`` holds one line ``total N`` once the tests
are collected, then one line ``done`` per finished test, for progress displays.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

__all__ = ["ResultsRecorder", "record_of", "report_message", "SCHEMA"]

SCHEMA = 1


def report_message(report: pytest.TestReport) -> str:
    """A report's reason or text: the xfail reason, the skip reason without pytest's "Skipped: ", else longrepr."""
    if report.skipped and hasattr(report, "wasxfail"):
        return str(report.wasxfail)
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        reason = str(longrepr[2])
        return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
    return str(longrepr)


def record_of(report: pytest.TestReport) -> dict[str, Any]:
    props = dict(report.user_properties)
    declared = "aiayn_declared" in props
    if report.skipped and hasattr(report, "wasxfail"):
        outcome = "xfailed"
    elif report.passed and hasattr(report, "wasxfail"):
        outcome = "xpassed"
    elif report.failed:
        if report.when != "call" or props.get("aiayn_status") == "error":
            outcome = "error"
        elif props.get("aiayn_status") == "fail":
            outcome = "failed"
        else:  # an exception that is not a clause violation: the check or the implementation crashed
            outcome = "error"
    else:
        outcome = "skipped" if report.skipped else "passed"
    # A clause violation or implementation error carries its own diagnostic; else the report's text.
    detail = str(props.get("aiayn_message") or report_message(report))
    first = next((line.strip() for line in detail.splitlines() if line.strip()), "")
    extra = {key: props[f"aiayn_{key}"] for key in ("note", "data") if f"aiayn_{key}" in props}
    return {
        "nodeid": report.nodeid,
        "subject": props.get("aiayn_subject"),
        "clause": props.get("clause"),
        "outcome": outcome,
        "declared": declared,
        "message": first[:500],
        "detail": detail[:4000],
        "duration": round(float(getattr(report, "duration", 0.0)), 4),
        **extra,
    }


class ResultsRecorder:
    """Registered by the conformance plugin when ``--results-json`` is given."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.progress = self.path.with_name(self.path.name + ".progress")
        self.records: dict[str, dict[str, Any]] = {}
        self.collected = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.progress.write_text("")

    def _progress(self, line: str) -> None:
        with self.progress.open("a") as f:
            f.write(line + "\n")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._progress(f"total {len(session.items)}")

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        # Under pytest-xdist the controller collects nothing itself: each worker reports the same tests.
        if not self.collected:
            self.collected = True
            self._progress(f"total {len(ids)}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # One record per test: the call phase, or the phase that did not pass (setup error, skip).
        if report.when == "call" or (report.when == "setup" and not report.passed) or (
                report.when == "teardown" and report.failed and report.nodeid not in self.records):
            if report.nodeid not in self.records:
                self._progress("done")
            self.records[report.nodeid] = record_of(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"schema": SCHEMA, "exitstatus": int(exitstatus), "tests": list(self.records.values())}
        self.path.write_text(json.dumps(payload, indent=1))
