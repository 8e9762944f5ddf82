"""The suite from your own test file: one pytest test per clause, in the manner of scikit-learn's
``parametrize_with_checks``.

.. code-block:: python

    from aiayn_conformance.checks import parametrize_with_checks

    @parametrize_with_checks("mine", plugins=["my_package.aiayn_plugin"])
    def test_paper_conformance(check):
        check()

The first ``check()`` of an implementation runs the conformance suite on it once, in a subprocess (the
run ``aiayn audit`` makes); every ``check()`` of it then reports its own clause from that run: a pass
returns; ``fail``, ``error`` and ``unexpected-pass`` call ``pytest.fail`` with the suite's diagnostic; an
observed declared deviation is an xfail; the rest (not judged, not applicable, no check ran, unavailable) skip.
docs/ci.md has the details and the use with pytest-xdist.
"""

from __future__ import annotations

import importlib.util
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiayn_conformance.spec import CLAUSES
from aiayn_conformance.spec.clauses import parse_clause_ids

from .audit.results import SubjectResult

__all__ = ["ClauseCheck", "parametrize_with_checks"]


@dataclass
class _SuiteRun:
    """The suite run on one implementation, made on its first check and shared by its checks."""
    impl: str
    plugins: tuple[str, ...]
    clauses: tuple[str, ...]
    timeout: float
    _subjects: dict[str, SubjectResult] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def subjects(self) -> dict[str, SubjectResult]:
        with self._lock:
            if self._subjects is None:
                self._subjects = self._run()
            return self._subjects

    def _run(self) -> dict[str, SubjectResult]:
        from aiayn_conformance.conformance.helpers import threads
        from aiayn_conformance.implementations import get_registry

        from .audit.runner import Progress, plan, run_job

        jobs = plan(get_registry(self.plugins), self.impl, None)
        extra = [f"--clause={','.join(self.clauses)}"] if len(self.clauses) < len(CLAUSES) else []
        with tempfile.TemporaryDirectory(prefix="aiayn-checks-") as tmp:
            for job in (j for j in jobs if j.runnable):  # an unavailable implementation is not run
                run_job(job, plugins=list(self.plugins), extra=extra, workdir=Path(tmp), timeout=self.timeout,
                        progress=Progress(enabled=False), env=threads.environment_for(1))
        return {s.name: s for j in jobs for s in j.subjects}


@dataclass(frozen=True)
class ClauseCheck:
    """The check of one clause on one implementation: call it in your test."""
    impl: str
    clause: str
    run: _SuiteRun = field(repr=False, compare=False)

    def __call__(self) -> None:
        import pytest

        subject = self.run.subjects()[self.impl]
        if subject.unavailable:
            pytest.skip(f"{self.impl} is unavailable here: {subject.unavailable}")
        r = subject.clauses.get(self.clause)
        c = CLAUSES[self.clause]
        head = f"{self.impl} {self.clause} ({c.citation}, {c.severity})"
        if r is None:
            pytest.skip(f"{head}: no check of this clause ran for this implementation")
        elif r.status in ("fail", "error", "unexpected-pass"):
            pytest.fail(f"{head} {r.status}: {r.message}\n{r.detail}".rstrip(), pytrace=False)
        elif r.status == "deviation":
            pytest.xfail(f"{head}: {r.message}")
        elif r.status in ("not-judged", "not-applicable"):
            pytest.skip(f"{head} {r.status}: {r.message}")


def parametrize_with_checks(impls: str | Sequence[str], *, plugins: Sequence[str] = (),
                            clauses: str | Sequence[str] | None = None, timeout: float = 1800.0):
    """``pytest.mark.parametrize("check", ...)`` over every (implementation, clause) pair.

    impls    a registered implementation's name, a comma-separated list, or a sequence of names
             (``"all"`` works too); unknown names raise at collection, naming the known ones
    plugins  plugins to load first: module names or ``.py`` paths, as ``--plugin`` takes
    clauses  clause ids to check (``"attention.scale,mask.causal"`` or a sequence; default: every clause)
    timeout  seconds the suite may run per implementation (default 1800)
    """
    import pytest

    from aiayn_conformance.implementations import get_registry

    names = impls if isinstance(impls, str) else ",".join(impls)
    selected = [i.name for i in get_registry(tuple(plugins)).select(names)]
    clause_ids = list(CLAUSES) if clauses is None else \
        parse_clause_ids(clauses if isinstance(clauses, str) else ",".join(clauses))
    runs = {name: _SuiteRun(name, tuple(plugins), tuple(clause_ids), timeout) for name in selected}
    # With pytest-xdist, --dist loadgroup gives all of an implementation's clauses to one worker, so the suite
    # runs once per implementation. pytest-xdist 3.8 ignores the groups under pytest 9 (it rewrites a node id
    # attribute pytest 9 no longer reads): the results stay right, but each worker drawing a clause runs the suite.
    grouped = importlib.util.find_spec("xdist") is not None  # the mark is unknown (a warning) without xdist
    params = [pytest.param(ClauseCheck(name, clause, runs[name]), id=f"{name}-{clause}",
                           marks=[pytest.mark.xdist_group(name)] if grouped else [])
              for name in selected for clause in clause_ids]
    return pytest.mark.parametrize("check", params)
