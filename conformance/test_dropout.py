"""dropout.residual (§5.4): dropout at P_drop on sub-layer outputs and embedding sums, in training only."""

from __future__ import annotations

import pytest
import torch

from . import readout as ro
from .harness import build_model, describe_call, run_forward, violation
from .inputs import CONFIG, witness_batch
from .weights import has_method, load_into, visible_state

CLAUSE = "dropout.residual"


@pytest.mark.clause(CLAUSE)
def test_no_randomness_when_p_drop_is_zero(impl):
    model = build_model(impl, CONFIG.replace(dropout=0.0), CLAUSE, train=True)
    src, tgt = witness_batch()
    a = run_forward(model, src, tgt, CLAUSE, vocab=CONFIG.tgt_vocab, pad_id=CONFIG.pad_id)
    b = run_forward(model, src, tgt, CLAUSE, vocab=CONFIG.tgt_vocab, pad_id=CONFIG.pad_id)
    if not torch.equal(a, b):
        diff = (a - b).abs().max().item()
        violation(CLAUSE, measured=f"two train-mode calls with dropout=0 differ by up to {diff:.3g}",
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


@pytest.mark.clause(CLAUSE)
def test_embedding_sum_dropout_rate(impl):
    """Sub-layers off, unit norms, train mode at P_drop = 0.5: about half of each position's embedding+PE
    features are dropped before the (first) norm."""
    p = 0.5
    cfg = CONFIG.replace(dropout=p)
    model = build_model(impl, cfg, CLAUSE, train=True)
    if not has_method(model, "load_reference_state"):
        pytest.skip(f"{impl.name} has no load_reference_state")
    state = ro.sublayers_off(visible_state(cfg, seed=71, unit_norms=True), "decoder")
    load_into(model, state, CLAUSE, impl.name)
    torch.manual_seed(72)
    from .probes import log_probs

    logp = log_probs(model, impl, ro.SRC, ro.TGT, CLAUSE, cfg)
    h, residual = ro.readout(logp, state["generator.weight"])
    if residual > 1e-3:
        pytest.skip("the hidden state cannot be read back")
    rate = dropped_fraction(h)
    if abs(rate - p) > 0.15:
        violation(CLAUSE, measured=f"about {rate:.0%} of the decoder's embedding+PE features are dropped in train mode",
                  expected=f"P_drop = {p:.0%} of them (dropout on the sums of embeddings and positional encodings)",
                  call=f"forward in train mode, dropout={p}, every decoder sub-layer output zeroed, unit norms",
                  hint="dropout missing on the embedding sum, or a rate that ignores config.dropout")
