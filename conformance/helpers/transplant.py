"""Transplanting canonical weights: weights that make bugs visible, loaded into an implementation and its
reference twin.

Random initializations hide bugs: with layer-norm gains 1 and biases 0 a
missing gain changes nothing; with small weights attention is nearly uniform,
so a wrong mask or scale barely moves the output. ``visible_state`` draws
weights that avoid both (gains far from 1, biases far from 0, projections
large enough that attention is sharp); ``load_into`` loads them into a model
through the adapter's ``load_reference_state``, ``transplanted`` builds the
implementation holding them, ``sharp_or_own`` the model a black-box witness runs on (transplanted where it
can be), and ``reference_twin`` (``reference.model``'s, re-exported here) the reference holding them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pytest
import torch

from aiayn_conformance.reference.model import reference_twin
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability
from aiayn_conformance.spec.schema import parameter_schema, tied_groups

from . import settings
from .harness import ImplementationError, build_model, could_not_check, current_clause, held_weights, seeded

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Implementation

__all__ = ["STATE_SEED", "visible_state", "load_into", "transplanted", "sharp_or_own", "reference_twin"]

STATE_SEED = 11  # the seed of the visible weights the transplant-based checks share


def visible_state(config: ModelConfig, *, seed: int = 0, attention_gain: float = 2.0,
                  unit_norms: bool = False,
                  adjust: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """A canonical state dict with bug-revealing values.

    Norm gains are drawn from U(0.5, 1.5) and biases from U(-0.5, 0.5) unless
    ``unit_norms`` (gain 1, bias 0: the configuration in which post-norm
    outputs have mean 0 and variance 1). Attention projections get std
    ``attention_gain / sqrt(d_model)`` so scores are O(attention_gain^2)
    and softmaxes are sharp. Tied names (§3.4) hold the very same tensor.
    ``adjust(name, tensor)`` may rewrite any entry (e.g. zero one sub-layer).
    """
    schema = parameter_schema(config)
    d = config.d_model
    state: dict[str, torch.Tensor] = {}
    with seeded(seed):
        for name, shape in schema.items():
            if ".norm" in name:
                if unit_norms:
                    t = torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
                elif name.endswith("weight"):
                    t = torch.empty(shape).uniform_(0.5, 1.5)
                else:
                    t = torch.empty(shape).uniform_(-0.5, 0.5)
            elif "embed" in name or name.startswith("generator"):
                t = torch.randn(shape) * d ** -0.5
            elif "attn" in name:
                t = torch.randn(shape) * attention_gain / d ** 0.5
            elif name.endswith("bias"):
                t = torch.empty(shape).uniform_(-0.2, 0.2)
            else:  # FFN matrices
                t = torch.randn(shape) / shape[1] ** 0.5
            state[name] = t
    for group in tied_groups(config):
        for other in group[1:]:
            state[other] = state[group[0]]
    if adjust is not None:
        state = {k: adjust(k, v) for k, v in state.items()}
        for group in tied_groups(config):
            for other in group[1:]:
                state[other] = state[group[0]]
    return state


def load_into(model: Any, state: Mapping[str, torch.Tensor], impl_name: str = "") -> None:
    """Call ``model.load_reference_state(state)`` with clones (ties kept); a crash, or an adapter without the
    method, means the clause under test could not be checked."""
    if not has_capability(model, "load_reference_state"):
        could_not_check(f"needs load_reference_state, which {impl_name or 'the adapter'} lacks")
    copies: dict[str, torch.Tensor] = {}
    clones: dict[int, torch.Tensor] = {}
    for k, v in state.items():  # keep ties tied in the copy
        copies[k] = clones.setdefault(id(v), v.detach().clone())
    try:
        with torch.no_grad():
            model.load_reference_state(copies)
    except ImplementationError:
        raise
    except Exception as exc:
        could_not_check(f"{impl_name}: load_reference_state(canonical state) raised", exc)


def transplanted(impl: Implementation, config: ModelConfig, state: Mapping[str, torch.Tensor] | None = None, *,
                 cache: bool = True) -> Any:
    """The implementation built for ``config`` in eval mode holding ``state`` (default: the visible weights,
    seed ``STATE_SEED``, built once per implementation, config and session when ``cache``); skips when the
    adapter has no ``load_reference_state``."""
    models = settings.current().cache("transplanted")
    key = (impl.name, id(impl), config)
    if cache and state is None and key in models:
        return models[key]
    model = build_model(impl, config)
    if not has_capability(model, "load_reference_state"):
        pytest.skip(f"{impl.name} has no load_reference_state(state): the transplant-based check of "
                    f"{current_clause()} needs it")
    load_into(model, visible_state(config, seed=STATE_SEED) if state is None else state, impl.name)
    model.eval()
    if cache and state is None:
        models[key] = model
    return model


SHARP = f"on sharp transplanted weights (load_reference_state(visible weights, seed {STATE_SEED}))"
OWN_SCALE = ("at the model's own initialisation: the adapter has no load_reference_state, so the witness ran at "
             "the model's own scale (a near-uniform attention can hide a leak)")


def sharp_or_own(impl: Implementation, model: Any, config: ModelConfig) -> tuple[Any, str]:
    """(the model a black-box witness should run on, which weights it holds, as its messages say it).

    A witness whose effect scales with the sharpness of attention (a leaked future or padded key) must not
    depend on the implementation's own initialisation: with a small init (std 0.02) attention is near uniform
    and a leak moves the output by less than the tolerance. Where the adapter can load weights that is the
    implementation holding the visible weights (``transplanted``); elsewhere ``model`` itself, said so.
    """
    if has_capability(model, "load_reference_state"):
        return transplanted(impl, config), SHARP
    if held_weights(impl, config):
        return model, (f"on the weights given with --weights ({held_weights(impl, config)}): the adapter has no "
                       "load_reference_state to load sharper ones")
    return model, OWN_SCALE
