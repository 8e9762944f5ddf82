"""ffn.formula (§3.3, Eq. 2): max(0, x W1 + b1) W2 + b2, probed in closed form on the last decoder layer."""

from __future__ import annotations

import pytest

from . import readout as ro
from .harness import violation

NAMES = {"gelu": "GELU instead of ReLU", "identity": "no activation", "relu-after-w2": "a ReLU after W2 as well"}


@pytest.mark.clause("ffn.formula")
def test_feed_forward_matches_equation_2(impl):
    matches, why = ro.last_sublayer_diagnosis(impl)
    if why:
        pytest.skip(why)
    if not matches:
        pytest.skip("the last decoder sub-layer matches no closed-form candidate: blocked by the norm clauses")
    if all(act != "relu" for act, _, _ in matches):
        violation("ffn.formula", measured=f"the feed-forward sub-layer computes {NAMES[matches[0][0]]}",
                  expected="max(0, x W1 + b1) W2 + b2",
                  call="forward after load_reference_state with the last norm2 gain 0 (the FFN input is its bias), "
                       "hidden state read back", hint="one ReLU between the two affine maps and none after W2")
