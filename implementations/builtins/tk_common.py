"""What the toolkit plugins share (``tk_opennmt``, ``tk_joeynmt``, ``tk_fairseq``): not a plugin, it registers
nothing."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from aiayn_conformance.spec.schema import CanonicalKey, Target, load_canonical

__all__ = ["load_with_extra_norms", "read_torch_checkpoint"]


def load_with_extra_norms(state: Mapping[str, Tensor], mapping: Mapping[CanonicalKey, Target],
                          params: Mapping[str, Tensor], used: set[str], zero: list[Tensor]) -> None:
    """``load_canonical`` after the mapped parameters, the toolkit's layer norms the schema has no place for (its
    final or pre-norm extras, ``*layer_norm.weight`` / ``.bias``) set to the identity; ValueError naming any other
    parameter left over."""
    rest = {n: p for n, p in params.items() if n not in used and not any(p is params[u] for u in used)}
    one = [p for n, p in rest.items() if n.endswith("layer_norm.weight")]
    zero = zero + [p for n, p in rest.items() if n.endswith("layer_norm.bias")]
    left = sorted(n for n, p in rest.items() if not n.endswith(("layer_norm.weight", "layer_norm.bias")))
    if left:
        raise ValueError(f"the canonical schema has no place for {', '.join(left)}")
    load_canonical(state, mapping, zero=zero, one=one)


def read_torch_checkpoint(path: str, toolkit: str, accepted: str) -> Any:
    """``torch.load`` of a toolkit's checkpoint (weights only, its argparse options allowed); a file torch cannot
    read is a one-line ValueError naming ``toolkit`` and what is ``accepted``."""
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        raise ValueError(f"not {toolkit} checkpoint (torch.load failed: {type(exc).__name__}: {text}); "
                         f"{accepted}") from None
