"""A check's report: its clause and diagnostic recorded on it, and a report even when pytest cannot format one."""

from __future__ import annotations

from typing import Any, cast

import pytest

from .budget import interrupted_at
from .harness import CheckTimeout, ClauseViolation, ImplementationError

__all__ = ["SafeReports", "annotate", "diagnostic"]


def diagnostic(exc: BaseException | None) -> BaseException | None:
    """Our own exception behind ``exc``: itself, or one inside an exception group or its cause/context.

    Hypothesis wraps failures: a check whose replay ended differently (an error, then a timeout while shrinking
    it) arrives as a FlakyFailure group holding both."""
    queue, seen = [exc], set()
    while queue:
        e = queue.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, (ClauseViolation, ImplementationError, CheckTimeout)):
            return e
        queue.extend(getattr(e, "exceptions", ()))
        queue.extend([e.__cause__, e.__context__])
    return None


class SafeReports:
    """pytest's own report, unless formatting the traceback fails or the check ran out of time (a plugin object).

    The time budget's alarm can land anywhere, hypothesis's tracer included, and pytest cannot format a traceback
    entry without a line number: an INTERNALERROR that would end the whole run."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport | None:
        if call.excinfo is None:
            return None
        found = diagnostic(call.excinfo.value)
        if isinstance(found, CheckTimeout):
            where = interrupted_at(found) if getattr(found, "interrupted", False) else ""
            text = str(found) + (f"\n  interrupted at: {where}" if where else "")
        else:
            try:
                return pytest.TestReport.from_item_and_call(item, call)
            except Exception as exc:  # pytest's formatter failed; the run must go on
                shown = found if found is not None else call.excinfo.value
                text = f"{shown}\n  (pytest could not format the traceback: {type(exc).__name__}: {exc})"
        when = cast(Any, call.when)  # "setup", "call" or "teardown": reports are made per phase
        return pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed", text, when,
                                 duration=call.duration, start=call.start, stop=call.stop,
                                 user_properties=list(item.user_properties))


def annotate(report: pytest.TestReport, clause_id: str | None, call: pytest.CallInfo[None]) -> None:
    """Record the clause and, for a failure of ours, its status (fail or error) and message on ``report``."""
    if clause_id is not None:
        report.user_properties.append(("clause", clause_id))
    # The call, or a fixture's setup (a module's model built once): either way the diagnostic is the message.
    if call.excinfo is None or call.when not in ("setup", "call"):
        return
    exc = diagnostic(call.excinfo.value)
    if exc is None:
        return
    status = "fail" if isinstance(exc, ClauseViolation) else "error"
    if isinstance(exc, CheckTimeout):
        message = str(report.longrepr)  # with where it was interrupted
    elif isinstance(exc, ImplementationError):
        message = exc.message_for(clause_id)
    else:
        message = str(exc)
    report.user_properties.append(("aiayn_status", status))
    report.user_properties.append(("aiayn_message", message))
    if report.failed:
        report.longrepr = message
