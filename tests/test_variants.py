"""The reference variants of conformance/helpers/variants.py: the paper's variant is the reference model, and each
departure computes something else (a knob that changes nothing could never explain an implementation)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from aiayn_conformance.conformance.helpers.inputs import witness_batch
from aiayn_conformance.conformance.helpers.transplant import reference_twin, visible_state
from aiayn_conformance.conformance.helpers.variants import KNOBS, Knobs, run_variant
from aiayn_conformance.spec.config import TINY as CONFIG


@pytest.fixture(scope="module")
def state():
    return visible_state(CONFIG, seed=11)


@pytest.fixture(scope="module")
def paper(state):
    return run_variant(Knobs(), state, CONFIG, *witness_batch(CONFIG))


def test_the_paper_variant_is_the_reference(state):
    src, tgt = witness_batch(CONFIG)
    logp, enc = run_variant(Knobs(), state, CONFIG, src, tgt)
    ref = reference_twin(CONFIG, state)
    with torch.no_grad():
        expected = torch.log_softmax(ref(src, tgt).double(), dim=-1)
        expected_enc = ref.encode(src).double()
    real = (tgt != CONFIG.pad_id)[..., None]
    torch.testing.assert_close(torch.where(real, logp, 0.0), torch.where(real, expected, 0.0), rtol=1e-4, atol=1e-4)
    real_s = (src != CONFIG.pad_id)[..., None]
    torch.testing.assert_close(torch.where(real_s, enc, 0.0), torch.where(real_s, expected_enc, 0.0),
                               rtol=1e-4, atol=1e-4)
    assert Knobs().departures() == {} and Knobs().describe() == "the paper's model"


@pytest.mark.parametrize("knob, value", [(k, v) for k, knob in KNOBS.items() for v in list(knob.values)[1:]])
def test_every_departure_changes_the_output(state, paper, knob, value):
    src, tgt = witness_batch(CONFIG)
    paper, paper_enc = paper
    variant = dataclasses.replace(Knobs(), **{knob: value})
    logp, enc = run_variant(variant, state, CONFIG, src, tgt)
    real, real_s = (tgt != CONFIG.pad_id)[..., None], (src != CONFIG.pad_id)[..., None]
    moved = max((torch.where(real, logp - paper, 0.0)).abs().max().item(),
                (torch.where(real_s, enc - paper_enc, 0.0)).abs().max().item())
    assert moved > 1e-6, f"{knob}={value} ({KNOBS[knob].values[value]}) computes the paper's model"
    assert variant.departures() == {knob: value}
