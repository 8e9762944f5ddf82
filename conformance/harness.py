"""Running an implementation safely, and saying what went wrong.

Two failure kinds, kept apart so reports can tell them apart:

``ClauseViolation`` (an AssertionError)
    the implementation ran and computed something the clause forbids.
``ImplementationError``
    the implementation could not be checked: its build or forward raised, it
    returned a non-tensor, the wrong shape or dtype. A declared deviation does
    not excuse these; nor does it excuse ``CheckTimeout`` (the time budget ran
    out), which is reported the same way.

Every message stands alone: clause id, paper section, what was measured,
what was expected, the call that shows it, and a hint at the likely bug.
"""

from __future__ import annotations

import contextlib
from typing import Any, NoReturn

import torch

from spec.clauses import get_clause
from spec.config import ModelConfig

__all__ = [
    "ClauseViolation", "ImplementationError", "CheckTimeout", "violation", "build_model",
    "run_forward", "as_log_probs", "describe_call", "seeded",
]


class ClauseViolation(AssertionError):
    """The implementation computed something the clause forbids."""


class ImplementationError(Exception):
    """The implementation crashed or returned something unusable.

    ``clause_id`` and ``reason`` (set by the harness) let the report restate the error under another
    clause: a module builds its model once, under one of its clauses, and each test reports that build's
    failure under the clause it checks.
    """

    def __init__(self, message: str, *, clause_id: str | None = None, reason: str | None = None):
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


def violation(clause_id: str, *, measured: str, expected: str, call: str = "", hint: str = "") -> NoReturn:
    """Raise a ClauseViolation whose message names the clause and stands alone."""
    clause = get_clause(clause_id)
    lines = [f"[{clause.id}] ({clause.citation}, {clause.severity}) {clause.statement}",
             f"  measured: {measured}", f"  expected: {expected}"]
    if call:
        lines.append(f"  call:     {call}")
    if hint:
        lines.append(f"  hint:     {hint}")
    raise ClauseViolation("\n".join(lines))


def _crash(clause_id: str, what: str, exc: BaseException | None = None) -> NoReturn:
    clause = get_clause(clause_id)
    detail = f": {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}" if exc else ""
    raise ImplementationError(f"[{clause.id}] ({clause.citation}) could not be checked: {what}{detail}",
                              clause_id=clause.id, reason=f"{what}{detail}") from exc


@contextlib.contextmanager
def seeded(seed: int = 0):
    """Fork the global RNG, seed it, and restore it afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def build_model(impl: Any, config: ModelConfig, clause_id: str, *, seed: int = 0, train: bool = False):
    """``impl.build(config)`` with a fixed seed, in eval mode unless ``train``."""
    try:
        with seeded(seed):
            model = impl.build(config)
    except CheckTimeout:
        raise
    except Exception as exc:
        _crash(clause_id, f"{impl.name}: build(config) raised", exc)
    if not isinstance(model, torch.nn.Module):
        _crash(clause_id, f"{impl.name}: build(config) returned {type(model).__name__}, not a torch.nn.Module")
    return model.train(train)


def describe_call(src: torch.Tensor, tgt: torch.Tensor, pad_id: int = 0) -> str:
    def lens(x: torch.Tensor) -> list[int]:
        return (x != pad_id).sum(dim=1).tolist()

    return (f"forward(src {list(src.shape)}, tgt {list(tgt.shape)}) "
            f"with real lengths src={lens(src)} tgt={lens(tgt)}")


def run_forward(model, src: torch.Tensor, tgt: torch.Tensor, clause_id: str, *, vocab: int,
                pad_id: int = 0, grad: bool = False, check_finite: bool = True) -> torch.Tensor:
    """Call ``model(src, tgt)`` and check it returned a finite float tensor [B, T, vocab]."""
    call = describe_call(src, tgt, pad_id)
    try:
        with torch.set_grad_enabled(grad):
            out = model(src, tgt)
    except CheckTimeout:
        raise
    except Exception as exc:
        _crash(clause_id, call + " raised", exc)
    if not isinstance(out, torch.Tensor):
        _crash(clause_id, f"{call} returned {type(out).__name__}, not a tensor")
    expected = (src.size(0), tgt.size(1), vocab)
    if tuple(out.shape) != expected:
        _crash(clause_id, f"{call} returned shape {list(out.shape)}, expected {list(expected)} [B, T, tgt_vocab]")
    if not out.is_floating_point():
        _crash(clause_id, f"{call} returned dtype {out.dtype}, expected a floating dtype")
    if check_finite:
        real = (tgt != pad_id)
        bad = ~torch.isfinite(out.detach()) & real[..., None]
        if bool(bad.any()):
            idx = [int(i) for i in bad.nonzero()[0]]
            _crash(clause_id, f"{call} returned a non-finite value {out[tuple(idx)].item()} at "
                              f"[batch, position, token] = {idx} (a real target position)")
    return out


def as_log_probs(out: torch.Tensor, kind: str) -> torch.Tensor:
    """Bring logits, log-probabilities or probabilities to log-probabilities (float64)."""
    out = out.detach().to(torch.float64)
    if kind == "logits":
        return torch.log_softmax(out, dim=-1)
    if kind == "log_probs":
        return out
    if kind == "probs":
        return torch.log(out.clamp_min(torch.finfo(torch.float64).tiny))
    raise ValueError(f"unknown output kind {kind!r}; accepted: logits, log_probs, probs")
