"""Canonical-schema weights that make bugs visible, and transplanting them.

Random initializations hide bugs: with layer-norm gains 1 and biases 0 a
missing gain changes nothing; with small weights attention is nearly uniform,
so a wrong mask or scale barely moves the output. ``visible_state`` draws
weights that avoid both (gains far from 1, biases far from 0, projections
large enough that attention is sharp), and ``load_into`` transplants them
into an implementation and its reference twin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from spec.config import ModelConfig
from spec.schema import parameter_schema, tied_groups

from .harness import ImplementationError, seeded
from .harness import _crash as crash

__all__ = ["visible_state", "load_into", "reference_twin", "has_method"]


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


def has_method(model: Any, name: str) -> bool:
    return callable(getattr(model, name, None))


def load_into(model: Any, state: Mapping[str, torch.Tensor], clause_id: str, impl_name: str = "") -> None:
    """Call ``model.load_reference_state(state)`` with clones, turning a crash into ImplementationError."""
    if not has_method(model, "load_reference_state"):
        raise ImplementationError(f"[{clause_id}] needs load_reference_state, which {impl_name or 'the adapter'} lacks")
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
        crash(clause_id, f"{impl_name}: load_reference_state(canonical state) raised", exc)


def reference_twin(config: ModelConfig, state: Mapping[str, torch.Tensor]):
    """The reference model in eval mode holding ``state``."""
    from reference.model import Transformer

    ref = Transformer(config).eval()
    ref.load_reference_state({k: v.detach().clone() for k, v in state.items()})
    return ref
