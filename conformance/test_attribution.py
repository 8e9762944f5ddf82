"""Variant attribution for the structural clauses outside attention (§3.1, §3.3, §3.4, §3.5).

The implementation holding the visible canonical weights is matched against the reference variants
(``conformance.variants``); a clause fails when the variant that reproduces the implementation departs
from it, and the message names what the implementation does instead. These tests complement the
closed-form probes of test_norm.py, test_ffn.py and test_inputs_path.py, which do not need an exact
explanation of the whole model.
"""

from __future__ import annotations

import pytest

from .census import blocked_by_layers
from .diagnosis import judge
from .inputs import CONFIG

NORMS = [f"{stack}.{i}.norm{k}" for stack, n in (("encoder", 2), ("decoder", 3))
         for i in range(CONFIG.n_layers) for k in range(1, n + 1)]


@pytest.mark.clause("norm.post-norm")
def test_post_norm_variant(impl):
    """§3.1: LayerNorm(x + Sublayer(x)) around every sub-layer, x the sub-layer's input."""
    judge(impl, "norm.post-norm",
          hint="pre-norm computes x + Sublayer(LayerNorm(x)); the residual must add the sub-layer's input x "
               "(not the sub-layer's output to itself: ffn_out + dropout(ffn_out))")


@pytest.mark.clause("norm.no-extra-norm")
def test_no_extra_norm_variant(impl):
    """§3.1: no norm after the embeddings and none at the top of either stack."""
    judge(impl, "norm.no-extra-norm",
          hint="nn.TransformerEncoder/Decoder(norm=...) and nn.Transformer add a final LayerNorm; a LayerNorm "
               "right after embedding + PE is not in the paper")


@pytest.mark.clause("norm.layer-norm")
def test_layer_norm_variant(impl):
    """§3.1 (Ba et al. 2016): biased variance, eps inside the square root, per-feature gain and bias."""
    blocked = blocked_by_layers(impl, *NORMS)
    if blocked:
        pytest.skip(blocked)
    judge(impl, "norm.layer-norm",
          hint="(x - mean) / (x.std() + eps) uses the unbiased std and eps outside the sqrt; use "
               "torch.nn.functional.layer_norm")


@pytest.mark.clause("ffn.formula")
def test_ffn_variant(impl):
    """§3.3, Eq. (2): ReLU between the two affine maps, and nowhere else."""
    judge(impl, "ffn.formula", hint="nn.Sequential(Linear, ReLU, Linear): not GELU, not a missing activation, "
                                    "not ReLU after the second Linear")


@pytest.mark.clause("embedding.scale")
def test_embedding_scale_variant(impl):
    """§3.4: the embedding lookup is multiplied by sqrt(d_model) before PE is added."""
    judge(impl, "embedding.scale", hint="x = embedding(tokens) * math.sqrt(d_model), in both stacks")


@pytest.mark.clause("position.added")
def test_position_added_variant(impl):
    """§3.5: x = sqrt(d_model) E[tokens] + PE, once, in the encoder and in the decoder."""
    judge(impl, "position.added",
          hint="add the table once per stack (a module that returns x + PE must not be added to x again), "
               "in both the encoder and the decoder")
