"""embedding.shared-weights (§3.4): one matrix for both embeddings and the pre-softmax projection."""

from __future__ import annotations

import pytest

from .harness import build_model, violation
from .inputs import CONFIG

CLAUSE = "embedding.shared-weights"


def vocab_parameters(model, vocab: int, d_model: int) -> dict[int, list[str]]:
    """Distinct parameter tensors of shape [vocab, d_model] or [d_model, vocab], with their names."""
    found: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if tuple(p.shape) in ((vocab, d_model), (d_model, vocab)):
            found.setdefault(id(p), []).append(name)
    return found


@pytest.mark.clause(CLAUSE)
def test_shared_when_configured(impl):
    model = build_model(impl, CONFIG, CLAUSE)
    mats = vocab_parameters(model, CONFIG.tgt_vocab, CONFIG.d_model)
    if len(mats) != 1:
        names = ["/".join(v) for v in mats.values()]
        violation(CLAUSE, measured=f"{len(mats)} distinct [{CONFIG.tgt_vocab}, {CONFIG.d_model}] matrices: "
                  f"{', '.join(names) or 'none'}", expected="one matrix shared by the source embedding, the target "
                  "embedding and the pre-softmax projection (share_embeddings=True)",
                  call=f"{impl.name}.build(config with share_embeddings=True)",
                  hint="tie generator.weight and both embeddings to one nn.Parameter")
    biases = [n for n, p in model.named_parameters() if tuple(p.shape) == (CONFIG.tgt_vocab,)]
    if biases:
        violation(CLAUSE, measured=f"a [{CONFIG.tgt_vocab}] bias: {', '.join(biases)}",
                  expected="no bias on the pre-softmax projection (logits = h E^T)",
                  call=f"{impl.name}.build(config)", hint="nn.Linear(d_model, vocab, bias=False)")


@pytest.mark.clause(CLAUSE)
def test_separate_when_not_configured(impl):
    cfg = CONFIG.replace(src_vocab=41, tgt_vocab=43, share_embeddings=False)
    model = build_model(impl, cfg, CLAUSE)
    src = vocab_parameters(model, cfg.src_vocab, cfg.d_model)
    tgt = vocab_parameters(model, cfg.tgt_vocab, cfg.d_model)
    if len(src) != 1 or len(tgt) != 2:
        violation(CLAUSE, measured=f"{len(src)} source matrix(es) and {len(tgt)} distinct target-vocabulary "
                  "matrices", expected="with share_embeddings=False: a source embedding, and a target embedding "
                  "distinct from the pre-softmax projection", call=f"{impl.name}.build(share_embeddings=False, "
                  f"src_vocab={cfg.src_vocab}, tgt_vocab={cfg.tgt_vocab})",
                  hint="the tying flag is ignored (always tied, or tied to the wrong matrix)")
