"""Masks (§3.2.3): causality, source and target padding, finiteness. Black-box unless stated."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from .harness import build_model, describe_call, run_forward, violation
from .inputs import CONFIG, random_tokens, witness_batch
from .probes import compare_real, log_probs, other_token
from .weights import has_method, load_into, visible_state

PAD = CONFIG.pad_id


@pytest.fixture(scope="module")
def model(impl):
    return build_model(impl, CONFIG, "mask.causal")


def check_causal(model, impl, src, tgt, j: int) -> None:
    """Changing target token j leaves positions < j unchanged and changes position j."""
    changed = tgt.clone()
    changed[:, j] = torch.tensor([other_token(int(t), CONFIG.tgt_vocab, PAD) for t in tgt[:, j]])
    a = log_probs(model, impl, src, tgt, "mask.causal", CONFIG)
    b = log_probs(model, impl, src, changed, "mask.causal", CONFIG)
    call = f"{describe_call(src, tgt, PAD)}, then target token {j} changed in every row"
    if j > 0:
        before = compare_real(a, b, tgt, PAD, positions=slice(0, j))
        if not before.ok:
            violation("mask.causal", measured=f"outputs before position {j} changed: {before.describe()}",
                      expected=f"outputs at positions 0..{j - 1} independent of target token {j}",
                      call=call, hint="the decoder self-attention sees future tokens: causal mask missing, "
                                      "added as a 0/1 float, or built with triu/tril swapped")
    at_j = (a[:, j] - b[:, j]).abs().max().item()
    if at_j <= 1e-6:
        violation("mask.causal", measured=f"the output at position {j} moved by only {at_j:.2g}",
                  expected=f"the output at position {j} depends on target token {j} (up to and including)",
                  call=call, hint="the decoder ignores its own input at position j")


@pytest.mark.clause("mask.causal")
@pytest.mark.parametrize("j", [0, 2, 5])
def test_causal_witness(impl, model, j):
    src = random_tokens(CONFIG, [7, 4], 7, vocab=CONFIG.src_vocab, seed=3)
    tgt = random_tokens(CONFIG, [6, 6], 6, vocab=CONFIG.tgt_vocab, seed=4)
    check_causal(model, impl, src, tgt, j)


@pytest.mark.clause("mask.causal")
@given(t_len=st.integers(1, CONFIG.max_len), s_len=st.integers(1, CONFIG.max_len), data=st.data())
def test_causal_explored(impl, model, t_len, s_len, data):
    j = data.draw(st.integers(0, t_len - 1), label="j (changed position)")
    seed = data.draw(st.integers(0, 1000), label="seed")
    src = random_tokens(CONFIG, [s_len], s_len, vocab=CONFIG.src_vocab, seed=seed)
    tgt = random_tokens(CONFIG, [t_len], t_len, vocab=CONFIG.tgt_vocab, seed=seed + 1)
    check_causal(model, impl, src, tgt, j)


@pytest.mark.clause("mask.causal")
def test_position_zero_attends_to_itself(impl):
    """§3.2.3 "up to and including": decoder position 0 attends to key 0 (transplant probe).

    The residual path carries token 0 to position 0 even when the diagonal is
    masked, so a black-box perturbation cannot see a missing diagonal. Instead:
    zero W_v of every decoder self-attention. If position 0 attends to itself,
    its self-attention output was W_o W_v x_0 != 0, so the output moves; with
    the diagonal masked it attends to nothing and nothing moves.
    """
    model = build_model(impl, CONFIG, "mask.causal")
    if not has_method(model, "load_reference_state"):
        pytest.skip("needs load_reference_state (the adapter lacks it)")
    state = visible_state(CONFIG, seed=5)
    zeroed = {k: (torch.zeros_like(v) if ".self_attn.v." in k and k.startswith("decoder") else v)
              for k, v in state.items()}
    src = random_tokens(CONFIG, [5, 7], 7, vocab=CONFIG.src_vocab, seed=6)
    tgt = random_tokens(CONFIG, [4, 4], 4, vocab=CONFIG.tgt_vocab, seed=7)
    load_into(model, state, "mask.causal", impl.name)
    a = log_probs(model, impl, src, tgt, "mask.causal", CONFIG)
    load_into(model, zeroed, "mask.causal", impl.name)
    b = log_probs(model, impl, src, tgt, "mask.causal", CONFIG)
    moved = (a[:, 0] - b[:, 0]).abs().max().item()
    if moved <= 1e-6:
        violation("mask.causal",
                  measured=f"zeroing W_v of every decoder self-attention moved position 0 by {moved:.2g}",
                  expected="position 0 attends to itself, so its self-attention output (and the model output) changes",
                  call=f"{describe_call(src, tgt, PAD)} with canonical weights, then decoder self_attn.v zeroed",
                  hint="the causal mask excludes the diagonal (torch.triu(..., diagonal=0) / tril(..., -1))")


def appended(tokens: torch.Tensor, extra: int) -> torch.Tensor:
    return torch.cat([tokens, torch.full((tokens.size(0), extra), PAD, dtype=tokens.dtype)], dim=1)


@pytest.mark.clause("mask.source-padding")
@pytest.mark.parametrize("extra", [1, 5])
def test_source_padding_witness(impl, model, extra):
    src, tgt = witness_batch()
    a = log_probs(model, impl, src, tgt, "mask.source-padding", CONFIG)
    longer = appended(src, extra)
    b = log_probs(model, impl, longer, tgt, "mask.source-padding", CONFIG)
    cmp = compare_real(a, b, tgt, PAD)
    if not cmp.ok:
        violation("mask.source-padding", measured=f"appending {extra} source pad token(s) moved the outputs: "
                  f"{cmp.describe()}", expected="outputs at real target positions unchanged by source padding",
                  call=f"{describe_call(src, tgt, PAD)} vs src padded to {longer.size(1)}",
                  hint="padded keys keep weight: the mask is missing (often in cross-attention), filled with a "
                       "small value such as 1e-9 instead of -inf, or applied on the query axis")


@pytest.mark.clause("mask.source-padding")
@given(s_real=st.integers(1, CONFIG.max_len - 1), t_len=st.integers(1, 8), data=st.data())
def test_source_padding_explored(impl, model, s_real, t_len, data):
    extra = data.draw(st.integers(1, CONFIG.max_len - s_real), label="extra source padding")
    seed = data.draw(st.integers(0, 1000), label="seed")
    src = random_tokens(CONFIG, [s_real], s_real, vocab=CONFIG.src_vocab, seed=seed)
    tgt = random_tokens(CONFIG, [t_len], t_len, vocab=CONFIG.tgt_vocab, seed=seed + 1)
    a = log_probs(model, impl, src, tgt, "mask.source-padding", CONFIG)
    b = log_probs(model, impl, appended(src, extra), tgt, "mask.source-padding", CONFIG)
    cmp = compare_real(a, b, tgt, PAD)
    if not cmp.ok:
        violation("mask.source-padding", measured=cmp.describe(), expected="outputs unchanged by source padding",
                  call=f"{describe_call(src, tgt, PAD)} vs {extra} pad token(s) appended to src",
                  hint="padded keys keep weight in encoder self-attention or cross-attention")


@pytest.mark.clause("mask.target-padding")
@pytest.mark.parametrize("extra", [1, 4])
def test_target_padding_witness(impl, model, extra):
    src, tgt = witness_batch()
    a = log_probs(model, impl, src, tgt, "mask.target-padding", CONFIG)
    b = log_probs(model, impl, src, appended(tgt, extra), "mask.target-padding", CONFIG)[:, : tgt.size(1)]
    cmp = compare_real(a, b, tgt, PAD)
    if not cmp.ok:
        violation("mask.target-padding", measured=f"appending {extra} target pad token(s) moved earlier outputs: "
                  f"{cmp.describe()}", expected="outputs at real target positions unchanged by target padding",
                  call=f"{describe_call(src, tgt, PAD)} vs tgt padded to {tgt.size(1) + extra}",
                  hint="the target mask lets real positions see padding, or the padding mask is built on the "
                       "wrong axis / with the source's pad id")


@pytest.mark.clause("mask.finite")
def test_fully_padded_source_row_is_finite(impl, model):
    src = random_tokens(CONFIG, [6, 0, 3], 6, vocab=CONFIG.src_vocab, seed=8)  # row 1 is all padding
    tgt = random_tokens(CONFIG, [4, 4, 2], 4, vocab=CONFIG.tgt_vocab, seed=9)
    out = run_forward(model, src, tgt, "mask.finite", vocab=CONFIG.tgt_vocab, pad_id=PAD, check_finite=False)
    check_finite(out, tgt, f"{describe_call(src, tgt, PAD)} (row 1 of src is all padding)",
                 "softmax over a row that is entirely -inf gives NaN: a query with no key should attend to nothing")


@pytest.mark.clause("mask.finite")
def test_bfloat16_autocast_is_finite(impl, model):
    src, tgt = witness_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run_forward(model, src, tgt, "mask.finite", vocab=CONFIG.tgt_vocab, pad_id=PAD, check_finite=False)
    check_finite(out, tgt, f"{describe_call(src, tgt, PAD)} under torch.autocast('cpu', bfloat16)",
                 "a mask fill that the low-precision dtype cannot hold (e.g. -1e9 cast to half) or an overflow")


def check_finite(out: torch.Tensor, tgt: torch.Tensor, call: str, hint: str) -> None:
    real = (tgt != PAD)[..., None].expand_as(out)
    bad = ~torch.isfinite(out.detach().float()) & real
    if bool(bad.any()):
        idx = bad.nonzero()[0].tolist()
        violation("mask.finite", measured=f"{int(bad.sum())} non-finite value(s) at real positions, first "
                  f"{out[tuple(idx)].item()} at [batch, position, token] = {idx}",
                  expected="finite outputs for every padded input", call=call, hint=hint)
