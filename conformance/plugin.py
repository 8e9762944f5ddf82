"""The suite's pytest hooks and fixtures (``pytest11`` entry point ``aiayn_conformance.conformance.plugin``, and
``pytest_plugins`` in the root conftest from a checkout). The work is in ``helpers/``: options and settings
(``options``, ``settings``), the time budget (``budget``), the declared deviations (``ledger``), reports
(``reports``).

Options: ``--impl``, ``--plugin``, ``--component``, ``--check-timeout``, ``--clause``, ``--config``,
``--weights``, ``--results-json`` (``pytest --help``, group aiayn-conformance).

Markers: ``clause(id)`` (exactly one per check, the literal id), ``component_kind(kind)`` (on a check taking
``component``), ``canonical_weights(why)`` (a check that needs the suite's own weights; skipped under --weights).

Which checks run is decided by their fixtures: a check taking ``impl`` runs once per implementation of --impl
(default: reference), one taking ``component`` once per selected component of its kind, and only with
--component. Around every phase of a check its clause is the clause under test (``harness.checking``), its
implementation the one under test (``shapes.under_test``), and the session's settings the current ones
(``settings.using``).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from aiayn_conformance.spec.clauses import CLAUSES, NOT_APPLICABLE
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import parameter_count

from .helpers import (
    inputs,
    shapes,
    strategies,  # registers and loads the hypothesis profiles
    threads,
)
from .helpers.budget import budgeted_phase
from .helpers.harness import checking, device_blocking
from .helpers.items import (
    component_kind,
    is_conformance_item,
    is_hypothesis_test,
    item_clause,
    longest_files_first,
    params,
)
from .helpers.ledger import DeclaredDeviations, Judgements, mark_declared
from .helpers.options import (
    add_options,
    audit_settings,
    components_only,
    registry,
    selected_clauses,
    selected_components,
    selected_implementations,
)
from .helpers.reports import SafeReports, annotate
from .helpers.settings import AuditSettings, using

THREADS = pytest.StashKey[str]()  # the report header's line on torch threads
DECLARED = pytest.StashKey[DeclaredDeviations]()
NOT_OBSERVED = pytest.StashKey["list[str]"]()  # "NAME::clause" declared but never observed failing
JUDGEMENTS = pytest.StashKey[Judgements]()  # which (subject, clause) a check judged


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "clause(id): the spec clause this test checks (spec/clauses.py)")
    config.addinivalue_line("markers", "component_kind(kind): the kind of component a check taking the "
                                       "`component` fixture audits")
    config.addinivalue_line("markers", "canonical_weights(why): the check needs the suite's own weights; skipped "
                                       "under --weights")
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
    if not config.pluginmanager.has_plugin("aiayn-safe-reports"):
        config.pluginmanager.register(SafeReports(), "aiayn-safe-reports")
    if config.getoption("--impl") is not None or config.getoption("--plugin"):
        selected_implementations(config)  # fail at once on an unknown name
    selected_components(config)
    selected_clauses(config)  # fail at once on an unknown clause
    settings = audit_settings(config)
    if settings.device != "cpu":  # float32 means float32 on the accelerator too
        import torch

        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    path = config.getoption("--results-json")
    if path and not hasattr(config, "workerinput"):  # under xdist the controller records
        from .helpers.results import ResultsRecorder

        config.pluginmanager.register(ResultsRecorder(path), "aiayn-results")


@pytest.fixture(scope="session")
def settings(pytestconfig: pytest.Config) -> AuditSettings:
    """The audit's settings: its configuration, the configurations derived from it, the user's weights."""
    return audit_settings(pytestconfig)


@pytest.fixture(scope="session")
def config(settings: AuditSettings) -> ModelConfig:
    """The configuration the audit runs at (the tiny preset, or --config's, or a checkpoint's)."""
    return settings.config


def pytest_report_header(config: pytest.Config) -> list[str]:
    if config.getoption("--impl") is None and not config.getoption("--plugin") and not config.getoption("--component"):
        return []
    from aiayn_conformance import spec
    from aiayn_conformance.implementations.availability import version_note

    impls = [] if components_only(config) else selected_implementations(config)
    lines = [f"aiayn-conformance: spec {spec.SPEC_VERSION} ({spec.PAPER}), {len(CLAUSES)} clauses"]
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
    for err in registry(config).errors:
        lines.append(f"  plugin error: {err}")
    settings = audit_settings(config)
    if settings.header:
        lines.append(f"  {settings.header}")
    if settings.device != "cpu":
        lines.append(f"  device: every check's models on {settings.device} (inputs and outputs cross to the CPU)")
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
            # An implementation that cannot be built here (its library is not installed) is skipped with its reason.
            impl_params = [pytest.param(i, id=i.name,
                                        marks=[pytest.mark.skip(reason=f"{i.name} is unavailable: {i.unavailable}")]
                                        if i.unavailable else [])
                           for i in selected_implementations(metafunc.config)]
            metafunc.parametrize("impl", impl_params, scope="module")
    if "component" in metafunc.fixturenames:
        kind = component_kind(metafunc.definition)
        comps = [c for c in selected_components(metafunc.config) if c.kind == kind]
        choices: list[Any] = list(comps) or [pytest.param(None, id=f"no-{kind}-selected")]
        metafunc.parametrize("component", choices, ids=[c.name for c in comps] or None, scope="module")


def _unselected(item: pytest.Item) -> bool:
    """A check whose subject was not selected (a ``None`` parameter), or any other conformance check when only
    components are audited."""
    given = params(item)
    if ("impl" in given and given["impl"] is None) or ("component" in given and given["component"] is None):
        return True
    return components_only(item.config) and "component" not in given and is_conformance_item(item)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    from aiayn_conformance.implementations import COMPONENT_KINDS

    problems = [f"{item.nodeid}: a check taking `component` needs @pytest.mark.component_kind(KIND), KIND one of "
                f"{', '.join(COMPONENT_KINDS)}" for item in items
                if "component" in getattr(item, "fixturenames", ()) and component_kind(item) is None]
    # Checks of a subject kind that was not selected are dropped silently, as if never collected: they are not
    # deselected by the user (--clause, -k), they simply have nothing to check.
    items[:] = [i for i in items if not _unselected(i)]
    settings = audit_settings(config)
    for item in items:
        marks = list(item.iter_markers("clause"))
        if not marks:
            if is_conformance_item(item):
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
        given = params(item)
        impl, comp = given.get("impl"), given.get("component")
        canonical = item.get_closest_marker("canonical_weights")
        if impl is not None and canonical is not None and impl.name == settings.weights_for:
            item.add_marker(pytest.mark.skip(reason=f"needs canonical weights: {canonical.args[0]} (--weights)"))
        if impl is not None:
            item.user_properties.append(("aiayn_subject", f"impl:{impl.name}"))
        elif comp is not None:
            item.user_properties.append(("aiayn_subject", f"component:{comp.kind}:{comp.name}"))
        subject = impl if impl is not None else comp
        why = subject.deviations.get(clause_id) if subject is not None else None
        if subject is not None and why is not None:
            mark_declared(item, subject.name, clause_id, why)
    if problems:
        raise pytest.UsageError("conformance tests with bad markers:\n  " + "\n  ".join(problems))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the collection xdist hands out file by file: the longest files first
        items[:] = longest_files_first(items)  # (a run in one process keeps its order and its memos' measured peaks)
    fewer = strategies.examples_for(parameter_count(settings.config))
    if fewer is not None:  # a large model: fewer examples per explored check
        _fewer_examples(config, items, fewer)
    wanted = selected_clauses(config)
    if wanted is not None:
        keep = [i for i in items if item_clause(i) in wanted]
        config.hook.pytest_deselected(items=[i for i in items if item_clause(i) not in wanted])
        items[:] = keep


def _fewer_examples(config: pytest.Config, items: list[pytest.Item], fewer: int) -> None:
    """At most ``fewer`` examples for each explored check, for this session only. Hypothesis reads a test's settings
    from its function object (the one @given wrapped, which parametrized items share, and which refuses a second
    @settings), so the attribute is set once per function and restored when the session ends."""
    from hypothesis import settings as hypothesis_settings

    attribute = "_hypothesis_internal_use_settings"
    seen: set[int] = set()
    for item in items:
        fn = getattr(item, "obj", None)
        if not (is_hypothesis_test(item) and isinstance(item, pytest.Function)) or id(fn) in seen:
            continue
        seen.add(id(fn))
        before = getattr(fn, attribute, None)
        parent = before if isinstance(before, hypothesis_settings) else hypothesis_settings()
        setattr(fn, attribute, hypothesis_settings(parent, max_examples=min(parent.max_examples, fewer)))
        config.add_cleanup(functools.partial(setattr, fn, attribute, before))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[DECLARED] = DeclaredDeviations()
    session.config.pluginmanager.register(session.config.stash[DECLARED], "aiayn-declared")
    session.config.stash[JUDGEMENTS] = Judgements()
    session.config.pluginmanager.register(session.config.stash[JUDGEMENTS], "aiayn-judgements")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    tracker = session.config.stash.get(DECLARED, None)
    missing = tracker.not_observed() if tracker is not None else []
    session.config.stash[NOT_OBSERVED] = missing
    if missing and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    judgements = config.stash.get(JUDGEMENTS, None)
    if judgements is not None:
        not_judged, not_applicable = judgements.unjudged()
        if not_judged:
            terminalreporter.section("clauses not judged (every check skipped: no finding either way)", sep="=",
                                     yellow=True)
            for subject, clause_id, reasons in not_judged:
                c = CLAUSES[clause_id]
                terminalreporter.line(f"{subject} {clause_id} ({c.citation}, {c.severity}): {'; '.join(reasons)}")
        if not_applicable:
            terminalreporter.section("clauses not applicable", sep="=")
            for subject, clause_id, reasons in not_applicable:
                terminalreporter.line(f"{subject} {clause_id}: {reasons[0][len(NOT_APPLICABLE):]}")
    missing = config.stash.get(NOT_OBSERVED, [])
    if missing:
        terminalreporter.section("declared deviations not observed", sep="=", red=True, bold=True)
        for key in missing:
            name, clause_id = key.split("::", 1)
            terminalreporter.line(f"{name}: declares {clause_id}, but every witness test of that clause passed "
                                  f"(the declaration is stale, or the suite misses the bug)", red=True)


@contextlib.contextmanager
def _under_its_clause(item: pytest.Item) -> Iterator[None]:
    """While open: the item's clause is the clause under test, its implementation the one under test (its shape
    contract fits the witnesses and gates forward calls), the session's settings the current ones."""
    clause_id = item_clause(item)
    if clause_id not in CLAUSES:  # not a conformance check (or a bad marker, rejected at collection)
        yield
        return
    settings = audit_settings(item.config)
    with using(settings), checking(clause_id), shapes.under_test(
            params(item).get("impl"), settings.config, lengths=inputs.WITNESS_LENGTHS,
            batches=inputs.WITNESS_BATCHES, witness=inputs.WITNESS_SHAPE):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    with _under_its_clause(item):
        return (yield from _device_blocked(item, budgeted_phase(item, "setup")))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    with _under_its_clause(item):
        return (yield from _device_blocked(item, budgeted_phase(item, "the call")))


def _device_blocked(item: pytest.Item, phase: Generator[None, object, object]) -> Generator[None, object, object]:
    """``phase``, with a check that fails because the model mixes devices on the audit's device (``--device``)
    skipped as blocked by device.portable, which judges that (harness.device_blocking)."""
    try:
        return (yield from phase)
    except Exception as exc:
        reason = device_blocking(exc) if item_clause(item) in CLAUSES else ""
        if reason:
            pytest.skip(reason)
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    with _under_its_clause(item):
        result = yield
    if item_clause(item) in CLAUSES and (nextitem is None or nextitem.path != item.path):
        audit_settings(item.config).release_models()  # the last check of a test file: its models go (large sizes)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    annotate(report, item_clause(item), call)
    return report
