"""decode.* (§3, §6.1): the cached decoder, greedy search, beam search with GNMT's length penalty, and the
default maximum output length, each checked through the adapter's optional decoding methods
(``spec.contract``); an adapter without them skips with the reason naming the missing method.

The searches are judged against the reference searches (``reference.decoding``) driven by the
implementation's *own* full forward on each prefix (``conformance.helpers.decoding.ForwardScores``), with the
weights it holds: a forward-pass bug belongs to the forward-pass clauses, and a decoding bug shows here
even in an implementation whose forward differs from the reference's. An adapter that loads canonical
weights holds the visible weights with embeddings (hence, tied, the logits) three times larger: sharp
distributions, under which one more likely token costs less than the length penalty gives back, so
α = 0 and α = 0.6 choose different outputs (witnesses are searched for at test time; a check without one
skips with the reason). Sharpened, the next token depends almost only on the last one, so one beam witness runs
on the weights unsharpened at §6.1's output length (longest source + 50), where a cache inside ``generate`` that
restarts positions, keeps a window or is left out of the reorder changes the outputs. The cached decoder is driven
through every position up to max_len. Every input is deterministic.

Components alone (``--component``, kinds ``length_penalty`` and ``search``): a length penalty against GNMT's
closed form and by the output the reference beam search chooses with it, a beam search by its outputs and its
default limit, both on scripted step decoders whose answers are worked out by hand (``ScriptedScores``), and a
beam search against the reference on 160 random score tables (``RandomTables``).
Composed into the reference (``reference+search=NAME``), a search is audited whole by the checks above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from aiayn_conformance.implementations import Component, Implementation
from aiayn_conformance.reference.decoding import beam_search, output_limits
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability
from aiayn_conformance.spec.schema import parameter_count
from aiayn_conformance.spec.tolerance import Comparison, compare

from .helpers import oracles, shapes
from .helpers.components import from_factory
from .helpers.decoding import (
    BEAM_VARIANTS,
    CACHE_VARIANTS,
    COMBINED_VARIANTS,
    NEVER_ENDING_SOURCES,
    NEVER_ENDS,
    PAPER,
    S_A,
    S_BOS,
    S_EOS,
    S_PAD,
    SCRIPTED_MAX_LEN,
    SCRIPTED_ROWS,
    SCRIPTED_SOURCES,
    TABLE_SEARCH,
    TABLE_VARIANTS,
    CacheVariant,
    ForwardScores,
    RandomTables,
    Replay,
    Schedule,
    ScriptedScores,
    TwinScores,
    TwinTree,
    beam_variant_outputs,
    call_generate,
    call_search,
    decode_sources,
    drive,
    expected_beam,
    greedy_rows,
    incremental_schedule,
    missing_step_methods,
    output_form,
    replay,
    rows_of,
    scripted_witnesses,
    table_cases,
)
from .helpers.harness import (
    CheckTimeout,
    ImplementationError,
    as_log_probs,
    build_model,
    could_not_check,
    held_weights,
    not_applicable,
    run_forward,
    violation,
)
from .helpers.inputs import random_tokens
from .helpers.outputs import log_probs, require_deterministic
from .helpers.settings import AuditSettings
from .helpers.settings import current as current_settings
from .helpers.transplant import STATE_SEED, load_into, reference_twin, transplanted, visible_state, visible_twin

BOS = PAPER.bos_id
GREEDY_MAX = 10  # output tokens in the greedy check (the default limit is decode.max-length's)
BEAM_MAX = 8  # output tokens in the beam checks
SHARPEN = 3.0
GENERATE = "generate(src, *, bos_id, eos_id, beam_size, alpha, max_len)"


def _sharpen(name: str, tensor: torch.Tensor) -> torch.Tensor:
    return tensor * SHARPEN if "embed" in name or name.startswith("generator") else tensor


@dataclass
class Subject:
    config: ModelConfig  # the decode checks' configuration: the audit's, with room for §6.1's output lengths
    model: Any
    twin: Any  # the reference holding the same weights, or None
    weights: str
    scores: ForwardScores | None = None
    fast: TwinScores | None = None  # the twin's cached decoder, where the model's forward is the twin's
    beam_witnesses: list[Witness] | None = None
    history: History | None = None

    @property
    def searched(self) -> ForwardScores:
        """The scores the expected searches run on: the twin's cache where it computes the model's function
        (every disagreement with generate is then judged again on the model's own forward), else that forward."""
        assert self.scores is not None
        return self.fast if self.fast is not None else self.scores


@dataclass
class History:
    """The model holding unsharpened weights, where the next token depends on the whole prefix, not mostly on the
    last token (the sharpened embeddings' regime): the witnesses of cache bugs inside ``generate``."""

    model: Any
    twin: Any  # the reference holding the same weights, or None
    weights: str
    scores: ForwardScores
    fast: TwinScores | None = None


def twin_scores(model: Any, impl: Implementation, twin: Any, cfg: ModelConfig) -> TwinScores | None:
    """The twin's cached decoder when the model's full forward computes the twin's function on a witness (three
    padded sources, targets of 12 tokens), else None."""
    if twin is None:
        return None
    src = decode_sources([6, 3, 1], seed=2, config=cfg)
    tgt = random_tokens(cfg, [12, 12, 12], 12, vocab=cfg.tgt_vocab, seed=3)
    tgt[:, 0] = BOS
    got = log_probs(model, impl, src, tgt, cfg)
    with torch.no_grad():
        want = torch.log_softmax(twin(src, tgt).double(), dim=-1)
    return TwinScores(twin, cfg) if compare(got, want, dtype=torch.float32, scope="model").ok else None


@pytest.fixture(scope="module")
def decode_config(settings: AuditSettings) -> ModelConfig:
    """The audit configuration with max_len long enough for §6.1's limits (the longest witness source + 50)."""
    return settings.others["longer"]


@pytest.fixture(scope="module")
def model(impl: Implementation, decode_config: ModelConfig) -> Any:
    return build_model(impl, decode_config)


def subject(impl: Implementation, model: Any, cfg: ModelConfig) -> Subject:
    """The model ready for the decode checks (transplanted once, when it can load canonical weights).

    Decoding feeds the model every target length from 1 to the output limit, batches of several sources and
    source lengths of their own: a model that rejects some shapes (model.shape) skips, naming the gate."""
    contract = shapes.current()
    if contract is not None and not contract.complete:
        pytest.skip(contract.need("decoding runs the forward at every target length from 1 to the output limit, "
                                  "on batches of several sources"))
    subjects = current_settings().cache("decode-subjects")  # keyed by id(model): each entry holds its model
    key = id(model)
    if key not in subjects:
        if has_capability(model, "load_reference_state"):
            state = visible_state(cfg, seed=STATE_SEED, adjust=_sharpen)
            load_into(model, state, impl.name)
            model.eval()
            subjects[key] = Subject(cfg, model, reference_twin(cfg, state),
                                    f"visible weights (seed {STATE_SEED}) with the embeddings x{SHARPEN:g}")
        else:
            held = held_weights(impl, cfg)
            subjects[key] = Subject(cfg, model, None, f"the weights given with --weights ({held})" if held
                                    else "its own initialization (seed 0)")
    subj: Subject = subjects[key]
    src = decode_sources([4, 2], seed=1, config=cfg)
    require_deterministic(model, src, torch.full((2, 3), BOS), cfg)
    if subj.scores is None:
        subj.scores = ForwardScores(model, impl.output, cfg)
        subj.fast = twin_scores(model, impl, subj.twin, cfg)
    return subj


def history(impl: Implementation, subj: Subject) -> History:
    """The subject's unsharpened counterpart: a second model holding the visible weights as they are, when it loads
    canonical weights; the model itself otherwise (its own initialization is not sharpened)."""
    if subj.history is None:
        if subj.twin is None:
            subj.history = History(subj.model, None, subj.weights, ForwardScores(subj.model, impl.output, subj.config))
        else:  # the transplanted model and twin the other checks share (a base model takes seconds to build)
            unsharp, twin = transplanted(impl, subj.config), visible_twin(subj.config)
            subj.history = History(unsharp, twin, f"visible weights (seed {STATE_SEED}), not sharpened",
                                   ForwardScores(unsharp, impl.output, subj.config),
                                   twin_scores(unsharp, impl, twin, subj.config))
    return subj.history


def needs_generate(impl: Implementation, model: Any) -> None:
    if not has_capability(model, "generate"):
        not_applicable(f"{impl.name} has no {GENERATE} (spec.contract): no search of its own to check")


# -- decode.incremental ----------------------------------------------------------------------------------------
@pytest.mark.clause("decode.incremental")
def test_cached_steps_equal_the_full_forward(impl: Implementation, model: Any, decode_config: ModelConfig) -> None:
    """Every step of the step-level decoder equals the full forward on the same prefix, at every position the
    model has (max_len steps, far past any window a cache might keep): three padded sources expanded to beams,
    rows finished early (fed padding), reorders across sources in the middle."""
    missing = missing_step_methods(model)
    if missing:
        not_applicable(f"{impl.name} has no {', '.join(missing)} (spec.contract step-level decoding): no "
                       "incremental decoder to check")
    cfg = decode_config
    subj = subject(impl, model, cfg)
    schedule = incremental_schedule(cfg)
    rep = replay(schedule, cfg.pad_id)
    got = drive(model, schedule, impl.output, cfg.tgt_vocab)
    readings = _forward_readings(impl, model, cfg, rep, list(got))
    agreed = -1
    for t, scores in got.items():
        cmp = compare(scores[rep.active[t]], readings[t], dtype=torch.float32, scope="model")
        if not cmp.ok:  # read in a longer prefix's forward: judged again on its own prefix before anything is said
            cmp = _step_against_forward(impl, model, cfg, rep, t, scores)
        if cmp.ok:
            agreed = t
            continue
        traced = ""
        if t - agreed > 1:  # steps between the last agreeing judged step and this one were not judged
            failed = t
            t, scores, cmp = _first_differing(impl, model, cfg, schedule, rep, agreed, failed, (scores, cmp))
            traced = f" (the first, found by bisection between the judged steps {agreed} and {failed})"
            got = {**{s: x for s, x in got.items() if s < t}, t: scores}
        active = rep.active[t]
        row = int(active.nonzero()[cmp.index[0]]) if cmp.index else 0
        named = _cache_variant(subj, schedule, got, rep, first=t)
        violation(measured=f"at step {t}{traced} (prefix length {t + 1}), row {row}: the cached decoder's "
                  f"next-token log-probabilities differ from the full forward's: {cmp.describe()}; the judged steps "
                  f"before it agreed ({', '.join(map(str, [s for s in got if s < t])) or 'none'})"
                  + (f"; the cached decoder matches the reference with {named}" if named else ""),
                  expected="decode_step(state, tokens)[0] == forward(src, prefix)[:, -1] at every step, the new "
                           "token at position t (the prefix length)",
                  call=f"{schedule.describe(cfg.pad_id)}; held {subj.weights}",
                  hint="positions restarted at 0 for each new token, a cross- or self-attention cache computed "
                       "from the wrong memory or not reordered with the beams, a self-attention cache not appended "
                       "or cut to a window of recent positions")


def _forward_readings(impl: Implementation, model: Any, cfg: ModelConfig, rep: Replay,
                      steps: list[int]) -> dict[int, torch.Tensor]:
    """The full forward's float64 next-token log-probabilities [real rows, V] at each of ``steps``, read from as few
    forwards as the schedule allows: a row's prefix at a step begins the prefix its lineage has at a later step, so
    each prefix is read at its last position inside the longest prefix it begins (fed with the same source), and
    the forwards run once per such carrier (a base model's max_len steps: about the cost of the last step alone).

    That reading is forward(src, prefix)[:, -1] for a model whose output at a position reads no later target
    token (mask.causal); the caller judges a step that differs from it again on the step's own prefix."""
    carriers: list[tuple[torch.Tensor, torch.Tensor]] = []  # (source row (S,), prefix (L,))
    where: dict[tuple[int, int], int] = {}  # (step, row) -> carrier
    for t in sorted(steps, reverse=True):  # the longest prefixes first: every shorter one finds its carrier
        for r in rep.active[t].nonzero().flatten().tolist():
            src, prefix = rep.src_rows[t][r], rep.prefixes[t][r]
            found = next((i for i, (s, p) in enumerate(carriers)
                          if torch.equal(s, src) and torch.equal(p[:prefix.numel()], prefix)), None)
            if found is None:
                found = len(carriers)
                carriers.append((src, prefix))
            where[(t, r)] = found
    read: dict[tuple[int, int], torch.Tensor] = {}
    for length in sorted({p.numel() for _, p in carriers}):
        group = [i for i, (_, p) in enumerate(carriers) if p.numel() == length]
        src = torch.stack([carriers[i][0] for i in group])  # (C, S)
        tgt = torch.stack([carriers[i][1] for i in group])  # (C, L)
        out = run_forward(model, src, tgt, vocab=cfg.tgt_vocab, pad_id=cfg.pad_id)  # (C, L, V)
        row_of = {i: k for k, i in enumerate(group)}  # carrier -> its row of this forward
        for (t, r), i in where.items():
            if i in row_of:
                read[(t, r)] = out[row_of[i], t].clone()  # (V,)
        del out
    return {t: as_log_probs(torch.stack([read[(t, r)] for r in rep.active[t].nonzero().flatten().tolist()]),
                            impl.output) for t in steps}


def _step_against_forward(impl: Implementation, model: Any, cfg: ModelConfig, rep: Replay, t: int,
                          scores: torch.Tensor) -> Comparison:
    """The cached decoder's scores at step ``t`` against the full forward on each real row's prefix (the rows fed
    padding are left out, and the forward's last position alone is read)."""
    active = rep.active[t]
    full = log_probs(model, impl, rep.src_rows[t][active], rep.prefixes[t][active], cfg, last=True)[:, -1]
    return compare(scores[active], full, dtype=torch.float32, scope="model")


def _first_differing(impl: Implementation, model: Any, cfg: ModelConfig, schedule: Schedule, rep: Replay,
                     agreed: int, failed: int, at_failed: tuple[torch.Tensor, Comparison]
                     ) -> tuple[int, torch.Tensor, Comparison]:
    """The first step after ``agreed`` where the cached decoder differs, by bisection up to ``failed`` (a cache
    gone wrong stays wrong): the step, its scores and the comparison."""
    got = drive(model, schedule, impl.output, cfg.tgt_vocab, keep=range(agreed + 1, failed))
    lo, hi, best = agreed, failed, at_failed
    while hi - lo > 1:
        mid = (lo + hi) // 2
        cmp = _step_against_forward(impl, model, cfg, rep, mid, got[mid])
        if cmp.ok:
            lo = mid
        else:
            hi, best = mid, (got[mid], cmp)
    return hi, *best


def _cache_variant(subj: Subject, schedule: Schedule, got: dict[int, torch.Tensor], rep: Replay, first: int) -> str:
    """The named cache bug whose outputs the implementation reproduces (on the reference twin), or ''. A window
    is tried at the size the first differing step implies (steps 0 .. first - 1 agreed)."""
    if subj.twin is None:
        return ""
    for knob, what in CACHE_VARIANTS.items():
        theirs = drive(CacheVariant(subj.twin, knob, window=first), schedule, "logits", subj.config.tgt_vocab,
                       keep=got)
        if all(compare(got[t][rep.active[t]], theirs[t][rep.active[t]], dtype=torch.float32, scope="model").ok
               for t in got):
            return what.format(window=first)
    return ""


MAX_END_SYMBOLS = 64  # end symbols a witness search tries: every token of a small vocabulary


def end_symbol_candidates(scores: ForwardScores, src: torch.Tensor) -> list[int]:
    """The tokens a witness search tries as the end symbol, in token order: every token but padding and the start
    symbol when the vocabulary is small; in a large one (37,000 in the paper), the MAX_END_SYMBOLS most likely at the
    first step of any source (a token no hypothesis ever chooses cannot end one)."""
    cfg = scores.config
    tokens = [t for t in range(cfg.tgt_vocab) if t not in (cfg.pad_id, BOS)]
    if len(tokens) <= MAX_END_SYMBOLS:
        return tokens
    first = scores.log_probs(src, torch.full((src.size(0), 1), BOS)).clone()  # (B, V)
    first[:, [cfg.pad_id, BOS]] = float("-inf")
    return sorted(first.max(dim=0).values.topk(MAX_END_SYMBOLS).indices.tolist())


# -- decode.greedy -------------------------------------------------------------------------------------------------
GREEDY_POOL = [6, 5, 4, 3, 2, 1] * 3  # candidate sources; greedy trajectories of random models mostly repeat a token


GreedyWitness = tuple[int, list[int], list[list[int]]]  # end symbol, rows of GREEDY_POOL, their free trajectories


def greedy_witness(scores: ForwardScores, max_len: int = GREEDY_MAX) -> GreedyWitness | None:
    """(end symbol, rows of the pool, their trajectories with no end symbol) such that under that symbol rows
    finish at different steps (preferably some after >= 2 tokens) while others go on: the witness of
    stopping at EOS while the batch goes on. None when no symbol gives two different finishing steps."""
    cfg = scores.config
    pool = decode_sources(GREEDY_POOL, seed=31, config=cfg)
    free = greedy_rows(scores, pool, eos_id=-1, max_len=max_len)
    best: tuple[int, tuple[int, int], list[int]] | None = None
    for eos in sorted({t for row in free for t in row} - {cfg.pad_id, BOS}):  # a token no trajectory holds ends none
        ends = [row.index(eos) if eos in row else None for row in free]
        late: dict[int, int] = {}
        for b, e in enumerate(ends):
            if e is not None and 1 <= e < max_len - 1:
                late.setdefault(e, b)
        rows = sorted(late.values())[:3]
        rows += [b for b, e in enumerate(ends) if e is None][:1] + [b for b, e in enumerate(ends) if e == 0][:1]
        rank = (len(late), len({ends[b] for b in rows}))  # rows finishing late first, then variety
        if rank[1] >= 2 and (best is None or rank > best[1]):
            best = (eos, rank, sorted(rows))
    if best is None:
        return None
    return best[0], best[2], [free[b] for b in best[2]]


@pytest.mark.clause("decode.greedy")
def test_greedy_is_the_argmax_trajectory(impl: Implementation, model: Any, decode_config: ModelConfig) -> None:
    """generate(beam_size=1) emits the argmax of the full forward at every step, stops each row at its end
    symbol and keeps a finished row finished (padding) while the others go on."""
    needs_generate(impl, model)
    subj = subject(impl, model, decode_config)
    assert subj.scores is not None
    witness = greedy_witness(subj.searched)
    if witness is None and subj.twin is not None:  # every trajectory repeats one token (the start symbol, or
        # another: measured at d_model 64, h 8, d_ff 256 and many other widths): judged on other weights, the start
        # symbol's row quieted, a few seeds on
        cfg = subj.config
        quiet = build_model(impl, cfg)  # one model, each seed's state loaded into it in turn
        for seed in range(STATE_SEED, STATE_SEED + QUIET_SEEDS):
            state = visible_state(cfg, seed=seed, adjust=_quiet_start)
            load_into(quiet, state, impl.name)
            quiet.eval()
            exact = ForwardScores(quiet, impl.output, cfg)
            twin = reference_twin(cfg, state)
            fast = twin_scores(quiet, impl, twin, cfg)
            searched = fast if fast is not None else exact
            witness = greedy_witness(searched)
            if witness is not None:
                check_greedy(impl, quiet, searched, f"visible weights (seed {seed}) with the embeddings "
                             f"x{SHARPEN:g} and the start symbol's row x{QUIET_START:g}", witness, exact=exact,
                             twin=twin)
                return
        pytest.skip(f"no end symbol makes the greedy trajectories of {impl.name} finish at different steps on "
                    f"{len(GREEDY_POOL)} sources, with {subj.weights} nor with the start symbol's row quieted at "
                    f"seeds {STATE_SEED}..{STATE_SEED + QUIET_SEEDS - 1}: no witness of early stopping")
    check_greedy(impl, model, subj.searched, subj.weights, witness, exact=subj.scores, twin=subj.twin)


@pytest.mark.clause("decode.greedy")
def test_greedy_follows_the_whole_prefix(impl: Implementation, model: Any, decode_config: ModelConfig) -> None:
    """generate(beam_size=1) on unsharpened weights (the next token depends on the whole prefix) at §6.1's output
    length (longest source + 50) emits the argmax trajectory of the model's own full forward: a cache inside
    generate that restarts positions or keeps a window emits other tokens. On the sharpened weights of the other
    greedy witness the last token decides the next one, and such a cache can leave every output unchanged."""
    needs_generate(impl, model)
    hist = history(impl, subject(impl, model, decode_config))
    src = history_sources(decode_config)
    eos = long_end_symbol(hist.scores, src)
    out, call = call_generate(hist.model, src, eos_id=eos, beam_size=1, alpha=PAPER.alpha, max_len=HISTORY_LIMIT,
                              config=decode_config)
    got = rows_of(out, decode_config.pad_id)

    def departures(scores: ForwardScores) -> tuple[list[list[int]], list[int | None], list[int]]:
        expected = greedy_rows(scores, src, eos_id=eos, max_len=HISTORY_LIMIT)
        if got == expected:  # the near ties are read only where rows differ (a full forward per prefix: T^2)
            return expected, [None] * len(expected), []
        ties = untied_lengths(scores, src, expected)
        return expected, ties, departing_rows(got, expected, ties)

    if hist.fast is not None and not departures(hist.fast)[2]:
        return  # the argmax trajectories of the twin's cache, which computes the model's function
    expected, ties, bad = departures(hist.scores)
    if not bad:
        return
    b = bad[0]
    first = first_difference(got[b], expected[b])
    form = output_form(got, expected, bos_id=BOS, pad_id=decode_config.pad_id)
    cache = "" if form else _history_variant(hist.twin, src, got, first, bos_id=BOS, eos_id=eos,
                                             max_len=HISTORY_LIMIT)
    named = form or (f"a cache with {cache}" if cache else "")
    violation(measured=f"row {b}: generated {got[b]}, the argmax trajectory of the full forward is {expected[b]} "
              f"(first difference at output position {first})" + (f"; the output matches {named}" if named else ""),
              expected=f"at each step the token of highest log-probability (padding excluded) under forward(src, "
                       f"prefix), stopping at eos_id={eos} or after {HISTORY_LIMIT} tokens; lengths of all rows: "
                       f"{[len(r) for r in expected]}"
              + (f" (near ties, judged before them only: {ties})" if any(n is not None for n in ties) else ""),
              call=f"{call}; held {hist.weights}; end symbol {eos}: the least likely at the first step",
              hint="a cache inside generate that restarts positions or keeps only recent positions (a window); "
                   "decode.incremental judges a step-level decoder's cache")


QUIET_SEEDS = 4  # the seeds of the visible weights a greedy witness search tries when the subject's has none
QUIET_START = 0.1  # the start symbol's embedding (and pre-softmax) row, scaled


def _quiet_start(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The decode subject's sharpening, with the start symbol's row of the target embedding and the pre-softmax
    matrix scaled by QUIET_START: its logit no longer dominates (tied, the row it is fed by is the row it is read
    by), so trajectories leave it and an end symbol can be found."""
    tensor = _sharpen(name, tensor)
    if name in ("src_embed.weight", "tgt_embed.weight", "generator.weight"):
        tensor = tensor.clone()
        tensor[BOS] *= QUIET_START
    return tensor


def first_difference(got: list[int], expected: list[int]) -> int:
    """The first output position where two rows differ (the shorter one's length when one extends the other)."""
    return next((i for i, (x, y) in enumerate(zip(got, expected)) if x != y), min(len(got), len(expected)))


def departing_rows(got: list[list[int]], expected: list[list[int]], ties: list[int | None]) -> list[int]:
    """The rows of ``got`` that differ from ``expected``, a row with a near tie (``untied_lengths``) compared
    before it only."""
    return [b for b, (g, e, n) in enumerate(zip(got, expected, ties)) if (g != e if n is None else g[:n] != e[:n])]


def untied_lengths(scores: ForwardScores, src: torch.Tensor, rows: list[list[int]]) -> list[int | None]:
    """Per row, the first output position whose token won by less than NEAR_TIE over the runner-up (a correct
    cache's rounding may choose the other one), or None when every token won clearly."""
    out: list[int | None] = []
    for b, row in enumerate(rows):
        prefix = torch.tensor([[BOS] + row])
        steps = torch.stack([scores.log_probs(src[b:b + 1], prefix[:, :t + 1])[0] for t in range(len(row))])
        steps[:, scores.config.pad_id] = float("-inf")
        top2 = steps.topk(2, dim=1).values
        tied = ((top2[:, 0] - top2[:, 1]) < NEAR_TIE).nonzero()
        out.append(int(tied[0]) if len(tied) else None)
    return out


def check_greedy(impl: Implementation, model: Any, scores: ForwardScores, weights: str,
                 witness: GreedyWitness | None, exact: ForwardScores | None = None, twin: Any = None) -> None:
    """The greedy ``witness`` (``greedy_witness(scores)``) on ``scores`` (the model's own full forward, or the
    twin's cache where it computes the same function: then a disagreement is judged again on ``exact``, the model's
    own forward, with its own witness): generate's outputs must be the argmax trajectories, judged up to a near tie
    (rows with one are compared before it only). A departure is named from ``twin`` (the reference holding the
    model's weights) where one of its cache bugs reproduces the outputs."""
    if witness is None:
        pytest.skip(f"no end symbol makes the greedy trajectories of {impl.name} ({weights}) finish at "
                    f"different steps on {len(GREEDY_POOL)} sources: no witness of early stopping")
    eos, rows, free = witness
    cfg = scores.config
    src = decode_sources(GREEDY_POOL, seed=31, config=cfg)[rows]
    expected = greedy_rows(scores, src, eos_id=eos, max_len=GREEDY_MAX)
    out, call = call_generate(model, src, eos_id=eos, beam_size=1, alpha=PAPER.alpha, max_len=GREEDY_MAX,
                              config=cfg)
    got = rows_of(out, cfg.pad_id)
    ties = untied_lengths(scores, src, expected)
    bad = departing_rows(got, expected, ties)
    if not bad:
        return
    if exact is not None and exact is not scores:
        return check_greedy(impl, model, exact, weights, greedy_witness(exact), twin=twin)
    b = bad[0]
    first = first_difference(got[b], expected[b])
    stop = min((r.index(eos) for r in expected if eos in r), default=GREEDY_MAX)
    form = output_form(got, expected, bos_id=BOS, pad_id=cfg.pad_id)
    if form:
        named = form
    elif got in (free, unfrozen(free, eos)):
        named = _after_the_end(model, src, got, free, eos, cfg)
    elif any(eos in row[:-1] for row in got):
        named = "a row that goes on after its end symbol (finished rows must stay finished: padding only)"
    elif any(len(row) > GREEDY_MAX for row in got):
        named = f"outputs longer than max_len={GREEDY_MAX}"
    elif cfg.pad_id in sum(got, []):
        named = "the padding id generated as a token (it is never generated)"
    elif got == [r[:stop + 1] for r in free]:
        named = "every row stopped when the first row emitted its end symbol (the batch stops together)"
    else:
        named = _history_variant(twin, src, got, first, bos_id=BOS, eos_id=eos, max_len=GREEDY_MAX)
        named = f"a cache with {named}" if named else ""
    violation(measured=f"row {b}: generated {got[b]}, the argmax trajectory of the full forward is "
              f"{expected[b]} (first difference at output position {first})"
              + (f"; the output matches {named}" if named else ""),
              expected=f"at each step the token of highest log-probability (padding excluded) under forward(src, "
                       f"prefix), stopping at eos_id={eos} or after max_len tokens; all rows: {expected}"
              + (f" (near ties, judged before them only: {ties})" if any(n is not None for n in ties) else ""),
              call=f"{call}; held {weights}",
              hint="a cached decoder that disagrees with the full forward (see decode.incremental), no stop at the "
                   "end symbol, or finished rows fed back into the search")


NO_STOP = "the argmax trajectories with no stop at the end symbol: rows keep growing after EOS up to max_len"
NOT_FROZEN = ("finished rows not frozen: a row that emitted its end symbol goes on emitting its argmax tokens until "
              "every row of the batch has ended (after its end symbol a row must only be padded, its feed being "
              "ignored)")


def unfrozen(free: list[list[int]], eos: int) -> list[list[int]]:
    """The greedy outputs of a batch whose finished rows are not frozen: each row's trajectory ``free`` (no end
    symbol) cut where the batch stops, after the last row's first end symbol (at max_len if a row never ends)."""
    ends = [row.index(eos) for row in free if eos in row]
    if len(ends) < len(free):
        return free
    return [row[:max(ends) + 1] for row in free]


def _after_the_end(model: Any, src: torch.Tensor, got: list[list[int]], free: list[list[int]], eos: int,
                   cfg: ModelConfig) -> str:
    """Which departure makes rows go on after their end symbol: no stop at the end symbol at all, or finished rows
    not frozen (the batch stops when every row has ended). Where a row of the witness never ends the two give the
    same outputs: generate runs again on the rows that end, which tells them apart."""
    if unfrozen(free, eos) != free:
        return NOT_FROZEN if got == unfrozen(free, eos) else NO_STOP
    ending = [b for b, row in enumerate(free) if eos in row]
    if not ending:
        return NO_STOP
    out, _ = call_generate(model, src[ending], eos_id=eos, beam_size=1, alpha=PAPER.alpha, max_len=GREEDY_MAX,
                           config=cfg)
    again, subset = rows_of(out, cfg.pad_id), [free[b] for b in ending]
    if again == unfrozen(subset, eos) != subset:
        return NOT_FROZEN + f" (rows {ending} alone stop when the last of them ends)"
    if again == subset:
        return NO_STOP + f" (rows {ending}, which all end, still run to max_len alone)"
    return "a row that goes on after its end symbol (finished rows must stay finished: padding only)"


HISTORY_SOURCES = [6, 5, 4, 3, 2, 1]  # §6.1's limits: 56 .. 51 output tokens
HISTORY_LIMIT = max(HISTORY_SOURCES) + 50  # one int for the batch (the per-source default is decode.max-length's)
NEAR_TIE = 1e-4  # log-probability gap under which two tokens count as tied (a cache's rounding may swap them)


# Every output of this witness is scored by the model's own full forward on each prefix (T^2 in the output length):
# above this many parameters (a base model's forward takes tens of milliseconds) it decodes every other source.
HISTORY_FULL_SIZE = 5_000_000


def history_sources(cfg: ModelConfig) -> torch.Tensor:
    """The witness sources: §6.1's longest limit (56) stays, so a cache's long-horizon bugs still show."""
    src = decode_sources(HISTORY_SOURCES, seed=51, config=cfg)
    return src if parameter_count(cfg) <= HISTORY_FULL_SIZE else src[::2]


def _history_variant(twin: Any, src: torch.Tensor, got: list[list[int]], first: int, **kw: Any) -> str:
    """The named cache bug (on the reference ``twin`` holding the weights generate ran with) whose greedy or beam
    outputs ``generate`` reproduces, or ''. Windows are tried at the first differing output position and at the
    powers of two up to 32 (a beam can change an early token for a difference scored later)."""
    if twin is None:
        return ""
    search = greedy_rows if kw.get("beam_size", 1) == 1 else expected_beam
    windows = sorted({max(first, 1), *(2 ** i for i in range(6))})
    for knob, what in CACHE_VARIANTS.items():
        for w in (windows if knob == "self-window" else [0]):
            variant = CacheVariant(twin, knob, window=w)
            opts = {k: v for k, v in kw.items() if k != "beam_size" or search is expected_beam}
            if search(variant, src, **opts) == got:  # type: ignore[arg-type]  # a step decoder with pad_id
                return what.format(window=w)
    return ""


# -- decode.beam -----------------------------------------------------------------------------------------------
BEAM_SOURCES = [6, 5, 4, 3, 2, 1]
PENALTY_VARIANTS = ["no-penalty", "length-power", "eos-not-counted"]


@dataclass
class Witness:
    eos: int
    expected: list[list[int]]
    variants: dict[str, list[list[int]]]
    rows: dict[str, list[int]]  # variant -> the rows where it differs from the expected output


BEAM_SEARCH = dict(bos_id=BOS, beam_size=PAPER.beam_size, alpha=PAPER.alpha, max_len=BEAM_MAX)


def witness_at(scores: ForwardScores, src: torch.Tensor, eos: int, names: list[str] | None = None) -> Witness:
    """§6.1's beam search and the named variants ``names`` (default: every one) on ``scores`` with end symbol
    ``eos``, and where they differ. A variant left out has no rows: it tells nothing apart here."""
    expected = expected_beam(scores, src, eos_id=eos, **BEAM_SEARCH)
    variants = beam_variant_outputs(scores, src, list(BEAM_VARIANTS) if names is None else names, eos_id=eos,
                                    **BEAM_SEARCH)
    rows = {name: [b for b, (x, e) in enumerate(zip(out, expected)) if x != e] for name, out in variants.items()}
    if "finished-in-beam" in rows:
        rows["finished-in-beam"] = [b for b in rows["finished-in-beam"] if expected[b][-1:] == [eos]]
    rows = {name: rows.get(name, []) for name in BEAM_VARIANTS}
    return Witness(eos, expected, variants, rows)


def beam_witnesses(impl: Implementation, subj: Subject) -> list[Witness]:
    """End symbols under which named beam-search variants choose other outputs than §6.1's search, on the
    implementation's own scores (searched once per implementation, in end-symbol order, until every variant
    is told apart or every symbol has been tried; each symbol runs only the variants not yet told apart, at a
    vocabulary of 37,000 a search of a few seconds each)."""
    if subj.beam_witnesses is not None:
        return subj.beam_witnesses
    cfg = subj.config
    src = decode_sources(BEAM_SOURCES, seed=5, config=cfg)
    scores = subj.searched if subj.fast is None else TwinTree(subj.fast.model, cfg)
    found: list[Witness] = []
    told: set[str] = set()
    for eos in end_symbol_candidates(scores, src):
        witness = witness_at(scores, src, eos, [name for name in BEAM_VARIANTS if name not in told])
        new = {name for name, r in witness.rows.items() if r} - told
        if new:
            found.append(witness)
            told |= new
        if told >= set(BEAM_VARIANTS):
            break
    subj.beam_witnesses = found
    return found


def check_beam(impl: Implementation, subj: Subject, witnesses: list[Witness], purpose: str) -> None:
    cfg = subj.config
    src = decode_sources(BEAM_SOURCES, seed=5, config=cfg)
    for w in witnesses:
        out, call = call_generate(subj.model, src, eos_id=w.eos, beam_size=PAPER.beam_size,
                                  alpha=PAPER.alpha, max_len=BEAM_MAX, config=cfg)
        got = rows_of(out, cfg.pad_id)
        if got == w.expected:
            continue
        if subj.fast is not None:  # searched on the twin's cache: judged on the model's own forward
            assert subj.scores is not None
            w = witness_at(subj.scores, src, w.eos)
            if got == w.expected:
                continue
        b = next(i for i, (g, e) in enumerate(zip(got, w.expected)) if g != e)
        searched = subj.searched if subj.fast is None or subj.scores is None else subj.scores
        rest = [n for n in BEAM_VARIANTS if n not in w.variants]  # left out while searching for witnesses
        variants = {**w.variants, **beam_variant_outputs(searched, src, rest, eos_id=w.eos, **BEAM_SEARCH)}
        named = [BEAM_VARIANTS[n].describe for n, o in variants.items() if o == got]
        form = output_form(got, w.expected, bos_id=BOS, pad_id=cfg.pad_id)
        named += [form] if form else []
        if not named:
            named = [v.describe for v in COMBINED_VARIANTS.values()
                     if v.run(searched, src, eos_id=w.eos, **BEAM_SEARCH) == got]
        witness_of = ", ".join(f"{n} (rows {r})" for n, r in w.rows.items() if r)
        violation(measured=f"row {b}: beam search returned {got[b]}, the §6.1 search on the "
                  f"implementation's own scores returns {w.expected[b]}"
                  + (f"; the outputs match {named[0]}" if named else "; no named variant reproduces them"),
                  expected=f"beam 4, summed log-probabilities divided by ((5 + |Y|) / 6)^0.6 (|Y| with the end "
                           f"symbol), finished hypotheses kept aside, tensor2tensor's early stop; all rows: "
                           f"{w.expected}",
                  call=f"{call}; held {subj.weights}; this end symbol is a witness of {purpose}: it tells apart "
                       f"{witness_of}",
                  hint="a length penalty of another form (|Y|^alpha, none, |Y| without EOS), finished hypotheses "
                       "not kept aside, the end symbol forbidden at the first step, a start or padding symbol left "
                       "at the head of the output, or a cache that disagrees with the forward (decode.incremental)")


@pytest.mark.clause("decode.beam")
def test_beam_length_penalty_witnesses(impl: Implementation, model: Any, decode_config: ModelConfig) -> None:
    """Beam 4, α = 0.6, on witnesses where no penalty (α = 0), |Y|^α, or |Y| counted without the end symbol
    would choose another output than GNMT's ((5 + |Y|) / 6)^α."""
    needs_generate(impl, model)
    subj = subject(impl, model, decode_config)
    witnesses = [w for w in beam_witnesses(impl, subj) if any(w.rows[n] for n in PENALTY_VARIANTS)]
    if not any(w.rows["no-penalty"] for w in witnesses):
        pytest.skip(f"no witness source where alpha = 0 and alpha = 0.6 choose different outputs on "
                    f"{impl.name}'s scores ({subj.weights}; {len(BEAM_SOURCES)} sources, every end symbol): "
                    "its distributions are too flat for the penalty to matter"
                    + ("" if subj.twin is not None else "; with load_reference_state the check loads sharper "
                       "weights"))
    check_beam(impl, subj, witnesses, "the length penalty's form")


@pytest.mark.clause("decode.beam")
def test_beam_early_finished_hypothesis_wins(impl: Implementation, model: Any, decode_config: ModelConfig) -> None:
    """A hypothesis that ended with EOS while live ones went on must still win when its score is best: the
    finished set is kept aside, not left to compete for the K beam slots."""
    needs_generate(impl, model)
    subj = subject(impl, model, decode_config)
    witnesses = [w for w in beam_witnesses(impl, subj) if w.rows["finished-in-beam"]]
    if not witnesses:
        pytest.skip(f"no witness source where a hypothesis pushed out of the beam after it finished must win, on "
                    f"{impl.name}'s scores ({subj.weights})")
    check_beam(impl, subj, witnesses[:1], "a finished hypothesis kept aside")


@pytest.mark.clause("decode.beam")
def test_beam_may_end_at_the_first_step(impl: Implementation, model: Any, decode_config: ModelConfig) -> None:
    """The end symbol competes from the first step: on a witness where §6.1's search returns the one-token output
    [end] for some source, forbidding it there (a minimum output length of 1) would choose another output."""
    needs_generate(impl, model)
    subj = subject(impl, model, decode_config)
    witnesses = [w for w in beam_witnesses(impl, subj) if w.rows["eos-forbidden-first"]]
    if not witnesses:
        pytest.skip(f"no witness source where §6.1's search ends at the first step, on {impl.name}'s scores "
                    f"({subj.weights}; {len(BEAM_SOURCES)} sources, every end symbol tried)")
    check_beam(impl, subj, witnesses[:1], "the end symbol allowed at the first step")


def hypothesis_scores(scores: Any, src_row: torch.Tensor, tokens: list[int], alpha: float = PAPER.alpha,
                      bos_id: int = BOS) -> str:
    """'sum log p = .., lp(|Y|) = .., score = ..' of the output ``tokens`` under the step decoder ``scores``."""
    if not tokens:
        return "the empty output"
    prefix = torch.tensor([[bos_id] + tokens])
    logp = torch.stack([scores.log_probs(src_row[None], prefix[:, :t + 1])[0, tok] for t, tok in enumerate(tokens)])
    total = float(logp.sum())
    lp = ((5.0 + len(tokens)) / 6.0) ** alpha
    return f"sum log p = {total:.5f}, lp({len(tokens)}) = {lp:.4f}, score = {total / lp:.5f}"


def long_end_symbol(scores: ForwardScores, src: torch.Tensor) -> int:
    """The end symbol least likely at the first step on every source (its highest log-probability over the sources
    is the lowest): hypotheses live long, scored over the whole output, while some still finish."""
    first = scores.log_probs(src, torch.full((src.size(0), 1), BOS)).clone()
    first[:, [scores.config.pad_id, BOS]] = float("inf")
    return int(first.max(dim=0).values.argmin())


@pytest.mark.clause("decode.beam")
def test_beam_follows_the_whole_prefix(impl: Implementation, model: Any, decode_config: ModelConfig) -> None:
    """Beam 4, alpha 0.6 on unsharpened weights (the next token depends on more than the last one) at §6.1's output
    length (longest source + 50): hypotheses are ranked by log-probabilities summed over the whole output and
    reordered at every step, so a cache inside generate that restarts positions, keeps a window or is left out of
    the reorder chooses other outputs than the §6.1 search on the model's own full forward."""
    needs_generate(impl, model)
    hist = history(impl, subject(impl, model, decode_config))
    src = history_sources(decode_config)
    eos = long_end_symbol(hist.scores, src)
    kw = dict(bos_id=BOS, eos_id=eos, beam_size=PAPER.beam_size, alpha=PAPER.alpha, max_len=HISTORY_LIMIT)
    out, call = call_generate(hist.model, src, eos_id=eos, beam_size=PAPER.beam_size, alpha=PAPER.alpha,
                              max_len=HISTORY_LIMIT, config=decode_config)
    got = rows_of(out, decode_config.pad_id)
    if hist.fast is not None and got == expected_beam(hist.fast, src, **kw):
        return  # the §6.1 search on the twin's cache, which computes the model's function
    expected = expected_beam(hist.scores, src, **kw)
    if got == expected:
        return
    b = next(i for i, (g, e) in enumerate(zip(got, expected)) if g != e)
    first = first_difference(got[b], expected[b])
    named = [BEAM_VARIANTS[n].describe for n in BEAM_VARIANTS if BEAM_VARIANTS[n].run(hist.scores, src, **kw) == got]
    form = output_form(got, expected, bos_id=BOS, pad_id=decode_config.pad_id)
    cache = "" if form else _history_variant(hist.twin, src, got, first, **kw)
    named += [form] if form else []
    named += [f"a cache with {cache}"] if cache else []
    violation(measured=f"row {b}: beam search returned {got[b]} ({hypothesis_scores(hist.scores, src[b], got[b])}), "
              f"the §6.1 search on the implementation's own scores returns {expected[b]} "
              f"({hypothesis_scores(hist.scores, src[b], expected[b])}); first difference at output position {first}"
              + (f"; the outputs match {named[0]}" if named else "; no named variant reproduces them"),
              expected=f"beam 4, log-probabilities of the full forward summed over the whole output, divided by "
                       f"((5 + |Y|) / 6)^0.6, finished hypotheses kept aside, tensor2tensor's early stop; lengths of "
                       f"all rows: {[len(r) for r in expected]}",
              call=f"{call}; held {hist.weights}; end symbol {eos}: the least likely at the first step",
              hint="a cache inside generate that restarts positions, keeps only recent positions (a window) or is "
                   "left out of the beam reorder; or a search of another form (decode.beam's other witnesses)")


# -- decode.max-length -----------------------------------------------------------------------------------------
MAX_SOURCES = [6, 3, 1]  # padded width 6: the default limits are 56, 53 and 51


def _length_rule(lengths: dict[int, int], src: torch.Tensor, pad_id: int) -> str:
    real = (src != pad_id).sum(dim=1).tolist()
    width = src.size(1)
    rules = {
        "each source's real length + 50": lambda b: real[b] + 50,
        "the padded source width + 50 (the batch's length, not each sample's)": lambda b: width + 50,
        "each source's real length + 100 (tensor2tensor's extra_length default)": lambda b: real[b] + 100,
        "the padded source width + 100": lambda b: width + 100,
        "each source's real length + 49 (one short)": lambda b: real[b] + 49,
        "each source's real length + 51 (one over)": lambda b: real[b] + 51,
        "each source's real length (a length ratio of 1, nothing added)": lambda b: real[b],
    }
    for what, rule in rules.items():
        if all(n == rule(b) for b, n in lengths.items()):
            return what
    if len(set(lengths.values())) == 1:
        return f"a fixed length {next(iter(lengths.values()))} for every source"
    return ""


def _candidate_end_symbols(subj: Subject, src: torch.Tensor) -> list[int]:
    """Tokens in increasing order of their highest log-probability over every prefix seen so far (those
    least likely ever to be chosen first)."""
    assert subj.scores is not None
    if not subj.scores.memo:
        subj.scores.log_probs(src, torch.full((src.size(0), 1), BOS))
    table = torch.stack(list(subj.scores.memo.values()))  # (prefixes, V)
    table[:, [subj.config.pad_id, BOS]] = float("inf")
    return table.max(dim=0).values.argsort().tolist()[:3]


FORCED_MARGIN = 1.0  # nats: how far below the search's last candidate an end symbol must score to be ruled out


def _forced_ends(subj: Subject, src: torch.Tensor, got: list[list[int]], eos: int, beam_size: int) -> dict[int, str]:
    """The rows that end with the end symbol where the model's own scores rule it out: after the row's prefix its
    log-probability is more than FORCED_MARGIN below the token a search could last take there, so §6.1's search
    could not have chosen it: greedy takes the best token; a beam of K takes the 2K best extensions of all its
    hypotheses together (tensor2tensor's, fairseq's), and 2K extensions of this very prefix outscore it. The search
    ended such a row itself, at a limit. {row: its scores, in words}."""
    assert subj.scores is not None
    rank = 1 if beam_size == 1 else 2 * beam_size
    forced = {}
    for b, row in enumerate(got):
        if row[-1:] != [eos]:
            continue
        logp = subj.scores.log_probs(src[b:b + 1], torch.tensor([[BOS] + row[:-1]]))[0]  # (V,) after the prefix
        last = float(logp.topk(rank).values[-1])
        if float(logp[eos]) < last - FORCED_MARGIN:
            forced[b] = (f"row {b}'s end symbol at output position {len(row) - 1} has log p = {float(logp[eos]):.2f}, "
                         f"the {'best' if rank == 1 else f'{rank}th best'} token's {last:.2f}")
    return forced


def check_default_limit(impl: Implementation, subj: Subject, beam_size: int) -> None:
    """Rows whose output holds no end symbol must be exactly their source's real length + 50 long, and so must
    rows whose end symbol the model's own scores rule out (``_forced_ends``: the search put it there); rows that
    end with a symbol the search may have chosen must be no longer. A padding id at the head of a row is not
    counted (padding is never generated: decode.greedy and decode.beam name that form). The end symbol is one the
    model hardly ever chooses (up to three tried, until a source shorter than the batch's padded width runs to its
    limit or is ended where the model would not end it)."""
    pad = subj.config.pad_id
    src = decode_sources(MAX_SOURCES, seed=41, config=subj.config)
    limits = output_limits(src, pad).tolist()
    for eos in _candidate_end_symbols(subj, src):
        out, call = call_generate(subj.model, src, eos_id=eos, beam_size=beam_size, alpha=PAPER.alpha,
                                  max_len=None, config=subj.config)
        got = [r[1:] if r[:1] == [pad] else r for r in rows_of(out, pad)]  # a leading pad is no output token
        forced = _forced_ends(subj, src, got, eos, beam_size)
        cut = {b: len(r) for b, r in enumerate(got) if r[-1:] != [eos] or b in forced}  # rows the limit ended
        if any(limits[b] != src.size(1) + 50 for b in cut):
            break
    else:
        pytest.skip(f"every source shorter than the padded width emitted the end symbol where the model's scores "
                    f"allow it (tried the 3 tokens {impl.name} least often chooses, {subj.weights}): no witness of "
                    f"the limit")
    bad = {b: n for b, n in cut.items() if n != limits[b]}
    bad.update({b: len(r) for b, r in enumerate(got) if b not in cut and len(r) > limits[b]})
    if not bad:
        return
    rule = _length_rule(cut, src, pad)
    b = next(iter(bad))
    ended = f"; {forced[b]}: the search ended the row" if b in forced else ""
    violation(measured=f"row {b} (real source length {int((src[b] != pad).sum())}) has {bad[b]} output "
              f"tokens{ended}; lengths of the rows the limit ended: {cut}" + (f"; they match {rule}" if rule else ""),
              expected=f"max_len=None limits each output to its source's real (non-pad) length + 50 tokens, the "
                       f"end symbol included: {limits}",
              call=f"{call} (an end symbol {impl.name} hardly ever chooses; {subj.weights})",
              hint="the limit taken from the padded batch width, a fixed max_len or a ratio of the source length, "
                   "tensor2tensor's extra_length = 100, or an off-by-one counting the start or the end symbol")


@pytest.mark.clause("decode.max-length")
def test_default_max_length_greedy(impl: Implementation, model: Any, decode_config: ModelConfig) -> None:
    """Greedy search with no end symbol in sight stops at each source's real length + 50 (§6.1)."""
    needs_generate(impl, model)
    check_default_limit(impl, subject(impl, model, decode_config), beam_size=1)


@pytest.mark.clause("decode.max-length")
def test_default_max_length_beam(impl: Implementation, model: Any, decode_config: ModelConfig) -> None:
    """Beam search (beam 4, α = 0.6) with no end symbol in sight stops at each source's real length + 50."""
    needs_generate(impl, model)
    check_default_limit(impl, subject(impl, model, decode_config), beam_size=PAPER.beam_size)


# -- components alone: length penalties and beam searches (--component) -----------------------------------------
# No model: scripted step decoders (conformance.decoding.ScriptedScores) whose answers are worked out by hand, so
# that a length penalty or a search is judged on scores where the paper's choice is known and the usual departures
# choose otherwise. The same witnesses decide for both kinds, against the reference beam search and GNMT's penalty.
LP_LENGTHS = torch.arange(1, 61)  # |Y| = 1 .. 60: the output lengths §6.1's limit allows short sources
LP_ALPHAS = (0.6, 0.3)  # §6.1 (translation) and §6.3 (parsing)
SCRIPTED: dict[str, Any] = dict(bos_id=S_BOS, eos_id=S_EOS, beam_size=PAPER.beam_size, alpha=PAPER.alpha,
                                max_len=SCRIPTED_MAX_LEN)
SCRIPTED_WHAT = {
    "penalty": "GNMT's penalty, no penalty and |Y|^0.6 choose three different outputs",
    "early": "an output that ended at the first step must win over four live hypotheses that outscore it "
             "(finished hypotheses kept aside)",
}


@pytest.fixture(scope="module")
def penalty_fn(component: Component) -> Any:
    """The length penalty the component's factory makes: fn(length, alpha) -> lp."""
    return from_factory(component)


@pytest.fixture(scope="module")
def search_fn(component: Component) -> Any:
    """The beam search the component's factory makes (``implementations/hookspecs.py``, kind ``search``)."""
    return from_factory(component)


def call_penalty(fn: Any, length: torch.Tensor, alpha: float) -> torch.Tensor:
    """``fn(length, alpha)`` as float64, checked to be a floating tensor of the shape of ``length``."""
    call = f"length_penalty(torch.arange(1, {len(length) + 1}), {alpha})"
    try:
        out = fn(length, alpha)
    except CheckTimeout:
        raise
    except Exception as exc:
        could_not_check(f"{call} raised", exc)
    if not isinstance(out, torch.Tensor) or out.shape != length.shape or not out.is_floating_point():
        got = f"{out.dtype} {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        could_not_check(f"{call} returned {got}, expected a floating tensor {list(length.shape)}")
    return out.detach().to(torch.float64)


@pytest.mark.clause("decode.beam")
@pytest.mark.component_kind("length_penalty")
def test_length_penalty_component_is_gnmts(penalty_fn: Any) -> None:
    """lp(|Y|) = ((5 + |Y|) / 6)^alpha for |Y| = 1 .. 60 at the paper's alphas (0.6 in §6.1, 0.3 in §6.3)."""
    for alpha in LP_ALPHAS:
        got = call_penalty(penalty_fn, LP_LENGTHS, alpha)
        cmp = compare(got, oracles.length_penalty(LP_LENGTHS, alpha), dtype=torch.float32)
        if cmp.ok:
            continue
        named = [what for form, what in oracles.LP_FORMS.items() if form != "paper" and compare(
            got, oracles.length_penalty(LP_LENGTHS, alpha, form=form), dtype=torch.float32).ok]
        n = int(LP_LENGTHS[cmp.index[0]])
        violation(measured=f"lp(|Y| = {n}) = {cmp.actual:.6g} at alpha = {alpha} ({cmp.describe()})"
                  + (f"; the penalty matches {named[0]}" if named else ""),
                  expected=f"GNMT's ((5 + |Y|) / 6)^alpha: lp({n}) = {cmp.expected:.6g}; lp(1) = 1, "
                           f"lp(10) = {2.5 ** alpha:.6g}",
                  call=f"length_penalty(torch.arange(1, {len(LP_LENGTHS) + 1}), {alpha})",
                  hint="fairseq, Hugging Face and CTranslate2 divide by |Y|^alpha; §6.1 cites GNMT's "
                       "((5 + |Y|) / 6)^alpha with |Y| counting the end symbol")


@pytest.mark.clause("decode.beam")
@pytest.mark.component_kind("length_penalty")
def test_length_penalty_component_chooses_the_papers_output(penalty_fn: Any) -> None:
    """The reference beam search (beam 4, alpha 0.6) ranking with this penalty chooses §6.1's output on scripted
    scores where GNMT's penalty, no penalty and |Y|^alpha choose three different ones."""
    row = SCRIPTED_ROWS["penalty"]
    src = SCRIPTED_SOURCES[row:row + 1]
    expected = expected_beam(scripted_witnesses(), src, **SCRIPTED)

    def checked(length: torch.Tensor, alpha: float) -> torch.Tensor:  # the component, its result checked
        return call_penalty(penalty_fn, length.reshape(-1), alpha).reshape(length.shape).float()

    try:
        got = rows_of(beam_search(scripted_witnesses(), src, pad_id=S_PAD, length_penalty=checked, **SCRIPTED).tokens,
                      S_PAD)
    except (CheckTimeout, ImplementationError):
        raise
    except Exception as exc:
        could_not_check("reference beam_search(scripted scores, ..., length_penalty=fn) raised", exc)
    if got == expected:
        return
    variants = beam_variant_outputs(scripted_witnesses(), src, list(BEAM_VARIANTS), **SCRIPTED)
    named = [BEAM_VARIANTS[n].describe for n, out in variants.items() if out == got]
    violation(measured=f"ranked with this penalty the search returns {got[0]}, with GNMT's {expected[0]}"
              + (f"; the output matches {named[0]}" if named else ""),
              expected=f"{expected[0]} ([a, end]; a = {S_A}, end = {S_EOS}): [a, end] scores -1.250 / lp(2) = "
                       f"-1.140 under GNMT's penalty, above [end] "
                       f"(-1.204) and [a, a, a, a, end] (-1.850 / lp(5) = -1.361)",
              call=f"reference beam_search(scripted scores, src {list(src.shape)}, bos_id={S_BOS}, eos_id={S_EOS}, "
                   f"beam_size={PAPER.beam_size}, alpha={PAPER.alpha}, max_len={SCRIPTED_MAX_LEN}, length_penalty=fn)",
              hint="a penalty of another form changes which finished hypothesis wins: no penalty favours short "
                   "outputs, |Y|^alpha long ones")


def check_scripted_search(search_fn: Any, which: str) -> None:
    """The component's search on the scripted witnesses (one batch, right-padded) equals the reference's on the row
    that witnesses ``which``."""
    rows, call = call_search(search_fn, scripted_witnesses(), SCRIPTED_SOURCES, **SCRIPTED)
    expected = expected_beam(scripted_witnesses(), SCRIPTED_SOURCES, **SCRIPTED)
    r = SCRIPTED_ROWS[which]
    if rows[r] == expected[r]:
        return
    variants = beam_variant_outputs(scripted_witnesses(), SCRIPTED_SOURCES, list(BEAM_VARIANTS), **SCRIPTED)
    named = [BEAM_VARIANTS[n].describe for n, out in variants.items() if out[r] == rows[r] != expected[r]]
    violation(measured=f"row {r} (where {SCRIPTED_WHAT[which]}): the search returned {rows[r]}, the §6.1 search "
              f"returns {expected[r]}" + (f"; the output matches {named[0]}" if named else ""),
              expected="beam 4, summed log-probabilities divided by the given length penalty (GNMT's "
                       "((5 + |Y|) / 6)^0.6, |Y| with the end symbol), finished hypotheses kept aside, tensor2tensor's "
                       f"early stop; all rows: {expected}",
              call=f"{call} on scripted scores (V = 8: pad 0, start 1, end 2, a 3, b 4)",
              hint="a length penalty of another form or ignored, finished hypotheses competing for the K beam slots, "
                   "or states not reordered with the beams")


@pytest.mark.clause("decode.beam")
@pytest.mark.component_kind("search")
def test_search_component_length_penalty_witness(search_fn: Any) -> None:
    """Beam 4, alpha 0.6, GNMT's penalty given: scripted scores where the penalty's form decides the winner."""
    check_scripted_search(search_fn, "penalty")


@pytest.mark.clause("decode.beam")
@pytest.mark.component_kind("search")
def test_search_component_keeps_finished_hypotheses_aside(search_fn: Any) -> None:
    """Beam 4, alpha 0.6: an output that finished at the first step and is outscored by four live hypotheses
    still wins (later ends are far worse)."""
    check_scripted_search(search_fn, "early")


@pytest.mark.clause("decode.beam")
@pytest.mark.component_kind("search")
def test_search_component_equals_the_reference_on_random_tables(search_fn: Any) -> None:
    """Beam 4, alpha 0.6, GNMT's penalty given, on 160 random score tables (horizons of 6 to 48 tokens; forks
    between ending and going on, long likely continuations, ties): the search returns the reference's output on every
    table no near tie decides. Early stopping, the finished set, the 2K candidates and ties all decide some of them."""
    for case in table_cases():
        tables = RandomTables(case.seed)
        rows, call = call_search(search_fn, tables, case.src, max_len=case.max_len, **TABLE_SEARCH)
        bad = [b for b, (g, e, j) in enumerate(zip(rows, case.expected, case.judged)) if j and g != e]
        if not bad:
            continue
        b = bad[0]
        named = [v.describe for v in TABLE_VARIANTS.values()
                 if v.run(tables, case.src[b:b + 1], max_len=case.max_len, **TABLE_SEARCH) == [rows[b]]]
        violation(measured=f"table {b} (source {case.src[b].tolist()}): the search returned {rows[b]} "
                  f"({hypothesis_scores(tables, case.src[b], rows[b], bos_id=S_BOS)}), the reference returns "
                  f"{case.expected[b]} ({hypothesis_scores(tables, case.src[b], case.expected[b], bos_id=S_BOS)}); "
                  f"{len(bad)} of the batch's {sum(case.judged)} judged tables differ"
                  + (f"; the output matches {named[0]}" if named else "; no named variant reproduces it"),
                  expected="beam 4, summed log-probabilities divided by GNMT's ((5 + |Y|) / 6)^0.6 (|Y| with the end "
                           "symbol), the 2K best candidates per step, finished hypotheses kept aside (K best), "
                           "tensor2tensor's early stop: lowest finished score > best live log-probability / "
                           "lp(maximum length)",
                  call=f"{call} on random score tables (seed {case.seed}; V = 7: pad 0, start 1, end 2, tokens 3-6; "
                       "conformance.decoding.RandomTables)",
                  hint="an early stop bounding the live hypotheses by lp(current length), only K candidates per step, "
                       "finished hypotheses competing for the beam slots, or another length penalty")


@pytest.mark.clause("decode.max-length")
@pytest.mark.component_kind("search")
def test_search_component_default_max_length(search_fn: Any) -> None:
    """max_len None, an end symbol never produced: each output is its source's real length + 50 long (§6.1)."""
    src = NEVER_ENDING_SOURCES
    rows, call = call_search(search_fn, ScriptedScores({}, NEVER_ENDS), src, eos_id=S_EOS,
                             beam_size=PAPER.beam_size, alpha=PAPER.alpha, max_len=None)
    limits = output_limits(src, S_PAD).tolist()
    lengths = {b: len(row) for b, row in enumerate(rows)}
    if list(lengths.values()) == limits:
        return
    b = next(i for i, n in lengths.items() if n != limits[i])
    rule = _length_rule(lengths, src, S_PAD)
    violation(measured=f"row {b} (real source length {int((src[b] != S_PAD).sum())}) has {lengths[b]} output tokens; "
              f"all rows: {list(lengths.values())}" + (f"; they match {rule}" if rule else ""),
              expected=f"max_len=None limits each output to its source's real (non-pad) length + 50 tokens: {limits}",
              call=f"{call} on scripted scores that never produce the end symbol",
              hint="the limit taken from the padded batch width or a fixed max_len, tensor2tensor's extra_length "
                   "= 100, or an off-by-one counting the start or the end symbol")
