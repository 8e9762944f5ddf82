"""Variant diagnosis: the implementation holding the visible canonical weights, the reference variant that
reproduces it (``variants.diagnose``), and the verdict on the clause under test.

The diagnosis is cached per implementation for the session: one build, one
transplant and one variant search serve every structural clause. When no variant
reproduces the implementation, the search does not stop there: it substitutes
what the implementation shows of itself (its own positional table, then unit
norms, then its own encoder output) and searches again, so that one part no
variant can name (a learned or offset positional table) does not hide the other
departures. The chain is reported: "after substituting its own positional table
(positional_encoding(length)), the remaining difference is explained by: an
extra LayerNorm right after embedding + PE".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pytest
import torch

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability
from aiayn_conformance.spec.tolerance import compare

from . import oracles, settings
from .harness import as_log_probs, could_not_check, current_clause, describe_call, run_forward, violation
from .inputs import witness_batch
from .transplant import STATE_SEED, transplanted, visible_state
from .variants import IMPROVEMENT, KNOBS, MAX_VARIANTS, Diagnosis, Parts, diagnose, float64_state

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Implementation

__all__ = ["UNIT_NORMS", "encode_output", "own_table", "diagnosis_of", "explanation", "fail_on_variant_departure"]

UNIT_NORMS = "visible weights with every norm at gain 1 and bias 0"


def encode_output(model: Any, src: torch.Tensor) -> torch.Tensor | None:
    """``model.encode(src)`` as float64 [B, S, d_model], or None when the adapter has no usable encode."""
    if not has_capability(model, "encode"):
        return None
    try:
        with torch.no_grad():
            out = model.encode(src)
    except Exception as exc:
        could_not_check(f"encode(src {list(src.shape)}) raised", exc)
    if isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, torch.Tensor) or out.dim() != 3 or out.shape[:2] != src.shape:
        return None
    return out.detach().to("cpu", torch.float64)


def own_table(model: Any, length: int, d_model: int) -> torch.Tensor | None:
    """The implementation's own positional table, float64 [length, d_model], when it exposes one
    (``positional_encoding``) that is not the §3.5 table; None otherwise (nothing to substitute)."""
    if not has_capability(model, "positional_encoding"):
        return None
    try:
        table = model.positional_encoding(length)
    except Exception:  # position.formula reports a table that cannot be read
        return None
    if not isinstance(table, torch.Tensor):
        return None
    table = table.detach().to("cpu", torch.float64)
    table = table.squeeze(0) if table.dim() == 3 and table.size(0) == 1 else table
    if tuple(table.shape) != (length, d_model) or not bool(torch.isfinite(table).all()):
        return None
    if compare(table, oracles.pe_table(length, d_model), dtype=torch.float32).ok:
        return None
    return table


def diagnosis_of(impl: Implementation, config: ModelConfig) -> Diagnosis:
    """The variant that reproduces the implementation on the witness batch (once per implementation and session).

    Searched on the visible weights first. When no variant reproduces them, the search goes on with what the
    implementation shows of itself, one step at a time, each step building on the previous ones, until a
    variant reproduces it (or the steps run out):

    1. its own positional table (``positional_encoding(length)``), substituted for the §3.5 table: a learned
       table, or one offset by a padding index, is no variant, and position.formula judges the table itself;
    2. every norm at gain 1 and bias 0 (``weights == UNIT_NORMS``): a match there means the implementation's
       norms do not apply the canonical per-feature gains and biases (a scalar gain, or norm parameters not
       loaded), and the match still explains the rest of the model;
    3. its own encoder output (``encode(src)``) read by the decoder variants: the decoder diagnosed alone.

    Each step searches afresh from the paper's model (a departure found to make up for an unexplained part is
    not carried over). ``Diagnosis.substituted`` lists the parts taken, and ``explanation`` reports the chain.
    """
    found = settings.current().cache("diagnoses")
    key = (impl.name, id(impl), config)
    if key in found:
        return found[key]
    src, tgt = witness_batch(config)

    def observer(model: Any) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]:
        def observe(src: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            out = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id, check_finite=False)
            return as_log_probs(out, impl.output), encode_output(model, src)
        return observe

    model = transplanted(impl, config)
    state = float64_state(visible_state(config, seed=STATE_SEED))  # once for the whole chain of searches
    parts = Parts()
    diag = diagnose(observer(model), state, config, src, tgt)
    tried, searched, first = diag.tried, [], diag

    def budget() -> int:  # one budget for the whole chain (MAX_VARIANTS); 0 left: the trial only scores its start
        return max(MAX_VARIANTS - tried, 1)

    for step in ("table", "unit norms", "encoder"):
        if diag.exact:
            break
        if step == "table":
            table = own_table(model, max(src.size(1), tgt.size(1)), config.d_model)
            if table is None:
                continue
            searched.append("its own positional table")
            with_table = dataclasses.replace(parts, pe=table)
            trial = diagnose(observer(model), state, config, src, tgt, parts=with_table,
                             max_variants=budget(), helpers=False)
            tried += trial.tried
            if trial.exact or trial.distance < diag.distance:
                parts, diag = with_table, trial
        elif step == "unit norms":
            searched.append("unit norms")
            unit = visible_state(config, seed=STATE_SEED, unit_norms=True)
            on_unit = transplanted(impl, config, unit, cache=False)
            unit = float64_state(unit)
            trial = diagnose(observer(on_unit), unit, config, src, tgt, parts=parts,
                             max_variants=budget(), helpers=False)
            tried += trial.tried
            if trial.exact:
                trial.weights = UNIT_NORMS
                model, state, diag = on_unit, unit, trial
        else:
            memory = encode_output(model, src)
            if memory is None:
                continue
            searched.append("its own encoder output")
            with_memory = dataclasses.replace(parts, memory=memory)
            trial = diagnose(observer(model), state, config, src, tgt, parts=with_memory,
                             max_variants=budget(), helpers=False)
            tried += trial.tried
            if trial.exact:
                parts, diag = with_memory, trial
    if diag.exact and parts.pe is not None:  # the own table earns its place as a departure does
        plain = diagnose(observer(model), state, config, src, tgt, parts=dataclasses.replace(parts, pe=None),
                         start=diag.knobs, max_departures=0, helpers=False)
        tried += plain.tried
        if plain.exact:
            plain.weights = diag.weights
            diag = plain
    if not diag.exact:  # unexplained: what was measured on the implementation as it is
        first.bounded = first.bounded or diag.bounded
        diag = first
    diag.tried, diag.searched = tried, tuple(searched)
    found[key] = diag
    return diag


def explanation(diag: Diagnosis) -> str:
    """One line: what the implementation computes, as the variant search has shown it, with the chain of the
    implementation's own parts it took to get there; or "unexplained" with how far off, after how many
    variants, and the single departures that each removed most of the difference on their own."""
    after = f"after substituting {' and then '.join(diag.substituted)}, " if diag.substituted else ""
    if diag.matches_paper:
        if after:
            return f"{after}the implementation matches the reference: nothing else differs"
        return "the implementation matches the reference on the witness batch"
    if diag.exact:
        if after:
            return f"{after}the remaining difference is explained by: {diag.knobs.describe()} (on {diag.weights})"
        return f"the implementation matches the reference with: {diag.knobs.describe()} (on {diag.weights})"
    also = f" (also tried with {' and with '.join(diag.searched)} substituted)" if diag.searched else ""
    bounded = f", where the search's budget of {MAX_VARIANTS} ran out" if diag.bounded else ""
    off = diag.detail.split(";")[0]
    most = f"most of the difference (more than {IMPROVEMENT:.0%} of the mean |diff|)"
    helped = (f"; no single departure removes {most} on its own" if not diag.helped else
              f"; single departures that each remove {most} on their own, the one removing the most first "
              f"(measurements, not attributions): {'; '.join(diag.helped)}")
    return (f"unexplained: off by {off} (mean |diff| {diag.distance:.3g}) after {diag.tried} variants{also}{bounded}: "
            f"no variant reproduces the implementation with each of its departures needed{helped}")


UNEXPLAINED_SKIP = ("blocked by model.reference-equivalence: no reference variant explains the implementation, "
                    "so no departure is attributed to {clause}; the search and what it measured are in "
                    "model.reference-equivalence's failure")


def fail_on_variant_departure(impl: Implementation, config: ModelConfig, *,
                              hint: str | Mapping[str, str]) -> Diagnosis:
    """Fail the clause under test when the variant that reproduces the implementation departs from it in a
    knob of that clause; skip when no variant reproduces the implementation (no attribution without an
    explanation), and when only the decoder is reproduced (its own encoder output substituted) and it keeps
    this clause's part (the encoder's part is not known). ``hint`` is one hint, or a mapping from
    ``"knob=value"`` or ``"knob"`` to a hint (the most specific one of each departing knob, joined)."""
    clause_id = current_clause()
    diag = diagnosis_of(impl, config)
    if not diag.exact:
        pytest.skip(UNEXPLAINED_SKIP.format(clause=clause_id))
    src, tgt = witness_batch(config)
    call = (f"{describe_call(src, tgt, config.pad_id)} after load_reference_state(visible weights, seed {STATE_SEED}); "
            "outputs compared in log-probability space (and encode() when present)")
    if clause_id == "norm.layer-norm" and diag.weights == UNIT_NORMS:
        violation(measured=f"no reference variant reproduces the implementation with the canonical norm "
                  f"gains and biases, but {explanation(diag)}: its norms do not apply a per-feature gain and bias "
                  "as loaded", expected="norm weight[i] and bias[i] scaling and shifting feature i",
                  call=call, hint="a scalar gain/bias (nn.Parameter(torch.ones(1))), or norm parameters the adapter "
                                  "does not load; use nn.LayerNorm(d_model)")
    departures = diag.departures_for(clause_id)
    if not departures and any(part.startswith("its own encoder output") for part in diag.substituted):
        pytest.skip(f"blocked by model.reference-equivalence: the decoder keeps the paper's {clause_id} part, but "
                    "no variant reproduces the encoder (its difference is in model.reference-equivalence's failure)")
    if departures:
        what = "; ".join(KNOBS[n].values[v] for n, v in departures.items())
        expected = "; ".join(next(iter(KNOBS[n].values.values())) for n in departures)
        if not isinstance(hint, str):
            hints = dict.fromkeys(hint.get(f"{n}={v}", hint.get(n, "")) for n, v in departures.items())
            hint = "; ".join(h for h in hints if h)
        violation(measured=f"{explanation(diag)}. The {clause_id} part of it: {what}",
                  expected=f"a variant that keeps {expected}", call=call, hint=hint)
    return diag
