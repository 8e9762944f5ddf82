"""Deliberately broken training recipes: the reference model with one recipe bug each.

A plugin for the suite's own tests (``--plugin tests/broken_recipes.py``). Every implementation here
is the reference Transformer with the paper's recipe (its recipe capabilities, ``reference/training.py``) in which
one piece (schedule, optimizer, criterion or batch) carries a bug of a kind real training code
carries (bugs.md-style: B10, B48-B52). Each registers as ``broken-recipe-<bug>`` and declares as
deviations the ``train`` clauses that bug breaks. ``tests/test_broken_models.py`` runs the ``train``
area over them (the model is the reference's, so the other areas have nothing to find) and asserts
that each is caught by exactly its declared clauses.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn_conformance.implementations import Implementation, hookimpl
from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.reference.training import LabelSmoothedCrossEntropy, LRateScheduler, lrate, smoothed_targets

LEARNS = "train.learns"


class Recipe(Transformer):
    """The reference model with the paper's recipe; each bug below overrides one recipe method."""


def _unit_lr(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    for group in optimizer.param_groups:  # LambdaLR multiplies the group's initial rate
        group["lr"] = 1.0
    return optimizer


# -- schedules ----------------------------------------------------------------------------------------------------
class StepFromZero(Recipe):
    def make_scheduler(self, optimizer, train_config):
        d, w = self.config.d_model, train_config.warmup_steps

        def rate(step: int) -> float:  # BUG: the raw counter (0 at the first update) is step_num
            return d ** -0.5 * min(step ** -0.5 if step > 0 else math.inf, step * w ** -1.5)

        return torch.optim.lr_scheduler.LambdaLR(_unit_lr(optimizer), rate)


class ClampedStep(Recipe):
    def make_scheduler(self, optimizer, train_config):
        d, w = self.config.d_model, train_config.warmup_steps

        def rate(step: int) -> float:
            step = max(step, 1)  # BUG: step 0 clamped to 1 (so updates 1 and 2 share a rate)
            return d ** -0.5 * min(step ** -0.5, step * w ** -1.5)

        return torch.optim.lr_scheduler.LambdaLR(_unit_lr(optimizer), rate)


class PerEpoch:
    """A loop that steps its scheduler once per epoch of ``every`` updates."""

    def __init__(self, inner, every: int):
        self.inner, self.every, self.calls = inner, every, 0

    def step(self) -> None:
        self.calls += 1
        if self.calls % self.every == 0:  # BUG: once per epoch
            self.inner.step()


class SteppedPerEpoch(Recipe):
    def make_scheduler(self, optimizer, train_config):
        return PerEpoch(LRateScheduler(optimizer, self.config.d_model, train_config.warmup_steps), every=100)


class ScheduleDModel512(Recipe):
    def make_scheduler(self, optimizer, train_config):
        return LRateScheduler(optimizer, 512, train_config.warmup_steps)  # BUG: the base model's d_model


class NoMin(Recipe):
    def make_scheduler(self, optimizer, train_config):
        d = self.config.d_model
        # BUG: the min() of Eq. (3) dropped, keeping the decay term: no warmup
        return torch.optim.lr_scheduler.LambdaLR(_unit_lr(optimizer), lambda step: d ** -0.5 * (step + 1) ** -0.5)


class LinearWarmupDecay(Recipe):
    def make_scheduler(self, optimizer, train_config):
        w, total = train_config.warmup_steps, 100_000
        peak = lrate(w, self.config.d_model, w)

        def rate(step: int) -> float:  # BUG: transformers' get_linear_schedule_with_warmup shape, not Eq. (3)
            k = step + 1
            return peak * (k / w if k <= w else max(0.0, (total - k) / (total - w)))

        return torch.optim.lr_scheduler.LambdaLR(_unit_lr(optimizer), rate)


class RateOnStep:
    """A schedule that sets Eq. (3)'s rate only when stepped (as toolkits that compute the rate in their training
    loop's step do): until its first step() the optimizer keeps its own base rate."""

    def __init__(self, optimizer, d_model: int, warmup: int):
        self.optimizer, self.d_model, self.warmup, self.step_num = optimizer, d_model, warmup, 0

    def step(self) -> None:
        self.step_num += 1
        for group in self.optimizer.param_groups:  # BUG: nothing set at construction: update 1 runs at the base rate
            group["lr"] = lrate(self.step_num, self.d_model, self.warmup)


class RateSetWhenStepped(Recipe):
    def make_optimizer(self, params, train_config):
        return torch.optim.Adam(params, lr=1e-3, betas=train_config.betas, eps=train_config.adam_eps)  # a base rate

    def make_scheduler(self, optimizer, train_config):
        return RateOnStep(optimizer, self.config.d_model, train_config.warmup_steps)


# -- optimizers -----------------------------------------------------------------------------------------------------
class AdamDefaults(Recipe):
    def make_optimizer(self, params, train_config):
        return torch.optim.Adam(params, lr=0.0)  # BUG: betas (0.9, 0.999), eps 1e-8


class AdamWDecay(Recipe):
    def make_optimizer(self, params, train_config):
        return torch.optim.AdamW(params, lr=0.0, betas=train_config.betas, eps=train_config.adam_eps)  # BUG: wd 0.01


class DecayOnMatrices(Recipe):
    def make_optimizer(self, params, train_config):
        params = list(params)
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},  # BUG: decay on matrices
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=0.0, betas=train_config.betas, eps=train_config.adam_eps)


# -- criteria --------------------------------------------------------------------------------------------------------
class NoSmoothing(Recipe):
    def make_criterion(self, train_config):
        return nn.CrossEntropyLoss(ignore_index=self.config.pad_id)  # BUG: no label smoothing


class SwappedSmoothing(Recipe):
    def make_criterion(self, train_config):
        eps, vocab, pad = train_config.label_smoothing, self.config.tgt_vocab, self.config.pad_id

        def criterion(scores: Tensor, labels: Tensor) -> Tensor:
            q = smoothed_targets(labels, vocab, 1.0 - eps, pad).to(scores.dtype)  # BUG: eps on the target
            return -(q * torch.log_softmax(scores, -1)).sum() / (labels != pad).sum().clamp_min(1)

        return criterion


class SmoothingMissingTrueShare(Recipe):
    def make_criterion(self, train_config):
        eps, vocab, pad = train_config.label_smoothing, self.config.tgt_vocab, self.config.pad_id

        def criterion(scores: Tensor, labels: Tensor) -> Tensor:
            q = torch.full((labels.numel(), vocab), eps / vocab, dtype=scores.dtype)
            q.scatter_(1, labels[:, None], 1.0 - eps)  # BUG: the true class loses its eps/V share: q sums to 1 - eps/V
            q = q.masked_fill((labels == pad)[:, None], 0.0)
            return -(q * torch.log_softmax(scores, -1)).sum() / (labels != pad).sum().clamp_min(1)

        return criterion


class PaddingCounted(Recipe):
    def make_criterion(self, train_config):
        return nn.CrossEntropyLoss(label_smoothing=train_config.label_smoothing)  # BUG: no ignore_index


class MeanOverAllPositions(Recipe):
    def make_criterion(self, train_config):
        reference = LabelSmoothedCrossEntropy(self.config.tgt_vocab, train_config.label_smoothing, self.config.pad_id)

        def criterion(scores: Tensor, labels: Tensor) -> Tensor:
            real = (labels != self.config.pad_id).sum().clamp_min(1)
            return reference(scores, labels) * real / labels.numel()  # BUG: divided by every position

        return criterion


class DoubleSoftmax(Recipe):
    def make_criterion(self, train_config):
        pad, eps = self.config.pad_id, train_config.label_smoothing

        def criterion(scores: Tensor, labels: Tensor) -> Tensor:  # BUG: probabilities fed to a logits loss
            return F.cross_entropy(torch.softmax(scores, -1), labels, ignore_index=pad, label_smoothing=eps)

        return criterion


# -- batches ----------------------------------------------------------------------------------------------------------
class NoShift(Recipe):
    def make_batch(self, target, bos_id):
        return target, target  # BUG: the decoder sees the token it predicts


class SliceWithoutBos(Recipe):
    def make_batch(self, target, bos_id):
        labels = F.pad(target[:, 1:], (0, 1), value=self.config.pad_id)
        return target, labels  # BUG: trg[:, :-1] / trg[:, 1:] on a target that has no start symbol


class LabelsShiftedToo(Recipe):
    def make_batch(self, target, bos_id):
        decoder_input = F.pad(target[:, :-1], (1, 0), value=bos_id)
        labels = F.pad(target[:, 1:], (0, 1), value=self.config.pad_id)  # BUG: the labels shifted as well
        return decoder_input, labels


class EosFirst(Recipe):
    def make_batch(self, target, bos_id):
        decoder_input, labels = super().make_batch(target, bos_id)  # (B, T): BOS, target[:, :-1]
        decoder_input = decoder_input.masked_fill(decoder_input == 2, self.config.pad_id)  # no end symbol inside
        decoder_input[:, 0] = 2  # BUG: fairseq's shift, the end symbol moved to the front instead of a start symbol
        return decoder_input, labels


class EosAsPadding(Recipe):
    def make_batch(self, target, bos_id):
        decoder_input, labels = super().make_batch(target, bos_id)
        # not a bug: every end symbol of the decoder input becomes padding (a toolkit's batching does this); in real
        # targets the end symbol is the last token, so in the decoder input it only ever sits past the end
        return decoder_input.masked_fill(decoder_input == 2, self.config.pad_id), labels


# name -> (class, bug, {clause: why})
BROKEN_RECIPES: dict[str, tuple[Callable[..., nn.Module], str, dict[str, str]]] = {
    "lr-step-from-zero": (StepFromZero, "LambdaLR on the raw counter: step_num 0 at the first update", {
        "train.lr-schedule": "update 1 runs at rate 0 and update k at Eq. (3)'s k - 1"}),
    "lr-clamped-step": (ClampedStep, "step 0 clamped to 1 (the Annotated Transformer's rate())", {
        "train.lr-schedule": "updates 1 and 2 share lrate(1), then one update late"}),
    "lr-set-when-stepped": (RateSetWhenStepped, "a schedule that sets the rate only in step(): update 1 runs at "
                            "the optimizer's base rate 1e-3", {
        "train.lr-schedule": "update 1 at the base rate, update k at Eq. (3)'s k - 1"}),
    "lr-per-epoch": (SteppedPerEpoch, "Eq. (3) stepped once per epoch of 100 updates", {
        "train.lr-schedule": "the rate changes every 100 updates",
        LEARNS: "the first 100 updates run at lrate(1), about 3e-4: too little to learn in 150 updates"}),
    "lr-d-model-512": (ScheduleDModel512, "Eq. (3) with the base model's d_model 512 on a smaller model", {
        "train.lr-schedule": "the rate is Eq. (3)'s scaled by sqrt(32 / 512)"}),
    "lr-no-min": (NoMin, "Eq. (3) without its min(): d_model^-0.5 * step_num^-0.5 from update 1", {
        "train.lr-schedule": "no warmup: the rate starts at its highest",
        LEARNS: "0.177 at update 1 and above 0.014 throughout: the loss barely falls"}),
    "lr-linear-warmup": (LinearWarmupDecay, "a linear warmup to Eq. (3)'s peak, then a linear decay", {
        "train.lr-schedule": "linear decay after the warmup, not step_num^-0.5"}),
    "adam-defaults": (AdamDefaults, "torch.optim.Adam's defaults", {
        "train.optimizer": "beta2 0.999 and eps 1e-8"}),
    "adamw-decay": (AdamWDecay, "AdamW with its default weight decay 0.01", {
        "train.optimizer": "decoupled weight decay 0.01"}),
    "adamw-decay-on-matrices": (DecayOnMatrices, "AdamW with weight decay 0.1 on the matrices, none on vectors", {
        "train.optimizer": "the matrices' parameter group decays by 0.1 (the vectors' group is Adam's)"}),
    "no-smoothing": (NoSmoothing, "cross entropy without label smoothing", {
        "train.label-smoothing": "one-hot targets"}),
    "smoothing-swapped": (SwappedSmoothing, "confidence and smoothing swapped", {
        "train.label-smoothing": "the true class gets eps, the others 1 - eps",
        LEARNS: "trained towards every class but the right one"}),
    "smoothing-missing-true-share": (SmoothingMissingTrueShare, "eps/V on the other classes, 1 - eps on the true "
                                                                 "class: the target sums to 1 - eps/V", {
        "train.label-smoothing": "the target distribution does not sum to 1"}),
    "padding-counted": (PaddingCounted, "label-smoothed cross entropy without ignore_index", {
        "train.label-smoothing": "padding targets are trained towards the padding class",
        "train.loss-padding": "padding positions count in the loss and its mean"}),
    "mean-over-all-positions": (MeanOverAllPositions, "the loss divided by every position, padding included", {
        "train.loss-padding": "appending padding shrinks the loss and every gradient"}),
    "double-softmax": (DoubleSoftmax, "a softmax before a loss that applies its own", {
        "train.label-smoothing": "the target read from the gradient depends on the scores",
        LEARNS: "the gradients through two softmaxes are tiny: the loss barely falls"}),
    "no-shift": (NoShift, "the decoder input is the target itself", {
        "train.shift": "position i sees its own label",
        LEARNS: "it learns to copy its decoder input, which greedy decoding does not have"}),
    "slice-without-bos": (SliceWithoutBos, "trg[:, :-1] / trg[:, 1:] on a target without BOS", {
        "train.shift": "no start symbol, and the first target token is never predicted",
        LEARNS: "greedy decoding starts from a BOS it never trained on"}),
    "eos-first": (EosFirst, "the end symbol moved to the front of the decoder input (fairseq's shift)", {
        "train.shift": "the decoder starts from </s>, not from a start symbol"}),
    "eos-as-padding": (EosAsPadding, "the decoder input's end symbols turned into padding (no departure: real "
                       "targets hold the end symbol last only)", {}),
    "labels-shifted-too": (LabelsShiftedToo, "BOS + target[:, :-1] as input and target[:, 1:] as labels", {
        "train.shift": "position i is trained to predict target token i + 1",
        LEARNS: "greedy decoding emits each token one position early"}),
}


# train.learns trains two tiny models per recipe (seconds each): it runs on the recipes that declare it and on these
# controls, which depart elsewhere (or, eos-as-padding, not at all) and must still learn (eos-first: decoded from
# the start symbol it trained with, which train.shift judges).
LEARNS_CONTROLS = ("eos-as-padding", "eos-first", "adam-defaults", "no-smoothing")


@hookimpl
def register_implementations(register):
    # AIAYN_BROKEN_UNDECLARED=1 registers them without their declarations (the negative control).
    declare = os.environ.get("AIAYN_BROKEN_UNDECLARED") != "1"
    for name, (cls, bug, clauses) in BROKEN_RECIPES.items():
        register(Implementation(name=f"broken-recipe-{name}", build=cls, output="logits", summary=f"BUG: {bug}",
                                source="tests/broken_recipes.py", deviations=clauses if declare else {}))


__all__ = ["BROKEN_RECIPES", "lrate"]
