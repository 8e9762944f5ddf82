"""Helpers shared by the property checks: log-probabilities at real positions, and comparisons."""

from __future__ import annotations

import weakref

import pytest
import torch

from spec.config import ModelConfig
from spec.tolerance import Comparison, compare

from .harness import as_log_probs, run_forward

# Keyed weakly by the model itself: an id() would be reused by a later model after this one is freed.
_DETERMINISTIC: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def require_deterministic(model, src: torch.Tensor, tgt: torch.Tensor, clause: str, config: ModelConfig) -> None:
    """Skip a comparison-based check when eval-mode outputs are random (model.eval-determinism fails):
    every comparison would fail for that one reason (a cascade, not a finding)."""
    key = model  # once per model instance: randomness shows on any input
    if key not in _DETERMINISTIC:
        a = run_forward(model, src, tgt, clause, vocab=config.tgt_vocab, pad_id=config.pad_id)
        b = run_forward(model, src, tgt, clause, vocab=config.tgt_vocab, pad_id=config.pad_id)
        _DETERMINISTIC[key] = bool(torch.equal(a, b))
    if not _DETERMINISTIC[key]:
        pytest.skip("blocked by model.eval-determinism: two identical eval-mode calls differ, so no comparison "
                    "of outputs can be trusted")


def log_probs(model, impl, src: torch.Tensor, tgt: torch.Tensor, clause: str, config: ModelConfig,
              **kw) -> torch.Tensor:
    """float64 log-probabilities [B, T, V] of ``model(src, tgt)`` (crashes become ImplementationError).

    In eval mode, a model whose outputs are random is skipped as blocked by model.eval-determinism.
    """
    if not model.training:
        require_deterministic(model, src, tgt, clause, config)
    out = run_forward(model, src, tgt, clause, vocab=config.tgt_vocab, pad_id=config.pad_id, **kw)
    return as_log_probs(out, impl.output)


def compare_real(a: torch.Tensor, b: torch.Tensor, tgt: torch.Tensor, pad_id: int, *,
                 positions: slice | None = None) -> Comparison:
    """Compare two [B, T, V] outputs at real (non-pad) target positions only (padded rows zeroed on both sides)."""
    real = (tgt != pad_id)[..., None]  # (B, T, 1)
    if positions is not None:
        a, b, real = a[:, positions], b[:, positions], real[:, positions]
    return compare(torch.where(real, a, 0.0), torch.where(real, b, 0.0), dtype=torch.float32, scope="model")


def other_token(token: int, vocab: int, pad_id: int, shift: int = 1) -> int:
    """A different non-pad token id."""
    t = token
    for _ in range(vocab):
        t = (t + shift) % vocab
        if t not in (token, pad_id):
            return t
    raise ValueError("vocabulary too small")
