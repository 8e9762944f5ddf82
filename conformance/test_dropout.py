"""dropout.residual (§5.4): dropout at P_drop on sub-layer outputs and embedding sums, before the residual
addition and the norm, in training only."""

from __future__ import annotations

import pytest
import torch

from aiayn_conformance.implementations import Implementation
from aiayn_conformance.spec.contract import has_capability

from . import readout_probes as ro
from .harness import build_model, describe_call, run_forward, violation
from .inputs import CONFIG, witness_batch
from .outputs import log_probs
from .transplant import load_into, visible_state


@pytest.mark.clause("dropout.residual")
def test_no_randomness_when_p_drop_is_zero(impl: Implementation) -> None:
    model = build_model(impl, CONFIG.replace(dropout=0.0), train=True)
    src, tgt = witness_batch()
    a = run_forward(model, src, tgt, vocab=CONFIG.tgt_vocab, pad_id=CONFIG.pad_id)
    b = run_forward(model, src, tgt, vocab=CONFIG.tgt_vocab, pad_id=CONFIG.pad_id)
    if not torch.equal(a, b):
        diff = (a - b).abs().max().item()
        violation(measured=f"two train-mode calls with dropout=0 differ by up to {diff:.3g}",
                  expected="no randomness at all when P_drop = 0", call=describe_call(src, tgt) + " twice, train mode",
                  hint="a dropout rate hard-coded instead of taken from the configuration")


def dropped_fraction(h: torch.Tensor) -> float:
    """Share of features per position that sit on the position's most common value.

    LayerNorm maps every zeroed input feature to the same value, so with
    sub-layers off the dropped embedding features of a position coincide.
    """
    shares = []
    for vec in h.reshape(-1, h.size(-1)):
        _, counts = torch.unique(torch.round(vec * 1e5), return_counts=True)
        top = counts.max().item()
        shares.append(top / vec.numel() if top > 1 else 0.0)
    return sum(shares) / len(shares)


@pytest.mark.clause("dropout.residual")
def test_embedding_sum_dropout_rate(impl: Implementation) -> None:
    """Sub-layers off, unit norms, train mode at P_drop = 0.5: about half of each position's embedding+PE
    features are dropped before the (first) norm."""
    p = 0.5
    cfg = CONFIG.replace(dropout=p)
    model = build_model(impl, cfg, train=True)
    if not has_capability(model, "load_reference_state"):
        pytest.skip(f"{impl.name} has no load_reference_state")
    state = ro.sublayers_off(visible_state(cfg, seed=71, unit_norms=True), "decoder")
    load_into(model, state, impl.name)
    torch.manual_seed(72)
    logp = log_probs(model, impl, *ro.witness(), cfg)
    h, residual = ro.readout(logp, state["generator.weight"])
    if residual > 1e-3:
        pytest.skip("the hidden state cannot be read back")
    rate = dropped_fraction(h)
    if abs(rate - p) > 0.15:
        violation(measured=f"about {rate:.0%} of the decoder's embedding+PE features are dropped in train mode",
                  expected=f"P_drop = {p:.0%} of them (dropout on the sums of embeddings and positional encodings)",
                  call=f"forward in train mode, dropout={p}, every decoder sub-layer output zeroed, unit norms",
                  hint="dropout missing on the embedding sum, or a rate that ignores config.dropout")


@pytest.mark.clause("dropout.residual")
def test_sublayer_output_dropout_rate(impl: Implementation) -> None:
    """The last decoder sub-layer's output is dropped at P_drop before the residual addition.

    With the last layer's norm2 at gain 0 and bias 0, the FFN's input is the zero vector at every position,
    whatever happened below (so no other dropout reaches this point), and the paper's last sub-layer
    computes LN3(0 + Dropout(FFN(0))). LayerNorm maps the dropped features (all exactly 0) to one shared
    value, so about P_drop of each position's features coincide; without that dropout none do."""
    p = 0.5
    cfg = CONFIG.replace(dropout=p)
    model = build_model(impl, cfg, train=True)
    if not has_capability(model, "load_reference_state"):
        pytest.skip(f"{impl.name} has no load_reference_state")
    post, why = ro.post_norm_probe(impl)
    if not post:
        pytest.skip(why or "blocked by norm.post-norm: the FFN's input is not norm2's output")
    state = visible_state(cfg, seed=73, unit_norms=True)
    state[f"{ro.LAST}.norm2.weight"] = torch.zeros(cfg.d_model)
    state[f"{ro.LAST}.norm2.bias"] = torch.zeros(cfg.d_model)
    load_into(model, state, impl.name)
    torch.manual_seed(74)
    src, tgt = ro.witness()
    logp = log_probs(model, impl, src, tgt, cfg)
    h, residual = ro.readout(logp, state["generator.weight"])
    if residual > 1e-3:
        pytest.skip("the hidden state cannot be read back")
    h = h[tgt != cfg.pad_id]
    rate = dropped_fraction(h)
    if abs(rate - p) > 0.15:
        violation(measured=f"about {rate:.0%} of the features of the last sub-layer's output are dropped "
                  "in train mode", expected=f"P_drop = {p:.0%} (dropout on every sub-layer output, §5.4)",
                  call=f"forward in train mode, dropout={p}, {ro.LAST}.norm2 gain 0 and bias 0, unit norms",
                  hint="LayerNorm(x + Sublayer(x)) without the Dropout: apply dropout to each sub-layer's output "
                       "before the residual addition")


@pytest.mark.clause("dropout.residual")
def test_post_norm_outputs_stay_normalized_in_train_mode(impl: Implementation) -> None:
    """§5.4 drops each sub-layer's output "before it is added to the sub-layer input and normalized": with unit
    norms the decoder's output is a layer norm's output, mean 0 and variance 1 per position, in train mode as in
    eval mode. Dropout after the add & norm (Dropout(LayerNorm(x + F(x)))) zeroes some of those features and
    scales the rest by 1/(1 - P_drop)."""
    p = 0.5
    cfg = CONFIG.replace(dropout=p)
    model = build_model(impl, cfg, train=True)
    if not has_capability(model, "load_reference_state"):
        pytest.skip(f"{impl.name} has no load_reference_state")
    state = visible_state(cfg, seed=75, unit_norms=True)
    load_into(model, state, impl.name)

    src, tgt = ro.witness()

    def hidden(train: bool) -> torch.Tensor | None:
        model.train(train)
        torch.manual_seed(76)
        h, residual = ro.readout(log_probs(model, impl, src, tgt, cfg), state["generator.weight"])
        return h[tgt != cfg.pad_id] if residual <= 1e-3 else None

    evaluated, trained = hidden(False), hidden(True)
    if evaluated is None or trained is None:
        pytest.skip("the hidden state cannot be read back")
    if not normalized(evaluated):
        pytest.skip("blocked by norm.post-norm: with unit norms the eval-mode output is not a layer norm's output")
    if not normalized(trained):
        var = trained.var(-1, unbiased=False)
        zeros = (trained.abs() < 1e-6).float().mean().item()
        violation(measured=f"in train mode (dropout {p}) the decoder's output has per-position variance "
                           f"{var.min().item():.3g}..{var.max().item():.3g} and {zeros:.0%} exact zeros; in eval mode "
                           "it is normalized (mean 0, variance 1)",
                  expected="LayerNorm(x + Dropout(Sublayer(x))): the layer's output is normalized in train mode too",
                  call=f"forward in train mode and in eval mode, dropout={p}, unit norms, hidden state read back",
                  hint="dropout applied after the add & norm (Dropout(LayerNorm(x + F(x)))) or on the stack's "
                       "output: drop the sub-layer output before the residual addition")


def normalized(h: torch.Tensor, tol: float = 1e-3) -> bool:
    """Every row has mean 0 and biased variance 1 (within ``tol``)."""
    mean, var = h.mean(-1), h.var(-1, unbiased=False)
    return bool((mean.abs() < tol).all() and ((var - 1).abs() < tol).all())
