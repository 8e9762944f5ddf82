"""§6.1 decoding: incremental (cached) decoding, greedy search and beam search with GNMT's length penalty.

§6.1: "We used beam search with a beam size of 4 and length penalty α = 0.6 [GNMT]. ... We set the maximum
output length during inference to input length + 50, but terminate early when possible." Where the paper is
silent this file follows tensor2tensor's ``utils/beam_search.py`` (the code the paper's results came from),
and says so.

The searches drive any step decoder (``spec.contract``): the reference ``Transformer`` with its key/value
cache (``init_cache``, ``decode_step``, ``reorder``), or any ``forward(src, tgt)`` through ``PrefixDecoding``.
They run batched on the source's device; the only Python loop is over time steps. An output is y_1 .. y_m:
no start symbol, the end symbol last when produced, right-padded with ``pad_id``, which is never generated.

Shapes as in ``reference/model.py``; N rows of a decoder state are B, or B * K in beam search (beam k of
source b is row b * K + k), and t is the prefix length. Masks are True where attention is allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from aiayn_conformance.spec.contract import StepDecoding
from aiayn_conformance.spec.decoding import TRANSLATION, DecodeConfig

# reference.model.Transformer and its MultiHeadAttention, typed loosely here: model.py imports this module
# for its decoding methods, and project imports never form a cycle (tests/test_imports.py).
Transformer = Any
MultiHeadAttention = Any

__all__ = [
    "LayerCache", "KVCache", "init_cache", "decode_step", "reorder",
    "PrefixState", "PrefixDecoding",
    "Hypotheses", "LengthPenalty", "SearchFn", "search_tokens", "gnmt_length_penalty", "output_limits",
    "greedy_search", "beam_search", "generate",
]


# ---------------------------------------------------------------------------
# Incremental decoding with a key/value cache
# ---------------------------------------------------------------------------
class LayerCache(NamedTuple):
    """One decoder layer's cache: plain tensors, batch first."""

    self_k: Tensor  # (N, h, t, d_k) self-attention keys of the prefix
    self_v: Tensor  # (N, h, t, d_v) self-attention values of the prefix
    cross_k: Tensor  # (N, h, S, d_k) cross-attention keys of the encoder output
    cross_v: Tensor  # (N, h, S, d_v) cross-attention values of the encoder output


class KVCache(NamedTuple):
    """The decoder state of incremental decoding: one ``LayerCache`` per decoder layer and the source mask."""

    layers: tuple[LayerCache, ...]
    src_mask: Tensor  # (N, 1, 1, S) bool, True at real source tokens

    @property
    def length(self) -> int:
        """t, the number of tokens fed so far: the position of the next token."""
        return self.layers[0].self_k.size(2)


def _attend(mha: MultiHeadAttention, y: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """§3.2.2 for queries y (N, 1, d_model) against cached keys (N, h, L, d_k) and values (N, h, L, d_v)."""
    q = mha.split_heads(mha.q(y))  # (N, h, 1, d_k)
    heads = mha.attention(q, k, v, mask)  # (N, h, 1, d_v)
    return mha.o(mha.merge_heads(heads))  # (N, 1, d_model)


def init_cache(model: Transformer, src: Tensor) -> KVCache:
    """Encode ``src`` (B, S) once and compute every layer's cross-attention keys and values from the
    final encoder output (§3.2.3); the self-attention caches start empty (t = 0)."""
    src_mask = (src != model.config.pad_id)[:, None, None, :]  # (B, 1, 1, S)
    memory = model.encode(src, src_mask)  # (B, S, d_model)
    layers = []
    for layer in model.decoder:
        xa, sa = layer.cross_attn, layer.self_attn
        no_keys = memory.new_zeros(src.size(0), sa.h, 0, sa.d_k)  # (B, h, 0, d_k)
        no_values = memory.new_zeros(src.size(0), sa.h, 0, sa.d_v)  # (B, h, 0, d_v)
        layers.append(LayerCache(no_keys, no_values, xa.split_heads(xa.k(memory)), xa.split_heads(xa.v(memory))))
    return KVCache(tuple(layers), src_mask)


def decode_step(model: Transformer, cache: KVCache, tokens: Tensor) -> tuple[Tensor, KVCache]:
    """One decoder step: the next-token logits (N, V) after feeding ``tokens`` (N,) at position t.

    Equal to ``model(src, prefix + tokens)[:, -1]`` for every row whose prefix holds no padding. Each
    layer appends the new token's keys/values to its self-attention cache (the query sees 0..t, so no
    causal mask is needed) and reads the cross-attention keys/values of ``init_cache``. Returns the logits
    and a new cache, the argument unmodified: a pure function of (model, cache, tokens), so an exporter
    can wrap it with past keys/values as inputs and present keys/values as outputs.
    """
    t = cache.length
    y = model.embed(tokens[:, None], model.tgt_embed, start=t)  # (N, 1, d_model), position t
    layers = []
    for layer, c in zip(model.decoder, cache.layers):
        sa = layer.self_attn
        k = torch.cat([c.self_k, sa.split_heads(sa.k(y))], dim=2)  # (N, h, t + 1, d_k)
        v = torch.cat([c.self_v, sa.split_heads(sa.v(y))], dim=2)  # (N, h, t + 1, d_v)
        y = layer.norm1(y + layer.dropout(_attend(sa, y, k, v, None)))  # (N, 1, d_model)
        y = layer.norm2(y + layer.dropout(_attend(layer.cross_attn, y, c.cross_k, c.cross_v, cache.src_mask)))
        y = layer.norm3(y + layer.dropout(layer.ffn(y)))  # (N, 1, d_model)
        layers.append(LayerCache(k, v, c.cross_k, c.cross_v))
    return model.generator(y[:, 0]), KVCache(tuple(layers), cache.src_mask)  # (N, V)


def reorder(cache: KVCache, indices: Tensor) -> KVCache:
    """Row i of the result is row ``indices[i]`` of ``cache`` (beam reordering, expansion to beams)."""
    layers = tuple(LayerCache(*(x.index_select(0, indices) for x in layer)) for layer in cache.layers)
    return KVCache(layers, cache.src_mask.index_select(0, indices))


# ---------------------------------------------------------------------------
# Recomputing the prefix: the step interface for any forward(src, tgt)
# ---------------------------------------------------------------------------
class PrefixState(NamedTuple):
    src: Tensor  # (N, S) source ids of each row
    prefix: Tensor  # (N, t) decoder inputs fed so far


class PrefixDecoding:
    """Mixin: the step-level decoding interface of a model with ``forward(src, tgt) -> [B, T, V]``.

    Each step runs the whole forward on the prefix and keeps its last position:
    exact by construction, O(t^2) per output instead of a cache's O(t).
    """

    def begin_decoding(self, src: Tensor) -> PrefixState:
        return PrefixState(src, src.new_zeros(src.size(0), 0))

    def decode_step(self, state: PrefixState, tokens: Tensor) -> tuple[Tensor, PrefixState]:
        prefix = torch.cat([state.prefix, tokens[:, None]], dim=1)  # (N, t + 1)
        return self(state.src, prefix)[:, -1], PrefixState(state.src, prefix)  # type: ignore[operator]

    def reorder_state(self, state: PrefixState, indices: Tensor) -> PrefixState:
        return PrefixState(state.src.index_select(0, indices), state.prefix.index_select(0, indices))


# ---------------------------------------------------------------------------
# Searches
# ---------------------------------------------------------------------------
class Hypotheses(NamedTuple):
    """The result of a search, one hypothesis per source."""

    tokens: Tensor  # (B, L) y_1 .. y_m, the end symbol included when produced, right-padded with pad_id
    scores: Tensor  # (B,) what the search ranked by: log_probs / lp(|Y|) (greedy: log_probs)
    log_probs: Tensor  # (B,) sum of the log-probabilities of y_1 .. y_m
    lengths: Tensor  # (B,) m = |Y|
    finished: Tensor  # (B,) bool, True when the output ends with the end symbol


LengthPenalty = Callable[[Tensor, float], Tensor]
"""lp(|Y|, alpha): the divisor of a hypothesis's summed log-probabilities, for a LongTensor of lengths."""


class SearchFn(Protocol):
    """A beam search with ``beam_search``'s signature: it drives any step decoder (``spec.contract``) and
    ranks hypotheses with ``length_penalty``; ``max_len`` None means its own default limit, which §6.1 sets
    to each source's real length + 50. It returns a ``Hypotheses``, or just their tokens [B, L]."""

    def __call__(self, decoder: StepDecoding, src: Tensor, *, bos_id: int, eos_id: int, pad_id: int,
                 beam_size: int, alpha: float, max_len: int | Tensor | None,
                 length_penalty: LengthPenalty) -> Hypotheses | Tensor: ...


def search_tokens(result: Hypotheses | Tensor) -> Tensor:
    """The output tokens [B, L] of a search's result (a ``Hypotheses`` or the tokens themselves)."""
    return result.tokens if isinstance(result, Hypotheses) else result


def gnmt_length_penalty(length: Tensor, alpha: float) -> Tensor:
    """§6.1 citing GNMT (Wu et al. 2016, Eq. 14): lp(Y) = ((5 + |Y|) / 6)^α.

    |Y| counts the output tokens y_1 .. y_m, the end symbol included and the start symbol excluded,
    as tensor2tensor does. lp(1) = 1; α = 0 gives lp = 1 (no penalty).
    """
    return ((5.0 + length.to(torch.float32)) / 6.0) ** alpha


def output_limits(src: Tensor, pad_id: int, *, max_len: int | Tensor | None = None,
                  extra_length: int = TRANSLATION.extra_length) -> Tensor:
    """The maximum output length of each source (B,), the end symbol included.

    Default (§6.1): the source's real length (its non-pad tokens) + ``extra_length``. tensor2tensor adds 100
    to the padded batch width; the paper's rule is per input, so each source's real tokens are counted.
    ``max_len`` gives the limit instead: an int for every source, or a LongTensor [B].
    """
    B = src.size(0)
    if max_len is None:
        return (src != pad_id).sum(dim=1) + extra_length  # (B,)
    if isinstance(max_len, Tensor):
        if max_len.shape != (B,):
            raise ValueError(f"max_len as a tensor must have shape [{B}] (one limit per source), "
                             f"got {list(max_len.shape)}")
        return max_len.to(device=src.device, dtype=torch.long)
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 0:
        raise ValueError(f"max_len must be None, an int >= 0 or a LongTensor [B], got {max_len!r}")
    return torch.full((B,), max_len, dtype=torch.long, device=src.device)


def _log_probs(scores: Tensor, pad_id: int) -> Tensor:
    """Log-softmax over the vocabulary in float32, padding excluded. (N, V)."""
    logp = torch.log_softmax(scores.float(), dim=-1)
    # Padding is never generated (as fairseq): the reference masks padded target keys, so a generated pad
    # would be invisible to later steps, and the output's padding would be ambiguous.
    logp[:, pad_id] = float("-inf")
    return logp


@torch.no_grad()
def greedy_search(decoder: StepDecoding, src: Tensor, *, bos_id: int, eos_id: int, pad_id: int,
                  max_len: int | Tensor | None = None,
                  extra_length: int = TRANSLATION.extra_length) -> Hypotheses:
    """Greedy search: at each step the most probable next token, for every source at once.

    A source stops at its end symbol or at its maximum output length; a
    finished source is fed ``pad_id`` afterwards (its scores are ignored) and
    its output stays as it was. The loop ends when every source has stopped.
    """
    B, device = src.size(0), src.device
    limit = output_limits(src, pad_id, max_len=max_len, extra_length=extra_length)  # (B,)
    done = limit <= 0  # (B,)
    total = torch.zeros(B, device=device)
    state = decoder.begin_decoding(src)
    tokens = torch.full((B,), bos_id, dtype=torch.long, device=device)
    out: list[Tensor] = []
    for t in range(int(limit.max()) if B else 0):
        if bool(done.all()):
            break
        scores, state = decoder.decode_step(state, tokens)
        logp = _log_probs(scores, pad_id)  # (B, V)
        best, nxt = logp.max(dim=-1)  # (B,)
        nxt = nxt.masked_fill(done, pad_id)
        total = total + best.masked_fill(done, 0.0)
        out.append(nxt)
        done = done | (nxt == eos_id) | (t + 1 >= limit)
        tokens = nxt
    ys = torch.stack(out, dim=1) if out else src.new_full((B, 0), pad_id)  # (B, L)
    lengths = (ys != pad_id).sum(dim=1)
    finished = (ys == eos_id).any(dim=1)
    return Hypotheses(ys, total, total, lengths, finished)


@torch.no_grad()
def beam_search(decoder: StepDecoding, src: Tensor, *, bos_id: int, eos_id: int, pad_id: int,
                beam_size: int = TRANSLATION.beam_size, alpha: float = TRANSLATION.alpha,
                max_len: int | Tensor | None = None, extra_length: int = TRANSLATION.extra_length,
                length_penalty: LengthPenalty = gnmt_length_penalty) -> Hypotheses:
    """§6.1 beam search, as tensor2tensor's ``utils/beam_search.py`` runs it, batched over sources.

    Per source, K = ``beam_size`` *alive* hypotheses (none ends with EOS) and
    up to K *finished* ones (each ends with EOS), kept aside. At step i (the
    hypotheses growing to |Y| = i + 1 tokens):

    1. every alive hypothesis is extended by every token: log-probability
       sums; the 2K best candidates are taken (2K, so that K of them do not
       end with EOS: at most one EOS per alive hypothesis);
    2. the K best candidates not ending with EOS become the new alive set;
    3. candidates ending with EOS are scored log_probs / lp(|Y|) (GNMT's
       penalty, ``length_penalty``) and merged with the finished set, which
       keeps its K best scores.

    Early stop (tensor2tensor's ``_is_finished``): a source is done when the
    lowest score in its finished set is greater than its best alive
    hypothesis's log-probability divided by lp(maximum output length). Since
    log-probabilities only fall as a hypothesis grows and lp grows with the
    length (α >= 0), that quotient bounds the score any alive hypothesis can
    ever reach, so neither the finished set nor its best entry can change
    any more. A source is also done at its maximum output length.

    The result is the best finished hypothesis; a source with none (no EOS
    within the limit) gets its best alive hypothesis, as in tensor2tensor.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    B, K, device = src.size(0), beam_size, src.device
    limit = output_limits(src, pad_id, max_len=max_len, extra_length=extra_length)  # (B,)
    L = int(limit.max()) if B else 0
    rows = torch.arange(B, device=device)
    state = decoder.begin_decoding(src)
    state = decoder.reorder_state(state, rows.repeat_interleave(K))  # (B * K) rows, beam k of b at b * K + k
    ninf = float("-inf")

    alive_seq = src.new_zeros(B, K, 0)  # (B, K, t)
    alive_logp = torch.full((B, K), ninf, device=device)
    alive_logp[:, 0] = 0.0  # one live hypothesis to start from: the others would repeat it
    fin_seq = src.new_full((B, K, L), pad_id)  # (B, K, L)
    fin_score = torch.full((B, K), ninf, device=device)
    fin_logp = torch.full((B, K), ninf, device=device)
    out_seq, out_score = src.new_full((B, L), pad_id), torch.zeros(B, device=device)
    out_logp, out_fin = torch.zeros(B, device=device), torch.zeros(B, dtype=torch.bool, device=device)
    done = limit <= 0  # (B,)
    max_lp = length_penalty(limit, alpha)  # (B,)
    tokens = torch.full((B * K,), bos_id, dtype=torch.long, device=device)

    for i in range(L):
        if bool(done.all()):
            break
        scores, state = decoder.decode_step(state, tokens)
        V = scores.size(-1)
        logp = _log_probs(scores, pad_id).view(B, K, V)
        cand = (alive_logp[:, :, None] + logp).view(B, K * V)  # (B, K * V) summed log-probabilities
        top_logp, top_idx = cand.topk(min(2 * K, K * V), dim=1)  # (B, 2K)
        origin, token = top_idx // V, top_idx % V  # (B, 2K) the beam extended and the token appended
        grown = torch.cat([alive_seq.gather(1, origin[:, :, None].expand(-1, -1, i)), token[:, :, None]], dim=2)
        is_eos = token == eos_id  # (B, 2K)

        # 2. the new alive set: the K best candidates that do not end with EOS
        alive_logp, pick = top_logp.masked_fill(is_eos, ninf).topk(K, dim=1)  # (B, K), best first
        alive_seq = grown.gather(1, pick[:, :, None].expand(-1, -1, i + 1))  # (B, K, i + 1)
        beam = origin.gather(1, pick)  # (B, K)
        state = decoder.reorder_state(state, (rows[:, None] * K + beam).view(-1))
        tokens = alive_seq[:, :, -1].reshape(-1)

        # 3. the finished set: its K best, old and new, by log_probs / lp(|Y|), |Y| = i + 1 (EOS included)
        lp = length_penalty(torch.tensor(i + 1, device=device), alpha)
        new_ok = is_eos & torch.isfinite(top_logp) & ~done[:, None]
        new_score = torch.where(new_ok, top_logp / lp, ninf)  # (B, 2K)
        padded = torch.nn.functional.pad(grown, (0, L - i - 1), value=pad_id)  # (B, 2K, L)
        fin_score, pick = torch.cat([fin_score, new_score], dim=1).topk(K, dim=1)  # (B, K)
        fin_logp = torch.cat([fin_logp, top_logp], dim=1).gather(1, pick)
        fin_seq = torch.cat([fin_seq, padded], dim=1).gather(1, pick[:, :, None].expand(-1, -1, L))

        # termination: tensor2tensor's bound, or the maximum output length
        has_fin = torch.isfinite(fin_score[:, 0])  # (B,)
        lowest_fin = torch.where(torch.isfinite(fin_score), fin_score, float("inf")).amin(dim=1)  # (B,)
        bound_met = has_fin & (lowest_fin > alive_logp[:, 0] / max_lp)
        newly = ~done & (bound_met | (i + 1 >= limit))
        if bool(newly.any()):
            best_alive = torch.nn.functional.pad(alive_seq[:, 0], (0, L - i - 1), value=pad_id)  # (B, L)
            alive_score = alive_logp[:, 0] / length_penalty(torch.tensor(i + 1, device=device), alpha)
            out_seq = torch.where(newly[:, None], torch.where(has_fin[:, None], fin_seq[:, 0], best_alive), out_seq)
            out_score = torch.where(newly, torch.where(has_fin, fin_score[:, 0], alive_score), out_score)
            out_logp = torch.where(newly, torch.where(has_fin, fin_logp[:, 0], alive_logp[:, 0]), out_logp)
            out_fin = torch.where(newly, has_fin, out_fin)
            done = done | newly

    lengths = (out_seq != pad_id).sum(dim=1)  # (B,)
    width = int(lengths.max()) if B else 0
    return Hypotheses(out_seq[:, :width], out_score, out_logp, lengths, out_fin)


def generate(decoder: StepDecoding, src: Tensor, config: DecodeConfig = TRANSLATION, *, pad_id: int,
             max_len: int | Tensor | None = None) -> Hypotheses:
    """Decode ``src`` with ``config``: greedy search when ``config.beam_size`` is 1, beam search otherwise.

    ``max_len`` overrides the default limit (real source length + ``config.extra_length``).
    """
    if config.beam_size == 1:
        return greedy_search(decoder, src, bos_id=config.bos_id, eos_id=config.eos_id, pad_id=pad_id,
                             max_len=max_len, extra_length=config.extra_length)
    return beam_search(decoder, src, bos_id=config.bos_id, eos_id=config.eos_id, pad_id=pad_id,
                       beam_size=config.beam_size, alpha=config.alpha, max_len=max_len,
                       extra_length=config.extra_length)

