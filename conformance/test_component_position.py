"""Positional-encoding components alone (``--component``): §3.5 against the float64 closed form."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spec.tolerance import compare

from . import oracles
from .harness import ImplementationError, violation

COMPONENT_KIND = "positional_encoding"


@pytest.fixture(scope="module")
def table_fn(component):
    try:
        return component.factory()
    except Exception as exc:
        raise ImplementationError(f"positional_encoding component {component.name!r}: factory() raised "
                                  f"{type(exc).__name__}: {exc}") from exc


def table(fn, length: int, d_model: int) -> torch.Tensor:
    try:
        out = torch.as_tensor(fn(length, d_model))
    except Exception as exc:
        raise ImplementationError(
            f"[position.formula] fn({length}, {d_model}) raised {type(exc).__name__}: {exc}") from exc
    if tuple(out.shape) != (length, d_model):
        raise ImplementationError(f"[position.formula] fn({length}, {d_model}) returned shape {list(out.shape)}, "
                                  f"expected [{length}, {d_model}]")
    return out


def check_table(got: torch.Tensor, length: int, d_model: int, call: str) -> None:
    expected = oracles.pe_table(length, d_model)
    cmp = compare(got, expected, dtype=got.dtype if got.is_floating_point() else torch.float32)
    if cmp.ok:
        return
    matches = [form for form in oracles.PE_FORMS if form != "paper"
               and compare(got, oracles.pe_table(length, d_model, form=form), dtype=torch.float32).ok]
    instead = f"; the table matches {oracles.PE_FORMS[matches[0]]}" if matches else ""
    violation("position.formula", measured=cmp.describe() + instead,
              expected="PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same), pos from 0 "
                       "(PE[1, 1] = cos(1) = 0.540302)",
              call=call, hint="interleave sin (even) and cos (odd) with a shared frequency per pair")


@pytest.mark.clause("position.formula")
@pytest.mark.parametrize("length, d_model", [(2, 512), (50, 32), (7, 6)])
def test_table_matches_the_closed_form(table_fn, length, d_model):
    check_table(table(table_fn, length, d_model), length, d_model, f"fn({length}, {d_model})")


@pytest.mark.clause("position.formula")
@given(length=st.integers(1, 64), half=st.integers(1, 48))
def test_table_explored(table_fn, length, half):
    d_model = 2 * half
    check_table(table(table_fn, length, d_model), length, d_model, f"fn({length}, {d_model})")
