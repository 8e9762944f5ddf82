"""layers.independent (§3.1): N layers with their own parameters, in sequence, the last one's output used."""

from __future__ import annotations

import pytest

from implementations import Implementation

from .census import DEAD, census, shared_parameters
from .harness import build_model, violation
from .inputs import CONFIG


@pytest.mark.clause("layers.independent")
def test_no_parameter_is_shared_between_layers_or_sublayers(impl: Implementation) -> None:
    model = build_model(impl, CONFIG)
    shared = shared_parameters(model, {(CONFIG.src_vocab, CONFIG.d_model), (CONFIG.tgt_vocab, CONFIG.d_model)})
    if shared:
        violation(measured="one parameter tensor serves several modules: "
                  + "; ".join(" = ".join(n) for n in shared[:3]),
                  expected="each layer and each sub-layer owns its parameters (only the §3.4 embedding tie is shared)",
                  call=f"{impl.name}.build(config) parameter census",
                  hint="a module instance reused ([layer] * N instead of copies, or one LayerNorm for two sub-layers)")


@pytest.mark.clause("layers.independent")
def test_every_layer_parameter_matters(impl: Implementation) -> None:
    """Perturbing any canonical parameter group of any layer changes the output (except those that
    only reach the decoder through the final encoder layer: attention.cross-source judges those)."""
    effect, why = census(impl)
    if why:
        pytest.skip(why)
    last = f"encoder.{CONFIG.n_layers - 1}."
    dead = [m for m, e in effect.items() if e <= DEAD and not m.startswith(last)]
    if dead:
        violation(measured=f"perturbing these canonical parameters changes no output: {', '.join(dead[:6])}",
                  expected="every layer's parameters take part, each stack's layers applied in sequence and the "
                           "decoder's output taken from its last layer",
                  call="load_reference_state(visible weights), then each group perturbed by N(0, 0.5^2) in turn",
                  hint="a module built but never called (another one reused in its place), or the decoder "
                       "returning an intermediate layer's output")
