"""decode.* (§3, §6.1): the cached decoder, greedy search, beam search with GNMT's length penalty, and the
default maximum output length, each checked through the adapter's optional decoding methods
(``spec.contract``); an adapter without them skips with the reason naming the missing method.

The searches are judged against the reference searches (``reference.decoding``) driven by the
implementation's *own* full forward on each prefix (``conformance.decoding.ForwardScores``), with the
weights it holds: a forward-pass bug belongs to the forward-pass clauses, and a decoding bug shows here
even in an implementation whose forward differs from the reference's. An adapter that loads canonical
weights holds the visible weights with embeddings (hence, tied, the logits) three times larger: sharp
distributions, under which one more likely token costs less than the length penalty gives back, so
α = 0 and α = 0.6 choose different outputs (witnesses are searched for at test time; a check without one
skips with the reason). Every input is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from reference.decoding import output_limits
from spec.contract import has_capability
from spec.tolerance import compare

from .decoding import (
    BEAM_VARIANTS,
    CACHE_VARIANTS,
    DECODE_CONFIG,
    PAPER,
    CacheVariant,
    ForwardScores,
    beam_variant_outputs,
    call_generate,
    decode_sources,
    drive,
    expected_beam,
    greedy_rows,
    incremental_schedule,
    missing_step_methods,
    replay,
    rows_of,
)
from .diagnosis import STATE_SEED
from .harness import build_model, violation
from .probes import log_probs, require_deterministic
from .weights import has_method, load_into, reference_twin, visible_state

CFG = DECODE_CONFIG
PAD, BOS, V = CFG.pad_id, PAPER.bos_id, CFG.tgt_vocab
GREEDY_MAX = 10  # output tokens in the greedy check (the default limit is decode.max-length's)
BEAM_MAX = 8  # output tokens in the beam checks
SHARPEN = 3.0
GENERATE = "generate(src, *, bos_id, eos_id, beam_size, alpha, max_len)"


def _sharpen(name: str, tensor: torch.Tensor) -> torch.Tensor:
    return tensor * SHARPEN if "embed" in name or name.startswith("generator") else tensor


@dataclass
class Subject:
    model: Any
    twin: Any  # the reference holding the same weights, or None
    weights: str
    scores: ForwardScores | None = None
    beam_witnesses: list | None = None
    extra: dict = field(default_factory=dict)


# Keyed by id(model): each entry holds its model, so no later model can take the same id.
_SUBJECTS: dict[int, Subject] = {}


@pytest.fixture(scope="module")
def model(impl):
    return build_model(impl, CFG, "decode.incremental")


def subject(impl, model, clause_id: str) -> Subject:
    """The model ready for the decode checks (transplanted once, when it can load canonical weights)."""
    key = id(model)
    if key not in _SUBJECTS:
        if has_method(model, "load_reference_state"):
            state = visible_state(CFG, seed=STATE_SEED, adjust=_sharpen)
            load_into(model, state, clause_id, impl.name)
            model.eval()
            _SUBJECTS[key] = Subject(model, reference_twin(CFG, state),
                                     f"visible weights (seed {STATE_SEED}) with the embeddings x{SHARPEN:g}")
        else:
            _SUBJECTS[key] = Subject(model, None, "its own initialization (seed 0)")
    subj = _SUBJECTS[key]
    src = decode_sources([4, 2], seed=1)
    require_deterministic(model, src, torch.full((2, 3), BOS), clause_id, CFG)
    if subj.scores is None:
        subj.scores = ForwardScores(model, impl.output, clause_id)
    subj.scores.clause_id = clause_id
    return subj


def needs_generate(impl, model) -> None:
    if not has_capability(model, "generate"):
        pytest.skip(f"{impl.name} has no {GENERATE} (spec.contract): no search of its own to check")


# -- decode.incremental ----------------------------------------------------------------------------------------
@pytest.mark.clause("decode.incremental")
def test_cached_steps_equal_the_full_forward(impl, model):
    """Every step of the step-level decoder equals the full forward on the same prefix: three padded
    sources expanded to beams, a row finished early (fed padding), then reordered like beams."""
    clause = "decode.incremental"
    missing = missing_step_methods(model)
    if missing:
        pytest.skip(f"{impl.name} has no {', '.join(missing)} (spec.contract step-level decoding): no "
                    "incremental decoder to check")
    subj = subject(impl, model, clause)
    schedule = incremental_schedule()
    rep = replay(schedule, PAD)
    got = drive(model, schedule, impl.output, clause, V)
    for t, (scores, src_rows, prefix, active) in enumerate(zip(got, rep.src_rows, rep.prefixes, rep.active)):
        full = log_probs(model, impl, src_rows, prefix, clause, CFG)[:, -1]  # (N, V)
        cmp = compare(scores[active], full[active], dtype=torch.float32, scope="model")
        if cmp.ok:
            continue
        row = int(active.nonzero()[cmp.index[0]]) if cmp.index else 0
        named = _cache_variant(subj, schedule, got, rep)
        violation(clause, measured=f"at step {t} (prefix length {t + 1}), row {row}: the cached decoder's "
                  f"next-token log-probabilities differ from the full forward's: {cmp.describe()}"
                  + (f"; the cached decoder matches the reference with {named}" if named else ""),
                  expected="decode_step(state, tokens)[0] == forward(src, prefix)[:, -1] at every step, the new "
                           "token at position t (the prefix length)",
                  call=f"begin_decoding(src {list(schedule.src.shape)}, real lengths "
                       f"{(schedule.src != PAD).sum(1).tolist()}), reorder_state to "
                       f"{schedule.expand.tolist()}, decode_step x {len(got)} (row 3 fed padding from step 3), "
                       f"reorder_state({schedule.reorders[4].tolist()}) before step 4; held {subj.weights}",
                  hint="positions restarted at 0 for each new token, a cross-attention cache computed from the "
                       "wrong memory or not reordered with the beams, or a self-attention cache not appended")


def _cache_variant(subj: Subject, schedule, got, rep) -> str:
    """The named cache bug whose outputs the implementation reproduces (on the reference twin), or ''."""
    if subj.twin is None:
        return ""
    for knob, what in CACHE_VARIANTS.items():
        theirs = drive(CacheVariant(subj.twin, knob), schedule, "logits", "decode.incremental", V)
        if all(compare(g[a], x[a], dtype=torch.float32, scope="model").ok
               for g, x, a in zip(got, theirs, rep.active)):
            return what
    return ""


# -- decode.greedy -------------------------------------------------------------------------------------------------
GREEDY_POOL = [6, 5, 4, 3, 2, 1] * 3  # candidate sources; greedy trajectories of random models mostly repeat a token


def greedy_witness(scores: ForwardScores) -> tuple[int, list[int], list[list[int]]] | None:
    """(end symbol, rows of the pool, their trajectories with no end symbol) such that under that symbol rows
    finish at different steps (preferably some after >= 2 tokens) while others go on: the witness of
    stopping at EOS while the batch goes on. None when no symbol gives two different finishing steps."""
    pool = decode_sources(GREEDY_POOL, seed=31)
    free = greedy_rows(scores, pool, eos_id=-1, max_len=GREEDY_MAX)
    best: tuple[int, tuple[int, int], list[int]] | None = None
    for eos in range(V):
        if eos in (PAD, BOS):
            continue
        ends = [row.index(eos) if eos in row else None for row in free]
        late: dict[int, int] = {}
        for b, e in enumerate(ends):
            if e is not None and 1 <= e < GREEDY_MAX - 1:
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
def test_greedy_is_the_argmax_trajectory(impl, model):
    """generate(beam_size=1) emits the argmax of the full forward at every step, stops each row at its end
    symbol and keeps a finished row finished (padding) while the others go on."""
    clause = "decode.greedy"
    needs_generate(impl, model)
    subj = subject(impl, model, clause)
    scores = subj.scores
    assert scores is not None
    witness = greedy_witness(scores)
    if witness is None:
        pytest.skip(f"no end symbol makes the greedy trajectories of {impl.name} ({subj.weights}) finish at "
                    f"different steps on {len(GREEDY_POOL)} sources: no witness of early stopping")
    eos, rows, free = witness
    src = decode_sources(GREEDY_POOL, seed=31)[rows]
    expected = greedy_rows(scores, src, eos_id=eos, max_len=GREEDY_MAX)
    out, call = call_generate(model, src, clause, eos_id=eos, beam_size=1, alpha=PAPER.alpha, max_len=GREEDY_MAX)
    got = rows_of(out, PAD)
    if got == expected:
        return
    b = next(i for i, (g, e) in enumerate(zip(got, expected)) if g != e)
    first = next((k for k, (x, y) in enumerate(zip(got[b], expected[b])) if x != y), min(len(got[b]), len(expected[b])))
    stop = min((r.index(eos) for r in expected if eos in r), default=GREEDY_MAX)
    if got == [[BOS] + r for r in expected]:
        named = "the expected outputs with the start symbol prepended (generate must return y_1 .. y_m only)"
    elif got == free:
        named = "the argmax trajectories with no stop at the end symbol: rows keep growing after EOS"
    elif any(eos in row[:-1] for row in got):
        named = "a row that goes on after its end symbol (finished rows must stay finished: padding only)"
    elif any(len(row) > GREEDY_MAX for row in got):
        named = f"outputs longer than max_len={GREEDY_MAX}"
    elif PAD in sum(got, []):
        named = "the padding id generated as a token (it is never generated)"
    elif got == [r[:stop + 1] for r in free]:
        named = "every row stopped when the first row emitted its end symbol (the batch stops together)"
    else:
        named = ""
    violation(clause, measured=f"row {b}: generated {got[b]}, the argmax trajectory of the full forward is "
              f"{expected[b]} (first difference at output position {first})"
              + (f"; the output matches {named}" if named else ""),
              expected=f"at each step the token of highest log-probability (padding excluded) under forward(src, "
                       f"prefix), stopping at eos_id={eos} or after max_len tokens; all rows: {expected}",
              call=f"{call}; held {subj.weights}",
              hint="a cached decoder that disagrees with the full forward (see decode.incremental), no stop at the "
                   "end symbol, or finished rows fed back into the search")


# -- decode.beam -----------------------------------------------------------------------------------------------
BEAM_SOURCES = [6, 5, 4, 3, 2, 1]
PENALTY_VARIANTS = ["no-penalty", "length-power", "eos-not-counted"]


@dataclass
class Witness:
    eos: int
    expected: list[list[int]]
    variants: dict[str, list[list[int]]]
    rows: dict[str, list[int]]  # variant -> the rows where it differs from the expected output


def beam_witnesses(impl, subj: Subject) -> list[Witness]:
    """End symbols under which named beam-search variants choose other outputs than §6.1's search, on the
    implementation's own scores (searched once per implementation, in end-symbol order, until every variant
    is told apart or every symbol has been tried)."""
    if subj.beam_witnesses is not None:
        return subj.beam_witnesses
    assert subj.scores is not None
    src = decode_sources(BEAM_SOURCES, seed=5)
    kw = dict(bos_id=BOS, beam_size=PAPER.beam_size, alpha=PAPER.alpha, max_len=BEAM_MAX)
    found: list[Witness] = []
    told: set[str] = set()
    for eos in range(V):
        if eos in (PAD, BOS):
            continue
        expected = expected_beam(subj.scores, src, eos_id=eos, **kw)
        variants = beam_variant_outputs(subj.scores, src, list(BEAM_VARIANTS), eos_id=eos, **kw)
        rows = {name: [b for b, (x, e) in enumerate(zip(out, expected)) if x != e] for name, out in variants.items()}
        rows["finished-in-beam"] = [b for b in rows["finished-in-beam"] if expected[b][-1:] == [eos]]
        new = {name for name, r in rows.items() if r} - told
        if new:
            found.append(Witness(eos, expected, variants, rows))
            told |= new
        if told >= set(BEAM_VARIANTS):
            break
    subj.beam_witnesses = found
    return found


def check_beam(impl, subj: Subject, witnesses: list[Witness], clause: str, purpose: str) -> None:
    src = decode_sources(BEAM_SOURCES, seed=5)
    for w in witnesses:
        out, call = call_generate(subj.model, src, clause, eos_id=w.eos, beam_size=PAPER.beam_size,
                                  alpha=PAPER.alpha, max_len=BEAM_MAX)
        got = rows_of(out, PAD)
        if got == w.expected:
            continue
        b = next(i for i, (g, e) in enumerate(zip(got, w.expected)) if g != e)
        named = [BEAM_VARIANTS[n].describe for n, o in w.variants.items() if o == got]
        if got == [[BOS] + r for r in w.expected]:
            named.append("the expected outputs with the start symbol prepended (generate must return y_1 .. y_m)")
        witness_of = ", ".join(f"{n} (rows {r})" for n, r in w.rows.items() if r)
        violation(clause, measured=f"row {b}: beam search returned {got[b]}, the §6.1 search on the "
                  f"implementation's own scores returns {w.expected[b]}"
                  + (f"; the outputs match {named[0]}" if named else "; no named variant reproduces them"),
                  expected=f"beam 4, summed log-probabilities divided by ((5 + |Y|) / 6)^0.6 (|Y| with the end "
                           f"symbol), finished hypotheses kept aside, tensor2tensor's early stop; all rows: "
                           f"{w.expected}",
                  call=f"{call}; held {subj.weights}; this end symbol is a witness of {purpose}: it tells apart "
                       f"{witness_of}",
                  hint="a length penalty of another form (|Y|^alpha, none, |Y| without EOS), finished hypotheses "
                       "not kept aside, or a cache that disagrees with the forward (decode.incremental)")


@pytest.mark.clause("decode.beam")
def test_beam_length_penalty_witnesses(impl, model):
    """Beam 4, α = 0.6, on witnesses where no penalty (α = 0), |Y|^α, or |Y| counted without the end symbol
    would choose another output than GNMT's ((5 + |Y|) / 6)^α."""
    clause = "decode.beam"
    needs_generate(impl, model)
    subj = subject(impl, model, clause)
    witnesses = [w for w in beam_witnesses(impl, subj) if any(w.rows[n] for n in PENALTY_VARIANTS)]
    if not any(w.rows["no-penalty"] for w in witnesses):
        pytest.skip(f"no witness source where alpha = 0 and alpha = 0.6 choose different outputs on "
                    f"{impl.name}'s scores ({subj.weights}; {len(BEAM_SOURCES)} sources, every end symbol): "
                    "its distributions are too flat for the penalty to matter"
                    + ("" if subj.twin is not None else "; with load_reference_state the check loads sharper "
                       "weights"))
    check_beam(impl, subj, witnesses, clause, "the length penalty's form")


@pytest.mark.clause("decode.beam")
def test_beam_early_finished_hypothesis_wins(impl, model):
    """A hypothesis that ended with EOS while live ones went on must still win when its score is best: the
    finished set is kept aside, not left to compete for the K beam slots."""
    clause = "decode.beam"
    needs_generate(impl, model)
    subj = subject(impl, model, clause)
    witnesses = [w for w in beam_witnesses(impl, subj) if w.rows["finished-in-beam"]]
    if not witnesses:
        pytest.skip(f"no witness source where a hypothesis pushed out of the beam after it finished must win, on "
                    f"{impl.name}'s scores ({subj.weights})")
    check_beam(impl, subj, witnesses[:1], clause, "a finished hypothesis kept aside")


# -- decode.max-length -----------------------------------------------------------------------------------------
MAX_SOURCES = [6, 3, 1]  # padded width 6: the default limits are 56, 53 and 51


def _length_rule(lengths: dict[int, int], src: torch.Tensor) -> str:
    real = (src != PAD).sum(dim=1).tolist()
    width = src.size(1)
    rules = {
        "each source's real length + 50": lambda b: real[b] + 50,
        "the padded source width + 50 (the batch's length, not each sample's)": lambda b: width + 50,
        "each source's real length + 100 (tensor2tensor's extra_length default)": lambda b: real[b] + 100,
        "the padded source width + 100": lambda b: width + 100,
        "each source's real length + 49 (one short)": lambda b: real[b] + 49,
        "each source's real length + 51 (one over)": lambda b: real[b] + 51,
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
    table[:, [PAD, BOS]] = float("inf")
    return table.max(dim=0).values.argsort().tolist()[:3]


def check_default_limit(impl, subj: Subject, clause: str, beam_size: int) -> None:
    """Rows whose output holds no end symbol must be exactly their source's real length + 50 long; rows
    that end with it must be no longer. The end symbol is one the model hardly ever chooses (up to three
    tried, until a source shorter than the batch's padded width runs to its limit)."""
    src = decode_sources(MAX_SOURCES, seed=41)
    limits = output_limits(src, PAD).tolist()
    for eos in _candidate_end_symbols(subj, src):
        out, call = call_generate(subj.model, src, clause, eos_id=eos, beam_size=beam_size, alpha=PAPER.alpha,
                                  max_len=None)
        got = rows_of(out, PAD)
        unended = {b: len(r) for b, r in enumerate(got) if r[-1:] != [eos]}
        if any(limits[b] != src.size(1) + 50 for b in unended):
            break
    else:
        pytest.skip(f"every source shorter than the padded width emitted the end symbol (tried the 3 tokens "
                    f"{impl.name} least often chooses, {subj.weights}): no witness of the limit")
    bad = {b: n for b, n in unended.items() if n != limits[b]}
    bad.update({b: len(r) for b, r in enumerate(got) if b not in unended and len(r) > limits[b]})
    if not bad:
        return
    rule = _length_rule(unended, src)
    b = next(iter(bad))
    violation(clause, measured=f"row {b} (real source length {int((src[b] != PAD).sum())}) has {bad[b]} output "
              f"tokens; lengths of the rows with no end symbol: {unended}" + (f"; they match {rule}" if rule else ""),
              expected=f"max_len=None limits each output to its source's real (non-pad) length + 50 tokens, the "
                       f"end symbol included: {limits}",
              call=f"{call} (an end symbol {impl.name} hardly ever chooses; {subj.weights})",
              hint="the limit taken from the padded batch width or a fixed max_len, tensor2tensor's extra_length "
                   "= 100, or an off-by-one counting the start or the end symbol")


@pytest.mark.clause("decode.max-length")
def test_default_max_length_greedy(impl, model):
    """Greedy search with no end symbol in sight stops at each source's real length + 50 (§6.1)."""
    clause = "decode.max-length"
    needs_generate(impl, model)
    check_default_limit(impl, subject(impl, model, clause), clause, beam_size=1)


@pytest.mark.clause("decode.max-length")
def test_default_max_length_beam(impl, model):
    """Beam search (beam 4, α = 0.6) with no end symbol in sight stops at each source's real length + 50."""
    clause = "decode.max-length"
    needs_generate(impl, model)
    check_default_limit(impl, subject(impl, model, clause), clause, beam_size=PAPER.beam_size)
