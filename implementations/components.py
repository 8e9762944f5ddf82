"""Built-in plugin: the components shipped with aiayn-conformance (kinds and their call contract:
``implementations/hookspecs.py``, ``register_components``; how they are audited and composed:
docs/components.md)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from reference.decoding import beam_search, gnmt_length_penalty
from reference.model import (
    LayerNorm,
    PositionwiseFeedForward,
    scaled_dot_product_attention,
    sinusoid_table,
)

from .declarations import Component, ComponentUnavailable
from .hookspecs import hookimpl

__all__ = ["ComponentUnavailable", "GELUFeedForward", "length_power_penalty", "no_length_penalty", "sdpa_attention",
           "t2t_timing_signal"]

REFERENCE_SOURCE = "aiayn-conformance reference/model.py"
DECODING_SOURCE = "aiayn-conformance reference/decoding.py"


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
