"""An example third-party plugin: one implementation and one component, registered through hooks.

Installed (``pip install ./examples/aiayn-example-plugin``), it is found through its
``aiayn`` entry point; nothing else needs configuring::

    aiayn list                                   # shows example-transformer and attention:example-sdpa
    pytest conformance/ --impl=example-transformer
    pytest conformance/ --component=attention:example-sdpa
    pytest conformance/ --impl='reference+attention=example-sdpa'
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from implementations import Component, Implementation, hookimpl
from reference.model import Transformer


def build(config):
    """ModelConfig -> adapter. Here the reference model stands in for "your" model; a real plugin
    wraps its own class so that ``forward(src, tgt)`` returns [B, T, tgt_vocab] and, if it can,
    exposes ``encode``, ``positional_encoding`` and ``load_reference_state``."""
    return Transformer(config)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Attention contract: q, k, v [B, h, L, d_k]; mask bool, True = may attend; returns [B, h, Lq, d_k]."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v)
    empty = ~mask.any(dim=-1, keepdim=True)  # (B, h, Lq, 1): a query with no admissible key attends to nothing
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | empty)
    return out.masked_fill(empty, 0.0)


@hookimpl
def register_implementations(register):
    register(Implementation(name="example-transformer", build=build, output="logits",
                            summary="example third-party plugin (installed through the 'aiayn' entry point)",
                            source="examples/aiayn-example-plugin"))


@hookimpl
def register_components(register):
    register(Component(kind="attention", name="example-sdpa", factory=lambda: sdpa_attention,
                       summary="scaled_dot_product_attention with a guard for fully masked rows",
                       source="examples/aiayn-example-plugin"))
