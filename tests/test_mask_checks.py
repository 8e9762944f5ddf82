"""The mask checks at extreme scores (conformance/test_mask.py): their tolerance follows float32's rounding at the
scores they reach and the model's d_k, and stays far below what a finite mask fill does."""

from __future__ import annotations

import pytest
import torch

from aiayn_conformance.conformance.test_mask import extreme_tolerance
from aiayn_conformance.spec.config import TINY, ModelConfig
from aiayn_conformance.spec.tolerance import tolerance


@pytest.mark.parametrize("config, atol", [
    (TINY, 0.0169),  # d_k = 8
    (ModelConfig(), 0.0477),  # Table 3's base: d_k = 64
    (ModelConfig(d_model=1024, n_heads=16, d_ff=4096), 0.0477),  # big: d_k = 64
])
def test_the_extreme_score_tolerance_is_float32_rounding_at_1e5_for_the_models_d_k(config, atol):
    tol = extreme_tolerance(config)
    assert tol.atol == pytest.approx(atol, abs=1e-4)
    assert tol.rtol == tolerance(torch.float32, scope="model").rtol  # only the absolute part is widened


def test_it_is_never_tighter_than_the_policy_and_stays_below_a_finite_fills_effect():
    policy = tolerance(torch.float32, scope="model")
    for h in (1, 2, 4, 8, 16, 32):
        tol = extreme_tolerance(ModelConfig(d_model=512, n_heads=h))
        assert policy.atol <= tol.atol
    # the smallest effect of a finite fill measured at the suite's sizes (fill-1e-9, one appended source pad): 0.0695
    assert extreme_tolerance(TINY).atol < 0.0695 / 4
