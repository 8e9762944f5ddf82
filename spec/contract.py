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

Decoding (§6.1), optional too; each unlocks the ``decode.*`` checks:

Step-level (all three; ``decode.incremental``):
``begin_decoding(src) -> state``
    Encode ``src`` [B, S] and return an opaque decoder state for B rows with
    an empty prefix (a key/value cache, Hugging Face's ``past_key_values`` with
    the encoder output, fairseq's ``incremental_state``, or just the prefix).
``decode_step(state, tokens) -> (scores, state)``
    Feed ``tokens`` [N] (one per row, the first call gets the start symbol)
    and return the next-token scores [N, tgt_vocab] (of the declared ``output``
    kind) and the new state. The scores must equal ``forward(src, prefix)[:,
    -1]`` on the same prefix. Rows that have finished are fed ``pad_id``; their
    scores are ignored.
``reorder_state(state, indices) -> state``
    Row i of the result continues row ``indices[i]`` (a LongTensor [N'],
    entries may repeat): how beams are selected, and how B rows become B * K
    beams.

Whole search (``decode.greedy``, ``decode.beam``, ``decode.max-length``):
``generate(src, *, bos_id, eos_id, beam_size, alpha, max_len=None) -> tokens``
    Decode ``src`` [B, S] from the start symbol ``bos_id``: greedy search when
    ``beam_size`` is 1 (``alpha`` then has no effect), otherwise beam search
    with the length penalty ((5 + |Y|) / 6)^alpha. Returns a LongTensor [B, L]:
    the output tokens y_1 .. y_m of each source *without* the start symbol,
    ending with ``eos_id`` when it was produced, right-padded with ``pad_id``
    (nothing but padding after the end symbol; ``pad_id`` is never generated).
    ``max_len`` (an int) caps the output length, end symbol included;
    ``None`` means the implementation's own default, which §6.1 sets to each
    source's real (non-pad) length + 50.

Mask polarity used throughout this project: a boolean mask is True where
attention is allowed ("may attend").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import torch

__all__ = ["Adapter", "OutputKind", "OUTPUT_KINDS", "OPTIONAL_METHODS", "has_capability", "StepDecoding",
           "Generating", "STEP_DECODING_METHODS", "has_step_decoding"]

OutputKind = Literal["logits", "log_probs", "probs"]
OUTPUT_KINDS: tuple[str, ...] = ("logits", "log_probs", "probs")
STEP_DECODING_METHODS: tuple[str, ...] = ("begin_decoding", "decode_step", "reorder_state")
OPTIONAL_METHODS: tuple[str, ...] = ("encode", "positional_encoding", "load_reference_state",
                                     *STEP_DECODING_METHODS, "generate")


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


@runtime_checkable
class StepDecoding(Protocol):
    """The step-level decoding capability (all three methods)."""

    def begin_decoding(self, src: torch.Tensor) -> Any:
        ...

    def decode_step(self, state: Any, tokens: torch.Tensor) -> tuple[torch.Tensor, Any]:  # ([N, V], state)
        ...

    def reorder_state(self, state: Any, indices: torch.Tensor) -> Any:
        ...


@runtime_checkable
class Generating(Protocol):
    """The whole-search decoding capability."""

    def generate(self, src: torch.Tensor, *, bos_id: int, eos_id: int, beam_size: int, alpha: float,
                 max_len: int | None = None) -> torch.Tensor:  # [B, L]
        ...


def has_step_decoding(adapter: object) -> bool:
    """True when the adapter offers all of begin_decoding, decode_step and reorder_state."""
    return all(has_capability(adapter, m) for m in STEP_DECODING_METHODS)
