"""Census: which canonical parameters matter. Perturb one group at a time and watch the output.

In the paper's model every parameter takes part in the output (eval mode,
weights that make attention sharp). A group whose perturbation changes
nothing is dead: a module built but never called, a decoder that returns an
intermediate layer, a cross-attention that reads the wrong encoder layer.
``blocked_by_layers`` turns that (and parameters shared between layers) into
the skip reason of the probes that assume every canonical group is its own
live parameter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability
from aiayn_conformance.spec.schema import tied_groups

from . import settings
from .harness import build_model
from .inputs import witness_batch
from .outputs import log_probs
from .transplant import load_into, visible_state

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Implementation

__all__ = ["census", "shared_parameters", "blocked_by_layers", "DEAD"]


def groups(state: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """Canonical names grouped by module (``decoder.1.norm3`` -> its weight and bias)."""
    out: dict[str, list[str]] = {}
    for name in state:
        out.setdefault(name.rsplit(".", 1)[0], []).append(name)
    return out


def _census(impl: Implementation, config: ModelConfig) -> tuple[dict[str, float], str]:
    model = build_model(impl, config)
    if not has_capability(model, "load_reference_state"):
        return {}, f"{impl.name} has no load_reference_state"
    state = visible_state(config, seed=21)
    src, tgt = witness_batch(config)
    load_into(model, state, impl.name)
    base = log_probs(model, impl, src, tgt, config)
    real = (tgt != config.pad_id)
    effect: dict[str, float] = {}
    g = torch.Generator().manual_seed(22)
    for module, names in groups(state).items():
        if module in ("tgt_embed", "generator") and config.share_embeddings:
            continue  # one tensor with src_embed
        changed = dict(state)
        for n in names:
            changed[n] = state[n] + torch.randn(state[n].shape, generator=g) * 0.5
            for group in tied_groups(config):
                if n in group:  # a tied tensor changes under all its names
                    changed.update({other: changed[n] for other in group})
        load_into(model, changed, impl.name)
        out = log_probs(model, impl, src, tgt, config)
        effect[module] = (out - base)[real].abs().max().item()
    load_into(model, state, impl.name)
    return effect, ""


def census(impl: Implementation, config: ModelConfig) -> tuple[dict[str, float], str]:
    """``({module: max output change when perturbed}, reason if unavailable)`` (once per implementation and
    session)."""
    found = settings.current().cache("census")
    key = (impl.name, id(impl), config)
    if key not in found:
        found[key] = _census(impl, config)
    return found[key]


DEAD = 1e-6


def shared_parameters(model: torch.nn.Module, vocab_shapes: set[tuple[int, int]]) -> list[list[str]]:
    """Groups of module paths that hold one parameter tensor (the embedding tie excepted).

    Walks modules without de-duplication, so ``[layer] * N`` shows up as N names for one tensor.
    """
    owners: dict[int, list[str]] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for pname, p in module.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append(f"{module_name}.{pname}" if module_name else pname)
            shapes[id(p)] = tuple(p.shape)
    return [names for pid, names in owners.items() if len(names) > 1 and shapes[pid] not in vocab_shapes]


def blocked_by_layers(impl: Implementation, config: ModelConfig, *groups_used: str) -> str:
    """A skip reason when probes that perturb named canonical parameters cannot be read (else "").

    Those probes assume each canonical group is its own parameter and takes part in the model; when
    layers share parameters, or a probed group changes no output at all, layers.independent reports it.
    """
    model = build_model(impl, config)
    shared = shared_parameters(model, {(config.src_vocab, config.d_model), (config.tgt_vocab, config.d_model)})
    if shared:
        return f"blocked by layers.independent: {' = '.join(shared[0])} is one tensor"
    if groups_used:
        effect, why = census(impl, config)
        dead = [g for g in groups_used if g in effect and effect[g] <= DEAD]
        if dead:
            return f"blocked by layers.independent: perturbing {', '.join(dead)} changes no output"
    return ""
