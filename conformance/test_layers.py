"""layers.independent (§3.1): N layers with their own parameters, in sequence, the last one's output used."""

from __future__ import annotations

import pytest

from aiayn_conformance.implementations import Implementation
from aiayn_conformance.spec.config import ModelConfig

from .helpers.census import DEAD, census, shared_parameters
from .helpers.diagnosis import fail_on_variant_departure
from .helpers.harness import build_model, violation


@pytest.mark.clause("layers.independent")
def test_no_parameter_is_shared_between_layers_or_sublayers(impl: Implementation, config: ModelConfig) -> None:
    model = build_model(impl, config)
    shared = shared_parameters(model, {(config.src_vocab, config.d_model), (config.tgt_vocab, config.d_model)})
    if shared:
        violation(measured="one parameter tensor serves several modules: "
                  + "; ".join(" = ".join(n) for n in shared[:3]),
                  expected="each layer and each sub-layer owns its parameters (only the §3.4 embedding tie is shared)",
                  call=f"{impl.name}.build(config) parameter census",
                  hint="a module instance reused ([layer] * N instead of copies, or one LayerNorm for two sub-layers)")


UNREAD = 1e-5  # an effect this small relative to the largest one is float32 rounding, not a parameter taking part


@pytest.mark.clause("layers.independent")
def test_every_layer_parameter_matters(impl: Implementation, config: ModelConfig) -> None:
    """Perturbing any canonical parameter group of any layer changes the output (except those that
    only reach the decoder through the final encoder layer: attention.cross-source judges those)."""
    effect, why = census(impl, config)
    if why:
        pytest.skip(why)
    last = f"encoder.{config.n_layers - 1}."
    dead = [m for m, e in effect.items() if e <= DEAD and not m.startswith(last)]
    encoder = [m for m in effect if m.startswith("encoder.")]
    if encoder and max(effect[m] for m in encoder) <= max(DEAD, UNREAD * max(effect.values())):
        # No encoder parameter moves the output beyond rounding: the decoder reads nothing of the encoder, whose only
        # way in is cross-attention's values (its queries and keys then only weigh nothing). That is
        # attention.cross-source's finding, not a layer never applied.
        dead = [m for m in dead if not (m.startswith(("encoder.", "src_embed")) or m.rsplit(".", 1)[-1] in ("q", "k")
                                        and ".cross_attn." in m)]
        if not dead:
            pytest.skip("blocked by attention.cross-source: perturbing any encoder parameter moves the output by at "
                        f"most {max(effect[m] for m in encoder):.3g} (rounding; the other groups by up to "
                        f"{max(effect.values()):.3g}): the decoder reads nothing of the encoder output")
    if dead:
        norms = [m for m in dead if m.rsplit(".", 1)[-1].startswith("norm")]
        if norms and len(norms) == len(dead):
            hint = (f"{norms[0]} is never applied: its sub-layer normalizes with another sub-layer's LayerNorm (one "
                    "norm module reused, e.g. self.norm1 after both the attention and the FFN); give every sub-layer "
                    "its own nn.LayerNorm(d_model), LayerNorm(x + Sublayer(x)) with that sub-layer's norm")
        else:
            hint = ("a module built but never called (another one reused in its place), or the decoder returning an "
                    "intermediate layer's output")
        violation(measured=f"perturbing these canonical parameters changes no output: {', '.join(dead[:6])}",
                  expected="every layer's parameters take part, each stack's layers applied in sequence and the "
                           "decoder's output taken from its last layer",
                  call="load_reference_state(visible weights), then each group perturbed by N(0, 0.5^2) in turn",
                  hint=hint)


@pytest.mark.clause("layers.independent")
def test_each_sublayer_has_its_own_norm_variant(impl: Implementation, config: ModelConfig) -> None:
    """§3.1: LayerNorm(x + Sublayer(x)) with each sub-layer's own norm; the variant that reproduces the
    implementation does not reuse one sub-layer's norm for another."""
    fail_on_variant_departure(
        impl, config, hint="one LayerNorm module applied after two sub-layers (the other never used): give every "
                           "sub-layer "
                   "its own norm (norm1 after self-attention, norm2 after cross-attention or the encoder's FFN, norm3 "
                   "after the decoder's FFN)")
