"""Reading a model's outputs: float64 log-probabilities, the eval-determinism gate, comparisons at real positions."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import pytest
import torch

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.tolerance import Comparison, Tolerance, compare

from .harness import as_log_probs, check_finite_at, run_forward

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Implementation

__all__ = ["log_probs", "require_deterministic", "determinism_judged", "compare_real"]

# Keyed weakly by the model itself: an id() would be reused by a later model after this one is freed.
_DETERMINISTIC: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def require_deterministic(model: Any, src: torch.Tensor, tgt: torch.Tensor, config: ModelConfig) -> None:
    """Skip a comparison-based check when eval-mode outputs are random (model.eval-determinism fails):
    every comparison would fail for that one reason (a cascade, not a finding)."""
    if model not in _DETERMINISTIC:  # once per model instance: randomness shows on any input
        a = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id)
        b = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id)
        _DETERMINISTIC[model] = bool(torch.equal(a, b))
    if not _DETERMINISTIC[model]:
        pytest.skip("blocked by model.eval-determinism: two identical eval-mode calls differ, so no comparison "
                    "of outputs can be trusted")


def determinism_judged(model: Any) -> bool:
    """Whether :func:`require_deterministic` has already judged this model instance."""
    return model in _DETERMINISTIC


def log_probs(model: Any, impl: Implementation, src: torch.Tensor, tgt: torch.Tensor,
              config: ModelConfig, *, grad: bool = False, check_finite: bool = True,
              last: bool = False) -> torch.Tensor:
    """float64 log-probabilities [B, T, V] of ``model(src, tgt)`` (crashes become ImplementationError); with
    ``last``, of the last position alone ([B, 1, V]: at a vocabulary of 37,000 the rest costs more than the
    forward).

    In eval mode, a model whose outputs are random is skipped as blocked by model.eval-determinism.
    """
    if not model.training:
        require_deterministic(model, src, tgt, config)
    out = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id, grad=grad,
                      check_finite=check_finite and not last)
    if last:
        out = out[:, -1:]
        if check_finite:
            check_finite_at(out, src, tgt, pad_id=config.pad_id, offset=tgt.size(1) - 1)
    return as_log_probs(out, impl.output)


def compare_real(a: torch.Tensor, b: torch.Tensor, tgt: torch.Tensor, pad_id: int, *,
                 positions: slice | None = None, kind: str = "logits", tol: Tolerance | None = None) -> Comparison:
    """Compare two [B, T, V] log-probability outputs at real (non-pad) target positions only (padded rows zeroed on
    both sides). Two outputs of one implementation that declares probabilities (``kind``) are compared as it gave
    them: a rounding error of float32 probabilities, taken the log of, grows without bound as they go to 0.
    ``tol``: the policy's float32 model entry unless a check gives a looser one with its reason."""
    real = (tgt != pad_id)[..., None]  # (B, T, 1)
    if kind == "probs":
        a, b = a.exp(), b.exp()
    if positions is not None:
        a, b, real = a[:, positions], b[:, positions], real[:, positions]
    return compare(torch.where(real, a, 0.0), torch.where(real, b, 0.0), dtype=torch.float32, scope="model",
                   tol=tol)
