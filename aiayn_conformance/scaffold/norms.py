"""Which sub-layer each layer norm of a layer serves, read from values: a copy of the model with random weights (so
that no two norms compute alike) runs once with hooks, and a norm serves sub-layer k when its input is k's input
plus k's output (post-norm, the paper's) or when its output is what k reads (pre-norm). A norm that matches no
sub-layer, or more than one, is named with the reason."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from .masks import _role
from .naming import tokens

Seen = dict[tuple[str, str], torch.Tensor]  # (module path in the layer, "in" or "out") -> the first tensor
MEMORY = {"memory", "mem", "enc", "encoder", "context", "src", "source", "cross"}  # a decoder layer's encoder input


@dataclass(frozen=True)
class Sublayer:
    """Where a sub-layer is read, as module paths inside the layer: the module whose first input is what it reads
    (its query or first projection), the one whose output it adds to the residual, and the sub-layer's module."""

    entry: str
    exit: str
    group: str


def _first_tensor(values: Any) -> torch.Tensor | None:
    for v in values if isinstance(values, (tuple, list)) else [values]:
        if isinstance(v, torch.Tensor):
            return v.detach().clone()
    return None


class _Record:
    """Hooks on the layer's norms and sub-layers recording what each first receives and returns."""

    def __init__(self, layer: nn.Module, sublayers: dict[int, Sublayer], norms: list[str]):
        self.seen: Seen = {}
        self.handles: list[Any] = []
        for n in norms:
            self._hook(layer, n, "norm")
        for sub in sublayers.values():
            self._hook(layer, sub.entry, "entry")
            self._hook(layer, sub.exit, "exit")
            self._hook(layer, sub.group, "exit")

    def _hook(self, layer: nn.Module, path: str, kind: str) -> None:
        module = layer.get_submodule(path) if path else layer

        def pre(_: nn.Module, args: tuple, kwargs: dict) -> None:
            t = _first_tensor([*args, *kwargs.values()])
            if t is not None:
                self.seen.setdefault((path, "in"), t)

        def post(_: nn.Module, args: tuple, out: Any) -> None:
            t = _first_tensor(out)
            if t is not None:
                self.seen.setdefault((path, "out"), t)

        self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        if kind != "entry":
            self.handles.append(module.register_forward_hook(post))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _close(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return False
    if a.shape != b.shape and a.dim() >= 2 and a.transpose(0, 1).shape == b.shape:
        a = a.transpose(0, 1)
    return a.shape == b.shape and bool(torch.isfinite(a).all()) and \
        torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-5)


def _call_alone(layer: nn.Module, d: int, blocked: bool, four_d: bool) -> None:
    """The layer called on its own: its first input random [2, 5, d], an encoder input [2, 7, d], masks that let
    everything through (``blocked``: the convention where True masks out), other required inputs None."""
    forward = layer.forward
    params = [p for p in inspect.signature(forward).parameters.values()
              if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    inner = getattr(layer, "_forward", None)
    if not params and callable(inner):  # forward(*args, **kwargs) passing them on
        params = [p for p in inspect.signature(inner).parameters.values()
                  if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    g = torch.Generator().manual_seed(0)
    x, memory = torch.randn(2, 5, d, generator=g), torch.randn(2, 7, d, generator=g)
    args: list[Any] = []
    for n, p in enumerate(params):
        words = tokens(p.name)
        if n == 0:
            args.append(x)
        elif "mask" in p.name.lower():
            length = 7 if _role(p.name.lower()) == "src" else 5
            shape = (2, 1, 1, length) if four_d else (2, 1, length)
            args.append(torch.full(shape, not blocked))
        elif words & MEMORY:
            args.append(memory)
        else:
            args.append(None)
    with torch.no_grad():
        layer(*args)


def _randomized(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters are random: weights scaled by their fan-in, vectors around 1."""
    out = copy.deepcopy(model).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in out.parameters():
            noise = torch.rand(p.shape, generator=g, dtype=torch.float64).to(p.dtype) - 0.5
            p.copy_(noise * 2 / p.shape[-1] ** 0.5 if p.dim() > 1 else 1 + noise)
    return out


def run_layer(model: nn.Module, layer_path: str, d: int, run_model: Callable[[nn.Module], object] | None,
              sublayers: dict[int, Sublayer], norms: list[str]) -> tuple[Seen, str]:
    """What the layer's norms and sub-layers received and returned in a copy of the model with random weights,
    from its forward (``run_model``) or, where that fails, the layer called on its own; and "" or why nothing was
    recorded."""
    model = _randomized(model)
    layer = model.get_submodule(layer_path)
    wanted = {(s.entry, "in") for s in sublayers.values()}
    tries: list[Callable[[], object]] = [lambda: run_model(model)] if run_model is not None else []
    tries += [partial(_call_alone, layer, d, b, f) for f in (False, True) for b in (False, True)]
    why = "no way to run the layer"
    for attempt in tries:
        record = _Record(layer, sublayers, norms)
        try:
            model.eval()
            with torch.no_grad():
                attempt()
        except Exception as exc:  # noqa: BLE001 - the user's model: a call that fails is one not to read
            why = f"running it raised {type(exc).__name__}"
            continue
        finally:
            record.remove()
        if wanted <= set(record.seen) and all(torch.isfinite(t).all() for t in record.seen.values()):
            return record.seen, ""
        why = "the run did not reach every sub-layer with finite values"
    return {}, why


def norm_slots(seen: Seen, sublayers: dict[int, Sublayer],
               norms: list[str], names: dict[int, str]) -> dict[str, int | str]:
    """Norm module -> the sub-layer it serves, or why the values cannot tell (``names``: each sub-layer's name)."""
    found: dict[str, int | str] = {}
    for n in norms:
        if (n, "in") not in seen:
            found[n] = f"{n} was not called"
            continue
        post = [k for k, s in sublayers.items()
                if _sum(seen.get((s.entry, "in")), seen.get((s.exit, "out")) if (s.exit, "out") in seen
                        else seen.get((s.group, "out")), seen.get((n, "in")))]
        pre = [k for k, s in sublayers.items() if _close(seen.get((n, "out")), seen.get((s.entry, "in")))]
        hits = post or pre
        if len(hits) == 1:
            found[n] = hits[0]
        elif hits:
            found[n] = f"{n} matches {' and '.join(names[k] for k in hits)}"
        else:
            found[n] = f"{n}'s values match no sub-layer's input, nor its input plus its output"
    decided = {n: k for n, k in found.items() if isinstance(k, int)}
    for k in set(decided.values()):
        twins = [m for m, j in decided.items() if j == k]
        if len(twins) > 1:
            said = f"{', '.join(twins[:-1])} and {twins[-1]} all match {names[k]}"
            found |= {m: said for m in twins}
    return found


def _sum(a: torch.Tensor | None, b: torch.Tensor | None, target: torch.Tensor | None) -> bool:
    if a is None or b is None or target is None:
        return False
    if a.shape != b.shape:
        return False
    return _close(target, a + b)
