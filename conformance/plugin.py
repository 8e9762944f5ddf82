"""The suite's control panel, loaded as a pytest plugin (``pytest11`` entry point
``conformance.plugin``, and ``pytest_plugins`` in the root conftest when run
from a checkout).

Options
    --impl NAME|a,b|all   implementations to audit (default: reference)
    --plugin MOD_OR_PATH  load one more plugin (repeatable)
    --component SEL       components to audit alone (NAME, KIND:NAME, a comma list, or 'all')
    --check-timeout SEC   per-check time budget; a check running past it is reported as an error of its
                          clause ("could not be checked"), and after two such checks the subject's remaining
                          checks error at once
    --clause ID|a,b       run only the tests of these clauses (ids from docs/clauses.md)
    --results-json PATH   write one record per test (subject, clause, outcome, diagnostic) as JSON
    --config SPEC         audit at these sizes: key=value pairs (d_model=64,h=4), a .json/.toml file, or a
                          Hugging Face config.json or model directory (conformance.user_config)
    --weights PATH        run on these trained weights (one implementation): a state_dict, a .safetensors
                          file or a Hugging Face model directory (conformance.user_weights); checks marked
                          canonical_weights are skipped
Markers
    clause(id)            the spec clause a test checks (exactly one per test, the literal id)
    component_kind(kind)  on a check taking the ``component`` fixture: the kind of component it audits
    canonical_weights(why) on a check that needs the suite's own weights (an initial state it trains from):
                          skipped under --weights, with ``why``

Which checks run is decided by their fixtures, never by file names: a check taking ``impl`` runs once per
implementation of --impl (default: reference); a check taking ``component`` runs once per selected
component of its ``component_kind``, and only with --component. With --component and no --impl, only the
component checks run.

The clause under test: around each test's setup, call and teardown the plugin makes the test's clause the
current one (``harness.checking``), so helpers (``violation``, ``could_not_check``, ``build_model``,
``run_forward``, ...) know it without being told. Likewise the test's implementation is the one under test
(``shapes.under_test``): its shape contract, probed on first use, fits the witnesses to the shapes it accepts
and skips forward calls at shapes it rejects ("blocked by model.shape").

Declared deviations: on each deterministic (witness) test of a clause an implementation or component
declares as a deviation, the test is marked ``xfail(strict=False, raises=AssertionError)`` (a clause has
several witnesses, and a deviation may break only some of them); the hypothesis tests of that clause are
skipped (a random search cannot promise to find a known bug on every run; the witness does). Strictness is
per clause, at session end: a declared clause none of whose witness tests failed fails the run (exit 1,
"declared deviations not observed"; "U" in the audit). An implementation error or a timeout is not excused
by a declaration: it is reported as an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

import pytest

from aiayn_conformance.spec.clauses import CLAUSES, get_clause, parse_clause_ids
from aiayn_conformance.spec.config import ModelConfig

from . import (
    inputs,
    shapes,
    strategies,  # noqa: F401  (registers and loads the hypothesis profiles)
    threads,
)
from .harness import USER_WEIGHTS, CheckTimeout, ClauseViolation, ImplementationError, checking

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Component, Implementation, Registry

CONFORMANCE_DIR = Path(__file__).resolve().parent
DEFAULT_TIMEOUT = 120.0

# What the plugin keeps on pytest's Config for the session.
IMPLS = pytest.StashKey["list[Implementation]"]()  # chosen by --impl
COMPONENTS = pytest.StashKey["list[Component]"]()  # chosen by --component
THREADS = pytest.StashKey[str]()  # the report header's line on torch threads
DECLARED = pytest.StashKey["DeclaredDeviations"]()  # witness outcomes of declared deviations
NOT_OBSERVED = pytest.StashKey["list[str]"]()  # "NAME::clause" declared but never observed failing


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
                    help=f"time budget per check; a check past it is reported as an error of its clause "
                         f"(default {DEFAULT_TIMEOUT:g}, or $AIAYN_CHECK_TIMEOUT; 0 disables)")
    group.addoption("--clause", action="store", default=None, metavar="ID",
                    help="run only the tests of this clause (or a comma-separated list of clauses)")
    group.addoption("--config", action="store", default=None, metavar="SPEC",
                    help="audit at these sizes: key=value pairs (d_model=64,h=4,src_vocab=40), a .json or .toml "
                         "file, or a Hugging Face config.json or model directory (keys: ModelConfig's fields)")
    group.addoption("--weights", action="store", default=None, metavar="PATH",
                    help="run the checks on these trained weights (one --impl): a torch state_dict (.pt/.pth), a "
                         ".safetensors file or a Hugging Face model directory; checks that need the suite's own "
                         "weights are skipped")
    group.addoption("--results-json", action="store", default=None, metavar="PATH",
                    help="write the outcome of every test (subject, clause, diagnostic) to PATH as JSON "
                         "(what `aiayn audit` reads)")


def _registry(config: pytest.Config) -> Registry:
    from aiayn_conformance.implementations import PluginError, get_registry

    try:
        return get_registry(config.getoption("--plugin") or ())
    except PluginError as exc:  # a plugin named with --plugin that cannot be loaded: a usage error
        raise pytest.UsageError(str(exc)) from None


def selected_implementations(config: pytest.Config) -> list[Implementation]:
    """The Implementations chosen by --impl (kept in the config's stash)."""
    if IMPLS in config.stash:
        return config.stash[IMPLS]
    from aiayn_conformance.implementations import UnknownNameError

    registry = _registry(config)
    selection = config.getoption("--impl") or "reference"
    try:
        impls = registry.select(selection)
    except UnknownNameError as exc:
        raise pytest.UsageError(f"--impl: {exc}") from None
    config.stash[IMPLS] = impls
    return impls


def selected_components(config: pytest.Config) -> list[Component]:
    """The Components chosen by --component (kept in the config's stash); [] without the option."""
    if COMPONENTS in config.stash:
        return config.stash[COMPONENTS]
    selection = config.getoption("--component")
    comps: list[Component] = []
    if selection:
        from aiayn_conformance.implementations import UnknownNameError

        try:
            comps = _registry(config).select_components(selection)
        except UnknownNameError as exc:
            raise pytest.UsageError(f"--component: {exc}") from None
    config.stash[COMPONENTS] = comps
    return comps


def components_only(config: pytest.Config) -> bool:
    """--component without --impl: only the component checks run."""
    return bool(config.getoption("--component")) and config.getoption("--impl") is None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "clause(id): the spec clause this test checks (spec/clauses.py)")
    config.addinivalue_line("markers", "component_kind(kind): the kind of component a check taking the "
                                       "`component` fixture audits")
    try:
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None:  # an xdist worker takes its share of the CPUs
            config.stash[THREADS] = threads.apply(int(workerinput["workercount"]))
        else:
            workers = getattr(config.option, "numprocesses", None)  # xdist's -n, resolved to a number
            config.stash[THREADS] = (threads.header_line(workers) if isinstance(workers, int) and workers > 0
                                     else threads.apply(None))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.addinivalue_line("markers", "canonical_weights(why): the check needs the suite's own weights; skipped "
                                       "under --weights")
    if not config.pluginmanager.has_plugin("aiayn-safe-reports"):
        config.pluginmanager.register(_SafeReports(), "aiayn-safe-reports")
    if config.getoption("--impl") is not None or config.getoption("--plugin"):
        selected_implementations(config)  # fail at once on an unknown name
    selected_components(config)
    _selected_clauses(config)  # fail at once on an unknown clause
    _audit_configuration(config)
    path = config.getoption("--results-json")
    if path and not hasattr(config, "workerinput"):  # under xdist the controller records
        from .results import ResultsRecorder

        config.pluginmanager.register(ResultsRecorder(path), "aiayn-results")


PREVIOUS_CONFIG = pytest.StashKey[ModelConfig]()  # the audit configuration before --config, restored after
AUDIT_AT = pytest.StashKey[str]()  # the report header's line on --config / --weights


def _audit_configuration(config: pytest.Config) -> None:
    """Apply --config (the audit configuration, in place: ``configs.audit_at``) and --weights (checked to fit
    the implementation built at it, then loaded by ``harness.build_model``), before any check is collected."""
    from . import configs, harness
    from .user_config import ConfigError
    from .user_weights import WeightsError, fit_problem, resolve

    spec, path = config.getoption("--config"), config.getoption("--weights")
    if not spec and not path:
        return
    impls = [] if components_only(config) or not path else selected_implementations(config)
    try:
        new, weights, sizes = resolve(spec, path, configs.CONFIG, impls)
    except (ConfigError, WeightsError) as exc:
        raise pytest.UsageError(str(exc)) from None
    if new is not None:
        config.stash[PREVIOUS_CONFIG] = configs.audit_at(new)
    config.stash[AUDIT_AT] = f"audit configuration (sizes from {sizes}): {configs.CONFIG}"
    if weights is None:
        return
    problem = fit_problem(impls, configs.CONFIG, weights)
    if problem:
        raise pytest.UsageError(problem)
    if weights.build is not None:  # a toolkit checkpoint: the model is built with its own options
        impls[0] = dataclasses.replace(impls[0], build=weights.build)
    harness.USER_WEIGHTS[impls[0].name] = weights
    config.stash[AUDIT_AT] += f"; weights: {weights.path}" + (f" ({weights.describes})" if weights.describes else "")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Restore the suite's own audit configuration and forget the weights (several sessions in one process)."""
    from . import configs, harness

    if PREVIOUS_CONFIG in config.stash:
        configs.audit_at(config.stash[PREVIOUS_CONFIG])
        del config.stash[PREVIOUS_CONFIG]
    if config.getoption("--weights", None):
        harness.USER_WEIGHTS.clear()


def _selected_clauses(config: pytest.Config) -> list[str] | None:
    value = config.getoption("--clause")
    if not value:
        return None
    try:
        return parse_clause_ids(value)
    except ValueError as exc:
        raise pytest.UsageError(f"--clause: {exc}") from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    if config.getoption("--impl") is None and not config.getoption("--plugin") and not config.getoption("--component"):
        return []
    from aiayn_conformance import spec

    impls = [] if components_only(config) else selected_implementations(config)
    lines = [f"aiayn-conformance: spec {spec.SPEC_VERSION} ({spec.PAPER}), {len(CLAUSES)} clauses"]
    from aiayn_conformance.implementations.availability import version_note

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
    if AUDIT_AT in config.stash:
        lines.append(f"  {config.stash[AUDIT_AT]}")
    lines.append(f"  {config.stash[THREADS]}")
    env = {k: v for k, v in os.environ.items() if k.startswith("AIAYN_")}
    if env:
        lines.append("  environment: " + ", ".join(f"{k}={v}" for k, v in sorted(env.items())))
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``impl`` and ``component`` are parametrized per module (a module-scoped fixture builds once per
    subject). A subject kind that is not selected gets one ``None`` parameter, dropped at collection."""
    if "impl" in metafunc.fixturenames:
        if components_only(metafunc.config):
            metafunc.parametrize("impl", [pytest.param(None, id="no-impl-selected")], scope="module")
        else:
            impls = selected_implementations(metafunc.config)
            # An implementation that cannot be built here (its library is not installed) is skipped with its
            # reason.
            impl_params = [pytest.param(i, id=i.name,
                                        marks=[pytest.mark.skip(reason=f"{i.name} is unavailable: {i.unavailable}")]
                                        if i.unavailable else []) for i in impls]
            metafunc.parametrize("impl", impl_params, scope="module")
    if "component" in metafunc.fixturenames:
        kind = component_kind(metafunc.definition)
        comps = [c for c in selected_components(metafunc.config) if c.kind == kind]
        params: list[Any] = list(comps) or [pytest.param(None, id=f"no-{kind}-selected")]
        metafunc.parametrize("component", params, ids=[c.name for c in comps] or None, scope="module")


def component_kind(item: pytest.Item) -> str | None:
    """The kind of component a check taking ``component`` audits (its ``component_kind`` marker), or None when
    the marker is missing or names no known kind (reported at collection)."""
    from aiayn_conformance.implementations import COMPONENT_KINDS

    mark = item.get_closest_marker("component_kind")
    kind = mark.args[0] if mark is not None and mark.args else None
    return kind if kind in COMPONENT_KINDS else None


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


def _is_hypothesis_test(item: pytest.Item) -> bool:
    """A ``@given`` test (hypothesis's own ``hypothesis`` marker is added after this plugin's collection hook)."""
    return hasattr(getattr(item, "obj", None), "hypothesis")


def _params(item: pytest.Item) -> dict[str, Any]:
    callspec = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec is not None else {}


def _unselected(item: pytest.Item) -> bool:
    """A check whose subject was not selected (a ``None`` parameter), or any other conformance check when only
    components are audited."""
    params = _params(item)
    if ("impl" in params and params["impl"] is None) or ("component" in params and params["component"] is None):
        return True
    return components_only(item.config) and "component" not in params and _is_conformance_item(item)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    from aiayn_conformance.implementations import COMPONENT_KINDS

    problems = [f"{item.nodeid}: a check taking `component` needs @pytest.mark.component_kind(KIND), KIND one of "
                f"{', '.join(COMPONENT_KINDS)}" for item in items
                if "component" in getattr(item, "fixturenames", ()) and component_kind(item) is None]
    # Checks of a subject kind that was not selected are dropped silently, as if never collected: they are not
    # deselected by the user (--clause, -k), they simply have nothing to check.
    items[:] = [i for i in items if not _unselected(i)]
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
        params = _params(item)
        impl, comp = params.get("impl"), params.get("component")
        canonical = item.get_closest_marker("canonical_weights")
        if impl is not None and canonical is not None and impl.name in USER_WEIGHTS:
            item.add_marker(pytest.mark.skip(reason=f"needs canonical weights: {canonical.args[0]} (--weights)"))
        if impl is not None:
            item.user_properties.append(("aiayn_subject", f"impl:{impl.name}"))
        elif comp is not None:
            item.user_properties.append(("aiayn_subject", f"component:{comp.kind}:{comp.name}"))
        subject = impl if impl is not None else comp
        why = subject.deviations.get(clause_id) if subject is not None else None
        if subject is None or why is None:
            continue
        if _is_hypothesis_test(item):
            item.add_marker(pytest.mark.skip(
                reason=f"declared deviation {clause_id} ({why}); the witness test checks it"))
        else:
            # Not strict per test: a clause has several witnesses and a deviation may break only some.
            # Strictness is per clause, in pytest_sessionfinish: at least one witness must fail.
            item.add_marker(pytest.mark.xfail(
                strict=False, raises=AssertionError, reason=f"declared deviation {clause_id}: {why}"))
            item.user_properties.append(("aiayn_declared", f"{subject.name}::{clause_id}"))
    if problems:
        raise pytest.UsageError("conformance tests with bad markers:\n  " + "\n  ".join(problems))
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
        if not isinstance(key, str) or report.when != "call":
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
    session.config.stash[DECLARED] = DeclaredDeviations()
    session.config.pluginmanager.register(_DeclaredRecorder(session.config.stash[DECLARED]), "aiayn-declared")


class _DeclaredRecorder:
    def __init__(self, tracker: DeclaredDeviations) -> None:
        self.tracker = tracker

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.tracker.record(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    tracker = session.config.stash.get(DECLARED, None)
    missing = tracker.not_observed() if tracker is not None else []
    session.config.stash[NOT_OBSERVED] = missing
    if missing and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    missing = config.stash.get(NOT_OBSERVED, [])
    if missing:
        terminalreporter.section("declared deviations not observed", sep="=", red=True, bold=True)
        for key in missing:
            name, clause_id = key.split("::", 1)
            terminalreporter.line(f"{name}: declares {clause_id}, but every witness test of that clause passed "
                                  f"(the declaration is stale, or the suite misses the bug)", red=True)


def _timeout(config: pytest.Config) -> float:
    value = config.getoption("--check-timeout")
    if value is None:
        return float(os.environ.get("AIAYN_CHECK_TIMEOUT", DEFAULT_TIMEOUT))
    return float(value)


# After this many checks of one subject ran past the budget, its remaining checks error at once: a hanging
# implementation costs minutes, not the budget times every check.
TIMEOUTS_BEFORE_GIVING_UP = 2
# Once a phase's budget is spent the alarm fires again at this interval until the phase ends, so nothing run
# after the first interruption (hypothesis replaying the failing example, a retry in a check) can stall.
REFIRE_SECONDS = 1.0


def _subject(item: pytest.Item) -> str | None:
    """The implementation or component under test (``NAME`` or ``KIND:NAME``), as recorded at collection."""
    subject = dict(item.user_properties).get("aiayn_subject")
    return subject.split(":", 1)[1] if isinstance(subject, str) else None


_TIMEOUTS = pytest.StashKey[dict[str, int]]()  # subject -> how many of its checks ran past the budget

# Time the check's thread spent runnable but waiting for a CPU (other processes' load) does not count against the
# budget, up to this many times the budget in wall time: on a loaded machine a verdict must not depend on the load,
# and a hang (which waits for no CPU) is still stopped at the budget.
MAX_STRETCH = 5.0
_SCHEDSTAT = Path("/proc/thread-self/schedstat")


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


def _budgeted_phase(item: pytest.Item, phase: str) -> Generator[None, object, object]:
    """Run a test phase (fixture setup or the call) under the per-check time budget (SIGALRM); time spent waiting
    for a CPU is given back (``budget_left``)."""
    budget = _timeout(item.config)
    clause_id = item_clause(item)
    if (budget <= 0 or not hasattr(signal, "setitimer") or clause_id is None
            or threading.current_thread() is not threading.main_thread()):
        return (yield)
    subject, clause = _subject(item), get_clause(clause_id)
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


@contextlib.contextmanager
def _under_its_clause(item: pytest.Item) -> Iterator[None]:
    """The item's clause is the clause under test (``harness.current_clause``) while this is open, and its
    implementation the one under test (``shapes.current``: its shape contract fits the witnesses and gates
    forward calls)."""
    clause_id = item_clause(item)
    if clause_id not in CLAUSES:  # not a conformance check (or a bad marker, rejected at collection)
        yield
        return
    with checking(clause_id), shapes.under_test(_params(item).get("impl"), inputs.CONFIG,
                                                 lengths=inputs.WITNESS_LENGTHS, batches=inputs.WITNESS_BATCHES,
                                                 witness=inputs.WITNESS_SHAPE):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    with _under_its_clause(item):
        return (yield from _budgeted_phase(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    with _under_its_clause(item):
        return (yield from _budgeted_phase(item, "the call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    with _under_its_clause(item):
        return (yield)


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
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport | None:
        return _report_without_crashing(item, call)


def _report_without_crashing(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport | None:
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
    when = cast(Any, call.when)  # "setup", "call" or "teardown": reports are made per phase
    return pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed", text, when,
                             duration=call.duration, start=call.start, stop=call.stop,
                             user_properties=list(item.user_properties))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
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
