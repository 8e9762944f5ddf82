"""config.parameters (§3, Table 3): parameter shapes and counts against the canonical schema."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from aiayn_conformance.implementations import Implementation
from aiayn_conformance.spec.config import BASE, TINY, ModelConfig
from aiayn_conformance.spec.schema import parameter_count, parameter_schema, tied_groups

from .helpers.harness import build_for_shapes, build_model, violation
from .helpers.settings import AuditSettings, others_for

TABLE_3_BASE = 65e6


def distinct_parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for p in model.parameters():
        seen.setdefault(id(p), p)
    return list(seen.values())


def schema_shapes(config: ModelConfig) -> Counter[tuple[int, ...]]:
    """Shapes of the schema's distinct tensors (tied names counted once)."""
    tied = {name for group in tied_groups(config) for name in group[1:]}
    return Counter(shape for name, shape in parameter_schema(config).items() if name not in tied)


def ignored_d_ff(impl: Implementation, params: list[torch.Tensor], config: ModelConfig) -> str:
    """"; d_ff=N requested, the model's FFN is W wide whatever d_ff says" when the implementation built at another
    d_ff has the very same parameter shapes (the width read from its [W, d_model] / [d_model, W] pairs), else ""."""
    other = config.replace(d_ff=2 * config.d_ff)
    try:
        shapes = Counter(tuple(p.shape) for p in distinct_parameters(build_model(impl, other)))
    except Exception:
        return ""
    if shapes != Counter(tuple(p.shape) for p in params):
        return ""
    d = config.d_model
    widths = [s[0] for s in shapes if len(s) == 2 and s[1] == d and (d, s[0]) in shapes and s[0] > 3 * d]
    width = f"{max(widths)} wide" if widths else "the same size"
    return f"; d_ff={config.d_ff} requested, the model's FFN is {width} whatever d_ff says (built at d_ff=" \
           f"{other.d_ff} too: the same shapes)"


@pytest.mark.clause("config.parameters")
def test_parameter_count_matches_the_schema(impl: Implementation, config: ModelConfig) -> None:
    model = build_model(impl, config)
    params = distinct_parameters(model)
    got = sum(p.numel() for p in params)
    expected = parameter_count(config)
    if got != expected:
        extra = Counter(tuple(p.shape) for p in params) - schema_shapes(config)
        missing = schema_shapes(config) - Counter(tuple(p.shape) for p in params)
        violation(measured=f"{got:,} parameters ({got - expected:+,} against the schema); shapes beyond the "
                  f"schema: {dict(extra) or 'none'}; schema shapes absent: {dict(missing) or 'none'}"
                  f"{ignored_d_ff(impl, params, config)}",
                  expected=f"{expected:,} parameters, the canonical schema for d_model={config.d_model}, "
                           f"h={config.n_heads}, d_k={config.d_k}, d_v={config.d_v}, d_ff={config.d_ff}, "
                           f"N={config.n_layers}, {'tied' if config.share_embeddings else 'separate'} embeddings",
                  call=f"{impl.name}.build(config) distinct parameters",
                  hint="biases on the attention projections (+4*d_model per attention), extra layer norms "
                       "(+2*d_model each), untied embeddings (+vocab*d_model each) or scalar norm gains")


@pytest.mark.clause("config.parameters")
def test_base_model_size_matches_table_3(impl: Implementation) -> None:
    """Built on the meta device when the implementation allows it (no memory is allocated)."""
    model = build_for_shapes(impl, BASE)
    got = sum(p.numel() for p in distinct_parameters(model))
    if abs(got / TABLE_3_BASE - 1) > 0.05:
        violation(measured=f"the base preset has {got / 1e6:.2f}M parameters "
                  f"({100 * (got / TABLE_3_BASE - 1):+.1f}% against Table 3)",
                  expected=f"65M within 5% (the schema gives {parameter_count(BASE) / 1e6:.2f}M at a 37000-token "
                           "shared vocabulary)", call=f"{impl.name}.build(BASE)",
                  hint="untied embeddings add 2 x 37000 x 512 = 37.9M; check the layer sizes against Table 3")


@pytest.mark.clause("config.parameters")
@pytest.mark.parametrize("which", list(others_for(TINY)))
def test_builds_the_other_configurations(impl: Implementation, which: str, settings: AuditSettings) -> None:
    """The configurations other checks build (two vocabularies, one head, a wider model): an implementation that
    refuses one fails here, once, with its own error, and the checks that needed it are skipped as blocked by
    config.parameters. Built on the meta device where the implementation allows it (nothing allocated or drawn:
    at the big model's sizes the five builds took 12 s on the CPU); a build that fails there is made again on the
    CPU, whose outcome is the verdict."""
    build_for_shapes(impl, settings.others[which])
