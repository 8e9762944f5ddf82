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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import has_capability
from aiayn_conformance.spec.schema import tied_groups

from . import settings
from .harness import build_model, run_forward
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


def _perturbations(config: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Per module, the random change of each of its canonical tensors (a tied tensor under its first module only)."""
    g = torch.Generator().manual_seed(22)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for module, names in groups(state).items():
        if module in ("tgt_embed", "generator") and config.share_embeddings:
            continue  # one tensor with src_embed
        out[module] = {n: torch.randn(state[n].shape, generator=g) * 0.5 for n in names}
    return out


def _shifted(config: ModelConfig, state: dict[str, torch.Tensor],
             shift: Callable[[str, str], torch.Tensor | float]) -> dict[str, torch.Tensor]:
    """``state`` with ``shift(module, name)`` added to every canonical tensor, tied names kept one tensor."""
    out = dict(state)
    for module, names in groups(state).items():
        if module in ("tgt_embed", "generator") and config.share_embeddings:
            continue
        for n in names:
            out[n] = state[n] + shift(module, n)
    for group in tied_groups(config):
        for other in group[1:]:
            out[other] = out[group[0]]
    return out


Elements = dict[str, "torch.Tensor | None"]  # parameter name -> flat indices one module sets (None: all of them)


def _parameter_map(model: Any, impl: Implementation, config: ModelConfig, state: dict[str, torch.Tensor],
                   modules: list[str]) -> dict[str, Elements] | None:
    """Which elements of the implementation's parameters each canonical module sets, found from two loads in which
    every module is shifted by 1 and by its own number k + 1 (an element copied from module k, scaled or not,
    moves k + 1 times as far in the second); None when an element follows no single module that way (a load that
    sums or transforms canonical tensors)."""
    params = dict(model.named_parameters())
    before = {n: p.detach().cpu().clone() for n, p in params.items()}  # on the CPU, whatever --device
    number = {m: k for k, m in enumerate(modules)}
    moved = []
    for shift in (lambda m, n: 1.0, lambda m, n: float(number[m] + 1)):
        load_into(model, _shifted(config, state, shift), impl.name)
        moved.append({n: (p.detach().cpu() - before[n]).flatten() for n, p in params.items()})
    load_into(model, state, impl.name)
    found: dict[str, Elements] = {m: {} for m in modules}
    for name, one in moved[0].items():
        touched = one.abs() > 1e-3
        count = int(touched.sum())
        if count == 0:
            continue
        every = count == one.numel()
        ratio = moved[1][name] / one if every else moved[1][name][touched] / one[touched]
        k = ratio.round()
        low, high = int(k.min()), int(k.max())
        if low < 1 or high > len(modules) or bool(((ratio - k).abs() > 1e-2).any()):
            return None
        where = None if every else touched.nonzero().flatten()
        if low == high:  # the usual case: the parameter (or its touched part) copies one module
            found[modules[low - 1]][name] = where
            continue
        positions = torch.arange(one.numel()) if where is None else where
        for idx in k.unique().tolist():
            found[modules[int(idx) - 1]][name] = positions[k == idx]
    return found


OBJECTIVES = 2  # random projections of the log-probabilities whose gradients the census reads


def _census(impl: Implementation, config: ModelConfig) -> tuple[dict[str, float], str]:
    model = build_model(impl, config)
    if not has_capability(model, "load_reference_state"):
        return {}, f"{impl.name} has no load_reference_state"
    state = visible_state(config, seed=21)
    src, tgt = witness_batch(config)
    load_into(model, state, impl.name)
    base = log_probs(model, impl, src, tgt, config)
    real = (tgt != config.pad_id)
    deltas = _perturbations(config, state)
    mapping = _parameter_map(model, impl, config, state, list(deltas))
    if mapping is not None:
        effect = _by_gradient(model, impl, config, state, deltas, mapping, src, tgt)
        if effect is not None:
            return effect, ""
    effect = {}
    for module, change in deltas.items():  # each module's change loaded through the adapter, one at a time
        def one(m: str, n: str, module: str = module, change: dict[str, torch.Tensor] = change) -> Any:
            return change[n] if m == module else 0.0

        load_into(model, _shifted(config, state, one), impl.name)
        effect[module] = (log_probs(model, impl, src, tgt, config) - base)[real].abs().max().item()
    load_into(model, state, impl.name)
    return effect, ""


def _by_gradient(model: Any, impl: Implementation, config: ModelConfig, state: dict[str, torch.Tensor],
                 deltas: dict[str, dict[str, torch.Tensor]], mapping: dict[str, Elements], src: torch.Tensor,
                 tgt: torch.Tensor) -> dict[str, float] | None:
    """Each module's effect as the largest directional derivative, along its perturbation, of a few random
    projections of the log-probabilities: one forward and OBJECTIVES backward passes instead of one forward per
    module (a base model has 127 modules). A module none of whose elements the output depends on gets exactly 0.
    None when the model cannot be differentiated (then each module is perturbed in turn)."""
    params = dict(model.named_parameters())
    before = {n: p.detach().cpu().clone() for n, p in params.items()}  # on the CPU, whatever --device
    load_into(model, _shifted(config, state, lambda m, n: deltas[m][n]), impl.name)
    change = {n: (p.detach().cpu() - before[n]).flatten() for n, p in params.items()}
    load_into(model, state, impl.name)
    real = (tgt != config.pad_id)
    g = torch.Generator().manual_seed(23)
    derivatives: dict[str, list[float]] = {m: [] for m in mapping}
    requires = {n: p.requires_grad for n, p in params.items()}
    try:
        for p in params.values():
            p.requires_grad_(True)
        scores = run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id, grad=True).double()
        out = (torch.log_softmax(scores, dim=-1) if impl.output == "logits" else
               scores.clamp_min(1e-300).log() if impl.output == "probs" else scores)
        for _ in range(OBJECTIVES):
            weights = torch.randn(out.shape, generator=g, dtype=out.dtype) * real[..., None]
            grads = torch.autograd.grad((out * weights).sum(), list(params.values()), retain_graph=True,
                                        allow_unused=True)
            flat = {n: (gr.flatten() if gr is not None else None) for n, gr in zip(params, grads)}
            for module, elements in mapping.items():
                total = 0.0
                for name, idx in elements.items():
                    grad, moved = flat[name], change[name]
                    if grad is not None:
                        if idx is not None:
                            grad, moved = grad[idx], moved[idx]
                        total += float(torch.dot(grad.float(), moved.float()))
                derivatives[module].append(abs(total))
    except (RuntimeError, TypeError):  # no autograd path through this adapter
        return None
    finally:
        for n, p in params.items():
            p.requires_grad_(requires.get(n, p.requires_grad))
    return {m: max(d) if d else 0.0 for m, d in derivatives.items()}


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
