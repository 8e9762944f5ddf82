"""An example third-party plugin: one implementation and one component, registered through hooks.

Installed (``pip install ./examples/aiayn-example-plugin``), it is found through its
``aiayn`` entry point; nothing else needs configuring::

    aiayn list                                   # shows example-transformer and attention:example-sdpa
    pytest conformance/ --impl=example-transformer
    pytest conformance/ --component=attention:example-sdpa
    pytest conformance/ --impl='reference+attention=example-sdpa'
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from aiayn_conformance.implementations import Component, Implementation, hookimpl
from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.spec import ModelConfig
from aiayn_conformance.spec.schema import CanonicalKey, Target, load_canonical, parameter_schema


class ExampleAdapter(nn.Module):
    """The adapter contract (``spec.contract``) around "your" model; here the reference stands in for it.

    ``forward(src, tgt)`` returns [B, T, tgt_vocab] logits; ``encode``, ``positional_encoding`` and
    ``load_reference_state`` are the optional methods, each unlocking more checks."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Transformer(config)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.model(src, tgt)  # (B, T, tgt_vocab)

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        return self.model.encode(src)  # (B, S, d_model)

    def positional_encoding(self, length: int) -> torch.Tensor:
        return self.model.positional_encoding(length)  # (length, d_model)

    def load_reference_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Canonical name -> your parameter. The stand-in's names are the schema's, so the mapping is the
        identity; a real model maps each name to its own parameter (a tuple of names for a packed q|k|v
        projection) and lists the parameters the paper lacks in ``zero=``."""
        mapping: dict[CanonicalKey, Target] = {name: self.model.get_parameter(name)
                                               for name in parameter_schema(self.config)}
        load_canonical(state, mapping)


def build(config: ModelConfig) -> ExampleAdapter:
    """ModelConfig -> adapter (a fresh, randomly initialized model)."""
    return ExampleAdapter(config)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Attention contract: q, k, v [B, h, L, d_k]; mask bool, True = may attend; returns [B, h, Lq, d_k]."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v)
    empty = ~mask.any(dim=-1, keepdim=True)  # (B, h, Lq, 1): a query with no admissible key attends to nothing
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | empty)
    return out.masked_fill(empty, 0.0)


@hookimpl
def register_implementations(register) -> None:
    register(Implementation(name="example-transformer", build=build, output="logits",
                            summary="example third-party plugin (installed through the 'aiayn' entry point)",
                            source="examples/aiayn-example-plugin"))


@hookimpl
def register_components(register) -> None:
    register(Component(kind="attention", name="example-sdpa", factory=lambda: sdpa_attention,
                       summary="scaled_dot_product_attention with a guard for fully masked rows",
                       source="examples/aiayn-example-plugin"))
