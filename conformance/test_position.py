"""position.formula (§3.5): the table the implementation adds, against the closed form in float64."""

from __future__ import annotations

import pytest
import torch

from spec.tolerance import compare

from . import oracles
from .harness import ImplementationError, build_model, violation
from .inputs import CONFIG

CLAUSE = "position.formula"
CONFIGS = {"d32": CONFIG, "d48": CONFIG.replace(d_model=48, n_heads=4, max_len=64)}


def table_of(model, length: int, impl_name: str) -> torch.Tensor:
    try:
        table = model.positional_encoding(length)
    except Exception as exc:
        raise ImplementationError(f"[{CLAUSE}] {impl_name}: positional_encoding({length}) raised "
                                  f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(table, torch.Tensor):
        raise ImplementationError(f"[{CLAUSE}] positional_encoding({length}) returned {type(table).__name__}")
    table = table.detach().squeeze(0) if table.dim() == 3 and table.size(0) == 1 else table.detach()
    return table


@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize("which", list(CONFIGS))
def test_table_matches_section_3_5(impl, which):
    cfg = CONFIGS[which]
    model = build_model(impl, cfg, CLAUSE)
    if not callable(getattr(model, "positional_encoding", None)):
        pytest.skip(f"{impl.name} has no positional_encoding(length): the table cannot be read")
    for length in (1, 7, cfg.max_len):
        table = table_of(model, length, impl.name)
        if tuple(table.shape) != (length, cfg.d_model):
            raise ImplementationError(f"[{CLAUSE}] positional_encoding({length}) returned shape {list(table.shape)}, "
                                      f"expected [{length}, {cfg.d_model}]")
        expected = oracles.pe_table(length, cfg.d_model)
        cmp = compare(table.double(), expected, dtype=torch.float32)
        if cmp.ok:
            continue
        instead = [f for f in oracles.PE_FORMS if f != "paper"
                   and compare(table.double(), oracles.pe_table(length, cfg.d_model, form=f), dtype=torch.float32).ok]
        named = f"; the table matches {oracles.PE_FORMS[instead[0]]}" if instead else ""
        violation(CLAUSE, measured=f"{cmp.describe()}{named}",
                  expected="PE(pos, 2i) = sin(pos/10000^(2i/d_model)), PE(pos, 2i+1) = cos(same), pos from 0; "
                           "e.g. PE[1, 1] = cos(1) = 0.540302",
                  call=f"positional_encoding({length}) with d_model={cfg.d_model}",
                  hint="interleave sin (even dims) and cos (odd dims) sharing one frequency per pair")
