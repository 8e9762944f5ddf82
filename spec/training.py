"""The paper's training procedure as data (§5.1-§5.4): ``TrainConfig`` and its presets.

``TrainConfig`` defaults are the base model's recipe: Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9
(§5.3), the learning rate of Eq. (3) with warmup_steps = 4000 (§5.3), label smoothing
ε_ls = 0.1 (§5.4), 100K training steps (§5.2) on batches of about 25000 source and 25000 target
tokens (§5.1). Where the paper is silent the value is tensor2tensor's ``transformer_base_v1``
(the configuration its authors published), and the field's comment says so.

The formulas that use these numbers are in ``reference/training.py``; an implementation's own
recipe receives a ``TrainConfig`` through the adapter contract's recipe capabilities
(``spec.contract``) the way its model receives a ``ModelConfig``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["TrainConfig", "BASE_TRAINING", "BIG_TRAINING"]


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of §5: optimizer, learning-rate schedule, label smoothing, training length.

    ``warmup_steps``: Eq. (3)'s warmup (§5.3); ``step_num`` counts parameter updates from 1.
    ``beta1``, ``beta2``, ``adam_eps``: Adam's β1, β2, ε (§5.3).
    ``weight_decay``: 0. The paper names no weight decay: §5.4 lists its regularizers (residual
    dropout, label smoothing) and tensor2tensor's published configuration has ``weight_decay=0``.
    ``label_smoothing``: ε_ls (§5.4). How the ε mass is spread is not stated; the reference spreads
    it over the V - 1 non-target classes (tensor2tensor), see ``reference.training``.
    ``train_steps``: 100K for the base model, 300K for the big one (§5.2).
    ``batch_tokens``: about 25000 source and 25000 target tokens per batch (§5.1).
    """

    warmup_steps: int = 4000
    beta1: float = 0.9
    beta2: float = 0.98
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    train_steps: int = 100_000
    batch_tokens: int = 25_000

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "train_steps", "batch_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {value!r}")
        for name, low, high in (("beta1", 0.0, 1.0), ("beta2", 0.0, 1.0), ("label_smoothing", 0.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < high:
                raise ValueError(f"TrainConfig.{name} must be a float in [{low:g}, {high:g}), got {value!r}")
        for name in ("adam_eps", "weight_decay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"TrainConfig.{name} must be a float >= 0, got {value!r}")

    @property
    def betas(self) -> tuple[float, float]:
        """(β1, β2), as ``torch.optim.Adam`` takes them."""
        return (self.beta1, self.beta2)

    def replace(self, **changes) -> TrainConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


BASE_TRAINING = TrainConfig()
"""§5: the base model's recipe (100K steps)."""

BIG_TRAINING = TrainConfig(train_steps=300_000)
"""§5.2: the big model trained for 300K steps; everything else as the base recipe (§5.3, §5.4)."""
