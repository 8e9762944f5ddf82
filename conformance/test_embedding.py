"""Embeddings (§3.4): scaled by sqrt(d_model) (embedding.scale), one matrix for both embeddings and the
pre-softmax projection (embedding.shared-weights).

embedding.scale is judged by variant attribution (``conformance.helpers.variants``) and by a readout probe of each
stack's input path (``readout_probes.check_input_path``); embedding.shared-weights by a parameter census of
the built model and by a readout probe of the pre-softmax transformation (``readout_probes.output_scale``).
"""

from __future__ import annotations

from typing import Any

import pytest

from aiayn_conformance.implementations import Implementation
from aiayn_conformance.spec.config import ModelConfig

from .helpers import readout_probes as ro
from .helpers.diagnosis import fail_on_variant_departure
from .helpers.harness import build_for_shapes, build_model, violation
from .helpers.readout_probes import check_input_path
from .helpers.settings import AuditSettings
from .helpers.traces import OWN_WEIGHTS, named_scale, observed


@pytest.mark.clause("embedding.scale")
def test_embedding_scale_variant(impl: Implementation, config: ModelConfig) -> None:
    """§3.4: the embedding lookup is multiplied by sqrt(d_model) before PE is added."""
    fail_on_variant_departure(impl, config, hint="x = embedding(tokens) * math.sqrt(d_model), in both stacks")


@pytest.mark.clause("embedding.scale")
@pytest.mark.parametrize("stack", ["decoder", "encoder"])
def test_embeddings_multiplied_by_sqrt_d_model(impl: Implementation, stack: str, config: ModelConfig) -> None:
    """Every sub-layer output zeroed, unit norms: the stack's input in closed form."""
    check_input_path(impl, config, stack, part="scale", hint="multiply the embedding lookup by sqrt(d_model) (§3.4)")


@pytest.mark.clause("embedding.scale")
def test_embedding_scale_on_own_weights(impl: Implementation, config: ModelConfig) -> None:
    """§3.4 without a transplant: in one traced forward at the model's own weights, the first result after each
    embedding lookup E that is the stack's input decomposes as c * E + P(position); c is sqrt(d_model)."""
    trace = observed(impl, config)
    measured = [lookup for lookup in trace.lookups if lookup.scale is not None]
    if not measured:
        why = "; ".join(lookup.how for lookup in trace.lookups) or "no embedding lookup of the source or target ids"
        pytest.skip(f"own-weights trace: the embedding scale could not be read ({why})")
    expected = config.d_model ** 0.5
    bad = [lookup for lookup in measured if abs((lookup.scale or 0.0) / expected - 1) > 1e-3]
    if bad:
        c = bad[0].scale or 0.0
        named = named_scale(c, {1.0: "1: not scaled", 1 / expected: "1/sqrt(d_model): divided instead",
                                float(config.d_model): "d_model: the square root forgotten"})
        violation(measured="; ".join(f"{lookup.stack} input = {lookup.scale:.6g} x E + P(position)" for lookup in bad)
                           + (f" ({named})" if named else ""),
                  expected=f"sqrt(d_model) = {expected:.6g} x E + PE", call=OWN_WEIGHTS,
                  hint="x = embedding(tokens) * math.sqrt(d_model), in both stacks, before PE is added")


def vocab_parameters(model: Any, vocab: int, d_model: int) -> dict[int, list[str]]:
    """Distinct parameter tensors of shape [vocab, d_model] or [d_model, vocab], with their names."""
    found: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if tuple(p.shape) in ((vocab, d_model), (d_model, vocab)):
            found.setdefault(id(p), []).append(name)
    return found


@pytest.mark.clause("embedding.shared-weights")
def test_shared_when_configured(impl: Implementation, settings: AuditSettings) -> None:
    cfg = settings.others["shared-vocabulary"]  # the audit configuration, unless --config gave separate vocabularies
    model = build_model(impl, cfg)
    mats = vocab_parameters(model, cfg.tgt_vocab, cfg.d_model)
    if len(mats) != 1:
        names = ["/".join(v) for v in mats.values()]
        violation(measured=f"{len(mats)} distinct [{cfg.tgt_vocab}, {cfg.d_model}] matrices: "
                  f"{', '.join(names) or 'none'}", expected="one matrix shared by the source embedding, the target "
                  "embedding and the pre-softmax projection (share_embeddings=True)",
                  call=f"{impl.name}.build(config with share_embeddings=True)",
                  hint="tie generator.weight and both embeddings to one nn.Parameter")
    biases = [n for n, p in model.named_parameters() if tuple(p.shape) == (cfg.tgt_vocab,)]
    if biases:
        violation(measured=f"a [{cfg.tgt_vocab}] bias: {', '.join(biases)}",
                  expected="no bias on the pre-softmax projection (logits = h E^T)",
                  call=f"{impl.name}.build(config)", hint="nn.Linear(d_model, vocab, bias=False)")


@pytest.mark.clause("embedding.shared-weights")
def test_separate_when_not_configured(impl: Implementation, settings: AuditSettings) -> None:
    cfg = settings.others["separate-vocabularies"]
    model = build_for_shapes(impl, cfg)  # tensors told apart by identity: the meta device's suffice
    src = vocab_parameters(model, cfg.src_vocab, cfg.d_model)
    tgt = vocab_parameters(model, cfg.tgt_vocab, cfg.d_model)
    if len(src) != 1 or len(tgt) != 2:
        violation(measured=f"{len(src)} source matrix(es) and {len(tgt)} distinct target-vocabulary "
                  "matrices", expected="with share_embeddings=False: a source embedding, and a target embedding "
                  "distinct from the pre-softmax projection", call=f"{impl.name}.build(share_embeddings=False, "
                  f"src_vocab={cfg.src_vocab}, tgt_vocab={cfg.tgt_vocab})",
                  hint="the tying flag is ignored (always tied, or tied to the wrong matrix)")


@pytest.mark.clause("embedding.shared-weights")
def test_pre_softmax_transformation_is_the_loaded_matrix(impl: Implementation, config: ModelConfig) -> None:
    """§3.4: the logits are h E^T with E the shared matrix, nothing more. With the last decoder norm at gain 0 and
    bias beta the paper's logits are E beta; logits scaled before the softmax read back as c beta."""
    fit = ro.output_scale(impl, config)
    if fit is None:
        pytest.skip(f"{impl.name}: the hidden state cannot be read back (needs load_reference_state and tied E)")
    c, residual = fit
    if residual > 1e-3:
        pytest.skip(f"with the last decoder norm at gain 0 and bias beta the output is no multiple of E beta (relative "
                    f"residual {residual:.3g}): something after that norm changes the hidden state, which the norm "
                    "and layer clauses judge")
    if abs(c) <= 1e-3:
        pytest.skip("blocked by norm.layer-norm: with the last decoder norm at gain 0 and bias beta the output hidden "
                    "state is 0, so that norm adds no bias and the pre-softmax transformation cannot be read here")
    if abs(c - 1) > 1e-3:
        violation(measured=f"the logits are {c:.4g} E beta: the scores are scaled by {c:.4g} before the softmax",
                  expected="logits E beta (the decoder's output beta times the loaded pre-softmax matrix, scale 1)",
                  call=f"forward after load_reference_state(visible weights) with {ro.last_layer(config)}.norm3 gain 0 "
                       "and bias beta (beta ~ N(1, 1) per feature); hidden state read back through the output matrix",
                  hint="no temperature or rescaling of the logits (e.g. T5's d_model^-0.5 on tied outputs): the "
                       "pre-softmax transformation is h E^T with the embedding matrix itself")
