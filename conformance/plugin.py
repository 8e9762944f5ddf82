"""The suite's control panel, loaded as a pytest plugin (``pytest11`` entry point
``conformance.plugin``, and ``pytest_plugins`` in the root conftest when run
from a checkout).

Options
    --impl NAME|a,b|all   implementations to audit (default: reference)
    --plugin MOD_OR_PATH  load one more plugin (repeatable)
    --check-timeout SEC   per-check time budget; a check running past it fails its clause
    --clause ID|a,b       run only the tests of these clauses (ids from docs/clauses.md)
    --results-json PATH   write one record per test (subject, clause, outcome, diagnostic) as JSON
Markers
    clause(id)            the spec clause a test checks (exactly one per test)

Deviations an implementation declares become ``xfail(strict=True)`` on the
deterministic (witness) tests of that clause, and skips on the hypothesis
tests of that clause (a random search cannot promise to find a known bug on
every run; the witness does).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from spec.clauses import CLAUSES, get_clause

from . import (
    strategies,  # noqa: F401  (registers and loads the hypothesis profiles)
    threads,
)
from .harness import CheckTimeout, ClauseViolation, ImplementationError

CONFORMANCE_DIR = Path(__file__).resolve().parent
DEFAULT_TIMEOUT = 120.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aiayn", "aiayn-conformance")
    group.addoption("--impl", action="store", default=None, metavar="NAME",
                    help="implementation(s) to audit: a name, a comma-separated list, or 'all' "
                         "(default: reference). `aiayn list` shows the names.")
    group.addoption("--plugin", action="append", default=[], metavar="MODULE_OR_PATH",
                    help="load an extra aiayn plugin from a module name or a .py file (repeatable)")
    group.addoption("--component", action="store", default=None, metavar="NAME",
                    help="component(s) to audit alone: NAME (every kind), KIND:NAME, a comma list, or 'all'; "
                         "without --impl only the component checks run")
    group.addoption("--check-timeout", action="store", type=float, default=None, metavar="SECONDS",
                    help=f"time budget per check; a check past it fails its clause "
                         f"(default {DEFAULT_TIMEOUT:g}, or $AIAYN_CHECK_TIMEOUT; 0 disables)")
    group.addoption("--clause", action="store", default=None, metavar="ID",
                    help="run only the tests of this clause (or a comma-separated list of clauses)")
    group.addoption("--results-json", action="store", default=None, metavar="PATH",
                    help="write the outcome of every test (subject, clause, diagnostic) to PATH as JSON "
                         "(what `aiayn audit` reads)")


def _registry(config: pytest.Config):
    from implementations import PluginError, get_registry

    try:
        return get_registry(config.getoption("--plugin") or ())
    except PluginError as exc:  # a plugin named with --plugin that cannot be loaded: a usage error
        raise pytest.UsageError(str(exc)) from None


def selected_implementations(config: pytest.Config):
    """The Implementations chosen by --impl (cached on the config)."""
    cached = getattr(config, "_aiayn_impls", None)
    if cached is not None:
        return cached
    from implementations import UnknownNameError

    registry = _registry(config)
    selection = config.getoption("--impl") or "reference"
    try:
        impls = registry.select(selection)
    except UnknownNameError as exc:
        raise pytest.UsageError(f"--impl: {exc}") from None
    config._aiayn_impls = impls
    return impls


def selected_components(config: pytest.Config):
    """The Components chosen by --component (cached on the config); [] without the option."""
    cached = getattr(config, "_aiayn_components", None)
    if cached is not None:
        return cached
    selection = config.getoption("--component")
    comps = []
    if selection:
        from implementations import UnknownNameError

        try:
            comps = _registry(config).select_components(selection)
        except UnknownNameError as exc:
            raise pytest.UsageError(f"--component: {exc}") from None
    config._aiayn_components = comps
    return comps


def pytest_ignore_collect(collection_path: Path, config: pytest.Config):
    """Component checks run only with --component; with --component alone, only they run."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if not Path(collection_path).resolve().is_relative_to(CONFORMANCE_DIR):
        return None
    is_component_module = collection_path.name.startswith("test_component_")
    if is_component_module and not config.getoption("--component"):
        return True
    if not is_component_module and config.getoption("--component") and config.getoption("--impl") is None:
        return True
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "clause(id): the spec clause this test checks (spec/clauses.py)")
    try:
        if hasattr(config, "workerinput"):  # an xdist worker takes its share of the CPUs
            config._aiayn_threads = threads.apply(int(config.workerinput["workercount"]))
        else:
            workers = getattr(config.option, "numprocesses", None)  # xdist's -n, resolved to a number
            config._aiayn_threads = (threads.header_line(workers) if isinstance(workers, int) and workers > 0
                                     else threads.apply(None))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if not config.pluginmanager.has_plugin("aiayn-safe-reports"):
        config.pluginmanager.register(_SafeReports(), "aiayn-safe-reports")
    if config.getoption("--impl") is not None or config.getoption("--plugin"):
        selected_implementations(config)  # fail at once on an unknown name
    selected_components(config)
    _selected_clauses(config)  # fail at once on an unknown clause
    path = config.getoption("--results-json")
    if path and not hasattr(config, "workerinput"):  # under xdist the controller records
        from .results import ResultsRecorder

        config.pluginmanager.register(ResultsRecorder(path), "aiayn-results")


def _selected_clauses(config: pytest.Config) -> list[str] | None:
    value = config.getoption("--clause")
    if not value:
        return None
    ids = [c.strip() for c in value.split(",") if c.strip()]
    unknown = [c for c in ids if c not in CLAUSES]
    if unknown or not ids:
        raise pytest.UsageError(f"--clause: unknown clause {', '.join(map(repr, unknown)) or repr(value)}; "
                                f"known: {', '.join(CLAUSES)}")
    return ids


def pytest_report_header(config: pytest.Config) -> list[str]:
    if config.getoption("--impl") is None and not config.getoption("--plugin") and not config.getoption("--component"):
        return []
    import spec

    impls = selected_implementations(config)
    lines = [f"aiayn-conformance: spec {spec.SPEC_VERSION} ({spec.PAPER}), {len(CLAUSES)} clauses"]
    from implementations.availability import version_note

    for impl in impls:
        dev = f", declares {len(impl.deviations)} deviation(s)" if impl.deviations else ""
        lines.append(f"  implementation under test: {impl.name} [{impl.output}] from {impl.source or '?'}{dev}")
        if impl.unavailable:
            lines.append(f"    unavailable, skipped: {impl.unavailable}")
        elif version_note(impl.written_for):
            lines.append(f"    {version_note(impl.written_for)}")
    for comp in selected_components(config):
        dev = f", declares {len(comp.deviations)} deviation(s)" if comp.deviations else ""
        lines.append(f"  component under test: {comp.kind}:{comp.name} from {comp.source or '?'}{dev}")
    errors = _registry(config).errors
    for err in errors:
        lines.append(f"  plugin error: {err}")
    lines.append(f"  {config._aiayn_threads}")
    env = {k: v for k, v in os.environ.items() if k.startswith("AIAYN_")}
    if env:
        lines.append("  environment: " + ", ".join(f"{k}={v}" for k, v in sorted(env.items())))
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" in metafunc.fixturenames:
        impls = selected_implementations(metafunc.config)
        # An implementation that cannot be built here (its library is not installed) is skipped with its reason.
        params = [pytest.param(i, id=i.name, marks=[pytest.mark.skip(reason=f"{i.name} is unavailable: "
                                                                           f"{i.unavailable}")]
                               if i.unavailable else []) for i in impls]
        metafunc.parametrize("impl", params, scope="module")
    if "component" in metafunc.fixturenames:
        kind = getattr(metafunc.module, "COMPONENT_KIND", None)
        comps = [c for c in selected_components(metafunc.config) if c.kind == kind]
        # A module whose kind was not selected gets no items (see pytest_collection_modifyitems).
        params = comps or [pytest.param(None, id=f"no-{kind}-selected")]
        metafunc.parametrize("component", params, ids=[c.name for c in comps] or None, scope="module")


def _is_conformance_item(item: pytest.Item) -> bool:
    """A test in conformance/, or any test run against an implementation or a component."""
    if {"impl", "component"} & set(getattr(item, "fixturenames", ())):
        return True
    try:
        return Path(str(item.path)).resolve().is_relative_to(CONFORMANCE_DIR)
    except (AttributeError, ValueError):
        return False


def item_clause(item: pytest.Item) -> str | None:
    marks = list(item.iter_markers("clause"))
    return marks[0].args[0] if marks and marks[0].args else None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = []
    unselected = [i for i in items if getattr(i, "callspec", None) is not None
                  and "component" in i.callspec.params and i.callspec.params["component"] is None]
    if unselected:
        config.hook.pytest_deselected(items=unselected)
        items[:] = [i for i in items if i not in unselected]
    for item in items:
        marks = list(item.iter_markers("clause"))
        if not marks:
            if _is_conformance_item(item):
                problems.append(f"{item.nodeid}: no @pytest.mark.clause(...) marker")
            continue
        ids = [m.args[0] if m.args else None for m in marks]
        if len(ids) != 1:
            problems.append(f"{item.nodeid}: exactly one clause marker expected, found {ids}")
            continue
        clause_id = ids[0]
        if clause_id not in CLAUSES:
            problems.append(f"{item.nodeid}: unknown clause {clause_id!r} (known: {', '.join(CLAUSES)})")
            continue
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        subject = params.get("impl") or params.get("component")
        if params.get("impl") is not None:
            item.user_properties.append(("aiayn_subject", f"impl:{subject.name}"))
        elif params.get("component") is not None:
            item.user_properties.append(("aiayn_subject", f"component:{subject.kind}:{subject.name}"))
        why = getattr(subject, "deviations", {}).get(clause_id) if subject is not None else None
        if why is None:
            continue
        if item.get_closest_marker("hypothesis") is not None:
            item.add_marker(pytest.mark.skip(
                reason=f"declared deviation {clause_id} ({why}); the witness test checks it"))
        else:
            # Not strict per test: a clause has several witnesses and a deviation may break only some.
            # Strictness is per clause, in pytest_sessionfinish: at least one witness must fail.
            item.add_marker(pytest.mark.xfail(
                strict=False, raises=AssertionError, reason=f"declared deviation {clause_id}: {why}"))
            item.user_properties.append(("aiayn_declared", f"{subject.name}::{clause_id}"))
    if problems:
        raise pytest.UsageError("conformance tests with bad clause markers:\n  " + "\n  ".join(problems))
    wanted = _selected_clauses(config)
    if wanted is not None:
        keep = [i for i in items if item_clause(i) in wanted]
        config.hook.pytest_deselected(items=[i for i in items if item_clause(i) not in wanted])
        items[:] = keep


class DeclaredDeviations:
    """Per (implementation, clause) outcome of the witness tests of a declared deviation."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.unseen: dict[str, int] = {}

    def record(self, report: pytest.TestReport) -> None:
        key = dict(report.user_properties).get("aiayn_declared")
        if key is None or report.when != "call":
            return
        self.seen.setdefault(key, 0)
        self.unseen.setdefault(key, 0)
        if report.skipped and hasattr(report, "wasxfail"):
            self.seen[key] += 1
        elif report.passed:
            self.unseen[key] += 1

    def not_observed(self) -> list[str]:
        return [key for key, n in self.seen.items() if n == 0 and self.unseen.get(key, 0) > 0]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    session.config._aiayn_declared = DeclaredDeviations()
    session.config.pluginmanager.register(_DeclaredRecorder(session.config._aiayn_declared), "aiayn-declared")


class _DeclaredRecorder:
    def __init__(self, tracker: DeclaredDeviations) -> None:
        self.tracker = tracker

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.tracker.record(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    tracker = getattr(session.config, "_aiayn_declared", None)
    missing = tracker.not_observed() if tracker is not None else []
    session.config._aiayn_not_observed = missing
    if missing and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    missing = getattr(config, "_aiayn_not_observed", [])
    if missing:
        terminalreporter.section("declared deviations not observed", sep="=", red=True, bold=True)
        for key in missing:
            name, clause_id = key.split("::", 1)
            terminalreporter.line(f"{name}: declares {clause_id}, but every witness test of that clause passed "
                                  f"(the declaration is stale, or the suite misses the bug)", red=True)


def _timeout(config: pytest.Config) -> float:
    value = config.getoption("--check-timeout")
    if value is None:
        value = float(os.environ.get("AIAYN_CHECK_TIMEOUT", DEFAULT_TIMEOUT))
    return value


# After this many checks of one subject ran past the budget, its remaining checks error at once: a hanging
# implementation costs minutes, not the budget times every check.
TIMEOUTS_BEFORE_GIVING_UP = 2
# Once a phase's budget is spent the alarm fires again at this interval until the phase ends, so nothing run
# after the first interruption (hypothesis replaying the failing example, a retry in a check) can stall.
REFIRE_SECONDS = 1.0


def _subject(item: pytest.Item) -> str | None:
    """The implementation or component under test (``NAME`` or ``KIND:NAME``), as recorded at collection."""
    subject = dict(item.user_properties).get("aiayn_subject")
    return subject.split(":", 1)[1] if subject else None


_TIMEOUTS = pytest.StashKey[dict]()  # subject -> how many of its checks ran past the budget


def _budgeted_phase(item: pytest.Item, phase: str):
    """Run a test phase (fixture setup or the call) under the per-check time budget (SIGALRM)."""
    budget = _timeout(item.config)
    if (budget <= 0 or not hasattr(signal, "setitimer") or item.get_closest_marker("clause") is None
            or threading.current_thread() is not threading.main_thread()):
        return (yield)
    subject, clause = _subject(item), get_clause(item_clause(item))
    timeouts = item.config.stash.setdefault(_TIMEOUTS, {})
    if subject is not None and timeouts.get(subject, 0) >= TIMEOUTS_BEFORE_GIVING_UP:
        raise CheckTimeout(f"[{clause.id}] ({clause.citation}) could not be checked: not run, because "
                           f"{timeouts[subject]} earlier checks of {subject} ran past the time budget of {budget:g} s "
                           f"(--check-timeout); the implementation hangs or is far too slow")
    state = {"active": True, "spent": False}

    def on_alarm(signum, frame):
        if not state["active"]:  # the phase is ending: never raise into pytest's own code
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    return (yield from _budgeted_phase(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _budgeted_phase(item, "the call"))


def _interrupted_at(timeout: CheckTimeout) -> str:
    """Where the time budget's alarm found the check: the innermost frame outside this module."""
    tb, where = timeout.__traceback__, ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if tb.tb_lineno is not None and Path(code.co_filename).resolve() != Path(__file__).resolve():
            where = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    return where


def _diagnostic(exc: BaseException | None) -> BaseException | None:
    """Our own exception behind ``exc``: itself, or one inside an exception group or its cause/context.

    Hypothesis wraps failures: a check whose replay ended differently (an error, then a timeout while
    shrinking it) arrives as a FlakyFailure group holding both.
    """
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


class _SafeReports:
    """Registered in pytest_configure (pytest reads only ``pytest_*`` names, so this lives on an object)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        return _report_without_crashing(item, call)


def _report_without_crashing(item: pytest.Item, call: pytest.CallInfo):
    """pytest's own report, unless formatting the traceback fails or the check ran out of time.

    The time budget's alarm can land anywhere, hypothesis's tracer included, and pytest cannot format a
    traceback entry that has no line number: an INTERNALERROR that would end the whole run. A timeout's
    message stands alone (plus where it was interrupted), and any other formatting failure falls back to
    the exception's text.
    """
    if call.excinfo is None:
        return None
    found = _diagnostic(call.excinfo.value)
    if isinstance(found, CheckTimeout):
        where = _interrupted_at(found) if getattr(found, "interrupted", False) else ""
        text = str(found) + (f"\n  interrupted at: {where}" if where else "")
    else:
        try:
            return pytest.TestReport.from_item_and_call(item, call)
        except Exception as exc:  # pytest's formatter failed; the run must go on
            shown = found if found is not None else call.excinfo.value
            text = f"{shown}\n  (pytest could not format the traceback: {type(exc).__name__}: {exc})"
    return pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed", text, call.when,
                             duration=call.duration, start=call.start, stop=call.stop,
                             user_properties=list(item.user_properties))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    clause_id = item_clause(item)
    if clause_id is not None:
        report.user_properties.append(("clause", clause_id))
    # The call, or a fixture's setup (a module's model built once): either way the diagnostic is the message.
    if call.excinfo is not None and call.when in ("setup", "call"):
        exc = _diagnostic(call.excinfo.value)
        if exc is not None:
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
    return report
