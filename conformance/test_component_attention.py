"""Attention kernels alone (``--component``): Eq. (1) against a float64 closed form.

Contract (implementations/components.py): ``fn(q, k, v, mask)`` with q, k, v
[B, h, L, d_k], a boolean mask where True means "may attend", result
[B, h, Lq, d_v]; a query with no allowed key gives zeros.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spec.tolerance import compare

from . import oracles
from .harness import ImplementationError, violation

COMPONENT_KIND = "attention"
B, H, LQ, LK, DK = 2, 3, 4, 6, 8


@pytest.fixture(scope="module")
def kernel(component):
    try:
        return component.factory()
    except Exception as exc:
        raise ImplementationError(f"attention component {component.name!r}: factory() raised "
                                  f"{type(exc).__name__}: {exc}") from exc


def call(kernel, q, k, v, mask, clause: str):
    from implementations.components import ComponentUnavailable

    try:
        out = kernel(q, k, v, mask)
    except ComponentUnavailable as exc:
        pytest.skip(str(exc))
    except Exception as exc:
        raise ImplementationError(f"[{clause}] kernel(q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}, "
                                  f"mask {None if mask is None else list(mask.shape)}) raised "
                                  f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    expected = (*q.shape[:-1], v.size(-1))
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ImplementationError(f"[{clause}] kernel returned {got}, expected shape {list(expected)}")
    return out


def qkv(seed: int = 0, dtype=torch.float64, lq: int = LQ, lk: int = LK, gain: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, lq, DK, generator=g, dtype=torch.float64) * gain
    k = torch.randn(B, H, lk, DK, generator=g, dtype=torch.float64) * gain
    v = torch.randn(B, H, lk, DK, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def key_padding(lengths: list[int], lk: int = LK) -> torch.Tensor:
    mask = torch.zeros(len(lengths), 1, 1, lk, dtype=torch.bool)  # (B, 1, 1, Lk), True = may attend
    for b, n in enumerate(lengths):
        mask[b, ..., :n] = True
    return mask


def fitted_scale(kernel, q, k, v) -> float | None:
    """The s for which the kernel equals softmax(s q k^T) v, if one exists (log-space search)."""
    out = call(kernel, q, k, v, None, "attention.scale")
    best, best_err = None, float("inf")
    for log_s in torch.linspace(math.log(1e-3), math.log(1e2), 400).tolist():
        err = (out.double() - oracles.attention(q, k, v, scale=math.exp(log_s))).abs().max().item()
        if err < best_err:
            best, best_err = math.exp(log_s), err
    lo, hi = best / 1.03, best * 1.03
    for _ in range(60):  # golden-section refinement
        m1, m2 = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        e1 = (out.double() - oracles.attention(q, k, v, scale=m1)).abs().max().item()
        e2 = (out.double() - oracles.attention(q, k, v, scale=m2)).abs().max().item()
        lo, hi = (lo, m2) if e1 < e2 else (m1, hi)
    s = (lo + hi) / 2
    err = (out.double() - oracles.attention(q, k, v, scale=s)).abs().max().item()
    return s if err < 1e-4 else None


@pytest.mark.clause("attention.scale")
def test_scale_is_one_over_sqrt_dk(kernel):
    q, k, v = qkv()
    out = call(kernel, q, k, v, None, "attention.scale")
    cmp = compare(out, oracles.attention(q, k, v))
    if cmp.ok:
        return
    s = fitted_scale(kernel, q, k, v)
    if s is None:
        pytest.skip("the kernel does not compute softmax(s QK^T)V for any scale s; attention.softmax-over-keys "
                    "judges its form")
    names = {1 / math.sqrt(DK): "1/sqrt(d_k)", 1 / DK: "1/d_k", 1.0: "1 (no scaling)", math.sqrt(DK): "sqrt(d_k)",
             1 / math.sqrt(DK * H): "1/sqrt(h*d_k) = 1/sqrt(d_model)"}
    label = min(names, key=lambda c: abs(math.log(c / s)))
    named = names[label] if abs(math.log(label / s)) < 0.01 else f"{s:.4g}"
    violation("attention.scale", measured=f"scores multiplied by {s:.6g} ({named}); {cmp.describe()}",
              expected=f"1/sqrt(d_k) = {1 / math.sqrt(DK):.6g} with d_k = {DK}",
              call=f"kernel(q, k, v [{B}, {H}, L, {DK}] float64, mask=None)",
              hint="divide QK^T by sqrt(d_k), the per-head size, not sqrt(d_model) and not d_k")


@pytest.mark.clause("attention.softmax-over-keys")
def test_weights_sum_to_one_over_keys(kernel):
    """With V = I (Lk = d_v), the output rows are the attention weights."""
    q, k, _ = qkv(1, lk=DK)
    v = torch.eye(DK, dtype=torch.float64).expand(B, H, DK, DK)  # (B, h, Lk, d_v) = identity
    weights = call(kernel, q, k, v, None, "attention.softmax-over-keys").double()  # (B, h, Lq, Lk)
    sums = weights.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-6) or bool((weights < -1e-9).any()):
        over_queries = oracles.attention(q, k, v, axis="queries")
        hint = ("the softmax runs over the query axis (dim=-2)" if compare(weights, over_queries).ok
                else "the weights are not a softmax over the keys")
        worst = (sums - 1).abs().argmax().item()
        violation("attention.softmax-over-keys",
                  measured=f"row sums of the weights range {sums.min().item():.4g}..{sums.max().item():.4g} "
                           f"(worst flat index {worst})",
                  expected="every query's weights are >= 0 and sum to 1 over the keys",
                  call=f"kernel(q [{B}, {H}, {LQ}, {DK}], k [{B}, {H}, {DK}, {DK}], v = identity, mask=None)",
                  hint=hint)


@pytest.mark.clause("mask.source-padding")
def test_key_padding_mask_semantics_and_polarity(kernel):
    q, k, v = qkv(2)
    lengths = [LK, 3]
    mask = key_padding(lengths)
    out = call(kernel, q, k, v, mask, "mask.source-padding")
    expected = oracles.attention(q, k, v, mask)
    cmp = compare(out, expected)
    if cmp.ok:
        return
    inverted = oracles.attention(q, k, v, ~mask)
    if compare(out, inverted).ok:
        violation("mask.source-padding", measured="the output equals attention over the keys where the mask is "
                  "False: mask polarity inverted",
                  expected="True in the mask means 'may attend' (the component contract); False keys get zero weight",
                  call=f"kernel(q, k, v, key-padding mask with real lengths {lengths})",
                  hint="the kernel treats True as 'masked out' (nn.MultiheadAttention's key_padding_mask convention); "
                       "invert the mask before filling with -inf")
    violation("mask.source-padding", measured=cmp.describe(),
              expected="masked keys receive zero weight (scores set to -inf before the softmax)",
              call=f"kernel(q, k, v, key-padding mask with real lengths {lengths})",
              hint="a mask filled with a small value (1e-9) or applied by multiplication leaves weight on masked keys")


@pytest.mark.clause("mask.causal")
def test_causal_mask_includes_the_diagonal(kernel):
    q, k, v = qkv(3, lq=LK)
    causal = torch.ones(LK, LK, dtype=torch.bool).tril()[None, None]  # (1, 1, L, L)
    out = call(kernel, q, k, v, causal, "mask.causal")
    cmp = compare(out, oracles.attention(q, k, v, causal))
    if not cmp.ok:
        strict = torch.ones(LK, LK, dtype=torch.bool).tril(-1)[None, None]
        hint = ("the diagonal is excluded" if compare(out, oracles.attention(q, k, v, strict)).ok
                else "future keys keep weight, or the mask is read with the wrong polarity")
        violation("mask.causal", measured=cmp.describe(), expected="query i attends to keys 0..i, nothing after",
                  call=f"kernel(q, k, v [{B}, {H}, {LK}, {DK}], causal mask (1, 1, {LK}, {LK}) lower-triangular)",
                  hint=hint)


@pytest.mark.clause("mask.finite")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_fully_masked_row_gives_zeros(kernel, dtype):
    q, k, v = qkv(4, dtype=dtype)
    mask = key_padding([LK, 0])  # the second sample has no key at all
    out = call(kernel, q, k, v, mask, "mask.finite")
    if not bool(torch.isfinite(out).all()):
        bad = (~torch.isfinite(out)).nonzero()[0].tolist()
        violation("mask.finite", measured=f"non-finite output {out[tuple(bad)].item()} at {bad} ({dtype})",
                  expected="finite outputs; a query with no allowed key attends to nothing (zeros)",
                  call=f"kernel(q, k, v {dtype}, key-padding mask with real lengths [{LK}, 0])",
                  hint="softmax over a row of -inf is NaN: detect empty rows and return zeros, or use a finite fill "
                       "that the dtype can represent")
    if out[1].abs().max().item() != 0.0:
        violation("mask.finite", measured=f"fully masked queries return values up to {out[1].abs().max().item():.4g}",
                  expected="zeros for a query with no allowed key (spec: it attends to nothing)",
                  call=f"kernel(q, k, v {dtype}, key-padding mask with real lengths [{LK}, 0])",
                  hint="a finite fill such as -1e9 makes the softmax uniform over masked keys instead of empty")


@pytest.mark.clause("mask.source-padding")
@given(data=st.data())
def test_mask_patterns_explored(kernel, data):
    """Random shapes and masks: masked keys never influence the output; allowed ones follow Eq. (1)."""
    b = data.draw(st.integers(1, 3), label="B")
    h = data.draw(st.integers(1, 4), label="h")
    lq = data.draw(st.integers(1, 7), label="Lq")
    lk = data.draw(st.integers(1, 7), label="Lk")
    d = data.draw(st.sampled_from([1, 4, 8]), label="d_k")
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]), label="dtype")
    bits = data.draw(st.lists(st.booleans(), min_size=b * lq * lk, max_size=b * lq * lk), label="mask bits")
    mask = torch.tensor(bits, dtype=torch.bool).view(b, 1, lq, lk)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64).to(dtype) for n in (lq, lk, lk))
    out = call(kernel, q, k, v, mask, "mask.source-padding")
    cmp = compare(out.double(), oracles.attention(q, k, v, mask), tol=None, dtype=dtype)
    if not cmp.ok:
        violation("mask.source-padding", measured=cmp.describe(),
                  expected="Eq. (1) over the allowed keys, zeros for rows with none",
                  call=f"kernel(q [{b}, {h}, {lq}, {d}], k/v [{b}, {h}, {lk}, {d}] {dtype}, "
                       f"mask {mask.int().tolist()})",
                  hint="check mask polarity (True = may attend) and broadcasting over heads")
