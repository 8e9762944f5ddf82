"""Positional encoding (§3.5): the sinusoid table (position.formula), added once at the bottom of both stacks
(position.added).

position.formula is judged on the table the adapter exposes (``positional_encoding(length)``) and on
positional-encoding components alone (``--component``, kind ``positional_encoding``), both against the
float64 closed form; position.added by variant attribution (``conformance.helpers.variants``) and by a readout probe
of each stack's input path (``readout_probes.check_input_path``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given

from aiayn_conformance.implementations import Component, Implementation
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability
from aiayn_conformance.spec.tolerance import compare

from .helpers import oracles, strategies
from .helpers.components import from_factory
from .helpers.diagnosis import fail_on_variant_departure
from .helpers.harness import CheckTimeout, build_model, could_not_check, violation
from .helpers.readout_probes import check_input_path
from .helpers.settings import AuditSettings
from .helpers.traces import OWN_WEIGHTS, Lookup, observed

MAX_OFFSET = 4  # offsets tried when the table is no named form (1 is the named positions-from-1)
PE_EXPECTED = ("PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same), pos from 0 "
               "(PE[1, 1] = cos(1) = 0.540302)")


def check_table(got: torch.Tensor, length: int, d_model: int, call: str,
                tolerance: torch.dtype = torch.float32) -> None:
    """Fail position.formula when ``got`` [length, d_model] is not the §3.5 table (within the tolerance of
    dtype ``tolerance``), naming the variant it is."""
    expected = oracles.pe_table(length, d_model)
    cmp = compare(got.double(), expected, dtype=tolerance)
    if cmp.ok:
        return
    instead = [f for f in oracles.PE_FORMS if f != "paper"
               and compare(got.double(), oracles.pe_table(length, d_model, form=f), dtype=torch.float32).ok]
    named = f"; the table matches {oracles.PE_FORMS[instead[0]]}" if instead else ""
    offset = next((k for k in range(2, MAX_OFFSET + 1) if not instead
                   and compare(got.double(), oracles.pe_table(length + k, d_model)[k:], dtype=torch.float32).ok), 0)
    if offset:
        named = f"; the table is the paper's from position {offset} on (positions offset by {offset})"
    hint = ("count positions from 0, so the first token gets PE[0] (a table offset past a padding index, as in "
            "positions = padding_idx + 1 + arange(L), starts later)" if offset or instead == ["positions-from-1"]
            else "interleave sin (even dims) and cos (odd dims) sharing one frequency per pair")
    violation(measured=f"{cmp.describe()}{named}", expected=PE_EXPECTED, call=call, hint=hint)


def table_of(model: Any, length: int, d_model: int, impl_name: str) -> torch.Tensor:
    """``model.positional_encoding(length)`` as [length, d_model]; anything else could not be checked."""
    try:
        table = model.positional_encoding(length)
    except CheckTimeout:
        raise
    except Exception as exc:
        could_not_check(f"{impl_name}: positional_encoding({length}) raised", exc)
    if not isinstance(table, torch.Tensor):
        could_not_check(f"positional_encoding({length}) returned {type(table).__name__}")
    table = table.detach().squeeze(0) if table.dim() == 3 and table.size(0) == 1 else table.detach()
    if tuple(table.shape) != (length, d_model):
        could_not_check(f"positional_encoding({length}) returned shape {list(table.shape)}, "
                        f"expected [{length}, {d_model}]")
    return table


@pytest.mark.clause("position.formula")
@pytest.mark.parametrize("which", ["audit", "wider"])
def test_table_matches_section_3_5(impl: Implementation, which: str, settings: AuditSettings) -> None:
    """At the audit's width and at a wider one (an odd number of sinusoid pairs per head, another d_model)."""
    cfg = settings.config if which == "audit" else settings.others["wider"]
    model = build_model(impl, cfg)
    if not has_capability(model, "positional_encoding"):
        pytest.skip(f"{impl.name} has no positional_encoding(length): the table cannot be read")
    for length in (1, 7, cfg.max_len):
        check_table(table_of(model, length, cfg.d_model, impl.name), length, cfg.d_model,
                    f"positional_encoding({length}) with d_model={cfg.d_model}")


@pytest.mark.clause("position.added")
def test_position_added_variant(impl: Implementation, config: ModelConfig) -> None:
    """§3.5: x = sqrt(d_model) E[tokens] + PE, once, in the encoder and in the decoder."""
    fail_on_variant_departure(
        impl, config, hint="add the table once per stack (a module that returns x + PE must not be added to x again), "
                   "in both the encoder and the decoder")


@pytest.mark.clause("position.added")
@pytest.mark.parametrize("stack", ["decoder", "encoder"])
def test_positional_table_added_once(impl: Implementation, stack: str, config: ModelConfig) -> None:
    """Every sub-layer output zeroed, unit norms: the stack's input in closed form."""
    check_input_path(impl, config, stack, part="pe",
                     hint="add the positional table once, at the bottom of each stack (§3.5)")


def traced_tables(impl: Implementation, config: ModelConfig) -> list[Lookup]:
    """The stacks whose traced input (own weights, ``helpers.traces``) decomposes as c E + P(position) with P not
    zero; skips when there is none."""
    trace = observed(impl, config)
    found = [lookup for lookup in trace.lookups if lookup.table is not None and float(lookup.table.abs().max()) > 1e-6]
    if not found:
        why = "; ".join(lookup.how for lookup in trace.lookups if lookup.table is None) or (
            "no embedding lookup of the source or target ids" if not trace.lookups
            else "the stack inputs are c x E with nothing added per position")
        pytest.skip(f"own-weights trace: no per-position term added to the embeddings could be read ({why})")
    return found


def multiple_of(got: torch.Tensor, table: torch.Tensor) -> float | None:
    """a when ``got`` = a x ``table`` (relative residual below 1e-3, a > 0), else None."""
    a = float((got * table).sum() / (table * table).sum())
    ok = a > 0 and float((got - a * table).norm()) <= 1e-3 * float(got.norm())
    return a if ok else None


@pytest.mark.clause("position.formula")
def test_table_form_on_own_weights(impl: Implementation, config: ModelConfig) -> None:
    """§3.5 without a transplant: the per-position term P of each stack's traced input c E + P (own weights) is
    the sinusoid table, up to a factor (how many times it is added is position.added's, which this trace cannot
    judge: of the sums after the lookup it reads the first that adds something per position, since a later one
    such as x + x is another clause's)."""
    for lookup in traced_tables(impl, config):
        table = lookup.table
        assert table is not None
        length = table.size(0)
        if multiple_of(table, oracles.pe_table(length, config.d_model)) is not None:
            continue
        named = [oracles.PE_FORMS[f] for f in oracles.PE_FORMS if f != "paper"
                 and multiple_of(table, oracles.pe_table(length, config.d_model, form=f)) is not None]
        offset = next((k for k in range(2, MAX_OFFSET + 1) if not named and multiple_of(
            table, oracles.pe_table(length + k, config.d_model)[k:]) is not None), 0)
        what = (f"the table {named[0]}" if named else f"the paper's table from position {offset} on" if offset
                else "no multiple of the sinusoid table nor of a named variant (a learned or other table)")
        violation(measured=f"the {lookup.stack} input is {lookup.scale:.4g} x E + P(position) with P {what}; "
                           f"P[1, :4] = {[round(x, 4) for x in table[1, :4].tolist()] if length > 1 else []}",
                  expected=PE_EXPECTED, call=OWN_WEIGHTS,
                  hint="add the §3.5 sinusoids: sin on even and cos on odd dimensions, one frequency per pair, base "
                       "10000, positions from 0")


@pytest.mark.clause("position.added")
def test_table_added_once_on_own_weights(impl: Implementation, config: ModelConfig) -> None:
    """§3.5 without a transplant: what each stack's first layer reads (the last sum c' E + P' after the lookup,
    before any projection or attention) is the first sum c E + P, or that sum scaled as a whole (a scale is
    embedding.scale's): P' = (c' / c) P. A table added again (P' = 2 P) or the embeddings added again (c' = 2 c,
    P' = P) departs."""
    for lookup in traced_tables(impl, config):
        assert lookup.table is not None and lookup.scale is not None and lookup.last is not None
        c, table = lookup.scale, lookup.table
        c_last, last = lookup.last
        a = multiple_of(last, table)
        if a is not None and c != 0 and abs(a / (c_last / c) - 1) < 1e-3:
            continue
        extra = last - (c_last / c) * table
        what = (f"{a:.4g} x P" if a is not None else
                f"P plus another per-position term of {float(extra.norm() / table.norm()):.3g} x |P|")
        violation(measured=f"the first sum after the {lookup.stack} embedding lookup is {c:.4g} x E + P(position); "
                           f"what the first {lookup.stack} layer reads is {c_last:.4g} x E + ({what}): the "
                           f"positional term and the embeddings are not in the first sum's proportion",
                  expected="the table added once: the stack's input is sqrt(d_model) x E + PE (§3.5)", call=OWN_WEIGHTS,
                  hint="add the table once per stack (a module that returns x + PE must not be added to x again)")


# --------------------------------------------------------------------------------------------------
# Positional-encoding components alone (--component, kind positional_encoding)
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def table_fn(component: Component) -> Any:
    """The table function the component's factory makes: fn(length, d_model) -> [length, d_model]."""
    return from_factory(component)


def component_table(fn: Any, length: int, d_model: int) -> torch.Tensor:
    """``fn(length, d_model)`` as a tensor [length, d_model]; anything else could not be checked."""
    try:
        out = torch.as_tensor(fn(length, d_model))
    except CheckTimeout:
        raise
    except Exception as exc:
        could_not_check(f"fn({length}, {d_model}) raised", exc)
    if tuple(out.shape) != (length, d_model):
        could_not_check(f"fn({length}, {d_model}) returned shape {list(out.shape)}, expected [{length}, {d_model}]")
    return out


def tolerance_of(table: torch.Tensor) -> torch.dtype:
    """A component's table is held to the tolerance of its own dtype (float32 for non-float tables)."""
    return table.dtype if table.is_floating_point() else torch.float32


@pytest.mark.clause("position.formula")
@pytest.mark.component_kind("positional_encoding")
@pytest.mark.parametrize("length, d_model", [(2, 512), (50, 32), (7, 6)])
def test_pe_component_matches_the_closed_form(table_fn: Any, length: int, d_model: int) -> None:
    got = component_table(table_fn, length, d_model)
    check_table(got, length, d_model, f"fn({length}, {d_model})", tolerance_of(got))


@pytest.mark.clause("position.formula")
@pytest.mark.component_kind("positional_encoding")
@given(size=strategies.table_size())
def test_pe_component_explored(table_fn: Any, size: tuple[int, int]) -> None:
    length, d_model = size
    got = component_table(table_fn, length, d_model)
    check_table(got, length, d_model, f"fn({length}, {d_model})", tolerance_of(got))
