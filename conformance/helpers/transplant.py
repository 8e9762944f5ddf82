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

import hashlib
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest
import torch

from aiayn_conformance.reference.model import reference_twin
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability
from aiayn_conformance.spec.schema import parameter_schema, tied_groups

from . import settings
from .harness import ImplementationError, build_model, could_not_check, current_clause, held_weights

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Implementation

__all__ = ["STATE_SEED", "visible_state", "visible_twin", "load_into", "transplanted", "scratch_model", "sharp_or_own",
           "reference_twin"]

STATE_SEED = 11  # the seed of the visible weights the transplant-based checks share


def visible_state(config: ModelConfig, *, seed: int = 0, attention_gain: float = 2.0, sublayer_gain: float = 0.5,
                  unit_norms: bool = False,
                  adjust: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """A canonical state dict with bug-revealing values, at any size.

    Norm gains are drawn from U(0.5, 1.5) and biases from U(-0.5, 0.5) unless ``unit_norms`` (gain 1, bias 0: the
    same matrices otherwise). W^Q and W^K get std ``attention_gain / sqrt(d_model)``, so that scores have std about
    attention_gain^2 whatever d_model and h: attention is sharp. W^V and W1 get std 1 / sqrt(fan_in), and the
    sub-layers' output maps (W^O, W2) std ``sublayer_gain / sqrt(fan_in)``: each sub-layer's output is about half
    its residual input, so what a token contributes survives every norm of a deep stack (with sub-layer outputs
    larger than the residual, its share shrinks geometrically with depth, to below float32's resolution at N = 6).
    Tied names (§3.4) hold the very same tensor. ``adjust(name, tensor)`` may rewrite any entry (into a new tensor:
    it is given the session's draw). Drawn once per session, arguments and parameter schema (configurations that
    differ in dropout or max_len alone share a draw, and so do ``unit_norms`` and not), adjusted or not (a base
    model's vocabulary tables are large): callers copy the dict and never change a tensor in place.
    """
    drawn = settings.current().cache("visible-states")
    # keyed by what the draw reads: configurations with one schema and ties (dropout, max_len apart) share it
    key = (tuple(parameter_schema(config).items()), tuple(tied_groups(config)), seed, attention_gain, sublayer_gain)
    if key not in drawn:
        drawn[key] = _draw(config, seed, attention_gain, sublayer_gain)
    state = dict(drawn[key])
    if unit_norms:
        state.update({name: torch.ones(t.shape) if name.endswith("weight") else torch.zeros(t.shape)
                      for name, t in state.items() if ".norm" in name})
    if adjust is not None:  # the session's draw, rewritten into new tensors, never changed in place: tied again
        state = {k: adjust(k, v) for k, v in state.items()}
        for group in tied_groups(config):
            for other in group[1:]:
                state[other] = state[group[0]]
    return state


def _generator(seed: int, name: str) -> torch.Generator:
    """The generator of one tensor of the draw of ``seed``: seeded from the seed and the parameter's name, so a
    tensor's values depend on neither the order nor the number of the others (nor on the global RNG)."""
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def _draw(config: ModelConfig, seed: int, attention_gain: float, sublayer_gain: float) -> dict[str, torch.Tensor]:
    """Each tensor from its own generator (``_generator``), the tied copies not drawn (they are the first of their
    group), on as many threads as torch's intra-op threads (the draws are serial in torch: at the big model's
    sizes one thread drew a state in 2.5 s, two in 0.9 s)."""
    schema = parameter_schema(config)
    d = config.d_model
    copies = {other for group in tied_groups(config) for other in group[1:]}
    names = [name for name in schema if name not in copies]

    def draw(name: str) -> torch.Tensor:
        shape, g = schema[name], _generator(seed, name)
        if ".norm" in name:
            low, high = (0.5, 1.5) if name.endswith("weight") else (-0.5, 0.5)
            return torch.empty(shape).uniform_(low, high, generator=g)
        if "embed" in name or name.startswith("generator"):
            return torch.randn(shape, generator=g).mul_(d ** -0.5)
        if name.endswith(("attn.q.weight", "attn.k.weight")):
            return torch.randn(shape, generator=g).mul_(attention_gain).div_(d ** 0.5)
        if name.endswith(("attn.o.weight", "ffn.w2.weight")):
            return torch.randn(shape, generator=g).mul_(sublayer_gain).div_(shape[1] ** 0.5)
        if name.endswith("bias"):
            return torch.empty(shape).uniform_(-0.2, 0.2, generator=g)
        return torch.randn(shape, generator=g).div_(shape[1] ** 0.5)  # W^V, W1

    threads = torch.get_num_threads()
    if threads <= 1:
        state = {name: draw(name) for name in names}
    else:
        with ThreadPoolExecutor(threads) as pool:
            state = dict(zip(names, pool.map(draw, names)))
    for group in tied_groups(config):
        for other in group[1:]:
            state[other] = state[group[0]]
    return state


def visible_twin(config: ModelConfig) -> Any:
    """The reference twin holding the visible weights (seed ``STATE_SEED``), built once per session and
    configuration for the checks that only read its outputs (a base model takes seconds to build)."""
    twins = settings.current().cache("visible-twins")
    if config not in twins:
        twins[config] = reference_twin(config, visible_state(config, seed=STATE_SEED))
    return twins[config]


def load_into(model: Any, state: Mapping[str, torch.Tensor], impl_name: str = "") -> None:
    """Call ``model.load_reference_state(state)``; a crash, or an adapter without the method, means the clause under
    test could not be checked.

    The first load into an adapter class gets copies (ties kept) and is watched: an adapter that keeps the tensors it
    is given (a parameter sharing their memory, or any reference to one) or changes them in place goes on getting
    copies, since the states are drawn once per session and shared by every check. The others are given the
    states themselves (a base model's copy costs as much as its load)."""
    if not has_capability(model, "load_reference_state"):
        could_not_check(f"needs load_reference_state, which {impl_name or 'the adapter'} lacks")
    copies_needed = settings.current().cache("load-needs-copies")  # adapter class -> bool
    kind = type(model)
    if copies_needed.get(kind) is False:
        _load(model, dict(state), impl_name)
        return
    copies: dict[str, torch.Tensor] = {}
    clones: dict[int, torch.Tensor] = {}
    for k, v in state.items():  # keep ties tied in the copy
        copies[k] = clones.setdefault(id(v), v.detach().clone())
    if kind in copies_needed:
        _load(model, copies, impl_name)
        return
    versions = {id(t): t._version for t in clones.values()}
    _load(model, copies, impl_name)
    ptrs = {t.untyped_storage().data_ptr() for t in clones.values() if t.numel()}
    own = [*model.parameters(), *model.buffers()] if isinstance(model, torch.nn.Module) else []
    kept = (any(t._version != versions[id(t)] for t in clones.values())
            or any(t.numel() and t.untyped_storage().data_ptr() in ptrs for t in own))
    refs = [weakref.ref(t) for t in clones.values()]
    del copies, clones, own
    copies_needed[kind] = kept or any(r() is not None for r in refs)


def _load(model: Any, state: dict[str, torch.Tensor], impl_name: str) -> None:
    try:
        with torch.no_grad():
            model.load_reference_state(state)
    except ImplementationError:
        raise
    except Exception as exc:
        could_not_check(f"{impl_name}: load_reference_state(canonical state) raised", exc)


def transplanted(impl: Implementation, config: ModelConfig, state: Mapping[str, torch.Tensor] | None = None, *,
                 cache: bool = True, scratch: bool = False) -> Any:
    """The implementation built for ``config`` in eval mode holding ``state`` (default: the visible weights,
    seed ``STATE_SEED``, built once per implementation, config and session when ``cache``); skips when the
    adapter has no ``load_reference_state``. ``scratch``: one model per implementation, config and session,
    loaded again at each call, for a caller that reads its outputs at once (a base model takes seconds to build)."""
    models = settings.current().cache("transplanted")
    key = (impl.name, id(impl), config)
    if cache and state is None and key in models:
        return models[key]
    model = scratch_model(impl, config) if scratch else build_model(impl, config)
    if not has_capability(model, "load_reference_state"):
        pytest.skip(f"{impl.name} has no load_reference_state(state): the transplant-based check of "
                    f"{current_clause()} needs it")
    load_into(model, visible_state(config, seed=STATE_SEED) if state is None else state, impl.name)
    model.eval()
    if cache and state is None:
        models[key] = model
    return model


def scratch_model(impl: Implementation, config: ModelConfig) -> Any:
    """One model of ``impl`` at ``config`` per session, for callers that load a full canonical state into it and
    read its outputs at once (left in whatever mode the last caller set)."""
    scratches = settings.current().cache("scratch-models")
    key = (impl.name, id(impl), config)
    if key not in scratches:
        scratches[key] = build_model(impl, config)
    return scratches[key]


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
