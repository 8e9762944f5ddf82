"""The per-check time budget: a check running past ``--check-timeout`` errors its clause, saying where it was.

Time the check's thread spent waiting for a CPU behind other processes does not count (Linux's schedstat), up to
``MAX_STRETCH`` times the budget in wall time, so a verdict does not depend on the machine's load; a hang, which
waits for no CPU, is still stopped at the budget. After ``TIMEOUTS_BEFORE_GIVING_UP`` timeouts of one subject, its
remaining checks error at once.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Generator
from pathlib import Path
from types import FrameType

import pytest

from aiayn_conformance.spec.clauses import get_clause
from aiayn_conformance.spec.config import BASE, ModelConfig
from aiayn_conformance.spec.schema import parameter_count

from .harness import CheckTimeout
from .items import item_clause, subject_of
from .options import DEFAULT_TIMEOUT, audit_settings

__all__ = ["MAX_STRETCH", "budget_left", "budgeted_phase", "default_timeout", "interrupted_at", "runqueue_wait",
           "timeout_of"]

TIMEOUTS_BEFORE_GIVING_UP = 2
# Once a phase's budget is spent the alarm fires again at this interval until the phase ends, so nothing run
# after the first interruption (hypothesis replaying the failing example, a retry in a check) can stall.
REFIRE_SECONDS = 1.0
MAX_STRETCH = 5.0
_SCHEDSTAT = Path("/proc/thread-self/schedstat")
_TIMEOUTS = pytest.StashKey[dict[str, int]]()  # subject -> how many of its checks ran past the budget


def timeout_of(config: pytest.Config) -> float:
    """--check-timeout, else $AIAYN_CHECK_TIMEOUT, else the default for the audit's sizes (``default_timeout``)."""
    value = config.getoption("--check-timeout")
    if value is None:
        env = os.environ.get("AIAYN_CHECK_TIMEOUT")
        return float(env) if env is not None else default_timeout(audit_settings(config).config)
    return float(value)


@functools.lru_cache(maxsize=8)  # asked at every phase of every check
def default_timeout(model: ModelConfig) -> float:
    """DEFAULT_TIMEOUT up to the paper's base model at a vocabulary of 37,000; above it, in proportion to the
    parameters (each check's work grows with the weights it reads: the big model gets about 3.4 times as long)."""
    return DEFAULT_TIMEOUT * max(1.0, parameter_count(model) / parameter_count(BASE))


def runqueue_wait() -> float | None:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux's schedstat); None where unknown."""
    try:
        return int(_SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def budget_left(budget: float, wall: float, waited: float | None) -> float | None:
    """Seconds to wait further before the budget is spent, ``wall`` seconds into a check that waited ``waited`` of
    them for a CPU; None when it is spent (the waiting discounted, up to ``MAX_STRETCH`` times the budget)."""
    if waited is None:
        return None
    left = min(budget - (wall - waited), MAX_STRETCH * budget - wall)
    return left if left > 0.01 else None


def budgeted_phase(item: pytest.Item, phase: str) -> Generator[None, object, object]:
    """Run a test phase (fixture setup or the call) under the per-check time budget (SIGALRM)."""
    budget = timeout_of(item.config)
    clause_id = item_clause(item)
    if (budget <= 0 or not hasattr(signal, "setitimer") or clause_id is None
            or threading.current_thread() is not threading.main_thread()):
        return (yield)
    subject, clause = subject_of(item), get_clause(clause_id)
    timeouts = item.config.stash.setdefault(_TIMEOUTS, {})
    if subject is not None and timeouts.get(subject, 0) >= TIMEOUTS_BEFORE_GIVING_UP:
        raise CheckTimeout(f"[{clause.id}] ({clause.citation}) could not be checked: not run, because "
                           f"{timeouts[subject]} earlier checks of {subject} ran past the time budget of {budget:g} s "
                           f"(--check-timeout); the implementation hangs or is far too slow")
    state = {"active": True, "spent": False}
    started, waited_before = time.monotonic(), runqueue_wait()

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        if not state["active"]:  # the phase is ending: never raise into pytest's own code
            return
        if not state["spent"]:
            waited = runqueue_wait()
            left = budget_left(budget, time.monotonic() - started,
                               None if waited is None or waited_before is None else waited - waited_before)
            if left is not None:  # the machine's load, not the check, used the time: wait the rest
                signal.setitimer(signal.ITIMER_REAL, left)
                return
        signal.setitimer(signal.ITIMER_REAL, REFIRE_SECONDS)
        if not state["spent"]:
            state["spent"] = True
            if subject is not None:
                timeouts[subject] = timeouts.get(subject, 0) + 1
        timeout = CheckTimeout(f"[{clause.id}] ({clause.citation}) could not be checked: the check ran past its "
                               f"time budget of {budget:g} s (--check-timeout) in {phase}; the implementation hangs "
                               f"or is far too slow")
        timeout.interrupted = True  # the report says where (a check given up on at once was not interrupted)
        raise timeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, budget)
    try:
        return (yield)
    finally:
        state["active"] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def interrupted_at(timeout: CheckTimeout) -> str:
    """Where the time budget's alarm found the check: the innermost frame outside the suite's machinery."""
    here = {Path(__file__).resolve(), Path(__file__).resolve().parents[1] / "plugin.py"}
    tb, where = timeout.__traceback__, ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if tb.tb_lineno is not None and Path(code.co_filename).resolve() not in here:
            where = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    return where
