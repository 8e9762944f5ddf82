"""The whole model (§3): the output's shape (model.shape), the same function as the reference
(model.reference-equivalence), batch independence, eval determinism and the declared output normalization."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from aiayn_conformance.implementations import Implementation
from aiayn_conformance.reference.model import Transformer, padding_mask
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability
from aiayn_conformance.spec.tolerance import compare

from .helpers import shapes, strategies
from .helpers.diagnosis import diagnosis_of, explanation
from .helpers.harness import (
    build_model,
    call_forward,
    could_not_check,
    describe_call,
    output_problem,
    run_forward,
    violation,
)
from .helpers.inputs import random_tokens, witness_batch
from .helpers.outputs import compare_real, log_probs
from .helpers.settings import AuditSettings
from .helpers.transplant import load_into, reference_twin, visible_state


@pytest.fixture(scope="module")
def model(impl: Implementation, config: ModelConfig) -> Any:
    """The implementation built once per module for config, in eval mode."""
    return build_model(impl, config)


# --------------------------------------------------------------------------------------------------
# model.shape: forward(src, tgt) returns a floating tensor [B, T, tgt_vocab] for every batch size and length
# --------------------------------------------------------------------------------------------------
def check_output_shape(model: Any, src: torch.Tensor, tgt: torch.Tensor, config: ModelConfig) -> None:
    """Fail model.shape when ``model(src, tgt)`` is not a floating tensor [B, T, tgt_vocab] (a crash still
    means it could not be checked)."""
    out = call_forward(model, src, tgt, pad_id=config.pad_id)
    problem = output_problem(out, src, tgt, config.tgt_vocab)
    if problem is not None:
        got, expected = problem
        violation(measured=f"forward returned {got}", expected=expected, call=describe_call(src, tgt, config.pad_id),
                  hint="keep the batch axis and every target position (no squeeze(), no [:, -1], no sequence-first "
                       "layout), project to tgt_vocab scores, and return them as a float tensor")


@pytest.mark.clause("model.shape")
def test_accepted_shapes(impl: Implementation, config: ModelConfig) -> None:
    """The shape probe (``conformance.helpers.shapes``): forward accepts every probed batch size and length (those the
    witnesses use, 1 and max_len) and returns [B, T, tgt_vocab] floats. A model that rejects some is reported
    here, once; the other checks run at the shapes it accepts, or skip naming model.shape."""
    contract = shapes.current()
    if contract is None:  # the build raised: say so here too
        build_model(impl, config)
        pytest.skip(f"{impl.name}: the shape probe could not build the model")
    if not contract.usable:
        could_not_check(f"forward raised at every probed shape ({len(contract.tried)} tried); the first: "
                        f"{contract.error}")
    assert contract.base is not None  # usable
    accepted, rejected = contract.report()
    if not contract.complete:
        violation(measured=f"forward rejects some shapes\n  accepted: {accepted}\n  rejected: {rejected}\n"
                           f"  error:    {contract.error}",
                  expected=f"any batch size and every length from 1 to max_len = {config.max_len}; the other "
                           "clauses are judged at the accepted shapes only, and their checks that need a rejected "
                           "shape skip as blocked by model.shape",
                  call="forward on unpadded random tokens at each probed batch size and length, the other two held "
                       f"as in {shapes.describe_shape(*contract.base)}",
                  hint=contract.hint)
    if contract.output is not None:
        got, expected = contract.output
        violation(measured=f"forward returned {got}", expected=expected,
                  call=f"{shapes.describe_shape(*contract.base)} on unpadded random tokens (the shape probe)",
                  hint="keep the batch axis and every target position (no squeeze(), no [:, -1], no sequence-first "
                       "layout), project to tgt_vocab scores, and return them as a float tensor")


@pytest.mark.clause("model.shape")
def test_shape_witness(impl: Implementation, model: Any, config: ModelConfig) -> None:
    """A padded batch with src_len != tgt_len."""
    check_output_shape(model, *witness_batch(config), config)


@pytest.mark.clause("model.shape")
@pytest.mark.parametrize("s_len, t_len", [(1, 1), (1, "max"), ("max", 1), ("max", "max")],
                         ids=["1x1", "1xmax", "maxx1", "maxxmax"])
def test_shape_edges(impl: Implementation, model: Any, s_len: int | str, t_len: int | str,
                     config: ModelConfig) -> None:
    """Lengths 1 and max_len, unpadded, batch 2."""
    s_len, t_len = (config.max_len if n == "max" else int(n) for n in (s_len, t_len))
    src = random_tokens(config, [s_len, s_len], s_len, vocab=config.src_vocab, seed=1)
    tgt = random_tokens(config, [t_len, t_len], t_len, vocab=config.tgt_vocab, seed=2)
    check_output_shape(model, src, tgt, config)


@pytest.mark.clause("model.shape")
def test_shape_over_the_target_vocabulary(impl: Implementation, settings: AuditSettings) -> None:
    """With separate vocabularies of different sizes (share_embeddings=False), the scores are over the target's."""
    cfg = settings.others["separate-vocabularies"]
    src, tgt = witness_batch(cfg)
    check_output_shape(build_model(impl, cfg), src, tgt, cfg)


@pytest.mark.clause("model.shape")
@given(data=st.data())
def test_shape_explored(impl: Implementation, model: Any, config: ModelConfig, data: st.DataObject) -> None:
    """Hypothesis over batch size, lengths (1 to max_len), padding and tokens."""
    check_output_shape(model, *data.draw(strategies.src_tgt(config), label="batch"), config)


# --------------------------------------------------------------------------------------------------
# model.reference-equivalence: same canonical weights, same function as the reference
# --------------------------------------------------------------------------------------------------
# The weights make bugs visible (``transplant.visible_state``: norm gains and biases far from 1 and 0, sharp
# attention). Outputs are compared in log-probability space at real target positions, so logits, log-probs and
# probs are judged alike. A failure is localized: the encoder output (when the adapter has ``encode``) is
# compared first, and the message names the first stage that diverges and the reference variant that
# reproduces the implementation (``conformance.helpers.variants``), if one does.
@pytest.fixture(scope="module")
def pair(impl: Implementation, config: ModelConfig) -> tuple[Any, Transformer]:
    """(implementation, reference) holding the same visible canonical weights, both in eval mode."""
    model = build_model(impl, config)
    if not has_capability(model, "load_reference_state"):
        pytest.skip(f"{impl.name} has no load_reference_state: the black-box clauses audit it instead")
    state = visible_state(config, seed=11)
    load_into(model, state, impl.name)
    return model.eval(), reference_twin(config, state)


def encoder_stage(model: Any, ref: Transformer, src: torch.Tensor, config: ModelConfig) -> str:
    """Where the first divergence lies, judged from the encoder output."""
    if not has_capability(model, "encode"):
        return "the adapter has no encode(), so the encoder cannot be checked alone"
    try:
        with torch.no_grad():
            got = model.encode(src)
    except Exception as exc:
        could_not_check(f"encode(src {list(src.shape)}) raised", exc)
    if isinstance(got, (tuple, list)):
        got = got[0]
    with torch.no_grad():
        expected = ref.encode(src)
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        shape = list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return f"encode() returned {shape}, expected {list(expected.shape)}"
    real = padding_mask(src, config.pad_id)[:, 0, 0, :, None]  # (B, S, 1)
    cmp = compare(torch.where(real, got.double(), 0.0), torch.where(real, expected.double(), 0.0),
                  dtype=torch.float32, scope="model")
    if cmp.ok:
        return "the encoder output agrees; the first divergence is in the decoder or the output projection"
    return f"the encoder output already diverges ({cmp.describe()}): look at the encoder first"


def check_equivalence(pair: tuple[Any, Transformer], impl: Implementation, src: torch.Tensor,
                      tgt: torch.Tensor, config: ModelConfig) -> None:
    model, ref = pair
    got = log_probs(model, impl, src, tgt, config)
    with torch.no_grad():
        expected = torch.log_softmax(ref(src, tgt).double(), dim=-1)
    cmp = compare_real(got, expected, tgt, config.pad_id)
    if not cmp.ok:
        violation(measured=f"log-probabilities differ from the reference's: {cmp.describe()}; "
                  f"{encoder_stage(model, ref, src, config)}; {explanation(diagnosis_of(impl, config))}",
                  expected="the reference's log-probabilities (model tolerance) with the same canonical weights",
                  call=f"{describe_call(src, tgt, config.pad_id)} after load_reference_state(visible weights, seed 11)",
                  hint="see the structural clauses (attention.*, norm.*, ffn.formula, embedding.*, position.*) "
                       "for which part departs from the paper")


@pytest.mark.clause("model.reference-equivalence")
def test_equivalent_to_the_reference_witness(impl: Implementation, pair: tuple[Any, Transformer],
                                             config: ModelConfig) -> None:
    check_equivalence(pair, impl, *witness_batch(config), config)


@pytest.fixture(scope="module")
def explorable(impl: Implementation, pair: tuple[Any, Transformer], config: ModelConfig) -> tuple[Any, Transformer]:
    """Exploring is for differences the witness misses: when the witness already differs, the explored test
    would only re-find (and slowly shrink) the same violation, so it is skipped."""
    try:
        check_equivalence(pair, impl, *witness_batch(config), config)
    except AssertionError:
        pytest.skip("the witness test already shows the difference from the reference; nothing left to explore")
    return pair


@pytest.mark.clause("model.reference-equivalence")
@given(data=st.data())
def test_equivalent_to_the_reference_explored(impl: Implementation, explorable: tuple[Any, Transformer],
                                              config: ModelConfig, data: st.DataObject) -> None:
    """Hypothesis over batch size, lengths, padding and tokens."""
    src, tgt = data.draw(strategies.src_tgt(config, max_batch=3), label="batch")
    check_equivalence(explorable, impl, src, tgt, config)


# --------------------------------------------------------------------------------------------------
# model.batch-independence
# --------------------------------------------------------------------------------------------------
def check_batch_independence(model: Any, impl: Implementation, src: torch.Tensor, tgt: torch.Tensor,
                             config: ModelConfig) -> None:
    full = log_probs(model, impl, src, tgt, config)
    order = torch.arange(src.size(0)).flip(0)
    flipped = log_probs(model, impl, src[order], tgt[order], config)[order.argsort()]
    cmp = compare_real(full, flipped, tgt, config.pad_id, kind=impl.output)
    if not cmp.ok:
        violation(measured=f"reversing the batch order changed outputs: {cmp.describe()}",
                  expected="each sample's outputs independent of its neighbours and their order",
                  call=f"{describe_call(src, tgt, config.pad_id)} vs the same batch reversed",
                  hint="heads split or merged with view/reshape across the batch axis, positional table indexed by "
                       "batch index, or statistics taken over the batch")
    for b in range(src.size(0)):
        alone = log_probs(model, impl, src[b:b + 1], tgt[b:b + 1], config)
        cmp = compare_real(full[b:b + 1], alone, tgt[b:b + 1], config.pad_id, kind=impl.output)
        if not cmp.ok:
            violation(measured=f"sample {b} alone differs from sample {b} in the batch: {cmp.describe()}",
                      expected="the same outputs alone and in a batch (same padded width)",
                      call=f"{describe_call(src, tgt, config.pad_id)} vs row {b} alone",
                      hint="features mixed across the batch (reshape without transpose, seq-first code fed "
                           "batch-first tensors, PE indexed on the batch axis)")


@pytest.mark.clause("model.batch-independence")
def test_batch_independence_witness(impl: Implementation, model: Any, config: ModelConfig) -> None:
    check_batch_independence(model, impl, *witness_batch(config, min_batch=2), config)


@pytest.mark.clause("model.batch-independence")
@given(data=st.data())
def test_batch_independence_explored(impl: Implementation, model: Any, config: ModelConfig,
                                     data: st.DataObject) -> None:
    """Hypothesis over batch size (2 to 4), lengths (1 to 10), padding and tokens."""
    src, tgt = data.draw(strategies.src_tgt(config, min_batch=2, max_batch=4, max_len=10), label="batch")
    check_batch_independence(model, impl, src, tgt, config)


# --------------------------------------------------------------------------------------------------
# model.eval-determinism
# --------------------------------------------------------------------------------------------------
@pytest.mark.clause("model.eval-determinism")
def test_eval_calls_agree_exactly(impl: Implementation, model: Any, config: ModelConfig) -> None:
    src, tgt = witness_batch(config)
    a = run_forward(model.eval(), src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id)
    b = run_forward(model.eval(), src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id)
    real = (tgt != config.pad_id)[..., None].expand_as(a)
    if not torch.equal(a[real], b[real]):
        diff = (a - b).abs()[real].max().item()
        violation(measured=f"two identical eval-mode calls differ by up to {diff:.3g}",
                  expected="identical outputs in eval mode",
                  call=describe_call(src, tgt, config.pad_id) + " twice, eval mode",
                  hint="dropout still active in eval mode (F.dropout without training=self.training)")


@pytest.mark.clause("model.eval-determinism")
def test_train_mode_with_dropout_varies(impl: Implementation, config: ModelConfig) -> None:
    model = build_model(impl, config, train=True)
    src, tgt = witness_batch(config)
    torch.manual_seed(1)
    a = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id)
    b = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id)
    if torch.equal(a, b):
        violation(measured=f"two train-mode calls with dropout {config.dropout} agree exactly",
                  expected="train mode with P_drop > 0 is stochastic (§5.4 residual and embedding dropout)",
                  call=describe_call(src, tgt, config.pad_id) + " twice, train mode",
                  hint="dropout missing or never enabled")


@pytest.mark.clause("model.eval-determinism")
def test_train_mode_without_dropout_equals_eval(impl: Implementation, config: ModelConfig) -> None:
    cfg = config.replace(dropout=0.0)
    model = build_model(impl, cfg)
    src, tgt = witness_batch(config)
    evaluated = log_probs(model.eval(), impl, src, tgt, cfg)
    trained = log_probs(model.train(), impl, src, tgt, cfg)
    cmp = compare_real(trained, evaluated, tgt, config.pad_id, kind=impl.output)
    if not cmp.ok:
        violation(measured=f"train mode with dropout 0 differs from eval mode: {cmp.describe()}",
                  expected="with P_drop = 0, dropout is the only train/eval difference, so the outputs agree",
                  call=describe_call(src, tgt, config.pad_id) + " in train mode (dropout 0) and in eval mode",
                  hint="a dropout rate that ignores the configuration, or an eval-only fast path that computes "
                       "something else (e.g. nested tensors dropping padded positions)")


# --------------------------------------------------------------------------------------------------
# model.output-normalization
# --------------------------------------------------------------------------------------------------
@pytest.mark.clause("model.output-normalization")
def test_output_is_what_is_declared(impl: Implementation, model: Any, config: ModelConfig) -> None:
    src, tgt = witness_batch(config)
    out = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id).detach()
    out = out.double()[tgt != config.pad_id]  # (N real positions, V)
    call = describe_call(src, tgt, config.pad_id)
    if impl.output == "logits":
        lse = torch.logsumexp(out, dim=-1)
        if bool((lse.abs() < 1e-5).all()):
            violation(measured=f"logsumexp of the declared logits is {lse.abs().max().item():.2g} at every position: "
                      "they are already log-probabilities",
                      expected="raw logits (the softmax belongs to the loss), or declare output='log_probs'",
                      call=call, hint="a (log-)softmax at the end of forward followed by a loss that applies another "
                                      "one: double softmax")
        if bool(((out >= 0) & (out <= 1)).all()) and bool(((out.sum(-1) - 1).abs() < 1e-5).all()):
            violation(measured="the declared logits are probabilities (each row in [0, 1] summing to 1)",
                      expected="raw logits, or declare output='probs'", call=call,
                      hint="a softmax at the end of forward")
    elif impl.output == "log_probs":
        lse = torch.logsumexp(out, dim=-1)
        if not bool((lse.abs() < 1e-4).all()):
            violation(measured=f"logsumexp of the declared log-probabilities reaches {lse.abs().max().item():.3g}",
                      expected="log-probabilities: logsumexp over the vocabulary = 0",
                      call=call, hint="declared 'log_probs' but returns logits or probabilities")
    else:
        sums = out.sum(-1)
        if not (bool((out >= 0).all()) and bool(((sums - 1).abs() < 1e-4).all())):
            violation(measured=f"declared probabilities sum to {sums.min().item():.4g}..{sums.max().item():.4g}",
                      expected="probabilities: non-negative, summing to 1", call=call,
                      hint="declared 'probs' but returns logits or log-probabilities")
