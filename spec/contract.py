"""The contract an implementation's adapter meets.

An implementation is registered with a ``build(config) -> adapter`` factory
(see ``implementations.hookspecs``). The adapter is a ``torch.nn.Module``:

``forward(src, tgt) -> scores``
    ``src`` is a LongTensor [B, S] of source token ids and ``tgt`` a
    LongTensor [B, T] of decoder input ids (already shifted right: the output
    at position i predicts the token after ``tgt[:, i]``). Both are batch
    first and right-padded with ``config.pad_id``; the adapter builds every
    mask its implementation needs from them, on their device. The result is
    a floating tensor [B, T, tgt_vocab]: logits, log-probabilities or
    probabilities, as the registration's ``output`` declares. Outputs at
    padded target positions are unspecified and never compared.

Optional methods, each unlocking more checks (a check whose method is absent
is skipped with a reason naming the method). ``has_capability(adapter, name)``
is the one way this project asks whether an adapter offers one:

``encode(src) -> [B, S, d_model]``
    The output of the final encoder layer (what cross-attention reads).
``positional_encoding(length) -> [length, d_model]``
    The table the implementation adds to the scaled embeddings.
``load_reference_state(state)``
    Load a state dict in the canonical schema (``spec.schema``). Parameters
    the paper lacks (e.g. attention biases) are set to zero. An adapter that
    cannot represent a schema parameter faithfully (e.g. a layer-norm gain
    stored as a scalar) loads what it can and declares
    ``model.reference-equivalence`` as a deviation. ``spec.schema.load_canonical``
    does the copying and its checks from a {canonical name: parameter} mapping.

Mask polarity used throughout this project: a boolean mask is True where
attention is allowed ("may attend").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol, runtime_checkable

import torch

__all__ = ["Adapter", "OutputKind", "OUTPUT_KINDS", "OPTIONAL_METHODS", "has_capability"]

OutputKind = Literal["logits", "log_probs", "probs"]
OUTPUT_KINDS: tuple[str, ...] = ("logits", "log_probs", "probs")
OPTIONAL_METHODS: tuple[str, ...] = ("encode", "positional_encoding", "load_reference_state")


@runtime_checkable
class Adapter(Protocol):
    """What ``Implementation.build(config)`` returns (a ``torch.nn.Module``)."""

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:  # [B, T, V]
        ...

    def train(self, mode: bool = True) -> Adapter:
        ...

    def eval(self) -> Adapter:
        ...


class FullAdapter(Adapter, Protocol):
    """An adapter with every optional method."""

    def encode(self, src: torch.Tensor) -> torch.Tensor:  # [B, S, d_model]
        ...

    def positional_encoding(self, length: int) -> torch.Tensor:  # [length, d_model]
        ...

    def load_reference_state(self, state: Mapping[str, torch.Tensor]) -> None:
        ...


def has_capability(adapter: object, method: str) -> bool:
    """True when the adapter offers the optional method ``method`` (one of ``OPTIONAL_METHODS``).

    The one test of a capability used by the suite, the exporter and the ``aiayn`` command; an
    unknown method name raises ValueError naming the accepted ones."""
    if method not in OPTIONAL_METHODS:
        raise ValueError(f"unknown optional method {method!r}; accepted: {', '.join(OPTIONAL_METHODS)}")
    return callable(getattr(adapter, method, None))
