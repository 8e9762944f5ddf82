"""Built-in components, the call contract of each kind, and composition into the reference.

A component is a part a Transformer is made of, registered through the
``register_components(register)`` hook with a ``Component(kind, name, factory)``.
What ``factory`` must return depends on the kind:

``attention``
    ``factory() -> fn`` with ``fn(q, k, v, mask) -> out``: q [B, h, Lq, d_k],
    k [B, h, Lk, d_k], v [B, h, Lk, d_v]; ``mask`` is None or a boolean tensor
    broadcastable to [B, h, Lq, Lk] where **True means "may attend"**; returns
    [B, h, Lq, d_v] = softmax(q k^T / sqrt(d_k)) v over the allowed keys
    (§3.2.1, Eq. 1). A query with no allowed key returns zeros. A kernel that
    cannot run here (e.g. a CUDA-only backend on a CPU machine) raises
    ``ComponentUnavailable``; its checks then skip with that reason.
``positional_encoding``
    ``factory() -> fn`` with ``fn(length, d_model) -> [length, d_model]``, the
    table added to the scaled embeddings (§3.5).
``layer_norm``
    ``factory(d_model, eps) -> nn.Module`` mapping [..., d_model] to the same
    shape, with per-feature parameters ``weight`` and ``bias`` of shape
    [d_model] (so canonical states load into it).
``feed_forward``
    ``factory(d_model, d_ff) -> nn.Module`` mapping [..., d_model] to the same
    shape, with ``nn.Linear``-like sub-modules ``w1`` (d_model -> d_ff) and
    ``w2`` (d_ff -> d_model), each with ``weight`` and ``bias``.

Components are audited alone with ``pytest conformance/ --component=NAME``
(``NAME``, ``kind:NAME`` or ``all``) and, composed into the reference, as a
whole model: ``--impl 'reference+attention=NAME'`` (several parts chain:
``reference+attention=a+layer_norm=b``). A composed implementation inherits
the deviations its components declare.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from reference.model import (
    LayerNorm,
    PositionwiseFeedForward,
    Transformer,
    scaled_dot_product_attention,
    sinusoid_table,
)

from .hookspecs import hookimpl
from .registry import COMPONENT_KINDS, Component, Implementation

__all__ = ["ComponentUnavailable", "compose", "parse_composition", "sdpa_attention", "t2t_timing_signal"]

REFERENCE_SOURCE = "aiayn-conformance reference/model.py"


class ComponentUnavailable(RuntimeError):
    """The component cannot run on this machine (its checks skip with this message)."""


# -- attention ---------------------------------------------------------------
def sdpa_attention(backend: str | None = None):
    """torch.nn.functional.scaled_dot_product_attention, optionally pinned to one backend."""

    def attention(q, k, v, mask=None):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        from torch.nn.attention import SDPBackend, sdpa_kernel

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


# -- composition -----------------------------------------------------------------
_BUILD_ARG = {"attention": "attention", "positional_encoding": "positional_encoding",
              "layer_norm": "layer_norm", "feed_forward": "feed_forward"}
_CALL_FACTORY = {"attention", "positional_encoding"}  # factory() -> function; the others are module factories


def parse_composition(name: str) -> tuple[str, list[tuple[str, str]]]:
    """``reference+attention=a+layer_norm=b`` -> ("reference", [("attention", "a"), ("layer_norm", "b")])."""
    base, *parts = name.split("+")
    pairs = []
    for part in parts:
        kind, sep, comp = part.partition("=")
        if not sep or not comp:
            raise ValueError(f"composition part {part!r} in {name!r} is not KIND=NAME")
        if kind not in COMPONENT_KINDS:
            raise ValueError(f"composition part {part!r}: kind {kind!r} is not one of {', '.join(COMPONENT_KINDS)}")
        pairs.append((kind, comp))
    if base != "reference":
        raise ValueError(f"compositions start from 'reference' (got {base!r}), e.g. reference+attention=NAME")
    if not pairs:
        raise ValueError(f"composition {name!r} names no component (e.g. reference+attention=NAME)")
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError(f"composition {name!r} names a kind twice")
    return base, pairs


def compose(name: str, components: list[Component]) -> Implementation:
    """The reference with these components swapped in, as an Implementation named ``name``."""
    parts: dict[str, Any] = {}
    deviations: dict[str, str] = {}
    for comp in components:
        parts[_BUILD_ARG[comp.kind]] = comp
        for clause_id, why in comp.deviations.items():
            deviations.setdefault(clause_id, f"{comp.kind} component {comp.name!r}: {why}")

    def build(config):
        kwargs = {arg: (c.factory() if c.kind in _CALL_FACTORY else c.factory) for arg, c in parts.items()}
        return Transformer(config, **kwargs)

    described = ", ".join(f"{c.kind}={c.name}" for c in components)
    return Implementation(
        name=name, build=build, summary=f"the reference with {described}",
        source="; ".join(f"{c.name}: {c.source or c.plugin}" for c in components),
        output="logits", deviations=deviations, plugin="implementations.components",
    )
