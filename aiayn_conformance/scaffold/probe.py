"""Probing the target class: building it with a small ``ModelConfig`` (the constructor calls worth trying, from
its parameter names), then calling it once to learn the forward call, the output kind, the positional table and
the encoder entry point the plugin will use."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from aiayn_conformance.spec.config import TINY, ModelConfig

from .construct import Constructor, build, constructors
from .masks import flattened
from .target import short

PROBE: ModelConfig = TINY.replace(d_ff=48)
"""The configuration the model is built with to read its parameters: h > 1, N = 2, tied embeddings, and sizes
that tell the parameters apart (d_ff = 48 is neither d_model = 32 nor a stacked 2 or 3 x d_model)."""


# -- the constructor (construct.py) ----------------------------------------------------------------------------
def build_with_config(target: Any, config: ModelConfig = PROBE) -> tuple[nn.Module, Constructor]:
    """``target`` (a class or a factory function) built with ``config``; ScaffoldError naming each call tried."""
    return build(target, config)


__all__ = ["PROBE", "Constructor", "build_with_config", "constructors", "probe_forward", "positional_table",
           "encode_call"]


# -- the built model ----------------------------------------------------------------------------------------------
@dataclass
class Forward:
    """The adapter's forward: its body (the last line returns), a CHECK note, the output kind and its CHECK note."""

    body: list[str]
    check: str
    output: str
    output_check: str


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
        return Forward([*body, f"return {call}"], note, "logits", "unknown: the probe call failed")
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        out = out[0]
        call += "[0]"
    if not isinstance(out, torch.Tensor):
        return Forward([*body, f"return {call}"], f"the probe call {call} returned {type(out).__name__}, not a tensor",
                       "logits", "unknown")
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
    return Forward([*body, f"return {call}"], note, *_output_kind(out))


def positional_table(model: nn.Module, config: ModelConfig) -> str:
    """The attribute path of a positional table (a [max_len, d_model] buffer or tensor attribute), or ""."""
    d = config.d_model
    for name, module in model.named_modules():
        for attr, value in list(module.__dict__.get("_buffers", {}).items()) + list(vars(module).items()):
            if not isinstance(value, torch.Tensor) or isinstance(value, nn.Parameter):
                continue
            shape = tuple(value.shape)
            if len(shape) in (2, 3) and shape[-1] == d and shape[-2] >= config.max_len and \
                    (len(shape) == 2 or shape[0] == 1):
                return f"{name}.{attr}" if name else attr
    return ""


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
