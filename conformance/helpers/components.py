"""Auditing a component alone (``--component``): building it from its factory, calling an attention kernel.

A crash means the clause under test could not be checked (``ImplementationError``); a component that cannot
run on this machine (``ComponentUnavailable``) is skipped with its reason. The factories' call contracts are
in ``implementations/builtins/components.py`` and docs/components.md; the checks that use these helpers sit in the
module of the clause they check (``test_attention.py``, ``test_mask.py``, ``test_norm.py``, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import torch

from aiayn_conformance.implementations.builtins.components import ComponentUnavailable

from .harness import CheckTimeout, could_not_check

if TYPE_CHECKING:
    from aiayn_conformance.implementations import Component

__all__ = ["Kernel", "from_factory", "call_kernel", "qkv", "key_padding", "B", "H", "LQ", "LK", "DK", "DV"]

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], Any]

# The attention kernels' witness sizes: batch, heads, query and key lengths, per-head size.
B, H, LQ, LK, DK = 2, 3, 4, 6, 8
DV = 5  # d_v apart from d_k (Table 3, row B), for the witnesses that must tell them apart


def from_factory(component: Component, *args: Any) -> Any:
    """``component.factory(*args)``; a crash means the clause under test could not be checked, and a component
    that cannot run here (``ComponentUnavailable``: a library it wraps is not installed) skips with its reason."""
    try:
        return component.factory(*args)
    except ComponentUnavailable as exc:
        pytest.skip(f"{component.kind} component {component.name!r} is unavailable here: {exc}")
    except CheckTimeout:
        raise
    except Exception as exc:
        could_not_check(f"{component.kind} component {component.name!r}: factory({', '.join(map(repr, args))}) "
                        "raised", exc)


def call_kernel(kernel: Kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
    """``kernel(q, k, v, mask)``, checked to be a tensor [B, h, Lq, d_v]; skips a kernel unavailable here."""
    try:
        out = kernel(q, k, v, mask)
    except ComponentUnavailable as exc:
        pytest.skip(str(exc))
    except CheckTimeout:
        raise
    except Exception as exc:
        could_not_check(f"kernel(q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}, "
                        f"mask {None if mask is None else list(mask.shape)}) raised", exc)
    expected = (*q.shape[:-1], v.size(-1))
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        could_not_check(f"kernel returned {got}, expected shape {list(expected)}")
    return out


def qkv(seed: int = 0, dtype: torch.dtype = torch.float64, lq: int = LQ, lk: int = LK,
        gain: float = 2.0, dv: int = DK) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Witness q [B, H, lq, DK], k [B, H, lk, DK] and v [B, H, lk, dv]; q and k scaled by ``gain`` so softmaxes
    are sharp."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, lq, DK, generator=g, dtype=torch.float64) * gain
    k = torch.randn(B, H, lk, DK, generator=g, dtype=torch.float64) * gain
    v = torch.randn(B, H, lk, dv, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def key_padding(lengths: list[int], lk: int = LK) -> torch.Tensor:
    """A key-padding mask (len(lengths), 1, 1, lk), True at the first lengths[b] keys of row b."""
    mask = torch.zeros(len(lengths), 1, 1, lk, dtype=torch.bool)  # (B, 1, 1, Lk), True = may attend
    for b, n in enumerate(lengths):
        mask[b, ..., :n] = True
    return mask
