"""Running an implementation safely, knowing which clause is under test, and saying what went wrong.

The clause under test
    The plugin sets it around every phase of a test (fixture setup, the call, teardown) from the test's
    ``@pytest.mark.clause("...")`` marker. Helpers read it with :func:`current_clause`; a check never
    passes it by hand. Code that runs outside a test (``aiayn``'s figures) sets it with
    ``with checking("mask.causal"): ...``.

Two failure kinds, kept apart so reports can tell them apart:

``ClauseViolation`` (an AssertionError), raised by :func:`violation`
    the implementation ran and computed something the clause forbids.
``ImplementationError``, raised by :func:`could_not_check`
    the implementation could not be checked: its build or forward raised, it
    returned a non-tensor, the wrong shape or dtype, or a non-finite value. A
    declared deviation does not excuse these; nor does it excuse
    ``CheckTimeout`` (the time budget ran out), which is reported the same way.

Every message stands alone: clause id, paper section, what was measured,
what was expected, the call that shows it, and a hint at the likely bug.

A forward call at a shape the implementation rejects (its shape contract, ``shapes``, reported once by
model.shape) is not made: :func:`call_forward` skips the check as "blocked by model.shape: ..." instead.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import pytest
import torch

from aiayn_conformance.spec.clauses import NOT_APPLICABLE, get_clause
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import as_log_probs

from . import devices, settings

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Implementation

__all__ = [
    "ClauseViolation", "ImplementationError", "CheckTimeout", "checking", "current_clause", "violation",
    "could_not_check", "not_applicable", "build_model", "refused", "call_forward", "output_problem",
    "first_nonfinite", "check_finite_at", "run_forward", "as_log_probs", "describe_call", "seeded", "shape_gate",
    "held_weights", "first_line",
]

_CLAUSE: contextvars.ContextVar[str | None] = contextvars.ContextVar("aiayn_clause_under_test", default=None)


@contextlib.contextmanager
def checking(clause_id: str) -> Iterator[None]:
    """Make ``clause_id`` the clause under test for the code inside (the plugin does this for every test)."""
    get_clause(clause_id)  # an unknown id fails here, not in a message later
    token = _CLAUSE.set(clause_id)
    try:
        yield
    finally:
        _CLAUSE.reset(token)


def current_clause() -> str:
    """The id of the clause under test: the running test's clause marker (or the innermost ``checking``)."""
    clause_id = _CLAUSE.get()
    if clause_id is None:
        raise RuntimeError("no clause under test: call conformance helpers from a test carrying "
                           "@pytest.mark.clause(...), or inside "
                           "`with conformance.helpers.harness.checking(clause_id):`")
    return clause_id


class ClauseViolation(AssertionError):
    """The implementation computed something the clause forbids."""


class ImplementationError(Exception):
    """The implementation crashed or returned something unusable.

    ``clause_id`` and ``reason`` (set by :func:`could_not_check`) let the report restate the error under
    another clause: a module builds its model once, in the setup of its first test, and each test reports
    that build's failure under the clause it checks.
    """

    def __init__(self, message: str, *, clause_id: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.clause_id, self.reason = clause_id, reason

    def message_for(self, clause_id: str | None) -> str:
        """The message, stated under ``clause_id``."""
        if self.reason is None or clause_id is None or clause_id == self.clause_id:
            return str(self)
        clause = get_clause(clause_id)
        return f"[{clause.id}] ({clause.citation}) could not be checked: {self.reason}"


class CheckTimeout(BaseException):
    """A check ran past its time budget.

    A BaseException, like pytest's own outcome exceptions, so that nothing between the alarm and pytest
    retries the hanging call: hypothesis replays and shrinks a failing example that raised an Exception, and
    a check's ``except Exception`` would swallow it. Reported like an ImplementationError (status error).
    """

    interrupted: bool = False  # set when the alarm interrupted a running check (not one given up on at once)


def violation(*, measured: str, expected: str, call: str = "", hint: str = "") -> NoReturn:
    """Fail the clause under test: raise a ClauseViolation whose message names the clause and stands alone."""
    clause = get_clause(current_clause())
    lines = [f"[{clause.id}] ({clause.citation}, {clause.severity}) {clause.statement}",
             f"  measured: {measured}", f"  expected: {expected}"]
    if call:
        lines.append(f"  call:     {call}")
    if hint:
        lines.append(f"  hint:     {hint}")
    raise ClauseViolation("\n".join(lines))


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, stripped ("" when it has none): what a one-line report quotes."""
    return (str(exc).strip().splitlines() or [""])[0]


def could_not_check(what: str, exc: BaseException | None = None) -> NoReturn:
    """The clause under test cannot be checked (``what`` happened): raise an ImplementationError."""
    clause = get_clause(current_clause())
    detail = f": {type(exc).__name__}: {first_line(exc)}" if exc is not None else ""
    raise ImplementationError(f"[{clause.id}] ({clause.citation}) could not be checked: {what}{detail}",
                              clause_id=clause.id, reason=f"{what}{detail}") from exc


def not_applicable(reason: str) -> NoReturn:
    """Skip: the clause under test does not apply to this subject (``reason``: the capability it lacks, e.g. no
    decoding method). An audit reports such a clause as not applicable, not as not judged."""
    pytest.skip(f"{NOT_APPLICABLE}{reason}")


@contextlib.contextmanager
def seeded(seed: int = 0) -> Iterator[None]:
    """Fork the global RNG, seed it, and restore it afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def held_weights(impl: Implementation, config: ModelConfig) -> str:
    """The path of the user's weights a model of ``impl`` built at ``config`` holds (``--weights``), else ""."""
    return settings.current().held_weights(impl, config)


def build_model(impl: Implementation, config: ModelConfig, *, seed: int = 0, train: bool = False,
                place: bool = True) -> Any:
    """``impl.build(config)`` with a fixed seed, in eval mode unless ``train``; holding the user's weights
    (``--weights``, checked to fit before the session) when ``config`` is the audit configuration up to dropout;
    on the audit's device (``--device``) unless ``place`` is False (the device checks move it themselves).

    A configuration other than the audit's (``AuditSettings.others``, the base preset) that the implementation
    refuses to build is a finding of config.parameters: under that clause it fails with the implementation's
    own error, and a check of another clause that needed the configuration is skipped as blocked by it.
    """
    audit = settings.current()
    model = _copy_of_built(impl, config, seed)
    if model is None:
        try:
            with seeded(seed):
                model = impl.build(config)
        except CheckTimeout:
            raise
        except Exception as exc:
            refused(impl, config, exc)
            could_not_check(f"{impl.name}: build(config) raised", exc)
        if not isinstance(model, torch.nn.Module):
            could_not_check(f"{impl.name}: build(config) returned {type(model).__name__}, not a torch.nn.Module")
        _keep_built(impl, config, seed, model)
    if audit.weights is not None and held_weights(impl, config):
        audit.weights.load_into(model)
    if place:
        model = devices.place(model, audit.device)
    return model.train(train)


def build_for_shapes(impl: Implementation, config: ModelConfig) -> Any:
    """``build_model(impl, config)`` for a check that reads parameter shapes and identities only: on the meta device
    where the implementation builds there (nothing allocated or drawn: a big model takes seconds on the CPU), else
    on the CPU, whose outcome (a refusal, a malfunction) is then the one reported."""
    try:
        with torch.device("meta"):
            return build_model(impl, config)
    except (Exception, pytest.skip.Exception):  # a refusal, or a step the meta device cannot run: the CPU says
        return build_model(impl, config)


def _copy_of_built(impl: Implementation, config: ModelConfig, seed: int) -> torch.nn.Module | None:
    """A copy of the model this session already built for (impl, config, seed), None when there is none: a base
    model takes seconds to initialise and a copy a fraction of that (an adapter that cannot be copied is built
    each time)."""
    kept = settings.current().cache("built-models").get((impl.name, id(impl), config, seed))
    if kept is None:
        return None
    try:
        copied: torch.nn.Module = copy.deepcopy(kept)
    except Exception:
        return None
    return copied


COPIED_ABOVE = 5_000_000  # parameters; a smaller model is built afresh each time


def _keep_built(impl: Implementation, config: ModelConfig, seed: int, model: torch.nn.Module) -> None:
    """Keep a pristine copy of a freshly built model (in eval mode, as built) for :func:`_copy_of_built`, when it
    has more than ``COPIED_ABOVE`` parameters. A smaller one is cheap to build again, and building it is exact: a
    copy shares what ``copy.deepcopy`` does not copy (a module a closure holds, which the copy's train() and
    eval() then never reach)."""
    if sum(p.numel() for p in model.parameters()) <= COPIED_ABOVE:
        return
    if any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers())):
        return  # built on the meta device (config.parameters counts parameters there): no pristine copy to hand out
    try:
        settings.current().cache("built-models")[(impl.name, id(impl), config, seed)] = copy.deepcopy(model)
    except Exception:  # an adapter holding something deepcopy cannot copy: built afresh each time
        pass


def refused(impl: Implementation, config: ModelConfig, exc: Exception) -> None:
    """Report ``impl.build(config)`` raising ``exc`` for a configuration other than the audit's (nothing for the
    audit configuration itself, which every check needs, nor for a model that cannot build that one either: those
    are could_not_check)."""
    audit = settings.current()
    change = audit.config_change(config)
    if not change:
        return
    try:  # a model that builds no configuration at all malfunctions (could_not_check); it refuses nothing
        with seeded(0):
            impl.build(audit.config)
    except CheckTimeout:
        raise
    except Exception:
        return
    error = f"{type(exc).__name__}: {first_line(exc)[:300]}"
    if current_clause() == "config.parameters":
        violation(measured=f"{impl.name} refuses to build the configuration with {change}: {error}",
                  expected="the model builds for every configuration of the schema's hyperparameters",
                  call=f"{impl.name}.build(audit config with {change})",
                  hint="a hyperparameter fixed or tied to another (one vocabulary size for both sides, a head count "
                       "or width hard-coded)")
    pytest.skip(f"blocked by config.parameters: {impl.name} refuses to build the configuration with {change} "
                f"({error})")


def describe_call(src: torch.Tensor, tgt: torch.Tensor, pad_id: int = 0) -> str:
    def lens(x: torch.Tensor) -> list[int]:
        return (x != pad_id).sum(dim=1).tolist()

    return (f"forward(src {list(src.shape)}, tgt {list(tgt.shape)}) "
            f"with real lengths src={lens(src)} tgt={lens(tgt)}")


# (src, tgt) -> "" when forward may be called at their shapes, else the reason to skip: set by
# ``shapes.under_test`` from the implementation's shape contract (model.shape), None outside a check.
ShapeGate = Callable[[torch.Tensor, torch.Tensor], str]
_SHAPE_GATE: contextvars.ContextVar[ShapeGate | None] = contextvars.ContextVar("aiayn_shape_gate", default=None)


@contextlib.contextmanager
def shape_gate(gate: ShapeGate) -> Iterator[None]:
    """While open, :func:`call_forward` asks ``gate`` before each call and skips the check with its reason when
    the shapes are ones the model rejects (``shapes.under_test`` installs the implementation's contract)."""
    token = _SHAPE_GATE.set(gate)
    try:
        yield
    finally:
        _SHAPE_GATE.reset(token)


def device_blocking(exc: BaseException, *, device: str | None = None, call: str = "") -> str:
    """"blocked by device.portable: ..." when ``exc``, or an exception that caused it, is torch refusing to mix
    devices while the model runs on ``device`` (an ``OnDevice``'s placement; by default the audit's ``--device``,
    when that is not the CPU), outside a check of device.portable (which judges it); else "". The plugin skips a
    check that raised such an error with it, and ``call_forward`` a forward call (named by ``call``) of an
    ``OnDevice`` model."""
    if device is None:  # the audit's device: on the CPU nothing is placed elsewhere
        device = settings.current().device
        if torch.device(device).type == "cpu":
            return ""
    if current_clause() == "device.portable":
        return ""
    seen: BaseException | None = exc
    while seen is not None:
        if devices.is_device_error(seen):
            return f"blocked by device.portable: on {device}, {call + ' raised ' if call else ''}" \
                   f"{type(seen).__name__}: {first_line(seen)}"
        seen = seen.__cause__
    return ""


def call_forward(model: Any, src: torch.Tensor, tgt: torch.Tensor, *, pad_id: int = 0, grad: bool = False) -> Any:
    """``model(src, tgt)`` as it returned, whatever it returned (a crash becomes ImplementationError).

    At a shape the implementation under test rejects (its shape contract, reported once by model.shape) the
    check is skipped as "blocked by model.shape: ..." instead: the crash is already explained. So is a model on
    the audit's device (``--device``) whose forward mixes devices there: "blocked by device.portable: ...", the
    clause that judges it (outside a check of that clause)."""
    gate = _SHAPE_GATE.get()
    blocked = gate(src, tgt) if gate is not None else ""
    if blocked:
        pytest.skip(blocked)
    try:
        with torch.set_grad_enabled(grad):
            return model(src, tgt)
    except CheckTimeout:
        raise
    except Exception as exc:
        call = describe_call(src, tgt, pad_id)
        blocked = device_blocking(exc, device=str(model.placed_on), call=call) \
            if isinstance(model, devices.OnDevice) else ""
        if blocked:
            pytest.skip(blocked)
        could_not_check(call + " raised", exc)


def output_problem(out: Any, src: torch.Tensor, tgt: torch.Tensor, vocab: int) -> tuple[str, str] | None:
    """(what forward returned, what the contract expects) when ``out`` is not a floating tensor [B, T, vocab]
    for ``forward(src, tgt)``; None when it is."""
    shape = [src.size(0), tgt.size(1), vocab]
    if not isinstance(out, torch.Tensor):
        return f"{type(out).__name__}, not a tensor", f"a floating tensor of shape {shape} [B, T, tgt_vocab]"
    if list(out.shape) != shape:
        return f"shape {list(out.shape)}", f"{shape} [B, T, tgt_vocab]"
    if not out.is_floating_point():
        return f"dtype {out.dtype}", "a floating dtype"
    return None


def first_nonfinite(out: torch.Tensor, tgt: torch.Tensor, pad_id: int = 0) -> tuple[int, list[int], float] | None:
    """(how many, [batch, position, token] of the first, its value) of the non-finite values of a [B, T, V]
    output at real (non-pad) target positions; None when all are finite."""
    finite = torch.isfinite(out.detach())
    if bool(finite.all()):
        return None
    bad = ~finite & (tgt != pad_id)[..., None]
    if not bool(bad.any()):
        return None
    idx = [int(i) for i in bad.nonzero()[0]]
    return int(bad.sum()), idx, float(out[tuple(idx)].item())


def run_forward(model: Any, src: torch.Tensor, tgt: torch.Tensor, *, vocab: int, pad_id: int = 0,
                grad: bool = False, check_finite: bool = True) -> torch.Tensor:
    """``model(src, tgt)``, checked to be a floating tensor [B, T, vocab], finite at real target positions
    unless ``check_finite`` is False; anything else means the clause under test could not be checked."""
    out = call_forward(model, src, tgt, pad_id=pad_id, grad=grad)
    problem = output_problem(out, src, tgt, vocab)
    if problem is not None:
        got, expected = problem
        could_not_check(f"{describe_call(src, tgt, pad_id)} returned {got}"
                        + (f", expected {expected}" if isinstance(out, torch.Tensor) else ""))
    if check_finite:
        check_finite_at(out, src, tgt, pad_id=pad_id)
    return out


def check_finite_at(out: torch.Tensor, src: torch.Tensor, tgt: torch.Tensor, *, pad_id: int = 0,
                    offset: int = 0) -> None:
    """Could not check when ``out`` (``forward(src, tgt)``'s output from position ``offset`` on) holds a
    non-finite value at a real target position."""
    bad = first_nonfinite(out, tgt[:, offset:offset + out.size(1)], pad_id)
    if bad is not None:
        _, idx, value = bad
        idx[1] += offset
        could_not_check(f"{describe_call(src, tgt, pad_id)} returned a non-finite value {value} at "
                        f"[batch, position, token] = {idx} (a real target position)")


