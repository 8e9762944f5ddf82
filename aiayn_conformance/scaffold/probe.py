"""Stage 3: the built model called once -> :class:`Probed`: the adapter's forward call (the masks it needs:
masks.py) and what it returns, the positional table (positions.py), the repository's initialisation
(initialisation.py), and the sizes the model ignores (a ``d_ff`` it builds the same whatever its value)."""

from __future__ import annotations

import argparse
import copy
import inspect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from aiayn_conformance.spec.config import ModelConfig

from .construct import Built, Constructor
from .errors import short
from .initialisation import Init, find_init, init_works
from .masks import find_convention, flattened
from .positions import Positional, positional


@dataclass(kw_only=True)
class Forward:
    """The adapter's forward: the lines building its masks, the call, a CHECK note, the output kind and its note,
    and the mask convention found ("" when the forward takes no masks)."""

    lines: list[str]
    call: str
    check: str
    output: str
    output_check: str
    masks: str = ""


def _forward_body(model: nn.Module) -> tuple[list[str], str]:
    """Lines that build the masks ``model.forward`` requires beyond (src, tgt), and the call that passes them."""
    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.default is p.empty]
    if len(names) <= 2 or len([n for n in names[2:] if "mask" in n.lower()]) != len(names) - 2:
        return [], "self.model(src, tgt)"
    body = ["pad = self.config.pad_id",
            "src_mask = (src != pad)[:, None, None, :]  # (B, 1, 1, S), True = may attend",
            "T = tgt.size(1)",
            "causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).tril()  # (T, T)",
            "tgt_mask = causal & (tgt != pad)[:, None, None, :]  # (B, 1, T, T)"]
    extra = ["src_mask" if "src" in n.lower() or "enc" in n.lower() or "memory" in n.lower() else "tgt_mask"
             for n in names[2:]]
    return body, f"self.model(src, tgt, {', '.join(extra)})"


def _output_kind(out: torch.Tensor) -> tuple[str, str]:
    """``logits``, ``log_probs`` or ``probs`` for the probe's output, and why."""
    flat = out.double()
    if torch.allclose(flat.exp().sum(-1), torch.ones_like(flat[..., 0]), atol=1e-4):
        return "log_probs", "the probe's outputs exponentiate to distributions"
    if bool((flat >= 0).all()) and torch.allclose(flat.sum(-1), torch.ones_like(flat[..., 0]), atol=1e-4):
        return "probs", "the probe's outputs sum to 1"
    return "logits", "the probe's outputs are not normalized"


def probe_forward(model: nn.Module, config: ModelConfig,
                  body_call: tuple[list[str], str] | None = None) -> Forward:
    """Run the forward call the adapter will make on a small padded batch, and read what it returns; ``body_call``
    (the lines building the masks and the call) replaces the default 4-D boolean masks (scaffold/masks.py)."""
    body, call = body_call or _forward_body(model)
    src = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [4, 5, 6, config.pad_id, config.pad_id, config.pad_id,
                                                 config.pad_id]])
    tgt = torch.tensor([[1, 2, 3, 4, 5], [3, 4, config.pad_id, config.pad_id, config.pad_id]])
    namespace: dict[str, Any] = {"torch": torch, "src": src, "tgt": tgt,
                                 "self": argparse.Namespace(model=model.eval(), config=config)}
    try:
        with torch.no_grad():
            exec("\n".join(body + [f"out = {call}"]), namespace)  # noqa: S102 - the code we are about to write
        out = namespace["out"]
    except Exception as exc:
        note = (f"the scaffold's probe call {call} raised {short(exc)}: adapt the call (and the masks: this "
                "project's are True where attention is allowed)")
        return Forward(lines=body, call=call, check=note, output="logits",
                       output_check="unknown: the probe call failed")
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        out = out[0]
        call += "[0]"
    if not isinstance(out, torch.Tensor):
        return Forward(lines=body, call=call, output="logits", output_check="unknown",
                       check=f"the probe call {call} returned {type(out).__name__}, not a tensor")
    shape = list(out.shape)
    flat = ""
    if flattened(out, src, tgt):  # scores flattened for a loss: the adapter returns them as (B, T, V)
        flat = (" (the scores flattened to (B * T, V), viewed here as (B, T, V) in batch-major order: check that "
                "your model flattens (B, T) and not (T, B))")
        call = f"{call}.view(src.size(0), tgt.size(1), -1)"
        out = out.view(src.size(0), tgt.size(1), -1)
    ok = list(out.shape) == [2, 5, config.tgt_vocab]
    note = (f"the scaffold called {call} on src [2, 7], tgt [2, 5] and got {shape}{flat}"
            + ("" if ok else f", not [2, 5, {config.tgt_vocab}] (B, T, tgt_vocab)")
            + "; check that padding (config.pad_id) and the causal mask are handled as your model expects")
    output, output_check = _output_kind(out)
    return Forward(lines=body, call=call, check=note, output=output, output_check=output_check)


def encode_call(cls: type) -> str:
    """``self.model.encode(src)`` when the class has an ``encode`` taking one required argument, else ""."""
    enc: Callable[..., Any] | None = getattr(cls, "encode", None)
    if not callable(enc):
        return ""
    try:
        required = [p for p in list(inspect.signature(enc).parameters.values())[1:] if p.default is p.empty]
    except (TypeError, ValueError):
        required = []
    return "self.model.encode(src)" if len(required) == 1 else ""


# -- sizes the model ignores ------------------------------------------------------------------------------------
def ignored_sizes(ctor: Constructor, model: nn.Module, config: ModelConfig) -> tuple[int, str] | None:
    """(the FFN's width, what was found) when the model ignores d_ff: built at two values, the same shapes."""
    other = config.replace(d_ff=config.d_ff + 16)
    try:
        torch.manual_seed(0)
        built = ctor.build(other)
    except Exception:
        return None
    shapes = Counter(tuple(p.shape) for p in model.parameters())
    if not isinstance(built, nn.Module) or shapes != Counter(tuple(p.shape) for p in built.parameters()):
        return None
    d = config.d_model
    widths = Counter(s[0] for s in shapes if len(s) == 2 and s[1] == d and (d, s[0]) in shapes
                     and s[0] not in (d, 2 * d, 3 * d, config.src_vocab, config.tgt_vocab))
    if not widths:
        return None
    width = widths.most_common(1)[0][0]
    return width, f"d_ff={config.d_ff} requested, the model's FFN is {width} wide whatever d_ff says"


# -- the stage --------------------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class Probed:
    """Stage 3's record: what calling the built model found."""

    built: Built
    forward: Forward
    encode: str  # "self.model.encode(src)" when the class has an encode(src), else ""
    table: Positional
    init: Init
    ignored: dict[str, str] = field(default_factory=dict)  # config field -> what the model does instead
    d_ff: int  # the FFN's width: config.d_ff, or the width the model has whatever d_ff says


def probe(built: Built) -> Probed:
    """Call the built model once and read what the adapter needs (see the module's docstring)."""
    model, config = built.model, built.config
    found = find_convention(model, config)
    forward = probe_forward(model, config, (found.lines, found.call) if found else None)
    if found is not None:
        src, tgt = found.convention or (None, None)
        forward.masks = (f"masks found by probing the forward: source {src.describe()}, target {tgt.describe()}"
                         if src and tgt else found.tried)
    init = find_init(built.loaded.obj)
    broken = init_works(init, copy.deepcopy(model))
    if broken:
        init.check = broken
    ffn = ignored_sizes(built.constructor, model, config)
    return Probed(built=built, forward=forward, encode=encode_call(type(model)), table=positional(model, config),
                  init=init, ignored={"d_ff": ffn[1]} if ffn else {}, d_ff=ffn[0] if ffn else config.d_ff)
