"""Diagnosis when deviations stack, and witnesses that do not depend on a model's own initialisation.

The suite-level proof is tests/test_broken_models.py (each broken model fails exactly its clauses); these tests
pin what the messages say: the chain of substitutions, the scale a mask witness ran at, the diagonal named
when it shows as NaN, and why the mask witnesses run on transplanted weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn_conformance.conformance import test_attention, test_mask, test_norm, test_position
from aiayn_conformance.conformance.helpers.diagnosis import diagnosis_of, explanation, fail_on_variant_departure
from aiayn_conformance.conformance.helpers.harness import ClauseViolation, build_model, checking
from aiayn_conformance.conformance.helpers.inputs import WITNESS_BATCHES, WITNESS_LENGTHS, WITNESS_SHAPE, random_tokens
from aiayn_conformance.conformance.helpers.settings import AuditSettings
from aiayn_conformance.conformance.helpers.shapes import under_test
from aiayn_conformance.conformance.helpers.transplant import (
    OWN_SCALE,
    SHARP,
    STATE_SEED,
    sharp_or_own,
    transplanted,
    visible_state,
)
from aiayn_conformance.conformance.helpers.variants import (
    IMPROVEMENT,
    KNOBS,
    MAX_VARIANTS,
    Diagnosis,
    Knobs,
    Parts,
    _helpers,
    _moves,
    diagnose,
    run_variant,
)
from aiayn_conformance.implementations import Implementation, get_registry
from aiayn_conformance.reference.model import Transformer, padding_mask
from aiayn_conformance.spec.config import TINY as CONFIG

BROKEN_PLUGIN = Path(__file__).resolve().parent / "broken_models.py"


@pytest.fixture(scope="module")
def registry():
    return get_registry([str(BROKEN_PLUGIN)])


def broken(registry, name: str) -> Implementation:
    return registry.select(f"broken-{name}")[0]


def test_the_chain_of_substitutions_is_reported(registry):
    """An offset table no variant names, an extra embedding norm and attention biases: after substituting the
    implementation's own table, the extra norm is named (and nothing else)."""
    impl = broken(registry, "offset-table-embed-norm-biases")
    with checking("model.reference-equivalence"):
        diag = diagnosis_of(impl, CONFIG)
    assert diag.exact and diag.knobs.departures() == {"embed_norm": "yes"}
    said = explanation(diag)
    assert said.startswith("after substituting its own positional table (positional_encoding(length)), the "
                           "remaining difference is explained by: an extra LayerNorm right after embedding + PE"), said
    with checking("norm.no-extra-norm"), pytest.raises(ClauseViolation) as caught:
        test_norm.test_no_extra_norm_variant(impl, CONFIG)
    assert "hint:     a LayerNorm right after embedding + PE is not in the paper" in str(caught.value)
    assert "final LayerNorm" not in str(caught.value)  # only the departing knob's hint
    with checking("position.formula"), pytest.raises(ClauseViolation) as caught:
        test_position.test_table_matches_section_3_5(impl, "audit", AuditSettings())
    assert "positions offset by 2" in str(caught.value) and "count positions from 0" in str(caught.value)


def test_a_norm_without_bias_is_not_an_extra_norm(registry):
    with checking("norm.layer-norm"):
        diag = diagnosis_of(broken(registry, "gain-only-norms"), CONFIG)
    assert diag.exact and diag.knobs.departures() == {"ln_bias": "none"}, explanation(diag)


def test_the_substitution_is_not_taken_for_a_named_table(registry):
    """A table of a named form (positions from 1) is a variant: no substitution, the form is named."""
    with checking("model.reference-equivalence"):
        diag = diagnosis_of(broken(registry, "pe-from-one"), CONFIG)
    assert diag.substituted == () and diag.knobs.departures() == {"pe_form": "positions-from-1"}


class NoCausalMaskNoLoad(Transformer):
    """No causal mask, and an adapter without load_reference_state."""

    load_reference_state = None  # type: ignore[assignment]

    def decode(self, memory, src_mask, tgt):
        y = self.embed(tgt, self.tgt_embed)
        for layer in self.decoder:
            y = layer(y, memory, src_mask, padding_mask(tgt, self.config.pad_id))
        return y


def test_a_mask_witness_says_it_ran_at_the_model_s_own_scale():
    impl = Implementation(name="no-causal-no-load", build=NoCausalMaskNoLoad, output="logits")
    with checking("mask.causal"):
        model, weights = sharp_or_own(impl, build_model(impl, CONFIG), CONFIG)
        assert weights == OWN_SCALE
        src = random_tokens(CONFIG, [7, 4], 7, vocab=CONFIG.src_vocab, seed=3)
        tgt = random_tokens(CONFIG, [6, 6], 6, vocab=CONFIG.tgt_vocab, seed=4)
        with pytest.raises(ClauseViolation, match="ran at the model's own scale"):
            test_mask.check_causal(model, impl, CONFIG, src, tgt, 2, weights)


def test_the_causal_witness_needs_sharp_weights(registry):
    """The causal mask dropped after the first decoder layer, std-0.02 initialisation: at the model's own scale the
    witness cannot see the leak (what the suite did before it transplanted); on sharp weights it fails."""
    impl = broken(registry, "causal-first-layer-only")
    src = random_tokens(CONFIG, [7, 4], 7, vocab=CONFIG.src_vocab, seed=3)
    tgt = random_tokens(CONFIG, [6, 6], 6, vocab=CONFIG.tgt_vocab, seed=4)
    with checking("mask.causal"):
        own = build_model(impl, CONFIG)
        for j in (2, 5):
            test_mask.check_causal(own, impl, CONFIG, src, tgt, j)  # passes: the leak is below the tolerance
        model, weights = sharp_or_own(impl, own, CONFIG)
        assert weights == SHARP and model is transplanted(impl, CONFIG)
        with pytest.raises(ClauseViolation, match="outputs before position 5 changed"):
            test_mask.check_causal(model, impl, CONFIG, src, tgt, 5, weights)


class StrictCausal(Transformer):
    """B08: a causal mask without the diagonal (position i attends to 0..i-1)."""

    def decode(self, memory, src_mask, tgt):
        T = tgt.size(1)
        strict = torch.ones(T, T, dtype=torch.bool, device=tgt.device).tril(-1)
        y = self.embed(tgt, self.tgt_embed)
        for layer in self.decoder:
            y = layer(y, memory, src_mask, strict & padding_mask(tgt, self.config.pad_id))
        return y


class StrictCausalNoGuard(StrictCausal):
    """B08 with B04: the diagonal masked with -inf and no guard, so position 0 has no key and becomes NaN."""

    def __init__(self, config):
        super().__init__(config, attention=self.attend)

    @staticmethod
    def attend(q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


def test_a_diagonal_masked_into_nan_is_named():
    impl = Implementation(name="strict-causal-nan", build=StrictCausalNoGuard, output="logits")
    with checking("mask.causal"), pytest.raises(ClauseViolation, match="diagonal") as caught:
        test_mask.test_position_zero_attends_to_itself(impl, CONFIG)
    assert "non-finite" in str(caught.value) and "no admissible key" in str(caught.value)


class OddEncoderStrictCausal(StrictCausal):
    """An encoder output no variant names (scaled by 1.5 and shifted) and a causal mask without the diagonal."""

    def encode(self, src, src_mask=None):
        return 1.5 * super().encode(src, src_mask) + 0.1


def test_the_decoder_is_diagnosed_on_the_implementation_s_own_encoder_output():
    """No variant reproduces the encoder; with its own encode(src) substituted, the decoder's diagonal-free causal
    mask is named under mask.causal, and a clause of the encoder's part is skipped, not cleared."""
    impl = Implementation(name="odd-encoder-strict-causal", build=OddEncoderStrictCausal, output="logits")
    with checking("mask.causal"):
        diag = diagnosis_of(impl, CONFIG)
        assert diag.exact and set(diag.knobs.departures()) == {"causal"}, explanation(diag)
        assert explanation(diag).startswith("after substituting its own encoder output (encode(src))")
        with pytest.raises(ClauseViolation, match="diagonal excluded"):
            fail_on_variant_departure(impl, CONFIG, hint="keep the diagonal")
    with checking("norm.post-norm"), pytest.raises(pytest.skip.Exception, match="no variant"):
        fail_on_variant_departure(impl, CONFIG, hint="")


# -- the diagnosis names only what it shows --------------------------------------------------------------
def test_a_stacked_model_no_variant_explains_is_unexplained_and_names_no_departure(registry):
    """A learned table (not exposed) and unscaled embeddings: no variant reproduces it. The diagnosis says so, with how
    far the plain reference is off, and attributes nothing: every variant-attributed clause skips with one short
    line that points at model.reference-equivalence, where the search is reported once."""
    impl = broken(registry, "learned-positions-unscaled")
    with checking("model.reference-equivalence"):
        diag = diagnosis_of(impl, CONFIG)
    said = explanation(diag)
    assert not diag.exact and diag.knobs.departures() == {}, said
    assert said.startswith("unexplained: off by max |diff| = ") and f"after {diag.tried} variants" in said, said
    assert f"(mean |diff| {diag.baseline:.3g})" in said, said  # the plain reference's distance, not a variant's
    assert diag.tried <= MAX_VARIANTS + 2 * sum(len(k.values) for k in KNOBS.values())  # the search is bounded
    skips = []
    for clause, check in (("attention.scale", test_attention.test_scale_variant),
                          ("mask.causal", test_mask.test_causal_variant),
                          ("norm.post-norm", test_norm.test_post_norm_variant)):
        with checking(clause), pytest.raises(pytest.skip.Exception) as skipped:
            check(impl, CONFIG)
        skips.append(str(skipped.value))
        assert skips[-1].startswith("blocked by model.reference-equivalence") and clause in skips[-1]
        assert "unexplained" not in skips[-1] and len(skips[-1]) < 260, skips[-1]  # the search is not repeated


def test_a_decoder_with_its_own_table_is_not_called_encoder_only(registry):
    impl = broken(registry, "decoder-own-table")
    with checking("position.added"):
        diag = diagnosis_of(impl, CONFIG)
        assert diag.departures_for("position.added") == {}, explanation(diag)
        assert "encoder input only" not in explanation(diag).split("on their own")[0]
        with pytest.raises(pytest.skip.Exception, match="blocked by model.reference-equivalence"):
            test_position.test_position_added_variant(impl, CONFIG)


def test_a_shape_limited_unscaled_model_is_diagnosed_with_its_one_departure(registry):
    """Position ids for length 5 only and unscaled embeddings, a correct causal mask: at the accepted shapes the
    diagnosis names the embedding scale and nothing else (no diagonal-free causal mask)."""
    impl = broken(registry, "fixed-length-unscaled")
    with under_test(impl, CONFIG, lengths=WITNESS_LENGTHS, batches=WITNESS_BATCHES, witness=WITNESS_SHAPE):
        with checking("mask.causal"):
            diag = diagnosis_of(impl, CONFIG)
            assert diag.exact and diag.knobs.departures() == {"embed_scale": "1"}, explanation(diag)
            fail_on_variant_departure(impl, CONFIG, hint="")  # mask.causal: nothing to say
        with checking("embedding.scale"), pytest.raises(ClauseViolation, match="embeddings not scaled"):
            fail_on_variant_departure(impl, CONFIG, hint="")


def test_a_departure_the_match_holds_without_is_dropped():
    """Started from a variant with a departure the witness cannot see (no source mask in cross-attention, on a source
    without padding) next to the real one, the search reports the real one alone: each part reported is needed."""
    state = visible_state(CONFIG, seed=STATE_SEED)
    src = random_tokens(CONFIG, [6, 6], 6, vocab=CONFIG.src_vocab, seed=3)
    tgt = random_tokens(CONFIG, [5, 4], 5, vocab=CONFIG.tgt_vocab, seed=4)
    truth = Knobs(embed_scale="1")

    def observe(s, t):
        return run_variant(truth, state, CONFIG, s, t)[0], None

    diag = diagnose(observe, state, CONFIG, src, tgt, start=Knobs(embed_scale="1", cross_mask="no"))
    assert diag.exact and diag.knobs == truth, diag.knobs.describe()


def test_an_unexplained_model_lists_only_departures_that_helped_on_their_own():
    """Output scrambled by a fixed permutation of the vocabulary: no variant helps, and none is listed."""
    state = visible_state(CONFIG, seed=STATE_SEED)
    src = random_tokens(CONFIG, [6, 6], 6, vocab=CONFIG.src_vocab, seed=3)
    tgt = random_tokens(CONFIG, [5, 4], 5, vocab=CONFIG.tgt_vocab, seed=4)
    perm = torch.randperm(CONFIG.tgt_vocab, generator=torch.Generator().manual_seed(0))

    def observe(s, t):
        return run_variant(Knobs(), state, CONFIG, s, t)[0][..., perm], None

    diag = diagnose(observe, state, CONFIG, src, tgt, max_variants=80)
    assert not diag.exact and diag.knobs == Knobs() and diag.tried <= 80 + len(KNOBS) * 5
    assert all("instead of" in h for h in diag.helped)
    assert diag.distance == diag.baseline


def test_an_unexplained_model_lists_only_departures_that_remove_most_of_the_difference():
    """A single departure is listed beside an unexplained model only when on its own it removes most of the
    difference (more than IMPROVEMENT, half, of the mean |diff|), the one removing the most first: one that removes
    15% or 45% is no finding, and the list reads as measurements, not attributions."""
    moves = _moves(Knobs(), Parts())
    removed = {moves[0]: 0.15, moves[1]: 0.55, moves[2]: 0.45, moves[3]: 0.8}
    baseline = 2.0

    def measure(knobs):
        return baseline * (1 - removed.get(knobs, 0.0)), False, ""

    helped = _helpers(measure, Parts(), baseline)
    assert IMPROVEMENT == 0.5
    assert [h.split(" (removes")[0] for h in helped] == [moves[3].describe(), moves[1].describe()], helped
    assert helped[0].endswith("(removes 80%: mean |diff| 0.4 instead of 2)"), helped
    diag = Diagnosis(Knobs(), exact=False, distance=baseline, detail="max |diff| = 3; ...", tried=9,
                     baseline=baseline, helped=helped)
    said = explanation(diag)
    assert ("single departures that each remove most of the difference (more than 50% of the mean |diff|) on their "
            "own, the one removing the most first (measurements, not attributions): ") in said, said
    diag.helped = ()
    assert explanation(diag).endswith("; no single departure removes most of the difference (more than 50% of the "
                                      "mean |diff|) on its own"), explanation(diag)
