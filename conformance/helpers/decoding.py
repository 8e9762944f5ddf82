"""What the decode.* checks share: the implementation's own scores as a step decoder, calling its decoding
methods (and a ``search`` component) safely, deterministic witness inputs, the named variants a failure is
matched against, and scripted step decoders for the components audited alone.

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

import functools
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Union, cast

import torch
from torch import Tensor

from aiayn_conformance.reference.decoding import (
    Hypotheses,
    KVCache,
    LayerCache,
    LengthPenalty,
    PrefixState,
    SearchFn,
    beam_search,
    gnmt_length_penalty,
    greedy_search,
    init_cache,
    output_limits,
)
from aiayn_conformance.reference.decoding import decode_step as twin_step
from aiayn_conformance.reference.decoding import reorder as reorder_cache
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import STEP_DECODING_METHODS, has_capability
from aiayn_conformance.spec.decoding import TRANSLATION

from .harness import CheckTimeout, ImplementationError, as_log_probs, could_not_check, run_forward
from .inputs import EOS_ID, ordinary_ids, random_tokens

__all__ = [
    "PAPER", "ForwardScores", "TwinScores", "TwinTree", "call_generate", "checked_tokens", "rows_of",
    "missing_step_methods",
    "decode_sources", "BEAM_VARIANTS", "beam_variant_outputs", "EosForbiddenFirst", "output_form",
    "COMBINED_VARIANTS", "finished_in_beam",
    "expected_beam", "greedy_rows",
    "Schedule", "incremental_schedule", "Replay", "replay", "drive", "CacheVariant", "CACHE_VARIANTS",
    "Script", "ScriptedScores", "Scores", "scripted_witnesses", "call_search", "PENALTY_SCRIPT", "EARLY_SCRIPT",
    "NEVER_ENDS", "SCRIPTED_SOURCES", "SCRIPTED_ROWS", "SCRIPTED_MAX_LEN", "NEVER_ENDING_SOURCES",
    "RandomTables", "table_sources", "TableCase", "table_cases", "t2t_search", "TABLE_VARIANTS", "TABLE_SEARCH",
]

PAPER = TRANSLATION  # beam 4, alpha 0.6, input length + 50; bos 1 (the end symbol is chosen per witness)


def decode_sources(lengths: list[int], *, seed: int, config: ModelConfig) -> Tensor:
    """Right-padded sources [len(lengths), max(lengths)] with these real lengths."""
    return random_tokens(config, lengths, max(lengths), vocab=config.src_vocab, seed=seed)


def missing_step_methods(model: Any) -> list[str]:
    return [m for m in STEP_DECODING_METHODS if not has_capability(model, m)]


class PrefixScores:
    """The step-decoder methods (``spec.contract``) over a ``log_probs(src, prefix)`` that scores a whole prefix:
    the state is the source and the prefix so far, each step appends the chosen tokens and scores again."""

    def log_probs(self, src: Tensor, prefix: Tensor) -> Tensor:
        raise NotImplementedError

    def begin_decoding(self, src: Tensor) -> PrefixState:
        return PrefixState(src, src.new_zeros(src.size(0), 0))

    def decode_step(self, state: PrefixState, tokens: Tensor) -> tuple[Tensor, PrefixState]:
        prefix = torch.cat([state.prefix, tokens[:, None]], dim=1)
        return self.log_probs(state.src, prefix), PrefixState(state.src, prefix)

    def reorder_state(self, state: PrefixState, indices: Tensor) -> PrefixState:
        return PrefixState(state.src.index_select(0, indices), state.prefix.index_select(0, indices))


class ForwardScores(PrefixScores):
    """A step decoder over the implementation's full forward: each step recomputes the prefix.

    Next-token log-probabilities (float64) are memoized per (source row, prefix), so the many searches
    of a witness search cost one forward per new prefix. The reference searches drive it like any
    step decoder (``spec.contract``).
    """

    def __init__(self, model: Any, output: str, config: ModelConfig):
        self.model, self.output, self.config = model, output, config
        self.pad_id = config.pad_id
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
            out = run_forward(self.model, src[idx], prefix[idx], vocab=self.config.tgt_vocab,
                              pad_id=self.config.pad_id, check_finite=False)
            for key, row in zip(missing, as_log_probs(out[:, -1], self.output)):
                self.memo[key] = row
        return torch.stack([self.memo[k] for k in keys])


class TwinScores(ForwardScores):
    """The step decoder of the reference ``twin`` (its key/value cache: one position per step), as float64
    log-probabilities; ``log_probs`` on a whole prefix stays the twin's full forward. The expected searches of an
    implementation whose forward is the twin's (checked on a witness before it is used) cost O(T) per output
    instead of the T^2 of recomputing every prefix: at a base model's sizes, minutes."""

    def __init__(self, twin: Any, config: ModelConfig):
        super().__init__(twin, "logits", config)

    def begin_decoding(self, src: Tensor) -> Any:
        with torch.no_grad():
            return init_cache(self.model, src)

    def decode_step(self, state: Any, tokens: Tensor) -> tuple[Tensor, Any]:
        with torch.no_grad():
            logits, state = twin_step(self.model, state, tokens)
        return torch.log_softmax(logits.double(), dim=-1), state

    def reorder_state(self, state: Any, indices: Tensor) -> Any:
        return reorder_cache(state, indices)


Key = tuple[tuple[int, ...], tuple[int, ...]]  # (source row, prefix)


class TwinTree(ForwardScores):
    """The twin's cached decoder (``TwinScores``: one position per step) memoized per (source row, prefix): each
    prefix is decoded once, from its parent prefix's keys and values, however many searches reach it. The many
    searches of a witness search (every end symbol, every named variant) share most of their prefixes, and the
    rows of a beam that repeat one (the K copies of the start) are decoded once. ``log_probs`` on a whole prefix
    is the same cached decoder (each missing ancestor decoded first), so every search sees the same scores."""

    def __init__(self, twin: Any, config: ModelConfig):
        super().__init__(twin, "logits", config)
        self.roots: dict[tuple[int, ...], tuple[tuple[tuple[Tensor, Tensor], ...], Tensor]] = {}
        self.nodes: dict[Key, tuple[Tensor, tuple[tuple[Tensor, Tensor], ...]]] = {}  # log-probs, self-attn k, v

    def log_probs(self, src: Tensor, prefix: Tensor) -> Tensor:
        """[N, V] float64 log-probabilities of the token after ``prefix`` [N, t] (t >= 1) given ``src`` [N, S]."""
        keys = list(zip(map(tuple, src.tolist()), map(tuple, prefix.tolist())))
        with torch.no_grad():
            self._grow(src, prefix, keys)
        return torch.stack([self.nodes[k][0] for k in keys])

    def _grow(self, src: Tensor, prefix: Tensor, keys: list[Key]) -> None:
        """Decode every prefix of ``keys`` not yet memoized (its ancestors first), one batch per length."""
        missing = list({k: i for i, k in enumerate(keys) if k not in self.nodes}.items())
        if not missing:
            return
        idx = torch.tensor([i for _, i in missing], dtype=torch.long)
        src, prefix = src[idx], prefix[idx]
        sources = [k[0] for k, _ in missing]
        self._encode(src, sources)
        if prefix.size(1) > 1:
            self._grow(src, prefix[:, :-1], [(s, k[1][:-1]) for s, (k, _) in zip(sources, missing)])
        logits, cache = twin_step(self.model, self._cache(sources, [k[1][:-1] for k, _ in missing]), prefix[:, -1])
        logp = torch.log_softmax(logits.double(), dim=-1)  # once per prefix, however many searches read it
        for b, (key, _) in enumerate(missing):
            self.nodes[key] = (logp[b], tuple((c.self_k[b], c.self_v[b]) for c in cache.layers))

    def _encode(self, src: Tensor, sources: list[tuple[int, ...]]) -> None:
        """The cross-attention keys and values and the mask of each source not yet encoded (``init_cache``)."""
        new = list({s: b for b, s in enumerate(sources) if s not in self.roots}.items())
        if new:
            cache = init_cache(self.model, src[torch.tensor([b for _, b in new], dtype=torch.long)])
            for r, (s, _) in enumerate(new):
                self.roots[s] = tuple((c.cross_k[r], c.cross_v[r]) for c in cache.layers), cache.src_mask[r]

    def _cache(self, sources: list[tuple[int, ...]], parents: list[tuple[int, ...]]) -> Any:
        """The twin's ``KVCache`` of the rows (source, parent prefix): the memoized keys and values, stacked."""
        roots = [self.roots[s] for s in sources]
        stems = [self.nodes[(s, p)][1] if p else None for s, p in zip(sources, parents)]
        layers = []
        for n in range(len(roots[0][0])):
            cross_k, cross_v = (torch.stack([r[0][n][j] for r in roots]) for j in (0, 1))
            if stems[0] is None:
                self_k, self_v = (x.new_zeros(len(roots), x.size(0), 0, x.size(-1)) for x in (cross_k[0], cross_v[0]))
                # (N, h, 0, d_k) and (N, h, 0, d_v)
            else:
                self_k, self_v = (torch.stack([st[n][j] for st in stems]) for j in (0, 1))  # type: ignore[index]
            layers.append(LayerCache(self_k, self_v, cross_k, cross_v))
        return KVCache(tuple(layers), torch.stack([r[1] for r in roots]))


# -- scripted scores: the witnesses of the search and length-penalty components --------------------------------
SCRIPT_VOCAB, S_PAD, S_BOS, S_EOS, S_A, S_B = 8, 0, 1, 2, 3, 4
S_FILLERS = (5, 6, 7)
Table = dict[tuple[int, ...], dict[int, float]]


@dataclass(frozen=True)
class Script:
    """Next-token probabilities by the output so far (y_1 .. y_t, the start symbol left out): ``table[output]``
    names some tokens' probabilities and the fillers it does not name share the rest; an output not in the
    table gives the end symbol ``eos_elsewhere`` and a, b and the fillers share the rest."""

    table: Table
    eos_elsewhere: float = 1e-4

    def distribution(self, output: tuple[int, ...]) -> list[float]:
        p = [0.0] * SCRIPT_VOCAB
        given = self.table.get(output)
        if given is None:
            p[S_EOS] = self.eos_elsewhere
            rest = [S_A, S_B, *S_FILLERS]
        else:
            for token, prob in given.items():
                p[token] = prob
            rest = [t for t in S_FILLERS if t not in given]
        share = (1.0 - sum(p)) / len(rest)
        for t in rest:
            p[t] = share
        return p


# Beam 4, alpha 0.6. The ends reachable at any sensible score:
#   [end]                log p = ln 0.30                                        = -1.204   |Y| = 1
#   [a, end]             log p = ln 0.65 + ln 0.441                             = -1.250   |Y| = 2
#   [a, a, a, a, end]    log p = ln 0.65 + ln 0.55 + 2 ln 0.97 + ln 0.4677      = -1.850   |Y| = 5
# GNMT's penalty ranks [a, end] first (-1.140 > -1.204 > -1.361); no penalty [end]; |Y|^0.6 [a, a, a, a, end].
PENALTY_SCRIPT = Script({
    (): {S_EOS: 0.30, S_A: 0.65},
    (S_A,): {S_EOS: 0.441, S_A: 0.55},
    (S_A, S_A): {S_A: 0.97, S_EOS: 1e-4},
    (S_A, S_A, S_A): {S_A: 0.97, S_EOS: 1e-4},
    (S_A, S_A, S_A, S_A): {S_EOS: 0.4677, S_A: 0.5},
})
# [end] finishes at the first step (ln 0.15 = -1.897); four live hypotheses a, b, 5, 6 (ln 0.2 = -1.609 each, then
# x x at -1.660 / lp(2) = -1.513) outscore it, so in K = 4 beam slots it is pushed out at once; every later end is
# far worse (a step to the end symbol costs ln 1e-3): [end] must win, which it does only if finished hypotheses
# are kept aside.
EARLY_SCRIPT = Script({
    (): {S_EOS: 0.15, S_A: 0.2, S_B: 0.2, 5: 0.2, 6: 0.2},
    **{(x,): {x: 0.95, S_EOS: 1e-3} for x in (S_A, S_B, 5, 6)},
    **{(x, x): {x: 0.95, S_EOS: 1e-3} for x in (S_A, S_B, 5, 6)},
}, eos_elsewhere=1e-3)
NEVER_ENDS = Script({}, eos_elsewhere=0.0)  # the end symbol is never produced: every output runs to its limit

# Row 0 (first token 5) follows PENALTY_SCRIPT, row 1 (6, padded) EARLY_SCRIPT: one batch, two witnesses.
SCRIPTED_SOURCES = torch.tensor([[5, 6, 7], [6, 7, S_PAD]])
SCRIPTED_ROWS = {"penalty": 0, "early": 1}
SCRIPTED_MAX_LEN = 10
# NEVER_ENDS on right-padded sources of real lengths 6, 3, 1: §6.1's limits are 56, 53 and 51.
NEVER_ENDING_SOURCES = torch.tensor([[5, 6, 7, 5, 6, 7], [5, 6, 7, S_PAD, S_PAD, S_PAD], [5] + [S_PAD] * 5])


def scripted_witnesses() -> ScriptedScores:
    return ScriptedScores({5: PENALTY_SCRIPT, 6: EARLY_SCRIPT})


class ScriptedScores(PrefixScores):
    """A step decoder whose next-token probabilities are scripted, so that a search's answer is worked out by
    hand: the witnesses of the ``search`` and ``length_penalty`` components (audited alone, no model).

    Vocabulary ``SCRIPT_VOCAB`` = 8: pad 0, start 1, end 2, a 3, b 4, fillers 5..7. The first token of a row's
    source picks its ``Script`` (``default`` otherwise). Log-probabilities are float64; padding gets none.
    """

    def __init__(self, scripts: dict[int, Script], default: Script | None = None):
        self.scripts, self.default = scripts, default or Script({})
        self.pad_id = S_PAD
        self.calls = 0

    def log_probs(self, src: Tensor, prefix: Tensor) -> Tensor:
        """[N, V] float64 log-probabilities of the token after ``prefix`` [N, t] (start symbol first)."""
        rows = [self.scripts.get(int(s[0]), self.default).distribution(tuple(p[1:]))
                for s, p in zip(src.tolist(), prefix.tolist())]
        return torch.tensor(rows, dtype=torch.float64).log()

    def decode_step(self, state: PrefixState, tokens: Tensor) -> tuple[Tensor, PrefixState]:
        self.calls += 1
        return super().decode_step(state, tokens)


Scores = Union[ForwardScores, ScriptedScores, "RandomTables"]  # noqa: UP007  # RandomTables is defined below


def describe_generate(src: Tensor, pad_id: int, **kw: Any) -> str:
    lengths = (src != pad_id).sum(dim=1).tolist()
    args = ", ".join(f"{k}={v}" for k, v in kw.items())
    return f"generate(src {list(src.shape)} with real lengths {lengths}, {args})"


def call_generate(model: Any, src: Tensor, *, eos_id: int, beam_size: int, alpha: float,
                  max_len: int | None, config: ModelConfig, bos_id: int = PAPER.bos_id) -> tuple[Tensor, str]:
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
        could_not_check(call + " raised", exc)
    return checked_tokens(out, src, call), call


def checked_tokens(out: Any, src: Tensor, call: str) -> Tensor:
    """``out`` as a CPU LongTensor [B, L] of token ids (one row per source of ``src``); anything else means the
    clause under test could not be checked."""
    if not isinstance(out, Tensor):
        could_not_check(f"{call} returned {type(out).__name__}, not a tensor [B, L] of token ids")
    if out.dim() != 2 or out.size(0) != src.size(0):
        could_not_check(f"{call} returned shape {list(out.shape)}, expected [{src.size(0)}, L] (one row per source)")
    if out.is_floating_point() or out.dtype == torch.bool or out.is_complex():
        could_not_check(f"{call} returned dtype {out.dtype}, expected integer token ids")
    return out.detach().to("cpu", torch.long)


def call_search(search: SearchFn, decoder: Any, src: Tensor, *, eos_id: int, beam_size: int, alpha: float,
                max_len: int | None, length_penalty: LengthPenalty = gnmt_length_penalty, penalty_name: str = "GNMT's",
                bos_id: int = S_BOS, pad_id: int = S_PAD) -> tuple[list[list[int]], str]:
    """A ``search`` component's ``fn(decoder, src, ...)`` (``implementations/hookspecs.py``), its result (a
    ``Hypotheses`` or the tokens) checked to be a LongTensor [B, L]. Returns (each row unpadded, the call)."""
    real = (src != pad_id).sum(dim=1).tolist()
    call = (f"search({type(decoder).__name__}, src {list(src.shape)} with real lengths {real}, bos_id={bos_id}, "
            f"eos_id={eos_id}, pad_id={pad_id}, beam_size={beam_size}, alpha={alpha}, max_len={max_len}, "
            f"length_penalty={penalty_name})")
    try:
        with torch.no_grad():
            out = search(decoder, src, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, beam_size=beam_size, alpha=alpha,
                         max_len=max_len, length_penalty=length_penalty)
    except CheckTimeout:
        raise
    except Exception as exc:
        could_not_check(call + " raised", exc)
    tokens = checked_tokens(out.tokens if isinstance(out, Hypotheses) else out, src, call)
    return rows_of(tokens, pad_id), call


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


def finished_in_beam(scores: Scores, src: Tensor, *, bos_id: int, eos_id: int, beam_size: int, alpha: float,
                     max_len: int | Tensor | None) -> list[list[int]]:
    """Beam search without a finished set: hypotheses ending with EOS keep one of the K beam slots (frozen,
    ranked by log_probs / lp(|Y|) beside the live ones, which are ranked by their current penalized
    score); one pushed out of the K best is lost. The search ends when every slot holds a finished
    hypothesis or at the maximum length, and returns the best slot."""
    pad = scores.pad_id
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
            # Only a hypothesis's beam_size best continuations can be among the beam_size best of all (they share
            # its prefix and length): ties go to the lower token, as the stable ranking below would (a vocabulary
            # of 37,000 is never turned into Python tuples).
            kept = logp.sort(dim=1, descending=True, stable=True).indices[:, :beam_size].sort(dim=1).values
            cands = [h for h in beam if h[2]]
            for h, tokens, values in zip(live, kept.tolist(), logp.gather(1, kept).tolist()):
                cands += [(h[0] + [v], h[1] + lp, v == eos_id) for v, lp in zip(tokens, values) if lp > -math.inf]
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
    def run(scores: Scores, src: Tensor, **kw: Any) -> list[list[int]]:
        hyp = beam_search(scores, src, pad_id=scores.pad_id, **{**kw, **knobs})
        return rows_of(hyp.tokens, scores.pad_id)
    return run


class EosForbiddenFirst:
    """A step decoder that forbids the end symbol at the first step (a minimum output length of 1: fairseq's
    ``min_len``, Hugging Face's ``min_length``/``min_new_tokens`` at 1), as those libraries do it: the end symbol's
    log-probability set to -inf after the softmax, the others not renormalized. The searches take a log-softmax
    of the scores and then drop padding, so the end symbol's probability is moved onto padding (dropped without
    renormalizing). Its state is (``decoder``'s state, step)."""

    def __init__(self, decoder: Any, eos_id: int):
        self.decoder, self.eos_id, self.pad_id = decoder, eos_id, decoder.pad_id

    def begin_decoding(self, src: Tensor) -> Any:
        return self.decoder.begin_decoding(src), 0

    def _forbid(self, scores: Tensor) -> Tensor:
        scores = torch.log_softmax(scores.double(), dim=-1)
        scores[:, self.pad_id] = torch.logaddexp(scores[:, self.pad_id], scores[:, self.eos_id])
        scores[:, self.eos_id] = -math.inf
        return scores

    def log_probs(self, src: Tensor, prefix: Tensor) -> Tensor:
        """The wrapped ``log_probs`` (a whole prefix scored), the end symbol forbidden after the start symbol."""
        out = self.decoder.log_probs(src, prefix)
        return self._forbid(out) if prefix.size(1) == 1 else out

    def decode_step(self, state: Any, tokens: Tensor) -> tuple[Tensor, Any]:
        inner, t = state
        scores, inner = self.decoder.decode_step(inner, tokens)
        return (self._forbid(scores) if t == 0 else scores), (inner, t + 1)

    def reorder_state(self, state: Any, indices: Tensor) -> Any:
        return self.decoder.reorder_state(state[0], indices), state[1]


def _eos_forbidden_first(scores: Scores, src: Tensor, **kw: Any) -> list[list[int]]:
    hyp = beam_search(EosForbiddenFirst(scores, kw["eos_id"]), src, pad_id=scores.pad_id, **kw)
    return rows_of(hyp.tokens, scores.pad_id)


BEAM_VARIANTS: dict[str, Variant] = {
    "no-penalty": Variant("no length penalty (alpha ignored: summed log-probabilities ranked as they are)",
                          _with_penalty(alpha=0.0)),
    "length-power": Variant("the penalty |Y|^alpha (fairseq, CTranslate2, OpenNMT 'avg') instead of GNMT's "
                            "((5 + |Y|) / 6)^alpha", _with_penalty(length_penalty=_power)),
    "eos-not-counted": Variant("GNMT's penalty with |Y| not counting the end symbol",
                               _with_penalty(length_penalty=_gnmt_without_eos)),
    "finished-in-beam": Variant("finished hypotheses kept in the K beam slots instead of aside: one pushed out by "
                                "live hypotheses is lost", finished_in_beam),
    "eos-forbidden-first": Variant("the end symbol forbidden at the first step (a minimum output length of 1): the "
                                   "one-token output [end] is never considered", _eos_forbidden_first),
}


# Two departures together (a toolkit's search often carries both), tried only once a check has failed and no single
# variant named the outputs: JoeyNMT's beam search keeps finished hypotheses in the slots and forbids the end symbol
# at the first step.
COMBINED_VARIANTS: dict[str, Variant] = {
    "finished-in-beam+eos-forbidden-first": Variant(
        "finished hypotheses kept in the K beam slots and the end symbol forbidden at the first step (JoeyNMT's "
        "search at min_output_length 1)",
        lambda scores, src, **kw: finished_in_beam(cast("Scores", EosForbiddenFirst(scores, kw["eos_id"])), src,
                                                   **kw)),
}


def output_form(got: list[list[int]], expected: list[list[int]], *, bos_id: int, pad_id: int) -> str:
    """The named departure of the output's form when ``got`` is ``expected`` with one symbol before every row (the
    rows as ``rows_of`` leaves them: right padding removed, a leading one kept), or ''."""
    if got == [[bos_id] + r for r in expected]:
        return "the expected outputs with the start symbol prepended (generate must return y_1 .. y_m only)"
    if got == [[pad_id] + r for r in expected]:
        return (f"the expected outputs with the padding id {pad_id} as the first token (a decoder start symbol that "
                "is the padding id kept in the output: generate must return y_1 .. y_m only, and padding only after "
                "the end)")
    return ""


def expected_beam(scores: Scores, src: Tensor, **kw: Any) -> list[list[int]]:
    """The reference beam search (tensor2tensor's, GNMT penalty) on the implementation's own scores."""
    return rows_of(beam_search(scores, src, pad_id=scores.pad_id, **kw).tokens, scores.pad_id)


def beam_variant_outputs(scores: Scores, src: Tensor, names: list[str], **kw: Any) -> dict[str, list[list[int]]]:
    return {name: BEAM_VARIANTS[name].run(scores, src, **kw) for name in names}


def greedy_rows(scores: Scores, src: Tensor, *, eos_id: int, max_len: int | Tensor | None,
                bos_id: int = PAPER.bos_id) -> list[list[int]]:
    """The argmax trajectory of the implementation's full forward, stopping at ``eos_id``."""
    hyp = greedy_search(scores, src, bos_id=bos_id, eos_id=eos_id, pad_id=scores.pad_id, max_len=max_len)
    return rows_of(hyp.tokens, scores.pad_id)


# -- incremental decoding: the schedule a step decoder is driven through, and cache variants ---------------------
@dataclass(frozen=True)
class Schedule:
    """How ``decode.incremental`` drives a step decoder.

    ``expand``: the rows after ``begin_decoding`` (as beam search expands sources to beams).
    ``tokens``: per step, the token fed to each row (``pad_id`` for a row that has finished); after a reorder to
    fewer rows, the first ``rows(t)`` columns (the others hold ``pad_id``).
    ``reorders``: step -> indices applied with ``reorder_state`` before that step's tokens.
    ``finishes``: row -> the step from which it is fed padding, having been fed the end symbol the step before
    (until a reorder replaces it, or to the end).
    """

    src: Tensor  # (B, S)
    expand: Tensor  # (N,) source of each row
    tokens: Tensor  # (steps, N)
    reorders: dict[int, Tensor]
    finishes: dict[int, int]

    def rows(self, t: int) -> int:
        """The rows fed at step ``t``: the size of the last reorder at or before it (the expansion's before any);
        ``tokens[t, :rows(t)]`` is what they are fed."""
        last = max((s for s in self.reorders if s <= t), default=None)
        return self.expand.numel() if last is None else self.reorders[last].numel()

    @property
    def judged(self) -> list[int]:
        """The steps whose scores are compared with the full forward: the first 16, the steps at and after each
        reorder and finish, the powers of two with the step before each (where a window or a restarted position
        count first shows), their midpoints up to EVENT_SPAN, and the last. Every step runs; judging each one costs
        a full forward per position, T^2 at a base model's max_len of 512. A cache that goes wrong stays wrong, so
        a later judged step shows what an unjudged one would; a failure is traced back to its first step
        (``first_differing``)."""
        n = self.tokens.size(0)
        events = {e + k for e in (*self.reorders, *self.finishes.values()) for k in (0, 1)}
        spaced = {p + q for k in range(4, n.bit_length() + 1) for p, q in ((2 ** k, -1), (2 ** k, 0))}
        spaced |= {3 * 2 ** (k - 1) for k in range(4, EVENT_SPAN.bit_length())}
        return sorted(t for t in {*range(16), *events, *spaced, n - 1} if 0 <= t < n)

    def describe(self, pad_id: int) -> str:
        """The calls the schedule makes, for a failure message."""
        reorders = "; ".join(f"before step {t}: {idx.tolist()}" for t, idx in self.reorders.items())
        finished = ", ".join(f"row {r} from step {t}" for r, t in self.finishes.items())
        return (f"begin_decoding(src {list(self.src.shape)}, real lengths {(self.src != pad_id).sum(1).tolist()}), "
                f"reorder_state to {self.expand.tolist()}, decode_step x {self.tokens.size(0)} (padding fed to "
                f"{finished}), reorder_state {reorders}")


STAYS = 1  # the schedule's row that finishes early and stays in the batch
EVENT_SPAN = 64  # the steps the reorders and finishes fall in: a quarter, a half... of at most this many


def incremental_schedule(config: ModelConfig, *, bos_id: int = PAPER.bos_id,
                         steps: int | None = None, seed: int = 22) -> Schedule:
    """Three right-padded sources (real lengths 6, 3, 1) expanded to two rows each, fed ``steps`` tokens
    (default ``config.max_len``: every position the model has, far past any window a cache might keep) from the
    start symbol, then ordinary tokens (no start or end symbol, no padding). Rows finish early as searches make
    them, fed the end symbol and then padding: row 3 at step 3 (then dropped), row 1 at the first quarter (fed
    padding to the end, as greedy search feeds a finished row), row 5 at two thirds (then dropped).
    Four reorders in the middle (before steps 4, a quarter, a half and three quarters in) draw each new row from
    the rows still going on, across sources, with repeats and drops, as beam search does; the row finished for
    good stays in place. Past EVENT_SPAN steps the events keep their places in the first EVENT_SPAN: the later
    steps feed long caches that every event has already shaped, on one row: at step EVENT_SPAN a reorder keeps one
    live row (as a search ends with one hypothesis going on), of a source with padding where one is live, so that
    the source mask stays under test; the hundreds of steps of a model's max_len then cost what one row costs (at
    base, vocabulary 37,000, 2 threads: 17.5 ms a step at 1 row, 26 ms at 3, 59 ms at 6)."""
    steps = config.max_len if steps is None else steps
    span = min(steps, EVENT_SPAN)
    src = decode_sources([6, 3, 1], seed=21, config=config)
    expand = torch.tensor([0, 0, 1, 1, 2, 2])
    n = expand.numel()
    g = torch.Generator().manual_seed(seed)
    ordinary = ordinary_ids(config, config.tgt_vocab)  # no start or end symbol, no padding
    tokens = ordinary[torch.randint(0, ordinary.numel(), (steps, n), generator=g)]
    tokens[0] = bos_id
    # a row fed padding from step t was fed the end symbol at step t - 1 (so none finishes before step 2)
    finishes = {r: t for r, t in ((3, 3), (STAYS, span // 4 - 2), (5, 2 * span // 3)) if 1 < t < steps}
    at = set()
    for t in (4, span // 4, span // 2 + 1, 3 * span // 4 + 2):
        while t in finishes.values() or t in at:  # no reorder at a finish: the row finishing is the one fed EOS
            t += 1
        if 0 < t < steps:
            at.add(t)
    reorders: dict[int, Tensor] = {}
    done = torch.zeros(n, dtype=torch.bool)  # the row's lineage has finished: it is fed padding
    row_src = expand.clone()  # the source each row continues
    for t in range(steps):
        if t in at:
            live = (~done).nonzero().flatten()
            idx = live[torch.randint(0, live.numel(), (n,), generator=g)]
            if done[STAYS]:  # finished for good: kept in place, fed padding to the end
                idx[STAYS] = STAYS
            reorders[t] = idx
        elif t == span:  # one row goes on, of a padded source where one is live
            live = (~done).nonzero().flatten()
            padded = live[(src[row_src[live]] == config.pad_id).any(dim=1)]
            reorders[t] = (padded if padded.numel() else live)[:1]
        if t in reorders:
            done, row_src = done[reorders[t]], row_src[reorders[t]]
        width = done.numel()
        ends = torch.tensor([finishes.get(r) == t for r in range(width)])
        tokens[t - 1, :width][ends & ~done] = EOS_ID  # the end symbol, then padding: what a search feeds a finished row
        done |= ends
        tokens[t, :width][done] = config.pad_id
        tokens[t, width:] = config.pad_id  # no row is fed these
    return Schedule(src, expand, tokens, reorders, finishes)


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
        prefix = torch.cat([prefix, schedule.tokens[t, :schedule.rows(t), None]], dim=1)  # (N_t, t + 1)
        out.src_rows.append(src_rows)
        out.prefixes.append(prefix)
        out.active.append((prefix != pad_id).all(dim=1))
    return out


def drive(decoder: Any, schedule: Schedule, output: str, vocab: int,
          keep: Iterable[int] | None = None) -> dict[int, Tensor]:
    """Run ``decoder`` through every step of the schedule: the float64 log-probabilities [N, V] it returns at each
    step of ``keep`` (default: the judged steps, ``Schedule.judged``)."""
    judged = set(schedule.judged if keep is None else keep)
    what = "begin_decoding(src)"
    try:
        state = decoder.begin_decoding(schedule.src)
        what = "reorder_state(state, expand to beams)"
        state = decoder.reorder_state(state, schedule.expand)
        out: dict[int, Tensor] = {}
        for t in range(schedule.tokens.size(0)):
            if t in schedule.reorders:
                what = f"reorder_state(state, {schedule.reorders[t].tolist()}) before step {t}"
                state = decoder.reorder_state(state, schedule.reorders[t])
            rows = schedule.rows(t)
            what = f"decode_step(state, tokens [{rows}]) at step {t}"
            with torch.no_grad():
                result = decoder.decode_step(state, schedule.tokens[t, :rows])
            if not isinstance(result, tuple) or len(result) != 2:
                could_not_check(f"{what} returned {type(result).__name__}, expected a pair (scores, state)")
            scores, state = result
            expected = (rows, vocab)
            if not isinstance(scores, Tensor) or tuple(scores.shape) != expected or not scores.is_floating_point():
                shape = list(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
                could_not_check(f"{what} returned scores {shape}, expected a floating tensor {list(expected)} "
                                  "[rows, tgt_vocab]")
            if t in judged:
                out[t] = as_log_probs(scores, output)
    except (CheckTimeout, ImplementationError):
        raise
    except Exception as exc:
        could_not_check(f"{what} raised", exc)
    return out


class CacheVariant:
    """The reference's cached decoder (``reference.decoding``) with one named bug, run on the reference twin.

    Its state is (the reference's ``KVCache``, t): t counts the tokens fed, since a windowed cache holds fewer."""

    def __init__(self, twin: Any, knob: str, window: int = 0):
        self.model, self.knob, self.window = twin, knob, window
        self.pad_id = twin.config.pad_id

    def begin_decoding(self, src: Tensor) -> Any:
        from aiayn_conformance.reference.decoding import KVCache, LayerCache, init_cache

        cache = init_cache(self.model, src)
        if self.knob != "cross-from-embeddings":
            return cache, 0
        x = self.model.embed(src, self.model.src_embed)  # the encoder's input instead of its output
        layers = tuple(LayerCache(c.self_k, c.self_v, l.cross_attn.split_heads(l.cross_attn.k(x)),
                                  l.cross_attn.split_heads(l.cross_attn.v(x)))
                       for l, c in zip(self.model.decoder, cache.layers))
        return KVCache(layers, cache.src_mask), 0

    def decode_step(self, state: Any, tokens: Tensor) -> tuple[Tensor, Any]:
        from aiayn_conformance.reference.decoding import KVCache, LayerCache, _attend

        (cache, t), m = state, self.model
        start = {"positions-restart": 0, "positions-from-1": t + 1}.get(self.knob, t)
        y = m.embed(tokens[:, None], m.tgt_embed, start=start)
        layers = []
        for layer, c in zip(m.decoder, cache.layers):
            sa = layer.self_attn
            k_new, v_new = sa.split_heads(sa.k(y)), sa.split_heads(sa.v(y))
            k, v = torch.cat([c.self_k, k_new], dim=2), torch.cat([c.self_v, v_new], dim=2)
            if self.knob == "self-window":  # only the last `window` positions are kept (the new one included)
                k, v = k[:, :, -self.window:], v[:, :, -self.window:]
            if self.knob == "self-cache-dropped":
                y = layer.norm1(y + _attend(sa, y, k_new, v_new, None))
            else:
                y = layer.norm1(y + _attend(sa, y, k, v, None))
            src_mask = None if self.knob == "cross-unmasked" else cache.src_mask
            y = layer.norm2(y + _attend(layer.cross_attn, y, c.cross_k, c.cross_v, src_mask))
            y = layer.norm3(y + layer.ffn(y))
            layers.append(LayerCache(k, v, c.cross_k, c.cross_v))
        return m.generator(y[:, 0]), (KVCache(tuple(layers), cache.src_mask), t + 1)

    def reorder_state(self, state: Any, indices: Tensor) -> Any:
        from aiayn_conformance.reference.decoding import KVCache, LayerCache, reorder

        cache, t = state
        moved = reorder(cache, indices)
        if indices.numel() != cache.src_mask.size(0):  # the expansion to beams: everything moves
            return moved, t
        if self.knob == "cross-not-reordered":
            return KVCache(tuple(LayerCache(n.self_k, n.self_v, o.cross_k, o.cross_v)
                                 for n, o in zip(moved.layers, cache.layers)), cache.src_mask), t
        if self.knob == "self-not-reordered":
            return KVCache(tuple(LayerCache(o.self_k, o.self_v, n.cross_k, n.cross_v)
                                 for n, o in zip(moved.layers, cache.layers)), moved.src_mask), t
        return moved, t


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
    "cross-unmasked": "cross-attention over the cached source keys with no padding mask (the step stops masking "
                      "the padded source positions that the full forward masks)",
    "self-window": "a self-attention cache that keeps only the last {window} positions (a sliding window: earlier "
                   "keys/values are dropped)",
}


# -- random score tables: any search against the reference on scores drawn at random -----------------------------
TABLE_VOCAB = 7  # pad 0, start 1, end 2 (S_PAD, S_BOS, S_EOS), tokens 3 .. 6
TABLE_TOKENS = (3, 4, 5, 6)


@functools.cache
def _table_mix(seed: int, src: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """A table's own mix of kinds (peaked, fork, ending, flat) and its horizon (0: none)."""
    table = random.Random(hash((seed, src)))
    mix = tuple(table.choice(m) for m in ((1, 4, 20), (0, 1, 3), (1, 2, 4), (0, 1, 4)))
    return mix, table.choice([0, 0, 2, 5, 10, 20, 40])


@functools.lru_cache(maxsize=1 << 17)
def _table_log_probs(seed: int, key: tuple[tuple[int, ...], tuple[int, ...]]) -> list[float]:
    """The log-probabilities table ``seed`` gives after the prefix ``key[1]`` for the source ``key[0]``
    (``RandomTables``). Ints and tuples hash the same in every run, so the tables are deterministic."""
    mix, depth = _table_mix(seed, key[0])
    t = len(key[1]) - 1  # output tokens so far
    if depth and t == 0:
        mix = (1, 6, 1, 2)  # a fork first: end at once, or go on
    elif depth:
        mix = (20, 0, 0, 1) if t < depth else (1, 1, 8, 0)
    rng = random.Random(hash((seed, key)))
    kind = rng.choices(("peaked", "fork", "ending", "flat"), mix)[0]
    w = [0.0] * TABLE_VOCAB
    for tok in TABLE_TOKENS:
        w[tok] = rng.uniform(0.0, 2.0) if kind in ("peaked", "fork") else rng.uniform(1.0, 4.0)
    if kind == "peaked":  # one token far more likely than the rest, the end symbol unlikely
        w[rng.choice(TABLE_TOKENS)] = rng.uniform(50.0, 800.0)
        w[S_EOS] = rng.choice([0.0, rng.uniform(0.0, 1.0)])
    elif kind == "fork":  # end now or go on: the end symbol and one token share most of the mass
        w[rng.choice(TABLE_TOKENS)] = rng.uniform(10.0, 30.0)
        w[S_EOS] = rng.uniform(15.0, 40.0)
    elif kind == "ending":  # the end symbol likely
        w[S_EOS] = rng.uniform(8.0, 200.0)
    else:  # flat
        w[S_EOS] = rng.choice([0.0, rng.uniform(0.0, 4.0)])
    if t < 3 and rng.random() < 0.5:  # a tie in the first steps: two tokens exactly as likely
        a, b = rng.sample((S_EOS, *TABLE_TOKENS), 2)
        w[b] = w[a]
    total = sum(w)
    return [math.log(x / total) if x > 0 else -math.inf for x in w]


class RandomTables(PrefixScores):
    """A step decoder whose next-token distribution is drawn at random for each (source, prefix): every source is
    its own score table. Probabilities are random weights normalized, two of them equal (a tie) at half the
    prefixes of up to 2 tokens; a prefix's distribution is peaked on one token (a hypothesis that stays likely
    for long), leans to the end symbol, forks (the end symbol and one token share most of the mass: end now, or
    go on and be judged by a larger length penalty later), or is flat, in proportions each table draws. Some
    tables have a horizon: a fork first, then peaked steps until a drawn depth (2 to 40 tokens), then likely ends,
    where continuing past a finished hypothesis pays off only to a search that bounds the live ones by
    lp(maximum length).

    Log-probabilities are float64; padding and the start symbol get none (-inf)."""

    def __init__(self, seed: int):
        self.seed = seed
        self.pad_id = S_PAD

    def log_probs(self, src: Tensor, prefix: Tensor) -> Tensor:
        """[N, V] float64 log-probabilities of the token after ``prefix`` [N, t] (start symbol first)."""
        rows = [_table_log_probs(self.seed, (tuple(s), tuple(p))) for s, p in zip(src.tolist(), prefix.tolist())]
        return torch.tensor(rows, dtype=torch.float64)


def table_sources(count: int, *, seed: int) -> Tensor:
    """``count`` distinct sources [count, 4] of tokens 3 .. 6: each picks its own random table."""
    rng = random.Random(seed)
    picks = rng.sample(range(len(TABLE_TOKENS) ** 4), count)
    return torch.tensor([[TABLE_TOKENS[(n >> (2 * i)) & 3] for i in range(4)] for n in picks])


@dataclass(frozen=True)
class TableCase:
    """One batch of random tables: the reference's outputs, and the rows no near tie decides (``judged``: the
    plain-Python search ``t2t_search`` meets no near tie at a cut and returns the reference's output)."""

    seed: int
    max_len: int
    src: Tensor
    expected: list[list[int]]
    judged: list[bool]


TABLE_SEARCH: dict[str, Any] = dict(bos_id=S_BOS, eos_id=S_EOS, beam_size=PAPER.beam_size, alpha=PAPER.alpha)
TABLE_BATCHES = ((101, 6), (102, 16), (103, 48), (104, 48))  # (seed, max_len): short and long horizons
TABLES_PER_BATCH = 40
NEAR_TIE = 1e-5  # scores closer than this at a cut count as tied: float32 sums may order them either way


@functools.lru_cache(maxsize=1)
def table_cases() -> tuple[TableCase, ...]:
    """The random-table witnesses of decode.beam: ``TABLE_BATCHES`` batches of ``TABLES_PER_BATCH`` tables."""
    cases = []
    for seed, max_len in TABLE_BATCHES:
        src, tables = table_sources(TABLES_PER_BATCH, seed=seed), RandomTables(seed)
        expected = expected_beam(tables, src, max_len=max_len, **TABLE_SEARCH)
        ties: list[bool] = []
        plain = t2t_search(tables, src, max_len=max_len, ties=ties, **TABLE_SEARCH)
        judged = [p == e and not t for p, e, t in zip(plain, expected, ties)]
        cases.append(TableCase(seed, max_len, src, expected, judged))
    return tuple(cases)


def t2t_search(scores: Scores, src: Tensor, *, bos_id: int, eos_id: int, beam_size: int,
               alpha: float, max_len: int | Tensor | None, bound: str = "max", candidates: int = 2,
               ties: list[bool] | None = None) -> list[list[int]]:
    """tensor2tensor's beam search, one source at a time in plain Python, with knobs that name departures: the
    early-stop ``bound`` divides the best live log-probability by lp(maximum length) ("max", §6.1's procedure) or by
    lp(current length) ("current": stops while a live hypothesis can still win); ``candidates`` x K candidates per
    step (2: K live hypotheses remain however many end; 1: only the K best may continue or finish). ``ties``, when
    given, receives per source whether two scores within NEAR_TIE met at a cut (the 2K candidates, the K live, the
    K finished, the early stop, the winner): there the output depends on how ties are broken."""
    limits = output_limits(src, scores.pad_id, max_len=max_len).tolist()

    def lp(n: int) -> float:
        return ((5.0 + n) / 6.0) ** alpha

    def cut(ranked: list[float], k: int) -> bool:
        return len(ranked) > k > 0 and ranked[k - 1] - ranked[k] < NEAR_TIE

    outputs = []
    for b in range(src.size(0)):
        alive: list[tuple[float, list[int]]] = [(0.0, [])]
        finished: list[tuple[float, list[int]]] = []  # (score, tokens)
        tied = False
        for i in range(limits[b]):
            prefixes = torch.tensor([[bos_id] + seq for _, seq in alive], dtype=torch.long)
            rows = scores.log_probs(src[b:b + 1].expand(len(alive), -1), prefixes).tolist()
            ranked = sorted(((lp0 + x, seq + [v]) for (lp0, seq), row in zip(alive, rows) for v, x in enumerate(row)
                             if v != scores.pad_id and x > -math.inf), key=lambda c: -c[0])
            cands = ranked[:candidates * beam_size]
            going = [c for c in cands if c[1][-1] != eos_id]
            alive = going[:beam_size]
            ended = [(c[0] / lp(i + 1), c[1]) for c in cands if c[1][-1] == eos_id]
            merged = sorted(finished + ended, key=lambda f: -f[0])
            finished = merged[:beam_size]
            tied |= (cut([c[0] for c in ranked], candidates * beam_size) or cut([c[0] for c in going], beam_size)
                     or cut([f[0] for f in merged], beam_size))
            if not alive:
                break
            divisor = lp(limits[b]) if bound == "max" else lp(i + 1)
            if finished:
                lowest, reach = min(f[0] for f in finished), alive[0][0] / divisor
                tied |= abs(lowest - reach) < NEAR_TIE
                if lowest > reach:
                    break
        tied |= cut([f[0] for f in finished], 1)
        outputs.append(finished[0][1] if finished else alive[0][1])
        if ties is not None:
            ties.append(tied)
    return outputs


TABLE_VARIANTS: dict[str, Variant] = {
    "early-stop-current-length": Variant("tensor2tensor's early stop with the best live log-probability divided by "
                                         "lp(current length) instead of lp(maximum length): it stops while a live "
                                         "hypothesis can still win", lambda s, src, **kw: t2t_search(
                                             s, src, bound="current", **kw)),
    "k-candidates": Variant("only the K best candidates of a step may continue or finish (tensor2tensor takes 2K, so "
                            "that K live hypotheses remain however many end)", lambda s, src, **kw: t2t_search(
                                s, src, candidates=1, **kw)),
    "finished-in-beam": BEAM_VARIANTS["finished-in-beam"],
    "no-penalty": BEAM_VARIANTS["no-penalty"],
    "length-power": BEAM_VARIANTS["length-power"],
}
