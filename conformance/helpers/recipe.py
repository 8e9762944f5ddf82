"""An implementation's training recipe, read through the adapter contract's recipe capabilities.

``recipe_for(model, output_kind, train_config)`` gathers the pieces an adapter exposes
(``make_optimizer``, ``make_scheduler`` or ``learning_rate``, ``make_criterion``, ``make_batch``;
see ``spec.contract``) and fills the others with the reference's (``reference/training.py``), saying
which is which. ``schedule_trace`` reads the learning rate of updates 1..n from either schedule style.
A capability that raises becomes an ``ImplementationError`` naming it (``could_not_check``), as a crashing
forward does; the clause is the one under test (``harness.current_clause()``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from aiayn_conformance.implementations import ComponentUnavailable
from aiayn_conformance.reference.training import LabelSmoothedCrossEntropy, LRateScheduler, adam, teacher_forcing
from aiayn_conformance.spec.contract import has_capability
from aiayn_conformance.spec.training import TrainConfig

from .harness import CheckTimeout, could_not_check

__all__ = ["Recipe", "recipe_for", "call", "StepFunctionScheduler", "schedule_trace", "scheduler_trace",
           "probs_to_log_probs", "PIECES", "missing_schedule", "has_schedule"]

# piece -> the capabilities that provide it
PIECES: dict[str, tuple[str, ...]] = {
    "optimizer": ("make_optimizer",),
    "schedule": ("make_scheduler", "learning_rate"),
    "criterion": ("make_criterion",),
    "batch": ("make_batch",),
}


def call(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; an exception means the clause under test could not be checked (naming ``what``)."""
    try:
        return fn(*args)
    except ComponentUnavailable as exc:  # a composed component that cannot run here
        pytest.skip(f"the implementation's {what} is unavailable here: {exc}")
    except CheckTimeout:
        raise
    except Exception as exc:
        could_not_check(f"the implementation's {what} raised", exc)


def has_schedule(model: object) -> bool:
    return has_capability(model, "make_scheduler") or has_capability(model, "learning_rate")


def missing_schedule() -> str:
    return ("the implementation exposes no learning-rate schedule (neither make_scheduler(optimizer, train_config) "
            "nor learning_rate(step_num, train_config), spec.contract)")


class StepFunctionScheduler:
    """Drives an optimizer from a function of the update number: update k runs at ``fn(k)``, k = 1, 2, ...

    Sets every group's rate to ``fn(1)`` at construction; ``step()`` (once after each optimizer step)
    sets ``fn(k + 1)`` for the next update.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, fn: Callable[[int], float]):
        self.optimizer, self.fn, self.step_num = optimizer, fn, 1
        self._apply()

    def _apply(self) -> None:
        rate = float(self.fn(self.step_num))
        for group in self.optimizer.param_groups:
            group["lr"] = rate

    def step(self) -> None:
        self.step_num += 1
        self._apply()


def probs_to_log_probs(scores: Tensor) -> Tensor:
    return torch.log(scores.clamp_min(torch.finfo(scores.dtype).tiny))


@dataclass
class Recipe:
    """The four pieces of a training recipe and where each came from (``own[piece]``: the implementation's)."""

    make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
    make_scheduler: Callable[[torch.optim.Optimizer], Any]
    criterion: Callable[[Tensor, Tensor], Tensor]
    make_batch: Callable[[Tensor, int], tuple[Tensor, Tensor]]
    own: dict[str, bool] = field(default_factory=dict)

    @property
    def fully_own(self) -> bool:
        return all(self.own.values())

    def describe(self) -> str:
        """E.g. 'the implementation's own recipe' or 'optimizer, schedule: the reference's (§5.3); criterion ...'."""
        if self.fully_own:
            return "the implementation's own recipe (optimizer, schedule, criterion, batch)"
        if not any(self.own.values()):
            return "the reference's recipe (the paper's §5.3-5.4: Adam, Eq. (3), label smoothing, shifted targets)"
        own = [p for p, o in self.own.items() if o]
        ref = [p for p, o in self.own.items() if not o]
        return f"the implementation's {', '.join(own)}; the reference's {', '.join(ref)}"


def recipe_for(model: nn.Module, output_kind: str, train_config: TrainConfig, *,
               d_model: int, vocab: int, pad_id: int, own: bool = True) -> Recipe:
    """The implementation's recipe pieces, the reference's where it exposes none (or everywhere with
    ``own=False``).

    The reference's criterion reads log-probabilities; for an implementation declaring probabilities it
    takes their log first.
    """
    own_pieces = {piece: own and any(has_capability(model, m) for m in methods) for piece, methods in PIECES.items()}
    return _recipe(model, output_kind, train_config, own_pieces, d_model=d_model, vocab=vocab, pad_id=pad_id)


def _recipe(model: nn.Module, output_kind: str, train_config: TrainConfig, own: dict[str, bool], *,
            d_model: int, vocab: int, pad_id: int) -> Recipe:
    m: Any = model

    def make_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        if own["optimizer"]:
            return call("make_optimizer(params, train_config)", m.make_optimizer, params, train_config)
        return adam(params, train_config)

    def make_scheduler(optimizer: torch.optim.Optimizer) -> Any:
        if not own["schedule"]:
            return LRateScheduler(optimizer, d_model, train_config.warmup_steps)
        if has_capability(model, "make_scheduler"):
            return call("make_scheduler(optimizer, train_config)", m.make_scheduler, optimizer,
                        train_config)
        if has_capability(model, "learning_rate"):
            return StepFunctionScheduler(optimizer, lambda k: call(
                f"learning_rate({k}, train_config)", m.learning_rate, k, train_config))
        return LRateScheduler(optimizer, d_model, train_config.warmup_steps)

    if own["criterion"]:
        criterion = call("make_criterion(train_config)", m.make_criterion, train_config)
        if not callable(criterion):
            could_not_check(f"the implementation's make_criterion(train_config) returned "
                            f"{type(criterion).__name__}, not a callable criterion(scores, labels)")
    else:
        reference = LabelSmoothedCrossEntropy(vocab, train_config.label_smoothing, pad_id)
        criterion = (reference if output_kind != "probs"
                     else (lambda scores, labels: reference(probs_to_log_probs(scores), labels)))

    def make_batch(target: Tensor, bos_id: int) -> tuple[Tensor, Tensor]:
        if own["batch"]:
            return call("make_batch(target, bos_id)", m.make_batch, target, bos_id)
        return teacher_forcing(target, bos_id)

    return Recipe(make_optimizer, make_scheduler, criterion, make_batch, own)


def schedule_trace(model: nn.Module, train_config: TrainConfig, steps: int) -> list[float]:
    """The learning rate of updates 1..steps under the implementation's schedule: ``make_scheduler`` (over its
    optimizer, or the reference's Adam when it exposes none) where it has one, else ``learning_rate``, as
    ``recipe_for`` trains with. Raises what the schedule raises (the check names it)."""
    m: Any = model
    if not has_capability(model, "make_scheduler"):  # learning_rate(step_num, train_config) then
        return [float(m.learning_rate(k, train_config)) for k in range(1, steps + 1)]
    param = nn.Parameter(torch.zeros(1))
    if has_capability(model, "make_optimizer"):
        optimizer = call("make_optimizer(params, train_config)", m.make_optimizer, [param], train_config)
    else:
        optimizer = adam([param], train_config)
    return scheduler_trace(lambda: m.make_scheduler(optimizer, train_config), optimizer, steps)


def scheduler_trace(make: Callable[[], Any], optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    """The rate of the optimizer's first group before each of ``steps`` updates, the scheduler ``make()`` returns
    stepped once after each (no update is made: the rate is read, not used). Raises what the scheduler raises."""
    rates = []
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": no update is made here
        warnings.simplefilter("ignore")
        scheduler = make()
        group = optimizer.param_groups[0]
        for _ in range(steps):
            rates.append(float(group["lr"]))
            scheduler.step()
    return rates
