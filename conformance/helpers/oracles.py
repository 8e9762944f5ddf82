"""Closed forms of the paper's equations in float64, and the named variants real code computes instead.

The variants exist to *name* a failure ("the table matches sines and cosines
concatenated"), never to accept it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["attention", "attention_weights", "layer_norm", "feed_forward", "PE_FORMS", "pe_table", "ACTIVATIONS",
           "LP_FORMS", "length_penalty"]


def attention_weights(q: Tensor, k: Tensor, mask: Tensor | None = None, *, scale: float | None = None,
                      axis: str = "keys", fill: float | None = None) -> Tensor:
    """The weights of §3.2.1, Eq. (1) in float64: softmax(q k^T * scale) [B, h, Lq, Lk].

    Masked scores (mask False) are -inf and a row with no allowed entry gets zero weights; ``fill`` instead
    sets masked scores to that finite value (the 1e-9 bug) and keeps the plain softmax. ``axis="queries"``
    is the classic bug (softmax over the query axis).
    """
    q, k = (t.detach().to("cpu", torch.float64) for t in (q, k))
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale  # (B, h, Lq, Lk)
    dim = -1 if axis == "keys" else -2
    if mask is None:
        return torch.softmax(scores, dim=dim)
    mask = mask.to(torch.bool)
    if fill is not None:
        return torch.softmax(scores.masked_fill(~mask, fill), dim=dim)
    mask = mask.expand_as(scores)
    any_allowed = mask.any(dim=dim, keepdim=True)
    scores = scores.masked_fill(~(mask | ~any_allowed), float("-inf"))
    return torch.softmax(scores, dim=dim).masked_fill(~mask, 0.0)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, scale: float | None = None,
              axis: str = "keys") -> Tensor:
    """§3.2.1, Eq. (1) in float64: softmax(q k^T * scale) v, masked scores -inf, empty rows -> 0 [B, h, Lq, d_v].

    ``axis="queries"`` is the classic bug (softmax over the query axis).
    """
    return attention_weights(q, k, mask, scale=scale, axis=axis) @ v.detach().to("cpu", torch.float64)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float, *, form: str = "paper") -> Tensor:
    """§3.1 layer norm over the last axis in float64.

    forms: ``paper`` (biased variance, eps inside the sqrt), ``unbiased-std``
    (the Annotated Transformer's (x - mean) / (std_unbiased + eps)), ``eps-outside``
    ((x - mean) / (std_biased + eps)), ``unbiased-var`` (sqrt(var_unbiased + eps)).
    """
    x, weight, bias = (t.detach().to("cpu", torch.float64) for t in (x, weight, bias))
    mean = x.mean(-1, keepdim=True)
    if form == "paper":
        normed = (x - mean) / torch.sqrt((x - mean).pow(2).mean(-1, keepdim=True) + eps)
    elif form == "unbiased-std":
        normed = (x - mean) / (x.std(-1, keepdim=True, unbiased=True) + eps)
    elif form == "eps-outside":
        normed = (x - mean) / ((x - mean).pow(2).mean(-1, keepdim=True).sqrt() + eps)
    elif form == "unbiased-var":
        normed = (x - mean) / torch.sqrt(x.var(-1, keepdim=True, unbiased=True) + eps)
    else:
        raise ValueError(f"unknown layer-norm form {form!r}")
    return normed * weight + bias


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "silu": torch.nn.functional.silu,
    "identity": lambda t: t,
}


def feed_forward(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, *, activation: str = "relu",
                 after_w2: bool = False) -> Tensor:
    """§3.3, Eq. (2) in float64: max(0, x W1^T + b1) W2^T + b2 (nn.Linear layout)."""
    x, w1, b1, w2, b2 = (t.detach().to("cpu", torch.float64) for t in (x, w1, b1, w2, b2))
    act = ACTIVATIONS[activation]
    out = act(x @ w1.T + b1) @ w2.T + b2
    return torch.relu(out) if after_w2 else out


def _interleave(sin: Tensor, cos: Tensor, d_model: int) -> Tensor:
    table = torch.zeros(sin.size(0), d_model, dtype=torch.float64)
    table[:, 0::2] = sin[:, : (d_model + 1) // 2]
    table[:, 1::2] = cos[:, : d_model // 2]
    return table


def pe_table(length: int, d_model: int, *, form: str = "paper") -> Tensor:
    """The positional table of §3.5 (``paper``) or a named variant, float64 [length, d_model]."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)[None, :]
    if form == "paper":
        angle = pos / 10000.0 ** (two_i / d_model)
        return _interleave(torch.sin(angle), torch.cos(angle), d_model)
    if form == "positions-from-1":
        angle = (pos + 1) / 10000.0 ** (two_i / d_model)
        return _interleave(torch.sin(angle), torch.cos(angle), d_model)
    if form == "base-1000":
        angle = pos / 1000.0 ** (two_i / d_model)
        return _interleave(torch.sin(angle), torch.cos(angle), d_model)
    if form == "sin-cos-swapped":
        angle = pos / 10000.0 ** (two_i / d_model)
        return _interleave(torch.cos(angle), torch.sin(angle), d_model)
    if form == "concatenated":
        angle = pos / 10000.0 ** (two_i / d_model)
        return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)[:, :d_model]
    if form == "tensor2tensor":
        half = d_model // 2
        inv = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000.0) / max(half - 1, 1)))
        angle = pos * inv[None, :]
        return torch.nn.functional.pad(torch.cat([torch.sin(angle), torch.cos(angle)], dim=1), (0, d_model % 2))
    if form == "exponent-2i-twice":  # 2*i where i already steps by 2
        angle = pos / 10000.0 ** (2 * two_i / d_model)
        return _interleave(torch.sin(angle), torch.cos(angle), d_model)
    raise ValueError(f"unknown PE form {form!r}")


PE_FORMS: dict[str, str] = {
    "paper": "the paper's interleaved sin/cos from position 0",
    "concatenated": "all sines, then all cosines (two halves) instead of interleaved",
    "tensor2tensor": "tensor2tensor's timing signal: halves, frequencies 10000^(-i/(d/2-1))",
    "positions-from-1": "positions counted from 1 instead of 0",
    "base-1000": "base 1000 instead of 10000",
    "sin-cos-swapped": "cosines on even and sines on odd dimensions",
    "exponent-2i-twice": "exponent 4i/d_model (2*i where i already steps by 2)",
}


def length_penalty(length: Tensor, alpha: float, *, form: str = "paper") -> Tensor:
    """lp(|Y|) of §6.1 (``paper``: GNMT's ((5 + |Y|) / 6)^alpha, |Y| counting the end symbol) or a named
    variant, float64, for a tensor of output lengths."""
    n = length.detach().to("cpu", torch.float64)
    if form == "paper":
        return ((5.0 + n) / 6.0) ** alpha
    if form == "length-power":
        return n ** alpha
    if form == "none":
        return torch.ones_like(n)
    if form == "eos-not-counted":
        return ((4.0 + n) / 6.0) ** alpha
    if form == "alpha-outside":  # ((5 + |Y|)^alpha) / 6, the 6 not raised to alpha
        return (5.0 + n) ** alpha / 6.0
    raise ValueError(f"unknown length-penalty form {form!r}")


LP_FORMS: dict[str, str] = {
    "paper": "GNMT's ((5 + |Y|) / 6)^alpha",
    "length-power": "|Y|^alpha (fairseq, Hugging Face, CTranslate2)",
    "none": "no penalty (1 for every length: alpha ignored)",
    "eos-not-counted": "GNMT's penalty with |Y| not counting the end symbol",
    "alpha-outside": "(5 + |Y|)^alpha / 6 (the 6 not raised to alpha)",
}
