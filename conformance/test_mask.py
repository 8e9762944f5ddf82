"""Masks (§3.2.3): causality (mask.causal), source and target padding (mask.source-padding,
mask.target-padding), finite outputs for fully padded rows (mask.finite).

Whole-model checks are black-box, run on sharp transplanted weights where the adapter can load them (at the
model's own scale otherwise, and the messages say so), with a witness whose attention scores reach 1e5 (a finite
mask constant such as -1e4 fails it), a transplant probe and a variant attribution for the diagonal. Attention
kernels alone (``--component``, kind ``attention``) are checked against the float64 closed form with masks of
every pattern. Mask polarity everywhere: True = "may attend".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from aiayn_conformance.implementations import Component, Implementation
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability
from aiayn_conformance.spec.tolerance import Tolerance, compare, tolerance

from .helpers import oracles, strategies
from .helpers.components import DK, LK, B, H, Kernel, call_kernel, from_factory, key_padding, qkv
from .helpers.diagnosis import fail_on_variant_departure
from .helpers.harness import build_model, describe_call, first_nonfinite, run_forward, violation
from .helpers.inputs import fitted, other_token, random_tokens, shape_need, witness_batch
from .helpers.outputs import compare_real, log_probs
from .helpers.traces import EXTREME as EXTREME_SCORES
from .helpers.traces import LEAK, OWN_WEIGHTS, Attention, observed, padded_keys, real_queries
from .helpers.transplant import STATE_SEED, load_into, sharp_or_own, transplanted, visible_state


@pytest.fixture(scope="module")
def model(impl: Implementation, config: ModelConfig) -> Any:
    """The implementation built once per module for config, in eval mode, at its own initialisation."""
    return build_model(impl, config)


@pytest.fixture(scope="module")
def sharp(impl: Implementation, model: Any, config: ModelConfig) -> tuple[Any, str]:
    """(the model the mask witnesses run on, which weights it holds, as the messages say it): the witnesses of
    mask.causal, mask.source-padding and mask.target-padding must not depend on how sharp the implementation's
    own initialisation is, so they run on sharp transplanted weights where the adapter can load them
    (``transplant.sharp_or_own``)."""
    return sharp_or_own(impl, model, config)


# Scores beyond any finite mask constant (B02): the query and key projections of every attention scaled so that
# |scores| reach ~1e5. A masked score of -1e4 (or -1e5) then beats every real score of some queries, which
# attend to masked keys; -inf (or the dtype's lowest value) still masks them.
SCORE_BOOST = 160.0
EXTREME = (f"on transplanted weights with every attention's W^Q and W^K multiplied by {SCORE_BOOST:g} "
           "(attention scores of order 1e5)")


def extreme_tolerance(config: ModelConfig) -> Tolerance:
    """The float32 model tolerance, with atol widened to what float32 rounding does at scores of order 1e5 (a reason
    for a looser entry, spec.tolerance): a score is a dot product of d_k terms, rounded to about
    sqrt(d_k) * 2^-24 * 1e5 (0.017 at d_k = 8, 0.048 at d_k = 64); the same scores computed at another length
    (appended padding, another blocking of the products) may round apart by that much, and where two real keys'
    scores lie that close their weights, so the outputs' log-probabilities, move by as much. Measured: a model with
    the paper's masks and shifted positions (tests/broken_models.py's pe-from-one) at base moved by 0.0019 when one
    target pad was appended; finite fills move the outputs by 0.07 to 1.2 (fill-1e4 and fill-1e-9 at the suite's
    sizes)."""
    d_k = config.d_k
    policy = tolerance(torch.float32, scope="model")
    return Tolerance(rtol=policy.rtol, atol=max(policy.atol, math.sqrt(d_k) * 2.0 ** -24 * EXTREME_SCORES))


def extreme_state(config: ModelConfig) -> dict[str, torch.Tensor]:
    def boost(name: str, t: torch.Tensor) -> torch.Tensor:
        return t * SCORE_BOOST if name.endswith(("attn.q.weight", "attn.k.weight")) else t

    return visible_state(config, seed=STATE_SEED, adjust=boost)


@pytest.fixture(scope="module")
def extreme(impl: Implementation, config: ModelConfig) -> Any:
    """The implementation holding ``extreme_state(config)`` (skips without load_reference_state)."""
    return transplanted(impl, config, extreme_state(config), cache=False)


FINITE_FILL_HINT = ("masked scores set to a finite constant (e.g. -1e4, -1e5, or a float16-safe -65504 kept in "
                    "float32) that real scores can fall below: fill with -inf (guarding rows with no admissible key) "
                    "or torch.finfo(scores.dtype).min")


def check_causal(model: Any, impl: Implementation, config: ModelConfig, src: torch.Tensor, tgt: torch.Tensor, j: int,
                 weights: str = "", hint: str = "", tol: Tolerance | None = None) -> None:
    """Changing target token j leaves positions < j unchanged and changes position j."""
    changed = tgt.clone()
    changed[:, j] = torch.tensor([other_token(int(t), config.tgt_vocab, config.pad_id) for t in tgt[:, j]])
    a = log_probs(model, impl, src, tgt, config)
    b = log_probs(model, impl, src, changed, config)
    call = f"{describe_call(src, tgt, config.pad_id)}, then target token {j} changed in every row" + (
        f", {weights}" if weights else "")
    if j > 0:
        before = compare_real(a, b, tgt, config.pad_id, positions=slice(0, j), kind=impl.output, tol=tol)
        if not before.ok:
            violation(measured=f"outputs before position {j} changed: {before.describe()}",
                      expected=f"outputs at positions 0..{j - 1} independent of target token {j}",
                      call=call, hint=hint or "the decoder self-attention sees future tokens: causal mask missing, "
                                              "added as a 0/1 float, built with triu/tril swapped, or dropped on "
                                              "some code path (some layers, some batch shapes)")
    at_j = (a[:, j] - b[:, j]).abs().max().item()
    if at_j <= 1e-6:
        violation(measured=f"the output at position {j} moved by only {at_j:.2g}",
                  expected=f"the output at position {j} depends on target token {j} (up to and including)",
                  call=call, hint="the decoder ignores its own input at position j")


@pytest.mark.clause("mask.causal")
@pytest.mark.parametrize("j", [0, 2, 5])
def test_causal_witness(impl: Implementation, sharp: tuple[Any, str], j: int, config: ModelConfig) -> None:
    src, tgt = fitted(random_tokens(config, [7, 4], 7, vocab=config.src_vocab, seed=3),
                      random_tokens(config, [6, 6], 6, vocab=config.tgt_vocab, seed=4), config)
    if j >= tgt.size(1):
        pytest.skip(shape_need(f"changing target position {j} needs target length {j + 1}", "tgt"))
    check_causal(sharp[0], impl, config, src, tgt, j, sharp[1])


@pytest.mark.clause("mask.causal")
@given(data=st.data())
def test_causal_explored(impl: Implementation, sharp: tuple[Any, str], config: ModelConfig,
                         data: st.DataObject) -> None:
    """Hypothesis over the lengths, the tokens and the changed position j (one unpadded sample)."""
    check_causal(sharp[0], impl, config, *data.draw(strategies.causal_case(config), label="case"), sharp[1])


@pytest.mark.clause("mask.causal")
def test_causal_with_scores_beyond_1e4(impl: Implementation, extreme: Any, config: ModelConfig) -> None:
    """B02: with attention scores of order 1e5, a future key masked by a finite constant outscores the real keys
    of some queries; -inf keeps it out."""
    src, tgt = fitted(random_tokens(config, [7, 4], 7, vocab=config.src_vocab, seed=3),
                      random_tokens(config, [6, 6], 6, vocab=config.tgt_vocab, seed=4), config)
    if tgt.size(1) < 4:
        pytest.skip(shape_need("changing target position 3 needs target length 4", "tgt"))
    check_causal(extreme, impl, config, src, tgt, 3, EXTREME, hint=FINITE_FILL_HINT, tol=extreme_tolerance(config))


@pytest.mark.clause("mask.causal")
def test_causal_variant(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.3 "up to and including": the variant that reproduces the implementation keeps the diagonal."""
    keep_diagonal = ("the causal mask must keep the diagonal: torch.ones(T, T).tril() (or triu(..., diagonal=1) for "
                     "the masked part), not tril(..., -1) / triu(..., diagonal=0); position 0 must be able to "
                     "attend to itself")
    fail_on_variant_departure(impl, config, hint={
        "causal=none": "the decoder self-attention has no causal mask: combine torch.ones(T, T).tril() with the "
                       "target padding mask and pass it to every decoder layer",
        "causal": keep_diagonal})


@pytest.mark.clause("mask.causal")
def test_position_zero_attends_to_itself(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.3 "up to and including": decoder position 0 attends to key 0 (transplant probe).

    The residual path carries token 0 to position 0 even when the diagonal is
    masked, so a black-box perturbation cannot see a missing diagonal. Instead:
    zero W_v of every decoder self-attention. If position 0 attends to itself,
    its self-attention output was W_o W_v x_0 != 0, so the output moves; with
    the diagonal masked it attends to nothing and nothing moves. A diagonal
    masked with -inf and no guard leaves position 0 with no admissible key: its
    output is NaN on an unpadded batch, which names the same bug.
    """
    model = build_model(impl, config)
    if not has_capability(model, "load_reference_state"):
        pytest.skip("needs load_reference_state (the adapter lacks it)")
    state = visible_state(config, seed=5)
    zeroed = {k: (torch.zeros_like(v) if ".self_attn.v." in k and k.startswith("decoder") else v)
              for k, v in state.items()}
    src, tgt = fitted(random_tokens(config, [7, 7], 7, vocab=config.src_vocab, seed=6),
                      random_tokens(config, [4, 4], 4, vocab=config.tgt_vocab, seed=7), config)
    call = f"{describe_call(src, tgt, config.pad_id)} with canonical weights"
    hint = "the causal mask excludes the diagonal (torch.triu(..., diagonal=0) / tril(..., -1))"
    load_into(model, state, impl.name)
    out = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id, check_finite=False)
    bad = first_nonfinite(out, tgt, config.pad_id)
    if bad is not None and bad[1][1] == 0:
        violation(measured=f"on an unpadded batch, decoder position 0 outputs {bad[2]} (non-finite) at "
                           f"[batch, position, token] = {bad[1]}: its self-attention row has no admissible key",
                  expected="position 0 attends to itself (up to and including), so every row of the causal mask "
                           "has at least one admissible key", call=call, hint=hint)
    a = log_probs(model, impl, src, tgt, config)
    load_into(model, zeroed, impl.name)
    b = log_probs(model, impl, src, tgt, config)
    moved = (a[:, 0] - b[:, 0]).abs().max().item()
    if moved <= 1e-6:
        violation(measured=f"zeroing W_v of every decoder self-attention moved position 0 by {moved:.2g}",
                  expected="position 0 attends to itself, so its self-attention output (and the model output) changes",
                  call=f"{call}, then decoder self_attn.v zeroed", hint=hint)


def appended(tokens: torch.Tensor, extra: int, pad_id: int) -> torch.Tensor:
    """tokens with ``extra`` pad tokens appended to every row."""
    return torch.cat([tokens, torch.full((tokens.size(0), extra), pad_id, dtype=tokens.dtype)], dim=1)


def check_source_padding(model: Any, impl: Implementation, config: ModelConfig, src: torch.Tensor, tgt: torch.Tensor,
                         extra: int, weights: str, hint: str, tol: Tolerance | None = None) -> None:
    a = log_probs(model, impl, src, tgt, config)
    longer = appended(src, extra, config.pad_id)
    b = log_probs(model, impl, longer, tgt, config)
    cmp = compare_real(a, b, tgt, config.pad_id, kind=impl.output, tol=tol)
    if not cmp.ok:
        violation(measured=f"appending {extra} source pad token(s) moved the outputs: "
                  f"{cmp.describe()}", expected="outputs at real target positions unchanged by source padding",
                  call=f"{describe_call(src, tgt, config.pad_id)} vs src padded to {longer.size(1)}, {weights}",
                  hint=hint)


SOURCE_HINT = ("padded keys keep weight: the mask is missing (often in cross-attention), filled with a small value "
               "such as 1e-9 instead of -inf, or applied on the query axis")


@pytest.mark.clause("mask.source-padding")
@pytest.mark.parametrize("extra", [1, 5])
def test_source_padding_witness(impl: Implementation, sharp: tuple[Any, str], extra: int, config: ModelConfig) -> None:
    check_source_padding(sharp[0], impl, config, *witness_batch(config, src_room=extra), extra, sharp[1], SOURCE_HINT)


@pytest.mark.clause("mask.source-padding")
def test_source_padding_with_scores_beyond_1e4(impl: Implementation, extreme: Any, config: ModelConfig) -> None:
    """B02: with scores of order 1e5, a padded key masked by a finite constant outscores the real keys of some
    queries (a short source has few)."""
    check_source_padding(extreme, impl, config, *witness_batch(config, src_room=1), 1, EXTREME, FINITE_FILL_HINT,
                         extreme_tolerance(config))


@pytest.mark.clause("mask.source-padding")
@given(data=st.data())
def test_source_padding_explored(impl: Implementation, sharp: tuple[Any, str], config: ModelConfig,
                                 data: st.DataObject) -> None:
    """Hypothesis over the lengths, the tokens and how much source padding is appended (one sample)."""
    src, tgt, extra = data.draw(strategies.source_padding_case(config), label="case")
    check_source_padding(sharp[0], impl, config, src, tgt, extra, sharp[1],
                         "padded keys keep weight in encoder self-attention or cross-attention")


def check_target_padding(model: Any, impl: Implementation, config: ModelConfig, extra: int, weights: str,
                         hint: str, tol: Tolerance | None = None) -> None:
    src, tgt = witness_batch(config, tgt_room=extra)
    a = log_probs(model, impl, src, tgt, config)
    b = log_probs(model, impl, src, appended(tgt, extra, config.pad_id), config)[:, : tgt.size(1)]
    cmp = compare_real(a, b, tgt, config.pad_id, kind=impl.output, tol=tol)
    if not cmp.ok:
        violation(measured=f"appending {extra} target pad token(s) moved earlier outputs: "
                  f"{cmp.describe()}", expected="outputs at real target positions unchanged by target padding",
                  call=f"{describe_call(src, tgt, config.pad_id)} vs tgt padded to {tgt.size(1) + extra}, {weights}",
                  hint=hint)


@pytest.mark.clause("mask.target-padding")
@pytest.mark.parametrize("extra", [1, 4])
def test_target_padding_witness(impl: Implementation, sharp: tuple[Any, str], extra: int, config: ModelConfig) -> None:
    check_target_padding(sharp[0], impl, config, extra, sharp[1],
                         "the target mask lets real positions see padding, or the padding mask is built on the "
                         "wrong axis / with the source's pad id")


@pytest.mark.clause("mask.target-padding")
def test_target_padding_with_scores_beyond_1e4(impl: Implementation, extreme: Any, config: ModelConfig) -> None:
    """B02: with scores of order 1e5, appended target padding masked by a finite constant outscores the
    admissible keys of some queries."""
    check_target_padding(extreme, impl, config, 1, EXTREME, FINITE_FILL_HINT, extreme_tolerance(config))


# --------------------------------------------------------------------------------------------------
# The attention weights themselves, at the model's own weights (no transplant: helpers.traces)
# --------------------------------------------------------------------------------------------------
def worst_leak(calls: list[Attention], keys: Callable[[Attention], torch.Tensor]) -> tuple[float, Attention, int]:
    """(the most weight one real query of ``calls`` gives the keys where ``keys(call)`` [Lq, Lk] is True, the call,
    that query's position)."""
    worst: tuple[float, Attention, int] = (-1.0, calls[0], 0)
    for a in calls:
        real = real_queries(a.lq)
        leak = (a.weights[:, :real] * keys(a)[:real]).sum(-1)  # (N, real queries)
        if float(leak.max()) > worst[0]:
            worst = (float(leak.max()), a, int(leak.argmax()) % real)
    return worst


def require_no_leak(calls: list[Attention], keys: Callable[[Attention], torch.Tensor], what: str, hint: str,
                    call: str = OWN_WEIGHTS) -> None:
    leak, a, q = worst_leak(calls, keys)
    if leak > LEAK:
        violation(measured=f"in {a.kind} (weights from {a.where}, [.., {a.lq}, {a.lk}]), real query {q} gives {what} "
                           f"a total weight of {leak:.3g}",
                  expected=f"no weight on {what} (below {LEAK:g}): masked scores are -inf before the softmax",
                  call=call, hint=hint)


def future_keys(a: Attention) -> torch.Tensor:
    """[Lq, Lk] True above the diagonal."""
    return torch.ones(a.lq, a.lk, dtype=torch.bool).triu(1)


DECODER_SELF = "decoder self-attention"


def decoder_self_attention_weights(impl: Implementation, config: ModelConfig) -> list[Attention]:
    """The decoder self-attention calls of the own-weights trace; skips, saying what was not seen, when none."""
    trace = observed(impl, config)
    calls = trace.of_kind(DECODER_SELF)
    if not calls:
        pytest.skip(trace.unseen("decoder self-attention weights (over the target, applied to values)"))
    return calls


@pytest.mark.clause("mask.causal")
def test_causal_weights_on_own_weights(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.3 without a transplant: every decoder self-attention gives real query i no weight on keys after i, and
    keeps key i (a weight of exactly 0 on the diagonal of every real query, in every call, is a masked diagonal)."""
    calls = decoder_self_attention_weights(impl, config)
    require_no_leak(calls, future_keys, "later target positions",
                    "the decoder self-attention sees future tokens: causal mask missing, filled with a small value "
                    "such as 1e-9, built with triu/tril swapped or shifted by one")
    diagonal = torch.cat([a.weights.diagonal(dim1=-2, dim2=-1)[:, :real_queries(a.lq)].reshape(-1) for a in calls])
    if bool((diagonal == 0).all()):
        violation(measured=f"every real query i of every decoder self-attention ({len(calls)} calls) gives key i a "
                           "weight of exactly 0",
                  expected="position i attends to positions up to and including i",
                  call=OWN_WEIGHTS, hint="the causal mask excludes the diagonal (torch.triu(..., diagonal=0) / "
                                         "tril(..., -1)); position 0 must be able to attend to itself")


@pytest.mark.clause("mask.source-padding")
def test_source_padding_weights_on_own_weights(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.3 without a transplant: encoder self-attention and cross-attention give padded source keys no weight."""
    trace = observed(impl, config)
    calls = trace.of_kind("encoder self-attention") + trace.of_kind("cross-attention")
    if not calls:
        pytest.skip(trace.unseen("attention weights over the source (applied to values)"))
    require_no_leak(calls, padded_keys, "the padded source keys", SOURCE_HINT)


@pytest.mark.clause("mask.target-padding")
def test_target_padding_weights_on_own_weights(impl: Implementation, config: ModelConfig) -> None:
    """§3.2.3 without a transplant: decoder self-attention gives padded target keys no weight from real queries."""
    calls = decoder_self_attention_weights(impl, config)
    require_no_leak(calls, padded_keys, "the padded target keys",
                    "the target mask lets real positions see padding: the causal or padding mask is missing or "
                    "filled with a small value such as 1e-9 instead of -inf")


# The same weights at scores of order 1e5, the model's query projections multiplied by one factor (no transplant): a
# mask filled with a finite constant such as -1e4 is outscored where every admissible score of a query is lower.
def sharpened_calls(impl: Implementation, config: ModelConfig, kinds: tuple[str, ...]) -> tuple[list[Attention], str]:
    """(the attention calls of ``kinds`` in the sharpened own-weights trace, the call's description); skips when
    the trace could not sharpen the scores to the order of 1e5 or saw no such call."""
    trace = observed(impl, config, sharpen=True)
    reached = max((s.peak for s in trace.scales if s.peak), default=0.0)
    if reached < EXTREME_SCORES / 10:
        pytest.skip(f"own-weights trace at extreme scores: with {trace.sharpened} the largest admissible score is "
                    f"{reached:.3g}, not of the order of {EXTREME_SCORES:g}")
    calls = [a for kind in kinds for a in trace.of_kind(kind)]
    if not calls:
        pytest.skip(trace.unseen(f"{' or '.join(kinds)} weights (applied to values)"))
    return calls, f"{OWN_WEIGHTS}, with {trace.sharpened}; largest admissible score {reached:.3g}"


@pytest.mark.clause("mask.causal")
def test_causal_beyond_1e4_on_own_weights(impl: Implementation, config: ModelConfig) -> None:
    """B02 without a transplant: at scores of order 1e5 the decoder self-attention still gives later positions no
    weight (a finite fill is outscored where every admissible score of a query is below it)."""
    calls, call = sharpened_calls(impl, config, (DECODER_SELF,))
    require_no_leak(calls, future_keys, "later target positions", FINITE_FILL_HINT, call)


@pytest.mark.clause("mask.source-padding")
def test_source_padding_beyond_1e4_on_own_weights(impl: Implementation, config: ModelConfig) -> None:
    """B02 without a transplant: at scores of order 1e5 padded source keys still get no weight."""
    calls, call = sharpened_calls(impl, config, ("encoder self-attention", "cross-attention"))
    require_no_leak(calls, padded_keys, "the padded source keys", FINITE_FILL_HINT, call)


@pytest.mark.clause("mask.target-padding")
def test_target_padding_beyond_1e4_on_own_weights(impl: Implementation, config: ModelConfig) -> None:
    """B02 without a transplant: at scores of order 1e5 padded target keys still get no weight from real queries."""
    calls, call = sharpened_calls(impl, config, (DECODER_SELF,))
    require_no_leak(calls, padded_keys, "the padded target keys", FINITE_FILL_HINT, call)


def require_finite(out: torch.Tensor, tgt: torch.Tensor, pad_id: int, call: str, hint: str) -> None:
    """Fail mask.finite when ``out`` holds a non-finite value at a real target position."""
    bad = first_nonfinite(out, tgt, pad_id)
    if bad is not None:
        count, idx, value = bad
        violation(measured=f"{count} non-finite value(s) at real positions, first {value} at "
                  f"[batch, position, token] = {idx}",
                  expected="finite outputs for every padded input", call=call, hint=hint)


@pytest.mark.clause("mask.finite")
def test_fully_padded_source_row_is_finite(impl: Implementation, model: Any, config: ModelConfig) -> None:
    src, tgt = fitted(random_tokens(config, [6, 0, 3], 6, vocab=config.src_vocab, seed=8),  # row 1: all padding
                      random_tokens(config, [4, 4, 2], 4, vocab=config.tgt_vocab, seed=9), config, keep=(1,))
    out = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id, check_finite=False)
    empty = int((src == config.pad_id).all(dim=1).nonzero()[0])  # row 1, or row 0 when fitted to one row (model.shape)
    require_finite(out, tgt, config.pad_id,
                   f"{describe_call(src, tgt, config.pad_id)} (row {empty} of src is all padding)",
                   "softmax over a row that is entirely -inf gives NaN: a query with no key should attend to nothing")


@pytest.mark.clause("mask.finite")
def test_bfloat16_autocast_is_finite(impl: Implementation, model: Any, config: ModelConfig) -> None:
    src, tgt = witness_batch(config)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id, check_finite=False)
    require_finite(out, tgt, config.pad_id,
                   f"{describe_call(src, tgt, config.pad_id)} under torch.autocast('cpu', bfloat16)",
                   "a mask fill that the low-precision dtype cannot hold (e.g. -1e9 cast to half) or an overflow")


# --------------------------------------------------------------------------------------------------
# Attention kernels alone (--component, kind attention)
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel(component: Component) -> Kernel:
    """The attention kernel the component's factory makes, once per module."""
    made: Kernel = from_factory(component)
    return made


@pytest.mark.clause("mask.source-padding")
@pytest.mark.component_kind("attention")
def test_kernel_key_padding_mask_semantics_and_polarity(kernel: Kernel) -> None:
    q, k, v = qkv(2)
    lengths = [LK, 3]
    mask = key_padding(lengths)
    out = call_kernel(kernel, q, k, v, mask)
    expected = oracles.attention(q, k, v, mask)
    cmp = compare(out, expected)
    if cmp.ok:
        return
    inverted = oracles.attention(q, k, v, ~mask)
    if compare(out, inverted).ok:
        violation(measured="the output equals attention over the keys where the mask is False: mask polarity inverted",
                  expected="True in the mask means 'may attend' (the component contract); False keys get zero weight",
                  call=f"kernel(q, k, v, key-padding mask with real lengths {lengths})",
                  hint="the kernel treats True as 'masked out' (nn.MultiheadAttention's key_padding_mask convention); "
                       "invert the mask before filling with -inf")
    violation(measured=cmp.describe(),
              expected="masked keys receive zero weight (scores set to -inf before the softmax)",
              call=f"kernel(q, k, v, key-padding mask with real lengths {lengths})",
              hint="a mask filled with a small value (1e-9) or applied by multiplication leaves weight on masked keys")


@pytest.mark.clause("mask.causal")
@pytest.mark.component_kind("attention")
def test_kernel_causal_mask_includes_the_diagonal(kernel: Kernel) -> None:
    q, k, v = qkv(3, lq=LK)
    causal = torch.ones(LK, LK, dtype=torch.bool).tril()[None, None]  # (1, 1, L, L)
    out = call_kernel(kernel, q, k, v, causal)
    cmp = compare(out, oracles.attention(q, k, v, causal))
    if not cmp.ok:
        strict = torch.ones(LK, LK, dtype=torch.bool).tril(-1)[None, None]
        hint = ("the diagonal is excluded" if compare(out, oracles.attention(q, k, v, strict)).ok
                else "future keys keep weight, or the mask is read with the wrong polarity")
        violation(measured=cmp.describe(), expected="query i attends to keys 0..i, nothing after",
                  call=f"kernel(q, k, v [{B}, {H}, {LK}, {DK}], causal mask (1, 1, {LK}, {LK}) "
                       "lower-triangular)",
                  hint=hint)


@pytest.mark.clause("mask.finite")
@pytest.mark.component_kind("attention")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_kernel_fully_masked_row_gives_zeros(kernel: Kernel, dtype: torch.dtype) -> None:
    q, k, v = qkv(4, dtype=dtype)
    mask = key_padding([LK, 0])  # the second sample has no key at all
    out = call_kernel(kernel, q, k, v, mask)
    if not bool(torch.isfinite(out).all()):
        bad = (~torch.isfinite(out)).nonzero()[0].tolist()
        violation(measured=f"non-finite output {out[tuple(bad)].item()} at {bad} ({dtype})",
                  expected="finite outputs; a query with no allowed key attends to nothing (zeros)",
                  call=f"kernel(q, k, v {dtype}, key-padding mask with real lengths [{LK}, 0])",
                  hint="softmax over a row of -inf is NaN: detect empty rows and return zeros, or use a finite fill "
                       "that the dtype can represent")
    if out[1].abs().max().item() != 0.0:
        violation(measured=f"fully masked queries return values up to {out[1].abs().max().item():.4g}",
                  expected="zeros for a query with no allowed key (spec: it attends to nothing)",
                  call=f"kernel(q, k, v {dtype}, key-padding mask with real lengths [{LK}, 0])",
                  hint="a finite fill such as -1e9 makes the softmax uniform over masked keys instead of empty")


@pytest.mark.clause("mask.source-padding")
@pytest.mark.component_kind("attention")
@given(case=strategies.kernel_case())
def test_kernel_mask_patterns_explored(kernel: Kernel,
                                       case: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    """Random shapes, dtypes and masks: masked keys never influence the output; allowed ones follow Eq. (1)."""
    q, k, v, mask = case
    (b, h, lq, d), lk, dtype = q.shape, k.size(2), q.dtype
    out = call_kernel(kernel, q, k, v, mask)
    cmp = compare(out.double(), oracles.attention(q, k, v, mask), tol=None, dtype=dtype)
    if not cmp.ok:
        violation(measured=cmp.describe(),
                  expected="Eq. (1) over the allowed keys, zeros for rows with none",
                  call=f"kernel(q [{b}, {h}, {lq}, {d}], k/v [{b}, {h}, {lk}, {d}] {dtype}, "
                       f"mask {mask.int().tolist()})",
                  hint="check mask polarity (True = may attend) and broadcasting over heads")
