"""What the decode.* checks share: the implementation's own scores as a step decoder, calling its decoding
methods safely, deterministic witness inputs, and the named variants a failure is matched against.

The expected outputs of the search checks are the reference searches
(``reference.decoding``) driven by the implementation's *own* next-token
distribution, recomputed from its full forward on each prefix
(``ForwardScores``): a search is judged on the scores of the model it belongs
to, so a forward-pass bug is reported by the forward-pass clauses and never
again here.

The variants exist to *name* a failure ("matches |Y|^α instead of GNMT's
penalty"), never to accept it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from reference.decoding import PrefixState, beam_search, greedy_search, output_limits
from spec.config import ModelConfig
from spec.contract import STEP_DECODING_METHODS, has_capability
from spec.decoding import TRANSLATION

from .harness import CheckTimeout, ImplementationError, _crash, as_log_probs, run_forward
from .inputs import CONFIG, random_tokens

__all__ = [
    "DECODE_CONFIG", "PAPER", "ForwardScores", "call_generate", "rows_of", "missing_step_methods",
    "decode_sources", "BEAM_VARIANTS", "beam_variant_outputs", "finished_in_beam",
]

# Positions up to the longest witness source + 50 (§6.1): the tiny preset's max_len (24) is too short.
DECODE_CONFIG: ModelConfig = CONFIG.replace(max_len=64)
PAPER = TRANSLATION  # beam 4, alpha 0.6, input length + 50; bos 1 (the end symbol is chosen per witness)


def decode_sources(lengths: list[int], *, seed: int, config: ModelConfig = DECODE_CONFIG) -> Tensor:
    """Right-padded sources [len(lengths), max(lengths)] with these real lengths."""
    return random_tokens(config, lengths, max(lengths), vocab=config.src_vocab, seed=seed)


def missing_step_methods(model: Any) -> list[str]:
    return [m for m in STEP_DECODING_METHODS if not has_capability(model, m)]


class ForwardScores:
    """A step decoder over the implementation's full forward: each step recomputes the prefix.

    Next-token log-probabilities (float64) are memoized per (source row, prefix), so the many searches
    of a witness search cost one forward per new prefix. The reference searches drive it like any
    step decoder (``spec.contract``).
    """

    def __init__(self, model: Any, output: str, clause_id: str, config: ModelConfig = DECODE_CONFIG):
        self.model, self.output, self.clause_id, self.config = model, output, clause_id, config
        self.memo: dict[tuple[tuple[int, ...], tuple[int, ...]], Tensor] = {}

    def log_probs(self, src: Tensor, prefix: Tensor) -> Tensor:
        """[N, V] float64 log-probabilities of the token after ``prefix`` [N, t] given ``src`` [N, S]."""
        keys = list(zip(map(tuple, src.tolist()), map(tuple, prefix.tolist())))
        missing: dict[tuple, int] = {}
        for i, key in enumerate(keys):
            if key not in self.memo and key not in missing:
                missing[key] = i
        if missing:
            idx = torch.tensor(list(missing.values()), dtype=torch.long)
            out = run_forward(self.model, src[idx], prefix[idx], self.clause_id, vocab=self.config.tgt_vocab,
                              pad_id=self.config.pad_id, check_finite=False)
            for key, row in zip(missing, as_log_probs(out[:, -1], self.output)):
                self.memo[key] = row
        return torch.stack([self.memo[k] for k in keys])

    def begin_decoding(self, src: Tensor) -> PrefixState:
        return PrefixState(src, src.new_zeros(src.size(0), 0))

    def decode_step(self, state: PrefixState, tokens: Tensor) -> tuple[Tensor, PrefixState]:
        prefix = torch.cat([state.prefix, tokens[:, None]], dim=1)
        return self.log_probs(state.src, prefix), PrefixState(state.src, prefix)

    def reorder_state(self, state: PrefixState, indices: Tensor) -> PrefixState:
        return PrefixState(state.src.index_select(0, indices), state.prefix.index_select(0, indices))


def describe_generate(src: Tensor, pad_id: int, **kw: Any) -> str:
    lengths = (src != pad_id).sum(dim=1).tolist()
    args = ", ".join(f"{k}={v}" for k, v in kw.items())
    return f"generate(src {list(src.shape)} with real lengths {lengths}, {args})"


def call_generate(model: Any, src: Tensor, clause_id: str, *, eos_id: int, beam_size: int, alpha: float,
                  max_len: int | None, bos_id: int = PAPER.bos_id,
                  config: ModelConfig = DECODE_CONFIG) -> tuple[Tensor, str]:
    """``model.generate(...)`` checked for the contract's form: a LongTensor [B, L]. Returns (tokens, call)."""
    call = describe_generate(src, config.pad_id, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha,
                             max_len=max_len)
    try:
        with torch.no_grad():
            out = model.generate(src, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha,
                                 max_len=max_len)
    except CheckTimeout:
        raise
    except Exception as exc:
        _crash(clause_id, call + " raised", exc)
    if not isinstance(out, Tensor):
        _crash(clause_id, f"{call} returned {type(out).__name__}, not a tensor [B, L] of token ids")
    if out.dim() != 2 or out.size(0) != src.size(0):
        _crash(clause_id, f"{call} returned shape {list(out.shape)}, expected [{src.size(0)}, L] (one row per source)")
    if out.is_floating_point() or out.dtype == torch.bool or out.is_complex():
        _crash(clause_id, f"{call} returned dtype {out.dtype}, expected integer token ids")
    return out.detach().to("cpu", torch.long), call


def rows_of(tokens: Tensor, pad_id: int) -> list[list[int]]:
    """Each row without its right padding."""
    rows = []
    for row in tokens.tolist():
        while row and row[-1] == pad_id:
            row.pop()
        rows.append(row)
    return rows


# -- beam search variants ----------------------------------------------------------------------------------------
def _power(length: Tensor, alpha: float) -> Tensor:
    return length.to(torch.float32) ** alpha


def _gnmt_without_eos(length: Tensor, alpha: float) -> Tensor:
    return ((4.0 + length.to(torch.float32)) / 6.0) ** alpha


def finished_in_beam(scores: ForwardScores, src: Tensor, *, bos_id: int, eos_id: int, beam_size: int, alpha: float,
                     max_len: int | Tensor | None) -> list[list[int]]:
    """Beam search without a finished set: hypotheses ending with EOS keep one of the K beam slots (frozen,
    ranked by log_probs / lp(|Y|) beside the live ones, which are ranked by their current penalized
    score); one pushed out of the K best is lost. The search ends when every slot holds a finished
    hypothesis or at the maximum length, and returns the best slot."""
    pad = scores.config.pad_id
    limits = output_limits(src, pad, max_len=max_len).tolist()
    outputs = []
    for b in range(src.size(0)):
        beam: list[tuple[list[int], float, bool]] = [([], 0.0, False)]
        for _ in range(limits[b]):
            live = [h for h in beam if not h[2]]
            if not live:
                break
            prefixes = torch.tensor([[bos_id] + h[0] for h in live], dtype=torch.long)
            logp = scores.log_probs(src[b:b + 1].expand(len(live), -1), prefixes)  # (n, V)
            logp[:, pad] = -math.inf
            cands = [h for h in beam if h[2]]
            for h, row in zip(live, logp.tolist()):
                cands += [(h[0] + [v], h[1] + lp, v == eos_id) for v, lp in enumerate(row) if lp > -math.inf]
            lpen = [((5.0 + len(c[0])) / 6.0) ** alpha for c in cands]
            order = sorted(range(len(cands)), key=lambda i: cands[i][1] / lpen[i], reverse=True)
            beam = [cands[i] for i in order[:beam_size]]
        best = max(beam, key=lambda h: h[1] / ((5.0 + len(h[0])) / 6.0) ** alpha)
        outputs.append(best[0])
    return outputs


@dataclass(frozen=True)
class Variant:
    describe: str
    run: Callable[..., list[list[int]]]


def _with_penalty(**knobs: Any) -> Callable[..., list[list[int]]]:
    def run(scores: ForwardScores, src: Tensor, **kw: Any) -> list[list[int]]:
        hyp = beam_search(scores, src, pad_id=scores.config.pad_id, **{**kw, **knobs})
        return rows_of(hyp.tokens, scores.config.pad_id)
    return run


BEAM_VARIANTS: dict[str, Variant] = {
    "no-penalty": Variant("no length penalty (alpha ignored: summed log-probabilities ranked as they are)",
                          _with_penalty(alpha=0.0)),
    "length-power": Variant("the penalty |Y|^alpha (fairseq, CTranslate2, OpenNMT 'avg') instead of GNMT's "
                            "((5 + |Y|) / 6)^alpha", _with_penalty(length_penalty=_power)),
    "eos-not-counted": Variant("GNMT's penalty with |Y| not counting the end symbol",
                               _with_penalty(length_penalty=_gnmt_without_eos)),
    "finished-in-beam": Variant("finished hypotheses kept in the K beam slots instead of aside: one pushed out by "
                                "live hypotheses is lost", finished_in_beam),
}


def expected_beam(scores: ForwardScores, src: Tensor, **kw: Any) -> list[list[int]]:
    """The reference beam search (tensor2tensor's, GNMT penalty) on the implementation's own scores."""
    return rows_of(beam_search(scores, src, pad_id=scores.config.pad_id, **kw).tokens, scores.config.pad_id)


def beam_variant_outputs(scores: ForwardScores, src: Tensor, names: list[str], **kw: Any) -> dict[str, list[list[int]]]:
    return {name: BEAM_VARIANTS[name].run(scores, src, **kw) for name in names}


def greedy_rows(scores: ForwardScores, src: Tensor, *, eos_id: int, max_len: int | Tensor | None,
                bos_id: int = PAPER.bos_id) -> list[list[int]]:
    """The argmax trajectory of the implementation's full forward, stopping at ``eos_id``."""
    hyp = greedy_search(scores, src, bos_id=bos_id, eos_id=eos_id, pad_id=scores.config.pad_id, max_len=max_len)
    return rows_of(hyp.tokens, scores.config.pad_id)


# -- incremental decoding: the schedule a step decoder is driven through, and cache variants ---------------------
@dataclass(frozen=True)
class Schedule:
    """How ``decode.incremental`` drives a step decoder.

    ``expand``: the rows after ``begin_decoding`` (as beam search expands sources to beams).
    ``tokens``: per step, the token fed to each row (``pad_id`` for a row that has finished).
    ``reorders``: step -> indices applied with ``reorder_state`` before that step's tokens.
    """

    src: Tensor  # (B, S)
    expand: Tensor  # (N,) source of each row
    tokens: Tensor  # (steps, N)
    reorders: dict[int, Tensor]


def incremental_schedule(config: ModelConfig = DECODE_CONFIG, *, bos_id: int = PAPER.bos_id) -> Schedule:
    """Three right-padded sources (real lengths 6, 3, 1) expanded to two rows each; 7 steps from the start
    symbol; row 3 finishes after step 2 and is fed padding; before step 4 the rows are reordered (row 3
    dropped, row 4 duplicated), as beam search does."""
    src = decode_sources([6, 3, 1], seed=21, config=config)
    g = torch.Generator().manual_seed(22)
    steps, rows = 7, 6
    tokens = torch.randint(1, config.tgt_vocab, (steps, rows), generator=g)
    tokens[tokens == config.pad_id] = bos_id
    tokens[0] = bos_id
    tokens[3:, 3] = config.pad_id  # row 3 has finished: padding from step 3 on (until it is dropped)
    reorders = {4: torch.tensor([5, 0, 1, 2, 4, 4])}
    tokens[4:, 3] = tokens[4:, 4]  # the new row 3 continues the old row 2 (real tokens again)
    return Schedule(src, torch.tensor([0, 0, 1, 1, 2, 2]), tokens, reorders)


@dataclass
class Replay:
    """What the schedule fed and which rows hold a real prefix at each step."""

    src_rows: list[Tensor]  # per step: (N, S) the source of each row
    prefixes: list[Tensor]  # per step: (N, t + 1) the tokens fed so far
    active: list[Tensor]  # per step: (N,) bool, the prefix holds no padding


def replay(schedule: Schedule, pad_id: int) -> Replay:
    src_rows, prefix = schedule.src[schedule.expand], schedule.tokens[:0].T  # (N, S), (N, 0)
    out = Replay([], [], [])
    for t in range(schedule.tokens.size(0)):
        if t in schedule.reorders:
            idx = schedule.reorders[t]
            src_rows, prefix = src_rows[idx], prefix[idx]
        prefix = torch.cat([prefix, schedule.tokens[t][:, None]], dim=1)
        out.src_rows.append(src_rows)
        out.prefixes.append(prefix)
        out.active.append((prefix != pad_id).all(dim=1))
    return out


def drive(decoder: Any, schedule: Schedule, output: str, clause_id: str, vocab: int) -> list[Tensor]:
    """Run ``decoder`` through the schedule: per step the float64 log-probabilities [N, V] it returns."""
    what = "begin_decoding(src)"
    try:
        state = decoder.begin_decoding(schedule.src)
        what = "reorder_state(state, expand to beams)"
        state = decoder.reorder_state(state, schedule.expand)
        out = []
        for t in range(schedule.tokens.size(0)):
            if t in schedule.reorders:
                what = f"reorder_state(state, {schedule.reorders[t].tolist()}) before step {t}"
                state = decoder.reorder_state(state, schedule.reorders[t])
            what = f"decode_step(state, tokens [{schedule.tokens.size(1)}]) at step {t}"
            with torch.no_grad():
                result = decoder.decode_step(state, schedule.tokens[t])
            if not isinstance(result, tuple) or len(result) != 2:
                _crash(clause_id, f"{what} returned {type(result).__name__}, expected a pair (scores, state)")
            scores, state = result
            expected = (schedule.tokens.size(1), vocab)
            if not isinstance(scores, Tensor) or tuple(scores.shape) != expected or not scores.is_floating_point():
                shape = list(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
                _crash(clause_id, f"{what} returned scores {shape}, expected a floating tensor {list(expected)} "
                                  "[rows, tgt_vocab]")
            out.append(as_log_probs(scores, output))
    except (CheckTimeout, ImplementationError):
        raise
    except Exception as exc:
        _crash(clause_id, f"{what} raised", exc)
    return out


class CacheVariant:
    """The reference's cached decoder (``reference.decoding``) with one named bug, run on the reference twin."""

    def __init__(self, twin: Any, knob: str):
        self.model, self.knob = twin, knob

    def begin_decoding(self, src: Tensor) -> Any:
        from reference.decoding import KVCache, LayerCache, init_cache

        cache = init_cache(self.model, src)
        if self.knob != "cross-from-embeddings":
            return cache
        x = self.model.embed(src, self.model.src_embed)  # the encoder's input instead of its output
        layers = tuple(LayerCache(c.self_k, c.self_v, l.cross_attn.split_heads(l.cross_attn.k(x)),
                                  l.cross_attn.split_heads(l.cross_attn.v(x)))
                       for l, c in zip(self.model.decoder, cache.layers))
        return KVCache(layers, cache.src_mask)

    def decode_step(self, cache: Any, tokens: Tensor) -> tuple[Tensor, Any]:
        from reference.decoding import KVCache, LayerCache, _attend

        m, t = self.model, cache.length
        start = {"positions-restart": 0, "positions-from-1": t + 1}.get(self.knob, t)
        y = m.embed(tokens[:, None], m.tgt_embed, start=start)
        layers = []
        for layer, c in zip(m.decoder, cache.layers):
            sa = layer.self_attn
            k_new, v_new = sa.split_heads(sa.k(y)), sa.split_heads(sa.v(y))
            k, v = torch.cat([c.self_k, k_new], dim=2), torch.cat([c.self_v, v_new], dim=2)
            if self.knob == "self-cache-dropped":
                y = layer.norm1(y + _attend(sa, y, k_new, v_new, None))
            else:
                y = layer.norm1(y + _attend(sa, y, k, v, None))
            y = layer.norm2(y + _attend(layer.cross_attn, y, c.cross_k, c.cross_v, cache.src_mask))
            y = layer.norm3(y + layer.ffn(y))
            layers.append(LayerCache(k, v, c.cross_k, c.cross_v))
        return m.generator(y[:, 0]), KVCache(tuple(layers), cache.src_mask)

    def reorder_state(self, cache: Any, indices: Tensor) -> Any:
        from reference.decoding import KVCache, LayerCache, reorder

        moved = reorder(cache, indices)
        if indices.numel() != cache.src_mask.size(0):  # the expansion to beams: everything moves
            return moved
        if self.knob == "cross-not-reordered":
            return KVCache(tuple(LayerCache(n.self_k, n.self_v, o.cross_k, o.cross_v)
                                 for n, o in zip(moved.layers, cache.layers)), cache.src_mask)
        if self.knob == "self-not-reordered":
            return KVCache(tuple(LayerCache(o.self_k, o.self_v, n.cross_k, n.cross_v)
                                 for n, o in zip(moved.layers, cache.layers)), moved.src_mask)
        return moved


CACHE_VARIANTS: dict[str, str] = {
    "positions-restart": "every new token embedded at position 0 (positions restart instead of continuing "
                         "from the prefix length)",
    "positions-from-1": "the new token embedded at position t + 1 instead of t (positions off by one)",
    "cross-not-reordered": "the cross-attention keys/values not reordered with the beams (a row reads another "
                           "row's source)",
    "self-not-reordered": "the self-attention keys/values not reordered with the beams",
    "cross-from-embeddings": "cross-attention keys/values computed from the encoder's input embeddings instead of "
                             "the final encoder output (the wrong memory)",
    "self-cache-dropped": "self-attention over the new token only (the prefix's keys/values are not kept)",
}
