"""Value tests of reference/decoding.py: the key/value cache against the full forward, GNMT's length penalty,
and the searches on scripted log-probabilities (a mock step decoder) where the answer is worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn_conformance.reference.decoding import (
    KVCache,
    PrefixDecoding,
    PrefixState,
    beam_search,
    decode_step,
    generate,
    gnmt_length_penalty,
    greedy_search,
    init_cache,
    output_limits,
    reorder,
)
from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.spec.config import TINY
from aiayn_conformance.spec.decoding import DECODE_PRESETS, PARSING, TRANSLATION, DecodeConfig, decode_preset

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4
CFG = TINY.replace(max_len=80)


def model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    m = Transformer(CFG).eval()
    with torch.no_grad():  # sharper distributions than the initialization's, so searches have choices to make
        m.src_embed.weight.mul_(3.0)
    return m


def sources(lengths: list[int], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, CFG.src_vocab, (len(lengths), max(lengths)), generator=g)
    for b, n in enumerate(lengths):
        src[b, n:] = PAD
    return src


# -- the cache -------------------------------------------------------------------------------------------------
def test_cache_holds_plain_tensors_of_the_documented_shapes():
    m, src = model(), sources([5, 2])
    cache = init_cache(m, src)
    assert isinstance(cache, KVCache) and len(cache.layers) == CFG.n_layers and cache.length == 0
    h, d_k = CFG.n_heads, CFG.d_k
    for layer in cache.layers:
        assert layer.self_k.shape == (2, h, 0, d_k) and layer.cross_k.shape == (2, h, 5, d_k)
    logits, cache2 = decode_step(m, cache, torch.tensor([BOS, BOS]))
    assert logits.shape == (2, CFG.tgt_vocab) and cache2.length == 1 and cache.length == 0  # the input is untouched
    assert cache2.layers[0].cross_k is cache.layers[0].cross_k  # computed once per source
    moved = reorder(cache2, torch.tensor([1, 1, 0]))
    assert moved.length == 1 and moved.src_mask.shape == (3, 1, 1, 5)
    assert torch.equal(moved.layers[1].self_v[0], cache2.layers[1].self_v[1])


def test_every_cached_step_equals_the_full_forward_on_padded_sources_and_reordered_rows():
    m, src = model(1), sources([7, 4, 1], seed=1)
    g = torch.Generator().manual_seed(2)
    rows, prefix = torch.arange(3), torch.full((3, 1), BOS)
    cache = init_cache(m, src)
    worst = 0.0
    with torch.no_grad():
        for t in range(12):
            if t == 5:  # beam-like: duplicate a row, drop another, permute
                idx = torch.tensor([2, 0, 0, 1])
                cache, rows, prefix = reorder(cache, idx), rows[idx], prefix[idx]
            logits, cache = decode_step(m, cache, prefix[:, -1])
            full = m(src[rows], prefix)[:, -1]
            worst = max(worst, (logits - full).abs().max().item())
            nxt = torch.randint(3, CFG.tgt_vocab, (prefix.size(0), 1), generator=g)
            prefix = torch.cat([prefix, nxt], dim=1)
    assert worst < 1e-5, f"cached and full forward differ by {worst}"


def test_positions_continue_from_the_prefix_length_beyond_max_len():
    m = model(2)
    small = Transformer(TINY).eval()
    small.load_reference_state(m.state_dict())
    src, prefix = sources([3]), torch.randint(3, 37, (1, 30))  # 30 > TINY.max_len = 24: the table extrapolates
    cache = init_cache(small, src)
    with torch.no_grad():
        for t in range(30):
            logits, cache = decode_step(small, cache, prefix[:, t])
        assert torch.allclose(logits, small(src, prefix)[:, -1], atol=1e-5)


def test_greedy_decode_is_a_thin_call_into_greedy_search():
    m, src = model(3), sources([6, 3])
    ys = m.greedy_decode(src, bos_id=BOS, eos_id=-1, max_new_tokens=5)
    hyp = greedy_search(m, src, bos_id=BOS, eos_id=-1, pad_id=PAD, max_len=5)
    assert ys[:, 0].tolist() == [BOS, BOS] and torch.equal(ys[:, 1:], hyp.tokens)


# -- the length penalty ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length, alpha, expected", [
    (1, 0.6, 1.0), (2, 0.6, (7 / 6) ** 0.6), (10, 0.6, 2.5 ** 0.6), (51, 0.6, (56 / 6) ** 0.6),
    (7, 0.0, 1.0), (7, 0.3, 2.0 ** 0.3), (19, 1.0, 4.0),
])
def test_gnmt_length_penalty_values(length, alpha, expected):
    assert gnmt_length_penalty(torch.tensor(length), alpha).item() == pytest.approx(expected, rel=1e-6)


# -- scripted step decoders ----------------------------------------------------------------------------------------
class Scripted:
    """A step decoder over V = 8 tokens (pad 0, bos 1, eos 2, a 3, b 4, fillers 5..7) whose next-token
    distribution is a table: the tokens after the start symbol -> {token: probability}; the rest of the mass
    goes equally to the fillers. Prefixes not in the table give the end symbol ``eos_elsewhere`` and
    the rest equally to a, b and the fillers. ``calls`` counts decode_step calls."""

    V = 8

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], eos_elsewhere: float = 1e-4,
                 roots: dict[int, dict[int, float]] | None = None):
        self.table, self.eos_elsewhere, self.calls = table, eos_elsewhere, 0
        self.roots = roots or {}  # the first distribution of a source whose first token is the key

    def distribution(self, key: tuple[int, ...], first: int | None = None) -> list[float]:
        p = [0.0] * self.V
        given = self.roots.get(first) if not key and first in self.roots else self.table.get(key)
        if given is None:
            p[EOS] = self.eos_elsewhere
            rest = [A, B, 5, 6, 7]
        else:
            for tok, prob in given.items():
                p[tok] = prob
            rest = [t for t in (5, 6, 7) if t not in given]
        share = (1.0 - sum(p)) / len(rest)
        for t in rest:
            p[t] = share
        return p

    def begin_decoding(self, src):
        return PrefixState(src, src.new_zeros(src.size(0), 0))

    def decode_step(self, state, tokens):
        self.calls += 1
        prefix = torch.cat([state.prefix, tokens[:, None]], dim=1)
        probs = torch.tensor([self.distribution(tuple(row[1:]), src[0]) for row, src in
                              zip(prefix.tolist(), state.src.tolist())], dtype=torch.float64)
        return probs.log(), PrefixState(state.src, prefix)

    def reorder_state(self, state, indices):
        return PrefixState(state.src[indices], state.prefix[indices])


ONE_SOURCE = torch.tensor([[5, 6, 7]])
#   A = [eos]                     log p = ln 0.30                          = -1.204   |Y| = 1
#   B = [a, eos]                  log p = ln 0.65 + ln 0.441               = -1.250   |Y| = 2
#   C = [a, a, a, a, eos]         log p = ln 0.65 + ln 0.55 + 2 ln 0.97 + ln 0.4677 = -1.850   |Y| = 5
# no penalty: A (-1.204) > B (-1.250) > C; GNMT alpha 0.6: B (-1.140) > A (-1.204) > C (-1.361);
# |Y|^0.6: C (-0.704) > B (-0.825) > A (-1.204).
THREE_WINNERS = {
    (): {EOS: 0.30, A: 0.65},
    (A,): {EOS: 0.441, A: 0.55},
    (A, A): {A: 0.97, EOS: 1e-4},
    (A, A, A): {A: 0.97, EOS: 1e-4},
    (A, A, A, A): {EOS: 0.4677, A: 0.5},
}


def _score(seq: list[int], table, lp) -> float:
    s = Scripted(table)
    total = sum(math.log(s.distribution(tuple(seq[:i]))[tok]) for i, tok in enumerate(seq))
    return total / lp(len(seq))


def test_the_scripted_scores_are_as_worked_out():
    def ranked(lp) -> list[list[int]]:
        hyps = [[EOS], [A, EOS], [A, A, A, A, EOS]]
        return sorted(hyps, key=lambda h: _score(h, THREE_WINNERS, lp), reverse=True)

    assert ranked(lambda n: 1.0) == [[EOS], [A, EOS], [A, A, A, A, EOS]]
    assert ranked(lambda n: ((5 + n) / 6) ** 0.6) == [[A, EOS], [EOS], [A, A, A, A, EOS]]
    assert ranked(lambda n: n ** 0.6) == [[A, A, A, A, EOS], [A, EOS], [EOS]]


@pytest.mark.parametrize("penalty, alpha, winner", [
    ("gnmt", 0.6, [A, EOS]),
    ("none", 0.0, [EOS]),
    ("power", 0.6, [A, A, A, A, EOS]),
])
def test_gnmt_no_penalty_and_length_power_pick_different_winners(penalty, alpha, winner):
    lp = {"gnmt": gnmt_length_penalty, "none": gnmt_length_penalty,
          "power": lambda n, a: n.to(torch.float32) ** a}[penalty]
    hyp = beam_search(Scripted(THREE_WINNERS), ONE_SOURCE, bos_id=BOS, eos_id=EOS, pad_id=PAD, beam_size=2,
                      alpha=alpha, max_len=10, length_penalty=lp)
    assert hyp.tokens[0, :hyp.lengths[0]].tolist() == winner
    assert bool(hyp.finished[0])
    expected_logp = {1: math.log(0.30), 2: math.log(0.65 * 0.441)}.get(len(winner))
    if expected_logp is not None:
        assert hyp.log_probs[0].item() == pytest.approx(expected_logp, abs=1e-5)
        assert hyp.scores[0].item() == pytest.approx(expected_logp / lp(torch.tensor(len(winner)), alpha).item(),
                                                     abs=1e-5)


# [eos] finishes at step 0; two live hypotheses outscore it at every later step (even penalized), but every
# later finish is far worse: it must win, which it can only if finished hypotheses are kept aside.
EARLY_WINNER = {
    (): {EOS: 0.30, A: 0.35, B: 0.33},
    (A,): {A: 0.95, EOS: 1e-3}, (B,): {B: 0.95, EOS: 1e-3},
    (A, A): {A: 0.95, EOS: 1e-3}, (B, B): {B: 0.95, EOS: 1e-3},
}


def test_an_early_finished_hypothesis_wins_over_live_ones_that_went_on():
    s = Scripted(EARLY_WINNER, eos_elsewhere=1e-3)
    hyp = beam_search(s, ONE_SOURCE, bos_id=BOS, eos_id=EOS, pad_id=PAD, beam_size=2, alpha=0.6, max_len=8)
    assert hyp.tokens[0, :hyp.lengths[0]].tolist() == [EOS]
    assert s.calls > 1  # the live hypotheses were extended after [eos] finished


def test_early_stop_compares_the_lowest_finished_score_with_the_best_live_log_prob_over_lp_max():
    # After step 0: finished {[eos]: ln 0.9 = -0.105}; best live: ln 0.05 = -3.0. Bound: -3.0 / lp(max_len).
    table = {(): {EOS: 0.9, A: 0.05}}
    s = Scripted(table)
    beam_search(s, ONE_SOURCE, bos_id=BOS, eos_id=EOS, pad_id=PAD, beam_size=2, alpha=0.6, max_len=20)
    assert s.calls == 1, "the bound was met after the first step: the search must stop"
    # A finished score just below the bound keeps the search going, just above stops it (t2t: strictly greater).
    lp20 = ((5 + 20) / 6) ** 0.6
    for margin, stops in ((-1e-3, False), (1e-3, True)):
        live = 0.2  # a and the end symbol are the two best tokens; the fillers share the rest
        finished = math.exp(math.log(live) / lp20 + margin)  # its score (|Y| = 1, lp = 1) vs the bound
        s = Scripted({(): {EOS: finished, A: live}, (A,): {A: 0.999}}, eos_elsewhere=1e-9)
        beam_search(s, ONE_SOURCE, bos_id=BOS, eos_id=EOS, pad_id=PAD, beam_size=1, alpha=0.6, max_len=20)
        assert (s.calls == 1) == stops, (margin, s.calls)


def test_no_early_stop_before_a_hypothesis_finishes():
    s = Scripted({}, eos_elsewhere=0.0)
    beam_search(s, ONE_SOURCE, bos_id=BOS, eos_id=EOS, pad_id=PAD, beam_size=3, alpha=0.6, max_len=7)
    assert s.calls == 7


# -- maximum output length -----------------------------------------------------------------------------------------
def test_output_limits_count_each_sources_real_tokens():
    src = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0], [5, 0, 0, 0]])
    assert output_limits(src, PAD).tolist() == [54, 52, 51]
    assert output_limits(src, PAD, extra_length=300).tolist() == [304, 302, 301]
    assert output_limits(src, PAD, max_len=7).tolist() == [7, 7, 7]
    with pytest.raises(ValueError, match="max_len"):
        output_limits(src, PAD, max_len=-1)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_model_that_never_emits_eos_stops_at_src_len_plus_50(beam_size):
    src = torch.tensor([[5, 6, 7, 8, 9, 5], [5, 6, 7, 0, 0, 0], [5, 0, 0, 0, 0, 0]])
    s = Scripted({}, eos_elsewhere=0.0)
    hyp = generate(s, src, TRANSLATION.replace(beam_size=beam_size, bos_id=BOS, eos_id=EOS), pad_id=PAD)
    assert hyp.lengths.tolist() == [56, 53, 51] and not bool(hyp.finished.any())
    assert s.calls == 56 and hyp.tokens.shape == (3, 56)
    assert bool((hyp.tokens[1, 53:] == PAD).all()) and bool((hyp.tokens[1, :53] != PAD).all())


def test_the_parsing_preset_decodes_to_src_len_plus_300_with_beam_21():
    assert (PARSING.beam_size, PARSING.alpha, PARSING.extra_length) == (21, 0.3, 300)
    src = torch.tensor([[5, 6, 0]])
    s = Scripted({}, eos_elsewhere=0.0)
    hyp = generate(s, src, PARSING.replace(bos_id=BOS, eos_id=EOS), pad_id=PAD)
    assert hyp.lengths.tolist() == [302]


# -- batches ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("beam_size, alpha", [(1, 0.0), (4, 0.6), (3, 1.0)])
def test_a_batch_with_different_source_lengths_decodes_each_source_as_alone(beam_size, alpha):
    m = model(4)
    src = sources([7, 5, 3, 1], seed=4)
    cfg = DecodeConfig(beam_size=beam_size, alpha=alpha, bos_id=BOS, eos_id=7)
    together = generate(m, src, cfg, pad_id=PAD, max_len=12)
    for b in range(src.size(0)):
        n = int((src[b] != PAD).sum())
        alone = generate(m, src[b:b + 1, :n], cfg, pad_id=PAD, max_len=12)
        assert together.tokens[b, :together.lengths[b]].tolist() == alone.tokens[0, :alone.lengths[0]].tolist()
        assert together.scores[b].item() == pytest.approx(alone.scores[0].item(), abs=1e-5)


def test_greedy_stops_rows_at_eos_and_keeps_them_finished():
    table = {(): {A: 0.9}, (A,): {EOS: 0.9}, (B,): {B: 0.9}, (B, B): {B: 0.9}, (B, B, B): {B: 0.9}}
    s = Scripted(table, roots={6: {B: 0.9}})
    src = torch.tensor([[5, 6], [6, 0]])  # source 0: a, eos; source 1: b, b, b, b (to the limit)
    hyp = greedy_search(s, src, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=4)
    assert hyp.tokens.tolist() == [[A, EOS, PAD, PAD], [B, B, B, B]]
    assert hyp.lengths.tolist() == [2, 4] and hyp.finished.tolist() == [True, False]
    assert hyp.log_probs[0].item() == pytest.approx(2 * math.log(0.9), abs=1e-5)
    assert s.calls == 4


def test_padding_is_never_generated():
    class PadLover(Scripted):
        def decode_step(self, state, tokens):
            logp, state = super().decode_step(state, tokens)
            return logp.index_fill(1, torch.tensor([PAD]), 0.0), state  # the pad id scores best

    for beam in (1, 3):
        hyp = generate(PadLover({}), ONE_SOURCE, DecodeConfig(beam_size=beam, bos_id=BOS, eos_id=EOS), pad_id=PAD,
                       max_len=6)
        n = int(hyp.lengths[0])
        assert n >= 1 and PAD not in hyp.tokens[0, :n].tolist() and bool((hyp.tokens[0, n:] == PAD).all())


def test_prefix_decoding_recomputes_the_forward():
    class Recompute(PrefixDecoding, Transformer):
        pass

    m = model(5)
    r = Recompute(CFG).eval()
    r.load_reference_state(m.state_dict())
    src = sources([6, 2], seed=5)
    cfg = DecodeConfig(bos_id=BOS, eos_id=9)
    assert generate(r, src, cfg, pad_id=PAD, max_len=9).tokens.tolist() == \
        generate(m, src, cfg, pad_id=PAD, max_len=9).tokens.tolist()


def test_the_adapter_generate_returns_outputs_without_the_start_symbol():
    m, src = model(6), sources([5, 3], seed=6)
    out = m.generate(src, bos_id=BOS, eos_id=9, beam_size=4, alpha=0.6, max_len=7)
    hyp = beam_search(m, src, bos_id=BOS, eos_id=9, pad_id=PAD, max_len=7)
    assert torch.equal(out, hyp.tokens)


# -- the settings as data --------------------------------------------------------------------------------------
def test_decode_config_defaults_are_section_6_1():
    assert (TRANSLATION.beam_size, TRANSLATION.alpha, TRANSLATION.extra_length) == (4, 0.6, 50)
    assert set(DECODE_PRESETS) == {"translation", "parsing"} and decode_preset("parsing") is PARSING
    with pytest.raises(ValueError, match="unknown decoding preset 'beam'; accepted: translation, parsing"):
        decode_preset("beam")


@pytest.mark.parametrize("field, value, message", [
    ("beam_size", 0, "beam_size must be >= 1"), ("alpha", -0.1, "alpha must be a float >= 0"),
    ("extra_length", 1.5, "extra_length must be an int"), ("eos_id", True, "eos_id must be an int"),
])
def test_decode_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        DecodeConfig(**{field: value})


def test_decode_config_checks_its_ids_against_the_model():
    assert DecodeConfig().check_for(TINY) == DecodeConfig()
    with pytest.raises(ValueError, match="bos_id=0 is the padding id"):
        DecodeConfig(bos_id=0).check_for(TINY)
    with pytest.raises(ValueError, match=r"eos_id=40 is not a target token id \(tgt_vocab=37\)"):
        DecodeConfig(eos_id=40).check_for(TINY)


# -- cross-check with an independent transcription -------------------------------------------------------------
def _independent_class():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent / "independent_model.py"
    spec = importlib.util.spec_from_file_location("_independent_for_decoding", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Independent


@pytest.mark.parametrize("beam_size, alpha", [(1, 0.6), (4, 0.6), (4, 0.0), (3, 1.5), (21, 0.3)])
def test_the_batched_searches_agree_with_a_per_source_list_based_transcription(beam_size, alpha):
    """tests/independent_model.py decodes each source alone with Python lists (2K candidates, K alive, K
    finished kept aside, t2t's bound); the reference's batched tensors must choose the same outputs."""
    from aiayn_conformance.conformance.helpers.transplant import visible_state

    state = visible_state(CFG, seed=11, adjust=lambda n, t: t * 3 if "embed" in n or n.startswith("generator") else t)
    ref = Transformer(CFG).eval()
    ref.load_reference_state(state)
    ind = _independent_class()(CFG).eval()
    ind.load_reference_state(state)
    src = sources([6, 5, 4, 3, 2, 1], seed=7)
    for eos in (3, 9):
        kw = dict(bos_id=BOS, eos_id=eos, beam_size=beam_size, alpha=alpha, max_len=9)
        assert ref.generate(src, **kw).tolist() == ind.generate(src, **kw).tolist(), kw
