"""Built-in plugin: the components shipped with aiayn-conformance (kinds and their call contract:
``implementations/hookspecs.py``, ``register_components``; how they are audited and composed:
docs/components.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from aiayn_conformance.reference.decoding import beam_search, gnmt_length_penalty
from aiayn_conformance.reference.model import (
    LayerNorm,
    PositionwiseFeedForward,
    scaled_dot_product_attention,
    sinusoid_table,
)
from aiayn_conformance.reference.training import adam, label_smoothed_cross_entropy, lrate_scheduler

from ..declarations import Component, ComponentUnavailable
from ..hookspecs import hookimpl

__all__ = ["ComponentUnavailable", "GELUFeedForward", "annotated_rate_schedule", "hf_inverse_sqrt_schedule",
           "length_power_penalty", "no_length_penalty", "sdpa_attention", "t2t_timing_signal", "torch_adam_defaults",
           "torch_cross_entropy", "torch_cross_entropy_smoothed", "torch_cross_entropy_smoothed_no_ignore"]

REFERENCE_SOURCE = "aiayn-conformance reference/model.py"
DECODING_SOURCE = "aiayn-conformance reference/decoding.py"
TRAINING_SOURCE = "aiayn-conformance reference/training.py"


# -- attention ---------------------------------------------------------------
AttentionFn = Callable[..., torch.Tensor]


def sdpa_attention(backend: str | None = None) -> AttentionFn:
    """torch.nn.functional.scaled_dot_product_attention, optionally pinned to one backend."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        chosen = getattr(SDPBackend, backend)
        try:
            with sdpa_kernel([chosen]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        except RuntimeError as exc:
            if "No viable backend" in str(exc):
                raise ComponentUnavailable(
                    f"SDPA backend {backend} is not available for {q.device.type} inputs of dtype {q.dtype}"
                ) from exc
            raise

    return attention


# -- positional encodings ------------------------------------------------------
def t2t_timing_signal(length: int, d_model: int) -> torch.Tensor:
    """tensor2tensor's get_timing_signal_1d: [sin | cos] halves, frequencies 10000^(-i/(d/2-1))."""
    half = d_model // 2
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (L, 1)
    increment = math.log(10000.0) / max(half - 1, 1)
    inv = torch.exp(torch.arange(half, dtype=torch.float64) * -increment)  # (d/2,)
    angle = pos * inv[None, :]  # (L, d/2)
    table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)  # (L, 2*(d/2))
    return F.pad(table, (0, d_model % 2)).float()


class GELUFeedForward(PositionwiseFeedForward):
    """The FFN with GELU instead of ReLU (as in BERT/GPT), a common swap."""

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


def _torch_layer_norm(d_model: int, eps: float) -> nn.Module:
    return nn.LayerNorm(d_model, eps=eps)


# -- length penalties (lp(|Y|, alpha), the divisor of a hypothesis's summed log-probabilities) ---------------
def length_power_penalty(length: torch.Tensor, alpha: float) -> torch.Tensor:
    """|Y|^alpha: the length normalization of fairseq (``--lenpen``), Hugging Face ``generate``
    (``length_penalty``) and CTranslate2 (``length_penalty``), not GNMT's ((5 + |Y|) / 6)^alpha."""
    return length.to(torch.float32) ** alpha


def no_length_penalty(length: torch.Tensor, alpha: float) -> torch.Tensor:
    """1 for every length: hypotheses ranked by their summed log-probabilities (alpha ignored)."""
    return torch.ones_like(length, dtype=torch.float32)


# -- training (§5): optimizers, learning-rate schedules, criteria ---------------------------------------------
def torch_adam_defaults(params: Iterable[nn.Parameter], train_config: Any) -> torch.optim.Optimizer:
    """``torch.optim.Adam(params)``: its defaults betas (0.9, 0.999), eps 1e-8, no weight decay (the train_config
    is not read, as code that writes ``Adam(model.parameters())`` does not read the paper's)."""
    return torch.optim.Adam(params)


def _absolute_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """A LambdaLR multiplies each group's initial rate by its lambda: set both to ``lr``."""
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] = lr


def hf_inverse_sqrt_schedule(optimizer: torch.optim.Optimizer, d_model: int, train_config: Any) -> Any:
    """Hugging Face transformers' ``get_inverse_sqrt_schedule(optimizer, num_warmup_steps=warmup_steps)`` with the
    optimizer's rate set to Eq. (3)'s peak d_model^-0.5 * warmup^-0.5: a LambdaLR whose factor is
    current_step / warmup during the warmup and sqrt(warmup / current_step) after it, current_step counting the
    scheduler's steps from 0. Raises ComponentUnavailable without transformers."""
    try:
        from transformers import get_inverse_sqrt_schedule
    except ImportError as exc:
        raise ComponentUnavailable(f"Hugging Face transformers is not installed here ({exc})") from exc
    _absolute_rate(optimizer, d_model ** -0.5 * train_config.warmup_steps ** -0.5)
    return get_inverse_sqrt_schedule(optimizer, num_warmup_steps=train_config.warmup_steps)


def annotated_rate_schedule(optimizer: torch.optim.Optimizer, d_model: int, train_config: Any) -> Any:
    """The Annotated Transformer's ``rate(step, model_size, factor, warmup)`` in a LambdaLR over an optimizer at
    rate 1 (factor 1): Eq. (3) of the scheduler's step counter, which starts at 0 and is clamped to 1 there."""
    warmup = train_config.warmup_steps

    def rate(step: int) -> float:
        step = max(step, 1)  # the counter is 0 at the first update
        return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)

    _absolute_rate(optimizer, 1.0)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, rate)


def torch_cross_entropy_smoothed(vocab: int, pad_id: int, train_config: Any) -> nn.Module:
    """``nn.CrossEntropyLoss(ignore_index=pad_id, label_smoothing=eps_ls)``: at each real target 1 - eps + eps/V on
    the target and eps/V on every class (the padding class included); padding targets dropped from the sum and
    from the mean's count."""
    return nn.CrossEntropyLoss(ignore_index=pad_id, label_smoothing=train_config.label_smoothing)


def torch_cross_entropy_smoothed_no_ignore(vocab: int, pad_id: int, train_config: Any) -> nn.Module:
    """``nn.CrossEntropyLoss(label_smoothing=eps_ls)`` without ``ignore_index``: padding targets are trained towards
    the padding class and counted in the mean."""
    return nn.CrossEntropyLoss(label_smoothing=train_config.label_smoothing)


def torch_cross_entropy(vocab: int, pad_id: int, train_config: Any) -> nn.Module:
    """``nn.CrossEntropyLoss(ignore_index=pad_id)``: one-hot targets, no label smoothing."""
    return nn.CrossEntropyLoss(ignore_index=pad_id)


ANNOTATED = "The Annotated Transformer (Harvard NLP, 2022 edition): rate() in a LambdaLR"


@hookimpl
def register_components(register):
    register(Component("attention", "reference", lambda: scaled_dot_product_attention,
                       summary="the reference's Eq. (1) in plain torch ops", source=REFERENCE_SOURCE))
    register(Component("attention", "sdpa", lambda: sdpa_attention(None),
                       summary="torch.nn.functional.scaled_dot_product_attention, PyTorch's backend choice",
                       source="torch.nn.functional.scaled_dot_product_attention"))
    for backend in ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
        slug = backend.lower().replace("_attention", "")
        register(Component("attention", f"sdpa-{slug}", lambda b=backend: sdpa_attention(b),
                           summary=f"scaled_dot_product_attention pinned to the {backend} backend",
                           source="torch.nn.attention.sdpa_kernel"))
    register(Component("positional_encoding", "reference", lambda: sinusoid_table,
                       summary="§3.5 sinusoids, interleaved, positions from 0", source=REFERENCE_SOURCE))
    register(Component("positional_encoding", "t2t-timing-signal", lambda: t2t_timing_signal,
                       summary="tensor2tensor's timing signal: concatenated halves, other frequencies",
                       source="tensor2tensor layers/common_attention.py get_timing_signal_1d",
                       deviations={"position.formula": "sines then cosines in two halves, with frequencies "
                                                       "10000^(-i/(d/2-1)) instead of 10000^(-2i/d)"}))
    register(Component("layer_norm", "reference", LayerNorm,
                       summary="biased variance, eps inside the sqrt, per-feature gain and bias",
                       source=REFERENCE_SOURCE))
    register(Component("layer_norm", "torch-layernorm", _torch_layer_norm,
                       summary="torch.nn.LayerNorm with the config's eps", source="torch.nn.LayerNorm"))
    register(Component("feed_forward", "reference", PositionwiseFeedForward,
                       summary="max(0, x W1 + b1) W2 + b2 (Eq. 2)", source=REFERENCE_SOURCE))
    register(Component("feed_forward", "gelu", GELUFeedForward,
                       summary="GELU instead of ReLU between the two linear maps", source="BERT-style FFN",
                       deviations={"ffn.formula": "GELU instead of the ReLU max(0, .) of Eq. (2)"}))
    register(Component("length_penalty", "reference", lambda: gnmt_length_penalty,
                       summary="GNMT's ((5 + |Y|) / 6)^alpha (§6.1), |Y| counting the end symbol",
                       source=DECODING_SOURCE))
    register(Component("length_penalty", "length-power", lambda: length_power_penalty,
                       summary="|Y|^alpha, the length normalization of fairseq, Hugging Face and CTranslate2",
                       source="fairseq SequenceGenerator (normalize_scores, len_penalty); transformers generate "
                              "(length_penalty); CTranslate2 translate_batch (length_penalty)",
                       deviations={"decode.beam": "hypotheses divided by |Y|^alpha instead of GNMT's "
                                                  "((5 + |Y|) / 6)^alpha: long outputs gain more"}))
    register(Component("length_penalty", "none", lambda: no_length_penalty,
                       summary="no length penalty: summed log-probabilities ranked as they are (alpha ignored)",
                       source="fairseq --unnormalized; transformers generate(length_penalty=0)",
                       deviations={"decode.beam": "alpha ignored: short outputs win where §6.1's penalty "
                                                  "prefers a longer one"}))
    register(Component("search", "reference", lambda: beam_search,
                       summary="tensor2tensor's beam search (§6.1): 2K candidates, K alive, K finished kept aside, "
                               "early stop when no alive hypothesis can win",
                       source=DECODING_SOURCE))
    register(Component("optimizer", "reference", adam,
                       summary="Adam with beta1 0.9, beta2 0.98, eps 1e-9 and no weight decay (§5.3)",
                       source=TRAINING_SOURCE))
    register(Component("optimizer", "torch-adam-defaults", torch_adam_defaults,
                       summary="torch.optim.Adam(params) with its defaults: betas (0.9, 0.999), eps 1e-8",
                       source="torch.optim.Adam",
                       deviations={"train.optimizer": "torch's default beta2 0.999 and eps 1e-8 instead of §5.3's "
                                                      "0.98 and 1e-9"}))
    register(Component("lr_schedule", "reference", lrate_scheduler,
                       summary="Eq. (3) with warmup_steps 4000, step_num counting updates from 1 (§5.3)",
                       source=TRAINING_SOURCE))
    register(Component("lr_schedule", "hf-inverse-sqrt", hf_inverse_sqrt_schedule,
                       summary="Hugging Face transformers' get_inverse_sqrt_schedule, peaking at Eq. (3)'s peak rate",
                       source="transformers.get_inverse_sqrt_schedule (transformers/optimization.py)",
                       deviations={"train.lr-schedule": "Eq. (3) of the scheduler's counter, which is 0 at the first "
                                                        "update: update 1 runs at rate 0 and update k at Eq. (3)'s "
                                                        "step k - 1"},
                       notes="Built over the optimizer's rate set to d_model^-0.5 * warmup^-0.5, the schedule is "
                             "Eq. (3)'s shape exactly (a linear warmup to that peak, then warmup^0.5 / sqrt(step)), "
                             "one update late. Needs transformers; without it its checks skip."))
    register(Component("lr_schedule", "annotated-rate", annotated_rate_schedule,
                       summary="the Annotated Transformer's rate() in a LambdaLR: step 0 clamped to 1",
                       source=ANNOTATED,
                       deviations={"train.lr-schedule": "the LambdaLR counter starts at 0 and rate() clamps it to 1: "
                                                        "updates 1 and 2 both run at Eq. (3)'s step 1, update k at "
                                                        "step k - 1"}))
    register(Component("criterion", "reference", label_smoothed_cross_entropy,
                       summary="label smoothing 0.1 spread as eps/(V-1) over the other classes (tensor2tensor), "
                               "padding targets weighted 0, mean over the real targets (§5.4)",
                       source=TRAINING_SOURCE))
    register(Component("criterion", "torch-cross-entropy-ls", torch_cross_entropy_smoothed,
                       summary="nn.CrossEntropyLoss(ignore_index=pad_id, label_smoothing=0.1)",
                       source="torch.nn.CrossEntropyLoss",
                       notes="Passes: it spreads eps as eps/V over every class, the target and the padding class "
                             "included (Szegedy et al.'s form; the target gets 1 - eps + eps/V), which "
                             "train.label-smoothing accepts and reports. The padding class gets eps/V at every real "
                             "target, as tensor2tensor's eps/(V-1) gives it too. ignore_index removes padding "
                             "targets from the smoothing term as well as from the NLL term, and from the mean's "
                             "count."))
    register(Component("criterion", "torch-cross-entropy-ls-no-ignore", torch_cross_entropy_smoothed_no_ignore,
                       summary="nn.CrossEntropyLoss(label_smoothing=0.1) without ignore_index",
                       source="torch.nn.CrossEntropyLoss",
                       deviations={"train.label-smoothing": "padding targets are trained towards the padding "
                                                            "class (no ignore_index)",
                                   "train.loss-padding": "padding targets count in the loss and in its mean"}))
    register(Component("criterion", "torch-cross-entropy", torch_cross_entropy,
                       summary="nn.CrossEntropyLoss(ignore_index=pad_id): no label smoothing",
                       source="torch.nn.CrossEntropyLoss",
                       deviations={"train.label-smoothing": "one-hot targets: no label smoothing"}))
