"""The training procedure of "Attention Is All You Need" (§5.3, §5.4, and §3.1's shifted input), to the letter.

The oracle of the ``train`` clauses, as ``reference/model.py`` is the oracle of the model. Each
piece cites its section and equation; ``spec.training.TrainConfig`` holds the numbers.

Where the paper is silent the choice is named, and follows tensor2tensor's ``transformer_base_v1``
(the configuration the authors published) unless stated otherwise:

* ``step_num`` in Eq. (3) counts parameter updates from 1: the first update uses ``lrate(1)``
  (tensor2tensor's "legacy noam" is Eq. (3) with ``step_num = global_step + 1``). Step 0 is an
  error, not silently clamped to 1 (clamping gives the first two updates the same rate).
* Label smoothing spreads ε_ls over the V - 1 classes other than the target: the target gets
  1 - ε and every other class, the padding class included, ε / (V - 1). The paper cites Szegedy
  et al. without saying how the mass is spread; Szegedy's own form (ε / V on every class, the
  target included, as ``torch.nn.CrossEntropyLoss(label_smoothing=...)`` does) and the Annotated
  Transformer's (ε / (V - 2), nothing on the padding class) are the other common conventions.
* Padding targets contribute nothing, and the loss is normalised by the number of real (non-pad)
  target tokens: the mean over real tokens, so appending padding changes neither the loss nor any
  gradient (tensor2tensor weights pad targets 0 and divides by the sum of the weights).
* The decoder input is a start symbol (BOS) followed by the target without its last token ("the
  output embeddings are offset by one position", §3.1). tensor2tensor shifts the embedded targets
  and puts a zero vector first; a BOS token is the form token-level implementations take.

Shape legend
    B  batch size   T  target length   N = B * T flattened target positions   V  target vocabulary
Labels are right-padded with ``pad_id``; scores are logits or log-probabilities (B, T, V) or (N, V).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LRScheduler

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.training import BASE_TRAINING, TrainConfig

__all__ = [
    "lrate", "LRateScheduler", "lrate_scheduler", "adam", "smoothed_targets", "LabelSmoothedCrossEntropy",
    "label_smoothed_cross_entropy", "teacher_forcing", "train_step", "Step", "PaperRecipe",
]


# ---------------------------------------------------------------------------
# §5.3 Optimizer and learning rate, Eq. (3)
# ---------------------------------------------------------------------------
def lrate(step_num: int, d_model: int, warmup_steps: int = 4000) -> float:
    """§5.3, Eq. (3): lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5).

    ``step_num`` is the number of the parameter update, from 1: the rate rises linearly for the first
    ``warmup_steps`` updates, peaks at ``step_num = warmup_steps`` and then decays as step_num^-0.5.
    Base model (d_model 512, warmup 4000): 1.7469e-07 at step 1, 6.9877e-04 at 4000, 1.3975e-04 at 100000.
    """
    if isinstance(step_num, bool) or not isinstance(step_num, numbers.Integral):
        raise TypeError(f"step_num must be an int (the update's number, from 1), got {step_num!r}")
    if step_num < 1:
        raise ValueError(f"Eq. (3) is defined for step_num >= 1 (the first update is step 1), got {step_num}; "
                         "at 0 it divides by zero")
    if d_model <= 0 or warmup_steps <= 0:
        raise ValueError(f"d_model and warmup_steps must be positive, got {d_model} and {warmup_steps}")
    return d_model ** -0.5 * min(step_num ** -0.5, step_num * warmup_steps ** -1.5)


class LRateScheduler(LRScheduler):
    """§5.3, Eq. (3) as a ``torch.optim`` scheduler: update k runs at ``lrate(k)``.

    Construct it after the optimizer (it sets every group's rate to ``lrate(1)`` for the first update)
    and call ``step()`` once after each ``optimizer.step()``. The rate is absolute: the optimizer's own
    initial ``lr`` is ignored.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int = 4000,
                 last_epoch: int = -1):
        self.d_model, self.warmup_steps = d_model, warmup_steps
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:  # type: ignore[override]
        # ``last_epoch`` counts the scheduler's steps, 0 before the first update: update k is step_num k.
        rate = lrate(self.last_epoch + 1, self.d_model, self.warmup_steps)
        return [rate for _ in self.optimizer.param_groups]


def lrate_scheduler(optimizer: torch.optim.Optimizer, d_model: int,
                    config: TrainConfig = BASE_TRAINING) -> LRateScheduler:
    """§5.3, Eq. (3) with ``config.warmup_steps`` for a model of width ``d_model`` (the ``lr_schedule`` component
    kind's call: ``factory(optimizer, d_model, train_config)``)."""
    return LRateScheduler(optimizer, d_model, config.warmup_steps)


def adam(params: Iterable[nn.Parameter] | Iterable[dict], config: TrainConfig = BASE_TRAINING) -> torch.optim.Adam:
    """§5.3: Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9 (``config``), and no weight decay.

    Its learning rate is the scheduler's (``LRateScheduler``); until one is attached it is 0, so an
    optimizer used without its schedule does nothing rather than something else.
    """
    groups: list[Any] = list(params)
    try:  # the same update in one kernel per step (a base model's 63M parameters: 0.05 s a step against 0.2 s)
        return torch.optim.Adam(groups, lr=0.0, betas=config.betas, eps=config.adam_eps,
                                weight_decay=config.weight_decay, fused=True)
    except (RuntimeError, ValueError):  # parameters on a device or of a type the fused kernel lacks
        return torch.optim.Adam(groups, lr=0.0, betas=config.betas, eps=config.adam_eps,
                                weight_decay=config.weight_decay)


# ---------------------------------------------------------------------------
# §5.4 Label smoothing, with padding targets weighted 0
# ---------------------------------------------------------------------------
def smoothed_targets(labels: Tensor, vocab: int, epsilon: float = 0.1, pad_id: int = 0) -> Tensor:
    """§5.4: the target distribution for each label, (N,) -> (N, V) float64.

    1 - ε on the label's class and ε / (V - 1) on each of the others (tensor2tensor's convention; the
    padding class is one of the others). A padding label's row is all zeros: it contributes nothing.
    For V = 37000 and ε = 0.1: 0.9 on the target and 2.7028e-06 elsewhere.
    """
    if vocab < 2:
        raise ValueError(f"label smoothing needs at least 2 classes, got vocab={vocab}")
    labels = labels.reshape(-1)
    q = torch.full((labels.numel(), vocab), epsilon / (vocab - 1), dtype=torch.float64, device=labels.device)
    q.scatter_(1, labels[:, None].clamp(0, vocab - 1), 1.0 - epsilon)  # (N, V)
    return q.masked_fill((labels == pad_id)[:, None], 0.0)


class LabelSmoothedCrossEntropy(nn.Module):
    """§5.4: cross entropy against ``smoothed_targets`` (ε_ls = 0.1), averaged over the real target tokens.

    ``forward(scores, labels)``: scores (N, V) or (B, T, V), logits or log-probabilities (a log-softmax
    of log-probabilities leaves them unchanged, so both work); labels (N,) or (B, T), right-padded with
    ``pad_id``. Padding targets weigh 0 and the sum is divided by the number of real targets, so
    appending padding changes neither the loss nor any gradient. A batch with no real target gives 0.
    """

    def __init__(self, vocab: int, epsilon: float = 0.1, pad_id: int = 0):
        super().__init__()
        self.vocab, self.epsilon, self.pad_id = vocab, epsilon, pad_id

    def forward(self, scores: Tensor, labels: Tensor) -> Tensor:
        scores = scores.reshape(-1, scores.size(-1))  # (N, V)
        labels = labels.reshape(-1)  # (N,)
        if scores.size(0) != labels.numel() or scores.size(1) != self.vocab:
            raise ValueError(f"scores {tuple(scores.shape)} and labels {tuple(labels.shape)} do not match "
                             f"(expected (N, {self.vocab}) and (N,))")
        logp = torch.log_softmax(scores.to(torch.float32 if scores.dtype != torch.float64 else scores.dtype), -1)
        q = smoothed_targets(labels, self.vocab, self.epsilon, self.pad_id).to(logp.dtype)  # (N, V)
        terms = (q * logp).masked_fill(q == 0, 0.0)  # 0 * -inf (a log-probability of 0) counts 0
        real = (labels != self.pad_id).sum().clamp_min(1)
        return -terms.sum() / real


def label_smoothed_cross_entropy(vocab: int, pad_id: int = 0,
                                 config: TrainConfig = BASE_TRAINING) -> LabelSmoothedCrossEntropy:
    """§5.4 with ``config.label_smoothing`` (the ``criterion`` component kind's call:
    ``factory(vocab, pad_id, train_config)``)."""
    return LabelSmoothedCrossEntropy(vocab, config.label_smoothing, pad_id)


# ---------------------------------------------------------------------------
# §3.1 The decoder input: the target offset by one position
# ---------------------------------------------------------------------------
def teacher_forcing(target: Tensor, bos_id: int) -> tuple[Tensor, Tensor]:
    """§3.1 ("the output embeddings are offset by one position"): (decoder_input, labels), each (B, T).

    decoder_input = BOS followed by target[:, :-1]; labels = target. The output at position i is
    trained to predict target[i] from BOS, target[0], ..., target[i-1]: never from target[i] itself.
    """
    if target.dim() != 2:
        raise ValueError(f"target must be (B, T) token ids, got shape {tuple(target.shape)}")
    bos = torch.full_like(target[:, :1], bos_id)  # (B, 1)
    return torch.cat([bos, target[:, :-1]], dim=1), target  # (B, T), (B, T)


# ---------------------------------------------------------------------------
# One training step
# ---------------------------------------------------------------------------
class _Stepper(Protocol):
    def step(self) -> object: ...


class Step(NamedTuple):
    """What one update saw: its loss (before the update), the scores (B, T, V) and the labels (B, T)."""

    loss: float
    scores: Tensor
    labels: Tensor


def train_step(model: nn.Module, src: Tensor, target: Tensor, *, optimizer: torch.optim.Optimizer,
               scheduler: _Stepper | None, criterion, bos_id: int, make_batch=teacher_forcing) -> Step:
    """§5: one update. Shift the target (``make_batch``), run the model on (src, decoder input), take the
    criterion on (scores (N, V), labels (N,)), back-propagate, step the optimizer, then the scheduler
    (so update k ran at the schedule's rate for step k). Returns the loss, scores and labels it used."""
    model.train()
    decoder_input, labels = make_batch(target, bos_id)
    scores = model(src, decoder_input)  # (B, T, V)
    loss = criterion(scores.reshape(-1, scores.size(-1)), labels.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return Step(float(loss.detach()), scores.detach(), labels)


class PaperRecipe:
    """The paper's recipe as the adapter contract's recipe capabilities (``spec.contract``).

    Mix it into an adapter that has a ``config`` (``spec.ModelConfig``):
    ``class MyAdapter(PaperRecipe, nn.Module)``, as the fused built-in does. The reference model
    (``reference.model.Transformer``) has the same methods, with components swapped in where given.
    """

    config: ModelConfig

    def make_optimizer(self, params: Iterable[nn.Parameter], train_config: TrainConfig) -> torch.optim.Optimizer:
        """§5.3: Adam(β1, β2, ε) without weight decay."""
        return adam(params, train_config)

    def make_scheduler(self, optimizer: torch.optim.Optimizer, train_config: TrainConfig) -> LRScheduler:
        """§5.3, Eq. (3) with this model's d_model, stepped once per update."""
        return lrate_scheduler(optimizer, self.config.d_model, train_config)

    def make_criterion(self, train_config: TrainConfig) -> nn.Module:
        """§5.4: label-smoothed cross entropy, padding targets weighted 0."""
        return label_smoothed_cross_entropy(self.config.tgt_vocab, self.config.pad_id, train_config)

    def make_batch(self, target: Tensor, bos_id: int) -> tuple[Tensor, Tensor]:
        """§3.1: BOS + target[:, :-1] as the decoder input, the target as the labels."""
        return teacher_forcing(target, bos_id)
