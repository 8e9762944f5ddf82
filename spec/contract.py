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

Recipe capabilities (the implementation's own training recipe, §5; each receives a
``spec.training.TrainConfig`` whose defaults are the paper's). Where one is absent,
``train.learns`` trains with the reference's piece instead:

``make_optimizer(params, train_config) -> torch.optim.Optimizer``
    The optimizer over ``params`` (an iterable of parameters), as the
    implementation's training code builds it.
``make_scheduler(optimizer, train_config) -> scheduler``
    Any object whose ``step()`` the training loop calls once after each
    ``optimizer.step()`` (a ``torch.optim.lr_scheduler`` object, a Noam-style
    class ...), and which sets the learning rate in ``optimizer.param_groups``.
    The rate read before update k is the rate of update k. A loop that steps its
    scheduler less often (per epoch) exposes an object whose ``step()`` does so
    (e.g. steps the inner scheduler every ``steps_per_epoch`` calls).
``learning_rate(step_num, train_config) -> float``
    The alternative for a schedule that is a function of a step counter (a
    ``LambdaLR`` lambda, a ``rate(step)`` helper): the learning rate of the
    update number ``step_num`` = 1, 2, ... An adapter whose loop counts from 0
    passes ``step_num - 1`` to its function, as the loop would. When an adapter
    has both, ``make_scheduler`` is the one checked and trained with.
``make_criterion(train_config) -> criterion``
    A callable ``criterion(scores [N, V], labels [N]) -> scalar loss`` (an
    ``nn.Module`` such as ``nn.CrossEntropyLoss``, or a function): ``scores``
    are the forward's outputs flattened over batch and positions (logits,
    log-probabilities or probabilities, as the registration declares) and
    ``labels`` the target ids, with ``config.pad_id`` at padding positions.
``make_batch(target, bos_id) -> (decoder_input, labels)``
    Teacher forcing: from the target ids [B, T] (right-padded, no start symbol)
    the decoder input [B, T] given to ``forward`` and the labels [B, T] given to
    the criterion, as the implementation's training loop builds them.

Mask polarity used throughout this project: a boolean mask is True where
attention is allowed ("may attend").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from .training import TrainConfig

__all__ = ["Adapter", "OutputKind", "OUTPUT_KINDS", "OPTIONAL_METHODS", "RECIPE_METHODS", "has_capability",
           "StepDecoding", "Generating", "STEP_DECODING_METHODS", "has_step_decoding", "RecipeAdapter",
           "as_log_probs"]

OutputKind = Literal["logits", "log_probs", "probs"]
OUTPUT_KINDS: tuple[str, ...] = ("logits", "log_probs", "probs")
STEP_DECODING_METHODS: tuple[str, ...] = ("begin_decoding", "decode_step", "reorder_state")
RECIPE_METHODS: tuple[str, ...] = ("make_optimizer", "make_scheduler", "learning_rate", "make_criterion", "make_batch")
OPTIONAL_METHODS: tuple[str, ...] = ("encode", "positional_encoding", "load_reference_state",
                                     *STEP_DECODING_METHODS, "generate", *RECIPE_METHODS)


def as_log_probs(scores: torch.Tensor, kind: str = "logits", *, dtype: torch.dtype = torch.float64,
                 renormalize: bool = False) -> torch.Tensor:
    """An adapter's scores of output kind ``kind`` (``OUTPUT_KINDS``) as log-probabilities in ``dtype``, detached.

    Logits go through log-softmax; log-probabilities are kept and probabilities taken the log of (clamped at the
    dtype's smallest normal number), as the model gave them, so that a check sees scores that do not sum to 1.
    ``renormalize`` log-softmaxes those two as well: a decoder's next-token scores, which a search compares
    across rows. ValueError for an unknown kind."""
    if kind not in OUTPUT_KINDS:
        raise ValueError(f"unknown output kind {kind!r}; accepted: {', '.join(OUTPUT_KINDS)}")
    out = scores.detach().to(dtype)
    if kind == "probs":
        out = out.clamp_min(torch.finfo(dtype).tiny).log()
    return torch.log_softmax(out, dim=-1) if kind == "logits" or renormalize else out


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


class RecipeAdapter(Adapter, Protocol):
    """An adapter exposing its whole training recipe (each method is optional on its own)."""

    def make_optimizer(self, params: Iterable[torch.nn.Parameter], train_config: TrainConfig) -> torch.optim.Optimizer:
        ...

    def make_scheduler(self, optimizer: torch.optim.Optimizer, train_config: TrainConfig) -> Any:  # has .step()
        ...

    def learning_rate(self, step_num: int, train_config: TrainConfig) -> float:
        ...

    def make_criterion(self, train_config: TrainConfig) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        ...

    def make_batch(self, target: torch.Tensor, bos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
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
