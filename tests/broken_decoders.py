"""Deliberately broken decoders: the reference model with one decoding bug each, declaring the clauses it breaks.

A plugin for the suite's own tests (``--plugin tests/broken_decoders.py``), the decoding counterpart of
``tests/broken_models.py``: the forward pass is the reference's, so only ``decode.*`` clauses can fail, and
``tests/test_broken_models.py`` runs ``conformance/test_decode.py`` over every model here, asserting each
is caught by exactly the clauses it declares. Each registers as ``broken-decoder-<bug>``.

Three families, so each clause is proven by bugs that break it alone:

* cache bugs live in the step-level methods (``begin_decoding``, ``decode_step``, ``reorder_state``);
  these models offer no ``generate``, so only ``decode.incremental`` runs on them;
* cache bugs inside ``generate`` (positions restarting at 0, the self-attention cache left out of the
  reorder, an 8-position window) in models that offer only ``generate``, as library adapters do: only the
  search clauses can see them;
* search bugs live in ``generate``, over the reference's correct cache: greedy search that does not stop
  at the end symbol, beam search with another length penalty or without a finished set, a default
  maximum length that is not the source's real length + 50.

The search bugs are written here, apart from ``conformance/helpers/decoding.py``'s named variants, so that the
diagnosis recognizing them is evidence, not a tautology.

The plugin also registers broken ``search`` components (``register_components``, ``BROKEN_SEARCHES``): beam
searches with the reference's signature and one bug each, audited alone (``--component=search:NAME``) and
composed into the reference (``--impl 'reference+search=NAME'``), each declaring the clauses it breaks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
from torch import Tensor, nn

from aiayn_conformance.implementations import Component, Implementation, hookimpl
from aiayn_conformance.reference.decoding import (
    KVCache,
    LayerCache,
    LengthPenalty,
    _attend,
    beam_search,
    greedy_search,
    init_cache,
    output_limits,
    reorder,
)
from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.spec.config import ModelConfig

INC, GREEDY, BEAM, MAXLEN = "decode.incremental", "decode.greedy", "decode.beam", "decode.max-length"


# -- cache bugs (step-level interface only) ----------------------------------------------------------------------
class StepOnly(Transformer):
    generate = None  # type: ignore[assignment]  # no search of its own: only decode.incremental applies


class PositionsRestart(StepOnly):
    def embed(self, tokens: Tensor, embedding: nn.Embedding, start: int = 0) -> Tensor:
        return super().embed(tokens, embedding, 0)  # BUG: every new token at position 0 (the forward starts at 0)


class CrossNotReordered(StepOnly):
    def reorder_state(self, state: KVCache, indices: Tensor) -> KVCache:
        moved = reorder(state, indices)
        if indices.numel() != state.src_mask.size(0):
            return moved  # expanding sources to beams works ...
        layers = tuple(LayerCache(n.self_k, n.self_v, o.cross_k, o.cross_v) for n, o in zip(moved.layers, state.layers))
        return KVCache(layers, state.src_mask)  # BUG: ... but later reorders leave the cross-attention cache behind


class CrossFromEmbeddings(StepOnly):
    def begin_decoding(self, src: Tensor) -> KVCache:
        cache = init_cache(self, src)
        x = self.embed(src, self.src_embed)  # BUG: the encoder's input, not its final output
        layers = tuple(LayerCache(c.self_k, c.self_v, layer.cross_attn.split_heads(layer.cross_attn.k(x)),
                                  layer.cross_attn.split_heads(layer.cross_attn.v(x)))
                       for layer, c in zip(self.decoder, cache.layers))
        return KVCache(layers, cache.src_mask)


class BuggyCache:
    """The reference's cached decoder written out with one bug, on the model's own modules. Its state is (the
    reference's ``KVCache``, t), t counting the tokens fed, since a windowed cache holds fewer positions.

    ``bug``: "window" keeps only the last ``WINDOW`` self-attention keys/values; "restart" embeds every new token
    at position 0; "self-not-reordered" leaves the self-attention cache behind when beams are reordered;
    "cross-unmasked" attends over the cached source keys without the source padding mask."""

    def __init__(self, model: Transformer, bug: str, window: int = 0):
        self.model, self.bug, self.window = model, bug, window or WINDOW

    def begin_decoding(self, src: Tensor) -> tuple[KVCache, int]:
        return init_cache(self.model, src), 0

    def decode_step(self, state: tuple[KVCache, int], tokens: Tensor) -> tuple[Tensor, tuple[KVCache, int]]:
        (cache, t), m = state, self.model
        y = m.embed(tokens[:, None], m.tgt_embed, start=0 if self.bug == "restart" else t)
        layers = []
        for layer, c in zip(m.decoder, cache.layers):
            sa = layer.self_attn
            k = torch.cat([c.self_k, sa.split_heads(sa.k(y))], dim=2)
            v = torch.cat([c.self_v, sa.split_heads(sa.v(y))], dim=2)
            if self.bug == "window":
                k, v = k[:, :, -self.window:], v[:, :, -self.window:]
            y = layer.norm1(y + _attend(sa, y, k, v, None))
            src_mask = None if self.bug == "cross-unmasked" else cache.src_mask
            y = layer.norm2(y + _attend(layer.cross_attn, y, c.cross_k, c.cross_v, src_mask))
            y = layer.norm3(y + layer.ffn(y))
            layers.append(LayerCache(k, v, c.cross_k, c.cross_v))
        return m.generator(y[:, 0]), (KVCache(tuple(layers), cache.src_mask), t + 1)

    def reorder_state(self, state: tuple[KVCache, int], indices: Tensor) -> tuple[KVCache, int]:
        cache, t = state
        moved = reorder(cache, indices)
        if self.bug != "self-not-reordered" or indices.numel() != cache.src_mask.size(0):
            return moved, t
        return KVCache(tuple(LayerCache(o.self_k, o.self_v, n.cross_k, n.cross_v)
                             for n, o in zip(moved.layers, cache.layers)), moved.src_mask), t


WINDOW = 8


class StepWindow(StepOnly):
    """Step-level decoding through a self-attention cache that keeps only the last ``WINDOW`` positions."""

    WINDOW = WINDOW

    def begin_decoding(self, src: Tensor) -> tuple[KVCache, int]:  # type: ignore[override]
        return BuggyCache(self, "window", self.WINDOW).begin_decoding(src)

    def decode_step(self, state, tokens):  # type: ignore[override]
        return BuggyCache(self, "window", self.WINDOW).decode_step(state, tokens)

    def reorder_state(self, state, indices):  # type: ignore[override]
        return BuggyCache(self, "window", self.WINDOW).reorder_state(state, indices)


class StepWindow20(StepWindow):
    """The window at 20 positions: its first wrong step (20) falls between two judged steps (17 and 24)."""

    WINDOW = 20


class StepCrossUnmasked(StepOnly):
    """Step-level decoding whose cross-attention drops the source padding mask (the full forward keeps it)."""

    def begin_decoding(self, src: Tensor) -> tuple[KVCache, int]:  # type: ignore[override]
        return BuggyCache(self, "cross-unmasked").begin_decoding(src)

    def decode_step(self, state, tokens):  # type: ignore[override]
        return BuggyCache(self, "cross-unmasked").decode_step(state, tokens)

    def reorder_state(self, state, indices):  # type: ignore[override]
        return BuggyCache(self, "cross-unmasked").reorder_state(state, indices)


class GenerateOnly(Transformer):
    """Offers only ``generate`` (as the Hugging Face adapters' libraries decode inside it): the reference searches
    over a cache with the bug ``BUG``; no step-level methods, so decode.incremental cannot see the cache."""

    BUG = ""
    begin_decoding = None  # type: ignore[assignment]
    decode_step = None  # type: ignore[assignment]
    reorder_state = None  # type: ignore[assignment]

    @torch.no_grad()
    def generate(self, src, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_len=None):  # type: ignore[override]
        cache, pad = BuggyCache(self, self.BUG), self.config.pad_id
        if beam_size == 1:
            return greedy_search(cache, src, bos_id=bos_id, eos_id=eos_id, pad_id=pad, max_len=max_len).tokens
        return beam_search(cache, src, bos_id=bos_id, eos_id=eos_id, pad_id=pad, beam_size=beam_size, alpha=alpha,
                           max_len=max_len).tokens


class GenerateRestart(GenerateOnly):
    BUG = "restart"


class GenerateSelfNotReordered(GenerateOnly):
    BUG = "self-not-reordered"


class GenerateWindow(GenerateOnly):
    BUG = "window"


# -- search bugs (generate over the reference's cache) -----------------------------------------------------------
class Searching(Transformer):
    def search(self, src: Tensor, *, bos_id: int, eos_id: int, beam_size: int, alpha: float,
               max_len: int | Tensor | None) -> Tensor:
        pad = self.config.pad_id
        if beam_size == 1:
            return greedy_search(self, src, bos_id=bos_id, eos_id=eos_id, pad_id=pad, max_len=max_len).tokens
        return beam_search(self, src, bos_id=bos_id, eos_id=eos_id, pad_id=pad, beam_size=beam_size, alpha=alpha,
                           max_len=max_len).tokens

    def generate(self, src, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_len=None):  # type: ignore[override]
        return self.search(src, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha, max_len=max_len)


class GreedyNoEosStop(Searching):
    def generate(self, src, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_len=None):  # type: ignore[override]
        if beam_size == 1:  # BUG: greedy decoding never checks for the end symbol (runs to max_len)
            return greedy_search(self, src, bos_id=bos_id, eos_id=-1, pad_id=self.config.pad_id,
                                 max_len=max_len).tokens
        return super().generate(src, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha, max_len=max_len)


class LengthPower(Searching):
    def generate(self, src, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_len=None):  # type: ignore[override]
        if beam_size == 1:
            return super().generate(src, bos_id=bos_id, eos_id=eos_id, beam_size=1, max_len=max_len)
        return beam_search(self, src, bos_id=bos_id, eos_id=eos_id, pad_id=self.config.pad_id, beam_size=beam_size,
                           alpha=alpha, max_len=max_len,
                           length_penalty=lambda n, a: n.float() ** a).tokens  # BUG: |Y|^alpha


class NoLengthPenalty(Searching):
    def generate(self, src, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_len=None):  # type: ignore[override]
        return self.search(src, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=0.0,  # BUG: alpha ignored
                           max_len=max_len)


class FinishedInBeam(Searching):
    """Beam search as often written by hand: EOS-ended hypotheses stay in the K slots and compete with the live
    ones by log_probs / lp(|Y|); the search ends when every slot has finished or at the limit."""

    @torch.no_grad()
    def generate(self, src, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_len=None):  # type: ignore[override]
        if beam_size == 1:
            return super().generate(src, bos_id=bos_id, eos_id=eos_id, beam_size=1, max_len=max_len)
        pad = self.config.pad_id
        outs = []
        for b in range(src.size(0)):
            one = src[b:b + 1]
            limit = int((one != pad).sum()) + 50 if max_len is None else int(max_len)
            slots: list[tuple[float, list[int], bool]] = [(0.0, [], False)]

            def score(slot: tuple[float, list[int], bool]) -> float:
                return slot[0] / ((5.0 + len(slot[1])) / 6.0) ** alpha

            for _ in range(limit):
                live = [s for s in slots if not s[2]]
                if not live:
                    break
                ys = torch.tensor([[bos_id] + s[1] for s in live])
                logp = torch.log_softmax(self(one.expand(len(live), -1), ys)[:, -1].double(), dim=-1)
                logp[:, pad] = -math.inf
                grown = [s for s in slots if s[2]]
                for (lp0, seq, _), row in zip(live, logp.tolist()):
                    grown += [(lp0 + x, seq + [v], v == eos_id) for v, x in enumerate(row) if x > -math.inf]
                slots = sorted(grown, key=score, reverse=True)[:beam_size]  # BUG: finished ones can be pushed out
            outs.append(max(slots, key=score)[1])
        width = max((len(o) for o in outs), default=0)
        return torch.tensor([o + [pad] * (width - len(o)) for o in outs], dtype=torch.long).view(len(outs), width)


class MaxLenPaddedWidth(Searching):
    def generate(self, src, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_len=None):  # type: ignore[override]
        if max_len is None:
            max_len = src.size(1) + 50  # BUG: the batch's padded width, not each source's real length
        return self.search(src, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha, max_len=max_len)


class MaxLenT2TDefault(Searching):
    def generate(self, src, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_len=None):  # type: ignore[override]
        if max_len is None:  # BUG: tensor2tensor's extra_length = 100 instead of the paper's 50
            max_len = (src != self.config.pad_id).sum(dim=1) + 100
        return self.search(src, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha, max_len=max_len)


class MaxLenForcedEnd(Searching):
    """A limit of each source's real length + 5 with the end symbol forced in the last place, as Sockeye forces </s>
    at its limit: every row ends with the end symbol, so only the model's own scores show where the search cut."""

    def generate(self, src, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_len=None):  # type: ignore[override]
        if max_len is not None:
            return self.search(src, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha, max_len=max_len)
        limits = (src != self.config.pad_id).sum(dim=1) + 5  # BUG: + 5, not + 50
        out = self.search(src, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha, max_len=limits)
        for b, row in enumerate(out):
            n = int((row != self.config.pad_id).sum())
            if n == int(limits[b]) and int(row[n - 1]) != eos_id:
                row[n - 1] = eos_id  # BUG: the end symbol forced at the limit
        return out


class BeamPadFirst(Searching):
    """Beam search that returns the decoder's start symbol with each output, the start symbol being the padding id
    (as T5 and BART-style decoders start from the pad token): every row begins with padding."""

    def generate(self, src, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_len=None):  # type: ignore[override]
        out = self.search(src, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha, max_len=max_len)
        if beam_size == 1:
            return out
        start = torch.full((out.size(0), 1), self.config.pad_id, dtype=out.dtype)
        return torch.cat([start, out], dim=1)  # BUG: the start (pad) symbol kept as the first output token


class MinLengthOne:
    """The reference's cached decoder with a minimum output length of 1, the libraries' way: at the first step the
    end symbol's log-probability is -inf and the rest are not renormalized (its mass goes to padding, which the
    search drops)."""

    def __init__(self, model: Transformer, eos_id: int):
        self.model, self.eos_id = model, eos_id

    def begin_decoding(self, src: Tensor):
        return self.model.begin_decoding(src), True

    def decode_step(self, state, tokens: Tensor):
        cache, first = state
        logits, cache = self.model.decode_step(cache, tokens)
        if first:  # BUG: the end symbol may not be the first output token
            logp = torch.log_softmax(logits.double(), dim=-1)
            pad = self.model.config.pad_id
            logp[:, pad] = torch.logaddexp(logp[:, pad], logp[:, self.eos_id])
            logp[:, self.eos_id] = -math.inf
            logits = logp
        return logits, (cache, False)

    def reorder_state(self, state, indices: Tensor):
        return self.model.reorder_state(state[0], indices), state[1]


class BeamEosForbiddenFirst(Searching):
    def generate(self, src, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_len=None):  # type: ignore[override]
        if beam_size == 1:
            return super().generate(src, bos_id=bos_id, eos_id=eos_id, beam_size=1, max_len=max_len)
        return beam_search(MinLengthOne(self, eos_id), src, bos_id=bos_id, eos_id=eos_id, pad_id=self.config.pad_id,
                           beam_size=beam_size, alpha=alpha, max_len=max_len).tokens


class GreedyNotFrozen(Searching):
    """Greedy search as often written by hand: ``while not finished.all()``, every row fed its own argmax, a row
    finished once it has emitted the end symbol; its later tokens are kept (no padding after the end symbol). Each
    row still stops at its own length limit."""

    @torch.no_grad()
    def generate(self, src, *, bos_id, eos_id, beam_size=4, alpha=0.6, max_len=None):  # type: ignore[override]
        if beam_size != 1:
            return super().generate(src, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha,
                                    max_len=max_len)
        pad = self.config.pad_id
        limits = output_limits(src, pad, max_len=max_len)
        state, tokens = self.begin_decoding(src), torch.full((src.size(0),), bos_id, dtype=torch.long)
        finished = limits <= 0
        out: list[Tensor] = []
        for t in range(int(limits.max())):
            if bool(finished.all()):
                break
            logits, state = self.decode_step(state, tokens)
            logits[:, pad] = -math.inf
            tokens = logits.argmax(dim=-1)
            out.append(tokens.masked_fill(t >= limits, pad))  # rows past their own limit are padded ...
            finished = finished | (tokens == eos_id) | (t + 1 >= limits)  # BUG: ... but not rows that ended
        return torch.stack(out, dim=1) if out else src.new_full((src.size(0), 0), pad)


# name -> (build, output, bug, {clause: why})
BROKEN_DECODERS: dict[str, tuple[Callable[[ModelConfig], nn.Module], str, str, dict[str, str]]] = {
    "positions-restart": (PositionsRestart, "logits", "cached decoding embeds every new token at position 0", {
        INC: "from the second step on the cached scores differ from the full forward's"}),
    "cross-not-reordered": (CrossNotReordered, "logits", "reorder_state leaves the cross-attention cache behind", {
        INC: "after a beam reorder a row attends to another row's source"}),
    "cross-from-embeddings": (CrossFromEmbeddings, "logits", "cross-attention cache from the source embeddings", {
        INC: "the cached decoder reads the wrong memory"}),
    "self-window-8": (StepWindow, "logits", "the self-attention cache keeps only the last 8 positions", {
        INC: "from prefix length 9 on the cached scores differ from the full forward's"}),
    "self-window-20": (StepWindow20, "logits", "the self-attention cache keeps only the last 20 positions", {
        INC: "from prefix length 21 on: a step no judged step is, found by bisection"}),
    "step-cross-unmasked": (StepCrossUnmasked, "logits", "the cached step attends over padded source positions", {
        INC: "rows with a padded source read its padding"}),
    "generate-positions-restart": (GenerateRestart, "logits", "generate only; its cache embeds every new token at "
                                   "position 0", {
        BEAM: "hypotheses are scored with another distribution than the forward's",
        GREEDY: "the argmax of another distribution than the forward's: on unsharpened weights the trajectories "
                "depart from the full forward's"}),
    "generate-self-not-reordered": (GenerateSelfNotReordered, "logits", "generate only; its beam reorder leaves the "
                                    "self-attention cache behind", {
        BEAM: "after a reorder a beam continues another beam's prefix"}),
    "generate-window-8": (GenerateWindow, "logits", "generate only; its self-attention cache keeps only the last 8 "
                          "positions", {
        BEAM: "past 8 tokens hypotheses are scored with another distribution than the forward's",
        GREEDY: "past 8 tokens the argmax of another distribution than the forward's, on unsharpened weights (the "
                "sharpened witness settles on one repeated token before 8 tokens, which the window does not change)"}),
    "greedy-no-eos-stop": (GreedyNoEosStop, "logits", "greedy decoding never stops at the end symbol", {
        GREEDY: "rows keep growing after EOS"}),
    "greedy-not-frozen": (GreedyNotFrozen, "logits", "greedy decoding goes on feeding and keeping a row's tokens after "
                          "its end symbol until every row has ended", {
        GREEDY: "a finished row is not padded: tokens follow its end symbol"}),
    "beam-pad-first": (BeamPadFirst, "logits", "beam search returns the pad start symbol as the first output token", {
        BEAM: "every output begins with the padding id"}),
    "beam-eos-forbidden-first": (BeamEosForbiddenFirst, "logits", "beam search forbids the end symbol at the first "
                                 "step (minimum length 1)", {
        BEAM: "where the one-token output [end] is the best, another is returned"}),
    "length-power": (LengthPower, "logits", "beam search ranks by log_probs / |Y|^alpha", {
        BEAM: "the penalty of fairseq and CTranslate2, not GNMT's"}),
    "no-length-penalty": (NoLengthPenalty, "logits", "beam search ignores alpha", {
        BEAM: "summed log-probabilities ranked unpenalized: short outputs win"}),
    "finished-in-beam": (FinishedInBeam, "logits", "finished hypotheses compete for the beam slots", {
        BEAM: "a hypothesis pushed out after it finished is lost"}),
    "max-len-padded-width": (MaxLenPaddedWidth, "logits", "default limit: the padded batch width + 50", {
        MAXLEN: "short sources in a padded batch decode too long"}),
    "max-len-t2t-100": (MaxLenT2TDefault, "logits", "default limit: real length + 100 (tensor2tensor)", {
        MAXLEN: "twice the paper's extra length"}),
    "max-len-forced-end": (MaxLenForcedEnd, "logits", "default limit: real length + 5, the end symbol forced there", {
        MAXLEN: "short outputs cut, each ended with an end symbol the model would not choose"}),
}


# -- broken search components (kind "search": a beam search driving any step decoder) ---------------------------
def search_length_power(decoder, src: Tensor, *, bos_id: int, eos_id: int, pad_id: int, beam_size: int, alpha: float,
                        max_len: int | Tensor | None, length_penalty: LengthPenalty):
    return beam_search(decoder, src, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, beam_size=beam_size, alpha=alpha,
                       max_len=max_len, length_penalty=lambda n, a: n.float() ** a)  # BUG: |Y|^alpha, not the given one


def search_max_len_padded_width(decoder, src: Tensor, *, bos_id: int, eos_id: int, pad_id: int, beam_size: int,
                                alpha: float, max_len: int | Tensor | None, length_penalty: LengthPenalty):
    if max_len is None:
        max_len = src.size(1) + 50  # BUG: the batch's padded width, not each source's real length
    return beam_search(decoder, src, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, beam_size=beam_size, alpha=alpha,
                       max_len=max_len, length_penalty=length_penalty)


@torch.no_grad()
def search_finished_in_beam(decoder, src: Tensor, *, bos_id: int, eos_id: int, pad_id: int, beam_size: int,
                            alpha: float, max_len: int | Tensor | None, length_penalty: LengthPenalty) -> Tensor:
    """Beam search as often written by hand, one source at a time: a hypothesis that ends with EOS keeps its beam
    slot and competes with the live ones by log_probs / lp(|Y|); the search ends when every slot has finished or
    at the limit and returns the best slot."""
    limits = output_limits(src, pad_id, max_len=max_len).tolist()

    def score(slot: tuple[float, list[int], bool, int]) -> float:
        return slot[0] / float(length_penalty(torch.tensor(len(slot[1])), alpha))

    outs = []
    for b in range(src.size(0)):
        state = decoder.begin_decoding(src[b:b + 1])
        slots: list[tuple[float, list[int], bool, int]] = [(0.0, [], False, 0)]  # (log p, tokens, ended, state row)
        for _ in range(limits[b]):
            live = [slot for slot in slots if not slot[2]]
            if not live:
                break
            state = decoder.reorder_state(state, torch.tensor([slot[3] for slot in live]))
            scores, state = decoder.decode_step(state, torch.tensor([slot[1][-1] if slot[1] else bos_id
                                                                     for slot in live]))
            logp = torch.log_softmax(scores.double(), dim=-1)
            logp[:, pad_id] = -math.inf
            grown = [slot for slot in slots if slot[2]]
            for row, ((lp0, seq, _, _), dist) in enumerate(zip(live, logp.tolist())):
                grown += [(lp0 + x, seq + [v], v == eos_id, row) for v, x in enumerate(dist) if x > -math.inf]
            slots = sorted(grown, key=score, reverse=True)[:beam_size]  # BUG: finished ones can be pushed out
        outs.append(max(slots, key=score)[1])
    width = max((len(o) for o in outs), default=0)
    return torch.tensor([o + [pad_id] * (width - len(o)) for o in outs], dtype=torch.long).view(len(outs), width)


@torch.no_grad()
def search_early_stop_current_length(decoder, src: Tensor, *, bos_id: int, eos_id: int, pad_id: int, beam_size: int,
                                     alpha: float, max_len: int | Tensor | None,
                                     length_penalty: LengthPenalty) -> Tensor:
    """tensor2tensor's search written per source, with the early stop bounding the live hypotheses by lp(current
    length) instead of lp(maximum length)."""
    limits = output_limits(src, pad_id, max_len=max_len).tolist()

    def lp(n: int) -> float:
        return float(length_penalty(torch.tensor(n), alpha))

    outs = []
    for b in range(src.size(0)):
        state = decoder.begin_decoding(src[b:b + 1])
        beams: list[tuple[float, list[int]]] = [(0.0, [])]
        done: list[tuple[float, list[int]]] = []
        for step in range(limits[b]):
            scores, state = decoder.decode_step(state, torch.tensor([seq[-1] if seq else bos_id for _, seq in beams]))
            logp = torch.log_softmax(scores.double(), dim=-1)
            logp[:, pad_id] = -math.inf
            flat = [(total + float(x), row, v) for row, ((total, _), dist) in enumerate(zip(beams, logp))
                    for v, x in enumerate(dist) if x > -math.inf]
            top = sorted(flat, key=lambda c: -c[0])[:2 * beam_size]
            done = sorted(done + [(c[0] / lp(step + 1), beams[c[1]][1] + [c[2]]) for c in top if c[2] == eos_id],
                          key=lambda d: -d[0])[:beam_size]
            keep = [c for c in top if c[2] != eos_id][:beam_size]
            if not keep:
                break
            state = decoder.reorder_state(state, torch.tensor([c[1] for c in keep]))
            beams = [(c[0], beams[c[1]][1] + [c[2]]) for c in keep]
            if done and min(d[0] for d in done) > beams[0][0] / lp(step + 1):  # BUG: lp(limits[b]) bounds them
                break
        outs.append(done[0][1] if done else beams[0][1])
    width = max((len(o) for o in outs), default=0)
    return torch.tensor([o + [pad_id] * (width - len(o)) for o in outs], dtype=torch.long).view(len(outs), width)


# name -> (search, bug, {clause: why}); registered as search components "broken-<name>"
BROKEN_SEARCHES: dict[str, tuple[Callable[..., object], str, dict[str, str]]] = {
    "length-power": (search_length_power, "ranks by |Y|^alpha whatever length_penalty it is given", {
        BEAM: "fairseq's normalization where §6.1 uses GNMT's"}),
    "finished-in-beam": (search_finished_in_beam, "finished hypotheses compete for the K beam slots", {
        BEAM: "an output that finished first and was pushed out of the slots is lost"}),
    "max-len-padded-width": (search_max_len_padded_width, "default limit: the padded batch width + 50", {
        MAXLEN: "short sources in a padded batch decode too long"}),
    "early-stop-current-length": (search_early_stop_current_length, "the early stop divides the best live "
                                  "log-probability by lp(current length), not lp(maximum length)", {
        BEAM: "it stops while a live hypothesis can still finish better than the best finished one"}),
}


@hookimpl
def register_components(register):
    declare = os.environ.get("AIAYN_BROKEN_UNDECLARED") != "1"
    for name, (search, bug, clauses) in BROKEN_SEARCHES.items():
        register(Component("search", f"broken-{name}", lambda fn=search: fn, summary=f"BUG: {bug}",
                           source="tests/broken_decoders.py", deviations=clauses if declare else {}))


@hookimpl
def register_implementations(register):
    # AIAYN_BROKEN_UNDECLARED=1 registers them without their declarations (the negative control).
    declare = os.environ.get("AIAYN_BROKEN_UNDECLARED") != "1"
    for name, (build, output, bug, clauses) in BROKEN_DECODERS.items():
        register(Implementation(name=f"broken-decoder-{name}", build=build, output=output, summary=f"BUG: {bug}",
                                source="tests/broken_decoders.py", deviations=clauses if declare else {}))
