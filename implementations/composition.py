"""Components composed into the reference: ``reference+attention=a+layer_norm=b`` names a whole model.

The registry resolves such a name with ``parse_composition`` and ``compose``; the model is
the reference (``reference/model.py``) with each named component swapped in, and it inherits
the deviations its components declare. A ``search`` or ``length_penalty`` component replaces
the reference's beam search or GNMT penalty in the model's ``generate`` (``reference+search=NAME``
audits a third party's beam search driving the reference's key/value cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.spec.config import ModelConfig

from .declarations import COMPONENT_KINDS, Component, Implementation, validated

__all__ = ["compose", "parse_composition"]

# factory() -> a function; layer_norm and feed_forward are module factories, called by the model per layer
_CALL_FACTORY = ("attention", "positional_encoding", "length_penalty", "search")


def parse_composition(name: str) -> list[tuple[str, str]]:
    """``reference+attention=a+layer_norm=b`` -> ``[("attention", "a"), ("layer_norm", "b")]``.

    A one-line ValueError says what is wrong with a malformed name."""
    base, *parts = name.split("+")
    pairs = []
    for part in parts:
        kind, sep, comp = part.partition("=")
        if not sep or not comp:
            raise ValueError(f"composition part {part!r} in {name!r} is not KIND=NAME")
        if kind not in COMPONENT_KINDS:
            raise ValueError(f"composition part {part!r}: kind {kind!r} is not one of {', '.join(COMPONENT_KINDS)}")
        pairs.append((kind, comp))
    if base != "reference":
        raise ValueError(f"compositions start from 'reference' (got {base!r}), e.g. reference+attention=NAME")
    if not pairs:
        raise ValueError(f"composition {name!r} names no component (e.g. reference+attention=NAME)")
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError(f"composition {name!r} names a kind twice")
    return pairs


def compose(name: str, components: Sequence[Component]) -> Implementation:
    """The reference with these components swapped in, as an Implementation named ``name``."""
    deviations: dict[str, str] = {}
    for comp in components:
        for clause_id, why in comp.deviations.items():
            deviations.setdefault(clause_id, f"{comp.kind} component {comp.name!r}: {why}")

    def build(config: ModelConfig) -> Transformer:
        parts: dict[str, Any] = {c.kind: c.factory() if c.kind in _CALL_FACTORY else c.factory for c in components}
        return Transformer(config, **parts)

    described = ", ".join(f"{c.kind}={c.name}" for c in components)
    return validated(Implementation(
        name=name, build=build, summary=f"the reference with {described}",
        source="; ".join(f"{c.name}: {c.source or c.plugin}" for c in components),
        output="logits", deviations=deviations, free_head_dims=True,
        plugin="aiayn_conformance.implementations.builtins.components",
    ))
