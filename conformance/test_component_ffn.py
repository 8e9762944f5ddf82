"""Feed-forward components alone (``--component``): Eq. (2) against the float64 closed form."""

from __future__ import annotations

import pytest
import torch

from spec.tolerance import compare

from . import oracles
from .harness import ImplementationError, violation

COMPONENT_KIND = "feed_forward"
D, D_FF = 8, 16


def build(component):
    try:
        module = component.factory(D, D_FF)
    except Exception as exc:
        raise ImplementationError(f"feed_forward component {component.name!r}: factory({D}, {D_FF}) raised "
                                  f"{type(exc).__name__}: {exc}") from exc
    shapes = {"w1.weight": (D_FF, D), "w1.bias": (D_FF,), "w2.weight": (D, D_FF), "w2.bias": (D,)}
    params = dict(module.named_parameters())
    for name, shape in shapes.items():
        if name not in params or tuple(params[name].shape) != shape:
            got = list(params[name].shape) if name in params else "missing"
            violation("ffn.formula", measured=f"parameter {name} is {got}", expected=f"{name} of shape {list(shape)}",
                      call=f"factory({D}, {D_FF})", hint="Eq. (2) has W1, b1, W2 and b2 (nn.Linear layout)")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, shape in shapes.items():
            params[name].copy_(torch.randn(shape, generator=g))
    return module.eval(), params


@pytest.mark.clause("ffn.formula")
def test_matches_equation_2(component):
    module, p = build(component)
    x = torch.randn(3, 4, D, generator=torch.Generator().manual_seed(1))
    try:
        with torch.no_grad():
            got = module(x)
    except Exception as exc:
        raise ImplementationError(f"[ffn.formula] module(x [3, 4, {D}]) raised {type(exc).__name__}: {exc}") from exc
    args = (x, p["w1.weight"], p["w1.bias"], p["w2.weight"], p["w2.bias"])
    cmp = compare(got, oracles.feed_forward(*args), dtype=torch.float32)
    if cmp.ok:
        return
    alternatives = {"GELU instead of ReLU": {"activation": "gelu"}, "no activation": {"activation": "identity"},
                    "a ReLU after W2 as well": {"after_w2": True}}
    named = [label for label, kw in alternatives.items()
             if compare(got, oracles.feed_forward(*args, **kw), dtype=torch.float32).ok]
    violation("ffn.formula", measured=cmp.describe() + (f"; the output matches {named[0]}" if named else ""),
              expected="max(0, x W1 + b1) W2 + b2", call=f"factory({D}, {D_FF})(x [3, 4, {D}]) with random weights",
              hint="one ReLU between the two affine maps, none after W2")
