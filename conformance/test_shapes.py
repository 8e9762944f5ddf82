"""model.shape: forward(src, tgt) returns [B, T, tgt_vocab] for every batch size and length."""

from __future__ import annotations

import pytest
from hypothesis import given

from . import strategies
from .harness import build_model, run_forward
from .inputs import CONFIG, random_tokens, witness_batch

CLAUSE = "model.shape"


@pytest.fixture(scope="module")
def model(impl):
    return build_model(impl, CONFIG, CLAUSE)


@pytest.mark.clause(CLAUSE)
def test_shape_witness(impl, model):
    """A padded batch with src_len != tgt_len."""
    src, tgt = witness_batch()
    run_forward(model, src, tgt, CLAUSE, vocab=CONFIG.tgt_vocab, pad_id=CONFIG.pad_id)


@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize("s_len, t_len", [(1, 1), (1, CONFIG.max_len), (CONFIG.max_len, 1),
                                          (CONFIG.max_len, CONFIG.max_len)], ids=["1x1", "1xmax", "maxx1", "maxxmax"])
def test_shape_edges(impl, model, s_len, t_len):
    """Lengths 1 and max_len, unpadded, batch 2."""
    src = random_tokens(CONFIG, [s_len, s_len], s_len, vocab=CONFIG.src_vocab, seed=1)
    tgt = random_tokens(CONFIG, [t_len, t_len], t_len, vocab=CONFIG.tgt_vocab, seed=2)
    run_forward(model, src, tgt, CLAUSE, vocab=CONFIG.tgt_vocab, pad_id=CONFIG.pad_id)


@pytest.mark.clause(CLAUSE)
@given(batch=strategies.src_tgt(CONFIG))
def test_shape_explored(impl, model, batch):
    """Hypothesis over batch size, lengths (1 to max_len) and padding."""
    src, tgt = batch
    run_forward(model, src, tgt, CLAUSE, vocab=CONFIG.tgt_vocab, pad_id=CONFIG.pad_id)
