"""The canonical parameter schema: the paper's model as names and shapes.

Names follow ``torch.nn.Linear`` layout ([out_features, in_features]).
Attention projections carry no bias (§3.2.2 has none); the feed-forward
network has both biases (Eq. 2); each layer norm has a per-feature weight
(gain) and bias; the pre-softmax projection ``generator`` has no bias (§3.4
shares the embedding matrix with it and names no bias; tensor2tensor has
none).
For ``q`` and ``k`` (h d_k rows) head j owns output rows ``j*d_k`` to
``(j+1)*d_k``, for ``v`` (h d_v rows) rows ``j*d_v`` to ``(j+1)*d_v``; ``o``
(d_model x h d_v) takes the heads concatenated in head order. With the
paper's d_k = d_v = d_model / h every projection is d_model x d_model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

from .config import ModelConfig

__all__ = ["parameter_schema", "tied_groups", "parameter_count", "load_canonical", "copy_canonical", "ATTENTION",
           "NORMS", "CanonicalKey", "Target"]

ATTENTION = ("q", "k", "v", "o")
NORMS = {"encoder": ("norm1", "norm2"), "decoder": ("norm1", "norm2", "norm3")}


def _attention(prefix: str, config: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, hk, hv = config.d_model, config.n_heads * config.d_k, config.n_heads * config.d_v
    return {f"{prefix}.q.weight": (hk, d), f"{prefix}.k.weight": (hk, d), f"{prefix}.v.weight": (hv, d),
            f"{prefix}.o.weight": (d, hv)}


def _norm(prefix: str, d: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.weight": (d,), f"{prefix}.bias": (d,)}


def _ffn(prefix: str, d: int, d_ff: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}.w1.weight": (d_ff, d),
        f"{prefix}.w1.bias": (d_ff,),
        f"{prefix}.w2.weight": (d, d_ff),
        f"{prefix}.w2.bias": (d,),
    }


def parameter_schema(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` for every parameter of the paper's model, in paper order."""
    d, d_ff = config.d_model, config.d_ff
    schema: dict[str, tuple[int, ...]] = {
        "src_embed.weight": (config.src_vocab, d),
        "tgt_embed.weight": (config.tgt_vocab, d),
    }
    for i in range(config.n_layers):
        p = f"encoder.{i}"
        schema.update(_attention(f"{p}.self_attn", config))
        schema.update(_norm(f"{p}.norm1", d))
        schema.update(_ffn(f"{p}.ffn", d, d_ff))
        schema.update(_norm(f"{p}.norm2", d))
    for i in range(config.n_layers):
        p = f"decoder.{i}"
        schema.update(_attention(f"{p}.self_attn", config))
        schema.update(_norm(f"{p}.norm1", d))
        schema.update(_attention(f"{p}.cross_attn", config))
        schema.update(_norm(f"{p}.norm2", d))
        schema.update(_ffn(f"{p}.ffn", d, d_ff))
        schema.update(_norm(f"{p}.norm3", d))
    schema["generator.weight"] = (config.tgt_vocab, d)
    return schema


def tied_groups(config: ModelConfig) -> list[tuple[str, ...]]:
    """Names that are one tensor: the three-way tie of §3.4 when configured."""
    if config.share_embeddings:
        return [("src_embed.weight", "tgt_embed.weight", "generator.weight")]
    return []


def parameter_count(config: ModelConfig) -> int:
    """Distinct trainable scalars of the paper's model (tied tensors counted once)."""
    schema = parameter_schema(config)
    skip = {name for group in tied_groups(config) for name in group[1:]}
    total = 0
    for name, shape in schema.items():
        if name in skip:
            continue
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


CanonicalKey = str | tuple[str, ...]  # a canonical name, or names whose tensors are packed along dim 0
Target = torch.Tensor | Callable[[torch.Tensor], object]  # a parameter to fill, or a function that stores the value


def _gather(state: Mapping[str, torch.Tensor], names: tuple[str, ...]) -> torch.Tensor:
    missing = [n for n in names if n not in state]
    if missing:
        raise ValueError(f"canonical state has no {', '.join(missing)} (spec.parameter_schema lists the names)")
    return torch.cat([state[n] for n in names], dim=0) if len(names) > 1 else state[names[0]]


@torch.no_grad()
def load_canonical(state: Mapping[str, torch.Tensor], mapping: Mapping[CanonicalKey, Target], *,
                   zero: Iterable[torch.Tensor] = (), one: Iterable[torch.Tensor] = ()) -> None:
    """Load the canonical state dict ``state`` into a model: the body of an adapter's ``load_reference_state``.

    ``mapping`` says where each canonical name goes: ``{name: parameter}``; a tuple of names fills a packed
    parameter with their tensors concatenated along dim 0 (``{(f"{p}.q.weight", f"{p}.k.weight",
    f"{p}.v.weight"): mha.in_proj_weight}``); a callable instead of a parameter receives the canonical
    tensor, for a parameter the model stores differently (a scalar gain: ``lambda w: gain.fill_(w.mean())``).
    ``zero`` lists parameters the paper lacks (attention and generator biases), set to 0; ``one`` lists
    gains set to 1 (a norm the paper lacks, made as neutral as it can be).

    Every name in ``state`` must be consumed exactly once and every shape must match the parameter it
    fills; otherwise nothing is written and a one-line ValueError names the tensor.
    """
    seen: dict[str, CanonicalKey] = {}
    writes: list[tuple[Target, torch.Tensor]] = []
    for key, target in mapping.items():
        names = (key,) if isinstance(key, str) else tuple(key)
        for name in names:
            if name in seen:
                raise ValueError(f"{name}: mapped twice (by {seen[name]!r} and {key!r})")
            seen[name] = key
        value = _gather(state, names)
        if isinstance(target, torch.Tensor):
            if value.shape != target.shape:
                raise ValueError(f"{'+'.join(names)}: shape {tuple(value.shape)}, expected {tuple(target.shape)}")
        elif not callable(target):
            raise TypeError(f"{'+'.join(names)}: target must be a tensor or a callable, not {type(target).__name__}")
        writes.append((target, value))
    unused = [name for name in state if name not in seen]
    if unused:
        raise ValueError(f"canonical {unused[0]} is loaded nowhere ({len(unused)} name(s) unmapped; "
                         "the mapping must cover spec.parameter_schema)")
    for target, value in writes:
        if isinstance(target, torch.Tensor):
            target.copy_(value)
        else:
            target(value)
    for param in zero:
        param.zero_()
    for param in one:
        param.fill_(1.0)


@torch.no_grad()
def copy_canonical(state: Mapping[str, torch.Tensor], param: torch.Tensor, *names: str) -> None:
    """Copy the canonical tensor ``names[0]`` (or several, concatenated along dim 0) into ``param``.

    One copy of ``load_canonical``, with the same one-line ValueErrors. Several names fill a packed
    projection: ``copy_canonical(state, in_proj_weight, f"{p}.q.weight", f"{p}.k.weight", f"{p}.v.weight")``
    (``p = "encoder.0.self_attn"``) fills a fused [3*d_model, d_model] matrix in q|k|v order.
    """
    if not names:
        raise TypeError("copy_canonical() needs at least one canonical parameter name")
    value = _gather(state, names)
    if value.shape != param.shape:
        raise ValueError(f"{'+'.join(names)}: shape {tuple(value.shape)}, expected {tuple(param.shape)}")
    param.copy_(value)
