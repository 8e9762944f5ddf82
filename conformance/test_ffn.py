"""The position-wise feed-forward network (§3.3, Eq. 2): max(0, x W1 + b1) W2 + b2 (ffn.formula).

Three techniques, one room: variant attribution (``conformance.helpers.variants``), a readout probe of the last
decoder layer in closed form (``conformance.helpers.readout_probes``), and feed-forward components alone
(``--component``, kind ``feed_forward``) against the float64 closed form.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from aiayn_conformance.implementations import Component, Implementation
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.tolerance import compare

from .helpers import oracles
from .helpers import readout_probes as ro
from .helpers.components import from_factory
from .helpers.diagnosis import fail_on_variant_departure
from .helpers.harness import CheckTimeout, could_not_check, violation

NAMES = {"gelu": "GELU instead of ReLU", "identity": "no activation", "relu-after-w2": "a ReLU after W2 as well"}


@pytest.mark.clause("ffn.formula")
def test_ffn_variant(impl: Implementation, config: ModelConfig) -> None:
    """§3.3, Eq. (2): ReLU between the two affine maps, and nowhere else."""
    fail_on_variant_departure(
        impl, config, hint="nn.Sequential(Linear, ReLU, Linear): not GELU, not a missing activation, not ReLU after "
                           "the "
                   "second Linear")


@pytest.mark.clause("ffn.formula")
def test_feed_forward_matches_equation_2(impl: Implementation, config: ModelConfig) -> None:
    """The last decoder layer's FFN in closed form: with its norm2 at gain 0 the FFN's input is norm2's bias."""
    matches, why = ro.last_sublayer_diagnosis(impl, config)
    if why:
        pytest.skip(why)
    if not matches:
        pytest.skip("the last decoder sub-layer matches no closed-form candidate: blocked by the norm clauses")
    if all(act != "relu" for act, _, _ in matches):
        violation(measured=f"the feed-forward sub-layer computes {NAMES[matches[0][0]]}",
                  expected="max(0, x W1 + b1) W2 + b2",
                  call="forward after load_reference_state with the last norm2 gain 0 (the FFN input is its bias), "
                       "hidden state read back", hint="one ReLU between the two affine maps and none after W2")


@pytest.mark.clause("ffn.formula")
def test_negative_pre_activations_contribute_nothing(impl: Implementation, config: ModelConfig) -> None:
    """max(0, x) is 0 for every x < 0: with the last decoder FFN's pre-activations all negative, making them three
    times as negative must not move the output. An activation that agrees with ReLU on positive inputs only (leaky
    ReLU, ELU) passes every probe that feeds it positive values and fails here."""
    probe = ro.negative_side_probe(impl, config)
    if probe is None:
        pytest.skip(f"{impl.name}: the hidden state cannot be read back (needs load_reference_state and tied E)")
    moved, noise, size = probe
    if noise > 1e-7 * (1 + size):  # the read-back's own float64 rounding aside
        pytest.skip(f"blocked by model.eval-determinism: two identical eval-mode calls differ by {noise:.3g}")
    if moved > 1e-5 * (1 + size):
        lo, hi = ro.NEGATIVE_SIDES
        violation(measured=f"the decoder's output hidden state moved by up to {moved:.3g} (|h| up to {size:.3g}) "
                           f"when the last decoder FFN's pre-activations went from -{lo:g} r to -{hi:g} r",
                  expected="no change at all: max(0, x) = 0 for both, so the FFN outputs its bias b2 either way",
                  call=f"forward after load_reference_state(visible weights) with {ro.last_layer(config)}.ffn.w1 "
                       f"weight 0 and bias -{lo:g} r, then -{hi:g} r (r ~ U(0.5, 1.5) per hidden unit); hidden state "
                       "read back through the tied output matrix",
                  hint="the activation lets negative inputs through (leaky ReLU, ELU, GELU, or none): Eq. (2) is "
                       "max(0, x W1 + b1) W2 + b2, torch.relu")


# --------------------------------------------------------------------------------------------------
# Feed-forward components alone (--component, kind feed_forward)
# --------------------------------------------------------------------------------------------------
D, D_FF = 8, 16


def ffn_module(component: Component) -> tuple[Any, dict[str, torch.Tensor]]:
    """(the component's FFN for (D, D_FF) in eval mode with random weights, its parameters); fails ffn.formula
    when W1, b1, W2, b2 are not there in the nn.Linear layout."""
    module = from_factory(component, D, D_FF)
    shapes = {"w1.weight": (D_FF, D), "w1.bias": (D_FF,), "w2.weight": (D, D_FF), "w2.bias": (D,)}
    params = dict(module.named_parameters())
    for name, shape in shapes.items():
        if name not in params or tuple(params[name].shape) != shape:
            got = list(params[name].shape) if name in params else "missing"
            violation(measured=f"parameter {name} is {got}", expected=f"{name} of shape {list(shape)}",
                      call=f"factory({D}, {D_FF})", hint="Eq. (2) has W1, b1, W2 and b2 (nn.Linear layout)")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, shape in shapes.items():
            params[name].copy_(torch.randn(shape, generator=g))
    return module.eval(), params


@pytest.mark.clause("ffn.formula")
@pytest.mark.component_kind("feed_forward")
def test_ffn_component_matches_equation_2(component: Component) -> None:
    module, p = ffn_module(component)
    x = torch.randn(3, 4, D, generator=torch.Generator().manual_seed(1))
    try:
        with torch.no_grad():
            got = module(x)
    except CheckTimeout:
        raise
    except Exception as exc:
        could_not_check(f"module(x [3, 4, {D}]) raised", exc)
    args = (x, p["w1.weight"], p["w1.bias"], p["w2.weight"], p["w2.bias"])
    cmp = compare(got, oracles.feed_forward(*args), dtype=torch.float32)
    if cmp.ok:
        return
    alternatives: dict[str, dict[str, Any]] = {
        "GELU instead of ReLU": {"activation": "gelu"}, "no activation": {"activation": "identity"},
        "a ReLU after W2 as well": {"after_w2": True}}
    named = [label for label, kw in alternatives.items()
             if compare(got, oracles.feed_forward(*args, **kw), dtype=torch.float32).ok]
    violation(measured=cmp.describe() + (f"; the output matches {named[0]}" if named else ""),
              expected="max(0, x W1 + b1) W2 + b2", call=f"factory({D}, {D_FF})(x [3, 4, {D}]) with random weights",
              hint="one ReLU between the two affine maps, none after W2")
