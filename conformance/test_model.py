"""Whole-model properties: batch independence, eval determinism, output normalization."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from .harness import build_model, describe_call, run_forward, violation
from .inputs import CONFIG, random_tokens, witness_batch
from .probes import compare_real, log_probs

PAD = CONFIG.pad_id


@pytest.fixture(scope="module")
def model(impl):
    return build_model(impl, CONFIG, "model.batch-independence")


def check_batch_independence(model, impl, src, tgt) -> None:
    full = log_probs(model, impl, src, tgt, "model.batch-independence", CONFIG)
    order = torch.arange(src.size(0)).flip(0)
    flipped = log_probs(model, impl, src[order], tgt[order], "model.batch-independence", CONFIG)[order.argsort()]
    cmp = compare_real(full, flipped, tgt, PAD)
    if not cmp.ok:
        violation("model.batch-independence", measured=f"reversing the batch order changed outputs: {cmp.describe()}",
                  expected="each sample's outputs independent of its neighbours and their order",
                  call=f"{describe_call(src, tgt, PAD)} vs the same batch reversed",
                  hint="heads split or merged with view/reshape across the batch axis, positional table indexed by "
                       "batch index, or statistics taken over the batch")
    for b in range(src.size(0)):
        alone = log_probs(model, impl, src[b:b + 1], tgt[b:b + 1], "model.batch-independence", CONFIG)
        cmp = compare_real(full[b:b + 1], alone, tgt[b:b + 1], PAD)
        if not cmp.ok:
            violation("model.batch-independence", measured=f"sample {b} alone differs from sample {b} in the batch: "
                      f"{cmp.describe()}", expected="the same outputs alone and in a batch (same padded width)",
                      call=f"{describe_call(src, tgt, PAD)} vs row {b} alone",
                      hint="features mixed across the batch (reshape without transpose, seq-first code fed "
                           "batch-first tensors, PE indexed on the batch axis)")


@pytest.mark.clause("model.batch-independence")
def test_batch_independence_witness(impl, model):
    src, tgt = witness_batch()
    check_batch_independence(model, impl, src, tgt)


@pytest.mark.clause("model.batch-independence")
@given(batch=st.integers(2, 4), s_len=st.integers(1, 10), t_len=st.integers(1, 10), seed=st.integers(0, 1000))
def test_batch_independence_explored(impl, model, batch, s_len, t_len, seed):
    g = torch.Generator().manual_seed(seed)
    s_lengths = torch.randint(1, s_len + 1, (batch,), generator=g).tolist()
    t_lengths = torch.randint(1, t_len + 1, (batch,), generator=g).tolist()
    src = random_tokens(CONFIG, s_lengths, s_len, vocab=CONFIG.src_vocab, seed=seed)
    tgt = random_tokens(CONFIG, t_lengths, t_len, vocab=CONFIG.tgt_vocab, seed=seed + 1)
    check_batch_independence(model, impl, src, tgt)


@pytest.mark.clause("model.eval-determinism")
def test_eval_calls_agree_exactly(impl, model):
    src, tgt = witness_batch()
    a = run_forward(model.eval(), src, tgt, "model.eval-determinism", vocab=CONFIG.tgt_vocab, pad_id=PAD)
    b = run_forward(model.eval(), src, tgt, "model.eval-determinism", vocab=CONFIG.tgt_vocab, pad_id=PAD)
    real = (tgt != PAD)[..., None].expand_as(a)
    if not torch.equal(a[real], b[real]):
        diff = (a - b).abs()[real].max().item()
        violation("model.eval-determinism",
                  measured=f"two identical eval-mode calls differ by up to {diff:.3g}",
                  expected="identical outputs in eval mode", call=describe_call(src, tgt, PAD) + " twice, eval mode",
                  hint="dropout still active in eval mode (F.dropout without training=self.training)")


@pytest.mark.clause("model.eval-determinism")
def test_train_mode_with_dropout_varies(impl):
    model = build_model(impl, CONFIG, "model.eval-determinism", train=True)
    src, tgt = witness_batch()
    torch.manual_seed(1)
    a = run_forward(model, src, tgt, "model.eval-determinism", vocab=CONFIG.tgt_vocab, pad_id=PAD)
    b = run_forward(model, src, tgt, "model.eval-determinism", vocab=CONFIG.tgt_vocab, pad_id=PAD)
    if torch.equal(a, b):
        violation("model.eval-determinism",
                  measured=f"two train-mode calls with dropout {CONFIG.dropout} agree exactly",
                  expected="train mode with P_drop > 0 is stochastic (§5.4 residual and embedding dropout)",
                  call=describe_call(src, tgt, PAD) + " twice, train mode", hint="dropout missing or never enabled")


@pytest.mark.clause("model.eval-determinism")
def test_train_mode_without_dropout_equals_eval(impl):
    cfg = CONFIG.replace(dropout=0.0)
    model = build_model(impl, cfg, "model.eval-determinism")
    src, tgt = witness_batch()
    evaluated = log_probs(model.eval(), impl, src, tgt, "model.eval-determinism", cfg)
    trained = log_probs(model.train(), impl, src, tgt, "model.eval-determinism", cfg)
    cmp = compare_real(trained, evaluated, tgt, PAD)
    if not cmp.ok:
        violation("model.eval-determinism",
                  measured=f"train mode with dropout 0 differs from eval mode: {cmp.describe()}",
                  expected="with P_drop = 0, dropout is the only train/eval difference, so the outputs agree",
                  call=describe_call(src, tgt, PAD) + " in train mode (dropout 0) and in eval mode",
                  hint="a dropout rate that ignores the configuration, or an eval-only fast path that computes "
                       "something else (e.g. nested tensors dropping padded positions)")


@pytest.mark.clause("model.output-normalization")
def test_output_is_what_is_declared(impl, model):
    src, tgt = witness_batch()
    out = run_forward(model, src, tgt, "model.output-normalization", vocab=CONFIG.tgt_vocab, pad_id=PAD).detach()
    out = out.double()[tgt != PAD]  # (N real positions, V)
    call = describe_call(src, tgt, PAD)
    if impl.output == "logits":
        lse = torch.logsumexp(out, dim=-1)
        if bool((lse.abs() < 1e-5).all()):
            violation("model.output-normalization", measured=f"logsumexp of the declared logits is "
                      f"{lse.abs().max().item():.2g} at every position: they are already log-probabilities",
                      expected="raw logits (the softmax belongs to the loss), or declare output='log_probs'",
                      call=call, hint="a (log-)softmax at the end of forward followed by a loss that applies another "
                                      "one: double softmax")
        if bool(((out >= 0) & (out <= 1)).all()) and bool(((out.sum(-1) - 1).abs() < 1e-5).all()):
            violation("model.output-normalization", measured="the declared logits are probabilities (each row in "
                      "[0, 1] summing to 1)", expected="raw logits, or declare output='probs'", call=call,
                      hint="a softmax at the end of forward")
    elif impl.output == "log_probs":
        lse = torch.logsumexp(out, dim=-1)
        if not bool((lse.abs() < 1e-4).all()):
            violation("model.output-normalization", measured=f"logsumexp of the declared log-probabilities reaches "
                      f"{lse.abs().max().item():.3g}", expected="log-probabilities: logsumexp over the vocabulary = 0",
                      call=call, hint="declared 'log_probs' but returns logits or probabilities")
    else:
        sums = out.sum(-1)
        if not (bool((out >= 0).all()) and bool(((sums - 1).abs() < 1e-4).all())):
            violation("model.output-normalization", measured=f"declared probabilities sum to {sums.min().item():.4g}.."
                      f"{sums.max().item():.4g}", expected="probabilities: non-negative, summing to 1", call=call,
                      hint="declared 'probs' but returns logits or log-probabilities")
