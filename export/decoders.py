"""Step decoders the exporters verify and the decoding benchmark times, all driven by ``reference.decoding``.

Each class here offers the step-level decoding interface of ``spec.contract``
(``begin_decoding``, ``decode_step``, ``reorder_state``), so the reference's
``greedy_search`` and ``beam_search`` run every decoder with one set of rules
(§6.1: GNMT's length penalty, finished hypotheses kept aside, tensor2tensor's
early stop, a limit of the source's real length + 50). What differs between
two decoders is then only the model computation, which is what an export must
preserve.

``torch_step_decoder``  a PyTorch model as a step decoder: its own incremental
                        decoding when it has one, else recomputing the prefix
                        through ``forward(src, prefix)``
``MemoryPrefix``        recomputing the decoder over the prefix with the encoder
                        output computed once (what a decoder without a cache does;
                        the benchmark's "recomputed prefix" in eager PyTorch)
``Lockstep``            runs two step decoders on the same tokens, lets the first
                        one drive the search and records the worst difference of
                        their next-token log-probabilities at every step
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from aiayn_conformance.reference.decoding import PrefixDecoding
from aiayn_conformance.spec.contract import StepDecoding, as_log_probs, has_step_decoding

__all__ = ["ForwardPrefix", "torch_step_decoder", "MemoryPrefix", "MemoryPrefixState", "Lockstep"]


class ForwardPrefix(PrefixDecoding):
    """Any adapter's ``forward(src, tgt)`` as a step decoder, recomputing the whole prefix at each step.

    Scores come back as the search expects them (logits or log-probabilities): an adapter whose
    ``output`` is ``probs`` is read through its logarithm.
    """

    def __init__(self, model: nn.Module, output_kind: str = "logits"):
        self.model, self.output_kind = model, output_kind

    def __call__(self, src: Tensor, tgt: Tensor) -> Tensor:
        scores = self.model(src, tgt)
        if self.output_kind != "probs":
            return scores
        return as_log_probs(scores, "probs", dtype=torch.float32, renormalize=True)


def torch_step_decoder(model: nn.Module, output_kind: str = "logits") -> StepDecoding:
    """``model`` itself when it offers step decoding (e.g. the reference's key/value cache), else ``ForwardPrefix``."""
    if has_step_decoding(model) and output_kind != "probs":
        return model  # type: ignore[return-value]
    return ForwardPrefix(model, output_kind)


class MemoryPrefixState(NamedTuple):
    memory: Tensor  # (N, S, d_model) encoder output, computed once
    src_mask: Tensor  # (N, 1, 1, S) True at real source tokens
    prefix: Tensor  # (N, t) decoder inputs fed so far


class MemoryPrefix:
    """Decoding without a key/value cache: the encoder runs once, the decoder reruns over the whole prefix.

    Needs the reference's ``encode``, ``decode`` and ``generator``; each step costs the decoder on t
    positions, so a whole output of m tokens costs O(m^2) positions instead of a cache's O(m).
    """

    def __init__(self, model: nn.Module):
        for attr in ("encode", "decode", "generator"):
            if not hasattr(model, attr):
                raise TypeError(f"MemoryPrefix needs encode(), decode() and generator; {type(model).__name__} "
                                f"lacks {attr}")
        self.model: Any = model

    def begin_decoding(self, src: Tensor) -> MemoryPrefixState:
        mask = (src != self.model.config.pad_id)[:, None, None, :]  # (B, 1, 1, S)
        return MemoryPrefixState(self.model.encode(src, mask), mask, src.new_zeros(src.size(0), 0))

    def decode_step(self, state: MemoryPrefixState, tokens: Tensor) -> tuple[Tensor, MemoryPrefixState]:
        prefix = torch.cat([state.prefix, tokens[:, None]], dim=1)  # (N, t + 1)
        hidden = self.model.decode(state.memory, state.src_mask, prefix)  # (N, t + 1, d_model)
        return self.model.generator(hidden[:, -1]), MemoryPrefixState(state.memory, state.src_mask, prefix)

    def reorder_state(self, state: MemoryPrefixState, indices: Tensor) -> MemoryPrefixState:
        return MemoryPrefixState(*(x.index_select(0, indices) for x in state))


class Lockstep:
    """Two step decoders fed the same tokens; ``lead``'s scores drive the search.

    After a search, ``worst`` is the largest |log p_lead - log p_follow| over every step, row and
    token (NaN counts as infinite), ``worst_at`` its (row, step) and ``steps`` the steps run. The
    follower is teacher-forced on the leader's choices, so a difference shows at the step where it
    arises even when the argmax hides it.
    """

    def __init__(self, lead: StepDecoding, follow: StepDecoding, *, lead_kind: str = "logits",
                 follow_kind: str = "logits"):
        self.lead, self.follow = lead, follow
        self.lead_kind, self.follow_kind = lead_kind, follow_kind
        self.worst, self.worst_at, self.steps = 0.0, (0, 0), 0

    def begin_decoding(self, src: Tensor) -> tuple[Any, Any]:
        self.worst, self.worst_at, self.steps = 0.0, (0, 0), 0
        return self.lead.begin_decoding(src), self.follow.begin_decoding(src)

    def decode_step(self, state: tuple[Any, Any], tokens: Tensor) -> tuple[Tensor, tuple[Any, Any]]:
        a, lead_state = self.lead.decode_step(state[0], tokens)
        b, follow_state = self.follow.decode_step(state[1], tokens)
        diff = (as_log_probs(a, self.lead_kind, dtype=torch.float32, renormalize=True).double()
                - as_log_probs(b, self.follow_kind, dtype=torch.float32, renormalize=True).double()).abs()
        diff = diff.nan_to_num(float("inf")).amax(dim=-1)  # (N,)
        row = int(diff.argmax())
        if diff[row].item() > self.worst or self.steps == 0:
            self.worst, self.worst_at = diff[row].item(), (row, self.steps)
        self.steps += 1
        return a, (lead_state, follow_state)

    def reorder_state(self, state: tuple[Any, Any], indices: Tensor) -> tuple[Any, Any]:
        return self.lead.reorder_state(state[0], indices), self.follow.reorder_state(state[1], indices)
