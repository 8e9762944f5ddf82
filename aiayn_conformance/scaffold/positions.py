"""The positional table the adapter's ``positional_encoding`` returns: a buffer of ``max_len`` rows or more laid
out ``[max_len, d]``, ``[1, max_len, d]`` or ``[max_len, 1, d]`` (the sinusoid), else a learned table (an
``nn.Embedding`` or a parameter named for positions with ``max_len`` rows or more, not a vocabulary matrix)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from aiayn_conformance.spec.config import ModelConfig

from .naming import POSITION, tokens


@dataclass
class Positional:
    """The table ``positional_encoding`` reads ("" when none), the learned tables, and the CHECK note."""

    path: str = ""
    learned: list[str] | None = None  # the learned tables' parameter names (the value probe loads sinusoids into them)
    check: str = ""


def rows(shape: tuple[int, ...], d: int) -> int:
    """The number of positions of a table shaped [L, d], [1, L, d] or [L, 1, d]; 0 for any other shape."""
    if len(shape) == 2 and shape[1] == d:
        return shape[0]
    if len(shape) == 3 and shape[2] == d and 1 in shape[:2]:
        return shape[0] * shape[1]
    return 0


def buffer_table(model: nn.Module, config: ModelConfig) -> str:
    """The attribute path of a positional table (a buffer or tensor attribute of max_len rows or more), or ""."""
    for name, module in model.named_modules():
        for attr, value in list(module.__dict__.get("_buffers", {}).items()) + list(vars(module).items()):
            if not isinstance(value, torch.Tensor) or isinstance(value, nn.Parameter):
                continue
            if rows(tuple(value.shape), config.d_model) >= config.max_len:
                return f"{name}.{attr}" if name else attr
    return ""


def learned_tables(model: nn.Module, config: ModelConfig) -> list[str]:
    """Parameters that look like learned positional tables: [rows >= max_len, d_model] (or [1, rows, d_model]),
    not a vocabulary matrix, held by an nn.Embedding or named for positions."""
    vocab = {config.src_vocab, config.tgt_vocab}
    embeddings = {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Embedding)}
    out = []
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        if not (len(shape) == 2 or (len(shape) == 3 and shape[0] == 1)) or shape[-1] != config.d_model:
            continue
        named = bool(tokens(name) & POSITION)
        if shape[-2] >= config.max_len and shape[-2] not in vocab and (name in embeddings or named):
            out.append(name)
    return out


def positional(model: nn.Module, config: ModelConfig) -> Positional:
    """The buffer when there is one (the value probe compares it with the sinusoid), else the learned tables."""
    buffer = buffer_table(model, config)
    if buffer:
        return Positional(buffer, [], "the table both stacks add?")
    learned = learned_tables(model, config)
    if not learned:
        return Positional(check="no positional table found (a buffer or a learned table with max_len rows)")
    check = ("a learned table: the paper's is the sinusoid of section 3.5" + (
        f"; the decoder adds its own ({', '.join(learned[1:])}): this returns the encoder's (docs/plugins.md)"
        if len(learned) > 1 else ""))
    return Positional(learned[0], learned, check)
