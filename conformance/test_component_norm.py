"""Layer-norm components alone (``--component``): §3.1 against the float64 closed form."""

from __future__ import annotations

import pytest
import torch

from spec.tolerance import compare

from . import oracles
from .harness import ImplementationError, violation

COMPONENT_KIND = "layer_norm"
D, EPS = 16, 1e-6


def build(component, d_model: int = D, eps: float = EPS, seed: int = 0, clause: str = "norm.layer-norm"):
    try:
        module = component.factory(d_model, eps)
    except Exception as exc:
        raise ImplementationError(f"layer_norm component {component.name!r}: factory({d_model}, {eps}) raised "
                                  f"{type(exc).__name__}: {exc}") from exc
    for name in ("weight", "bias"):
        p = getattr(module, name, None)
        if not isinstance(p, torch.Tensor) or tuple(p.shape) != (d_model,):
            got = list(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
            if clause != "norm.layer-norm":
                pytest.skip(f"blocked by norm.layer-norm: parameter {name!r} is {got}, not per-feature")
            violation("norm.layer-norm", measured=f"parameter {name!r} is {got}",
                      expected=f"a per-feature {name} of shape [{d_model}]",
                      call=f"factory({d_model}, {eps})", hint="the gain and bias are per feature, not scalars")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        module.weight.copy_(torch.rand(d_model, generator=g) + 0.5)
        module.bias.copy_(torch.rand(d_model, generator=g) - 0.5)
    return module.eval()


def run(module, x: torch.Tensor) -> torch.Tensor:
    try:
        with torch.no_grad():
            return module(x)
    except Exception as exc:
        raise ImplementationError(
            f"[norm.layer-norm] module(x {list(x.shape)}) raised {type(exc).__name__}: {exc}") from exc


@pytest.mark.clause("norm.layer-norm")
def test_matches_the_closed_form(component):
    module = build(component)
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1)) * 3 + 1
    got = run(module, x)
    cmp = compare(got, oracles.layer_norm(x, module.weight, module.bias, EPS), dtype=torch.float32)
    if not cmp.ok:
        unbiased = oracles.layer_norm(x, module.weight, module.bias, EPS, form="unbiased-std")
        hint = ("(x - mean) / (unbiased std + eps): use the biased variance"
                if compare(got, unbiased, dtype=torch.float32).ok else "normalize over the last (feature) axis")
        violation("norm.layer-norm", measured=cmp.describe(),
                  expected="(x - mean) / sqrt(biased var + eps) * weight + bias over the d_model features",
                  call=f"factory({D}, {EPS})(x [2, 5, {D}])", hint=hint)


@pytest.mark.clause("norm.epsilon")
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_uses_the_given_eps(component, eps):
    """Rows of variance 1e-6 separate eps = 1e-6 from 1e-5 by a factor sqrt(2) vs sqrt(11)."""
    module = build(component, eps=eps, clause="norm.epsilon")
    with torch.no_grad():
        module.weight.fill_(1.0)
        module.bias.zero_()
    x = torch.tensor([[1.0, -1.0] * (D // 2)]) * 1e-3  # variance 1e-6
    got = run(module, x)
    expected = oracles.layer_norm(x, module.weight, module.bias, eps)
    cmp = compare(got, expected, dtype=torch.float32)
    if not cmp.ok:
        ratio = got.abs().max().item() * 1e-3
        used = 1e-6 / max(ratio**2, 1e-30) - 1e-6
        violation("norm.epsilon", measured=f"{cmp.describe()}; output scale implies eps ~ {used:.2g}",
                  expected=f"eps = {eps:g} inside the square root, as passed to the factory",
                  call=f"factory({D}, {eps})(x with variance 1e-6)",
                  hint="pass the configured eps through, inside the square root (PyTorch's default is 1e-5, "
                       "tensor2tensor's 1e-6; the paper gives none)")
