"""Diagnosis when deviations stack, and witnesses that do not depend on a model's own initialisation.

The suite-level proof is tests/test_broken_models.py (each broken model fails exactly its clauses); these tests
pin what the messages say: the chain of substitutions, the scale a mask witness ran at, the diagonal named
when it shows as NaN, and why the mask witnesses run on transplanted weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conformance import test_mask
from conformance.diagnosis import diagnosis_of, explanation
from conformance.harness import ClauseViolation, build_model, checking
from conformance.inputs import CONFIG, random_tokens
from conformance.transplant import OWN_SCALE, SHARP, sharp_or_own, transplanted
from implementations import Implementation, get_registry
from reference.model import Transformer, padding_mask

BROKEN_PLUGIN = Path(__file__).resolve().parent / "broken_models.py"


@pytest.fixture(scope="module")
def registry():
    return get_registry([str(BROKEN_PLUGIN)])


def broken(registry, name: str) -> Implementation:
    return registry.select(f"broken-{name}")[0]


def test_the_chain_of_substitutions_is_reported(registry):
    """An offset table no variant names, an extra embedding norm and attention biases: after substituting the
    implementation's own table, the extra norm is named (and nothing else)."""
    with checking("model.reference-equivalence"):
        diag = diagnosis_of(broken(registry, "offset-table-embed-norm-biases"))
    assert diag.exact and diag.knobs.departures() == {"embed_norm": "yes"}
    said = explanation(diag)
    assert said.startswith("after substituting its own positional table (positional_encoding(length)), the "
                           "remaining difference is explained by: an extra LayerNorm right after embedding + PE"), said


def test_a_norm_without_bias_is_not_an_extra_norm(registry):
    with checking("norm.layer-norm"):
        diag = diagnosis_of(broken(registry, "gain-only-norms"))
    assert diag.exact and diag.knobs.departures() == {"ln_bias": "none"}, explanation(diag)


def test_the_substitution_is_not_taken_for_a_named_table(registry):
    """A table of a named form (positions from 1) is a variant: no substitution, the form is named."""
    with checking("model.reference-equivalence"):
        diag = diagnosis_of(broken(registry, "pe-from-one"))
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
        model, weights = sharp_or_own(impl, build_model(impl, CONFIG))
        assert weights == OWN_SCALE
        src = random_tokens(CONFIG, [7, 4], 7, vocab=CONFIG.src_vocab, seed=3)
        tgt = random_tokens(CONFIG, [6, 6], 6, vocab=CONFIG.tgt_vocab, seed=4)
        with pytest.raises(ClauseViolation, match="ran at the model's own scale"):
            test_mask.check_causal(model, impl, src, tgt, 2, weights)


def test_the_causal_witness_needs_sharp_weights(registry):
    """The causal mask dropped after the first decoder layer, std-0.02 initialisation: at the model's own scale the
    witness cannot see the leak (what the suite did before it transplanted); on sharp weights it fails."""
    impl = broken(registry, "causal-first-layer-only")
    src = random_tokens(CONFIG, [7, 4], 7, vocab=CONFIG.src_vocab, seed=3)
    tgt = random_tokens(CONFIG, [6, 6], 6, vocab=CONFIG.tgt_vocab, seed=4)
    with checking("mask.causal"):
        own = build_model(impl, CONFIG)
        for j in (2, 5):
            test_mask.check_causal(own, impl, src, tgt, j)  # passes: the leak is below the tolerance
        model, weights = sharp_or_own(impl, own)
        assert weights == SHARP and model is transplanted(impl)
        with pytest.raises(ClauseViolation, match="outputs before position 5 changed"):
            test_mask.check_causal(model, impl, src, tgt, 5, weights)


class StrictCausalNoGuard(Transformer):
    """B08 with B04: the diagonal masked with -inf and no guard, so position 0 has no key and becomes NaN."""

    def __init__(self, config):
        super().__init__(config, attention=self.attend)

    @staticmethod
    def attend(q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    def decode(self, memory, src_mask, tgt):
        T = tgt.size(1)
        strict = torch.ones(T, T, dtype=torch.bool, device=tgt.device).tril(-1)
        y = self.embed(tgt, self.tgt_embed)
        for layer in self.decoder:
            y = layer(y, memory, src_mask, strict & padding_mask(tgt, self.config.pad_id))
        return y


def test_a_diagonal_masked_into_nan_is_named():
    impl = Implementation(name="strict-causal-nan", build=StrictCausalNoGuard, output="logits")
    with checking("mask.causal"), pytest.raises(ClauseViolation, match="diagonal") as caught:
        test_mask.test_position_zero_attends_to_itself(impl)
    assert "non-finite" in str(caught.value) and "no admissible key" in str(caught.value)
