"""Stage 4: where each canonical parameter (``spec.schema.parameter_schema``) goes in the built model, with the
reason to check each uncertain line, and how the adapter's ``encode`` reads the encoder output -> :class:`Proposed`.
The embeddings and the pre-softmax projection are placed here, the layers by layer.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from aiayn_conformance.spec.config import ModelConfig

from .layer import Member, Runner, layer_template
from .masks import probe_batch, run_call
from .naming import DECODER, EMBEDDING, ENCODER, GAIN, GENERATOR, SHIFT, SOURCE, TARGET, tokens
from .norms import run_layer
from .probe import Probed

ROLES = ("src_embed", "tgt_embed", "generator")  # the [vocab, d_model] matrices, in the order they are placed


@dataclass
class Line:
    """One proposed line of ``load_reference_state``."""

    canonical: str | tuple[str, ...]  # canonical name(s), with {i} for the layer index
    target: str  # the model's parameter name, with {i}; "" when none was found
    check: str = ""  # why the user must check it ("" when decided from names)


@dataclass(kw_only=True)
class Proposal:
    """The lines of ``load_reference_state``: outside the layers, and each stack's template for layer ``{i}``."""

    mapping: list[Line] = field(default_factory=list)  # non-layer lines
    layers: dict[str, list[Line]] = field(default_factory=dict)  # stack -> per-layer template lines
    layer_zero: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # stack -> (name, check)
    layer_one: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    zero: list[tuple[str, str]] = field(default_factory=list)  # (name, check) outside the layers
    one: list[tuple[str, str]] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)  # (name, why) parameters left as built
    stack_checks: dict[str, str] = field(default_factory=dict)


def stack_of(parts: list[str]) -> tuple[str, int] | None:
    """("encoder" or "decoder", index of the layer number in ``parts``) for a parameter inside a layer."""
    for pos, part in enumerate(parts):
        toks = tokens(part)
        stack = "encoder" if toks & ENCODER else "decoder" if toks & DECODER else None
        if stack is None:
            continue
        for j in range(pos + 1, len(parts)):
            if parts[j].isdigit():
                return stack, j
        return None
    return None


def vocab_role(name: str) -> str | None:
    """The role a [vocab, d_model] matrix's name gives it (one of ROLES), or None."""
    toks = tokens(name)
    if toks & GENERATOR and not toks & EMBEDDING:
        return "generator"
    if toks & SOURCE:
        return "src_embed"
    if toks & TARGET:
        return "tgt_embed"
    return None


@dataclass
class Proposed:
    """Stage 4's record: the mapping, and how ``encode`` reads the encoder output."""

    probed: Probed
    proposal: Proposal
    encode: Encode


def propose(probed: Probed) -> Proposed:
    """The mapping of the probed model, and its encode()."""
    built = probed.built
    ignored = probed.ignored.get("d_ff", "")
    forward = probed.forward
    model, config = built.model, built.config

    def run_model(copy: nn.Module) -> object:
        return run_call(copy, config, forward.lines, forward.call, *probe_batch(config))

    proposal = mapping(model, config, (probed.d_ff, ignored) if ignored else None, run_model)
    return Proposed(probed, proposal, encode_hook(built.model, proposal, built.config, forward.lines, forward.call,
                                                  probed.encode))


def mapping(model: nn.Module, config: ModelConfig, ffn: tuple[int, str] | None = None,
            run_model: Callable[[nn.Module], object] | None = None) -> Proposal:
    """Where each canonical parameter goes in ``model`` (built with ``config``); ``ffn`` (width, reason) when the
    model's FFN is another width than ``config.d_ff`` whatever d_ff says (probe.py: ignored_sizes); ``run_model``
    runs its forward (the layers' norms are told apart by the values it computes)."""
    params: list[tuple[str, torch.Tensor]] = list(model.named_parameters())  # one name per tensor, in order
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    out = Proposal()
    used = _place_vocab_matrices(out, params, aliases, config)
    used |= _place_layers(out, [(n, p) for n, p in params if n not in used], config, ffn, _runner(model, config,
                                                                                                  run_model))
    _place_the_rest(out, [(n, p) for n, p in params if n not in used], config.d_model)
    return out


def _place_vocab_matrices(out: Proposal, params: list[tuple[str, torch.Tensor]], aliases: dict[int, list[str]],
                          config: ModelConfig) -> set[str]:
    """Embeddings and the pre-softmax projection: [vocab, d_model] matrices, by name, then by order; a
    [tgt_vocab] bias beside them. Returns the names placed (every alias of a [vocab, d_model] matrix)."""
    vocab_shapes = {(config.src_vocab, config.d_model), (config.tgt_vocab, config.d_model)}
    mats = [(n, p) for n, p in params if tuple(p.shape) in vocab_shapes]
    chosen: dict[str, tuple[str, str]] = {}
    for role in ROLES:
        for _, p in mats:
            names = [a for a in aliases[id(p)] if vocab_role(a) == role]
            if names:
                chosen[role] = (names[0], "")
                break
    taken = {c[0] for c in chosen.values()}
    rest = [n for n, _ in mats if not set(aliases[id(dict(params)[n])]) & taken]
    for role in ROLES:
        if role in chosen:
            continue
        if rest:
            chosen[role] = (rest.pop(0), "chosen by registration order among the [vocab, d_model] matrices")
        elif mats:
            first = mats[0][0] if role != "generator" else mats[-1][0]
            chosen[role] = (first, f"no matrix named like a {role.replace('_', ' ')}: the same tensor is reused "
                                   "(a tie?)")
    used: set[str] = set()
    for role in ROLES:
        target, why = chosen.get(role, ("", "no [vocab, d_model] parameter found"))
        out.mapping.append(Line(f"{role}.weight", target, why))
        used.add(target)
    for n, p in params:
        if tuple(p.shape) in {(config.tgt_vocab,)} and n not in used:
            out.zero.append((n, "a bias on the pre-softmax projection? the paper's has none (declare "
                                "embedding.shared-weights)"))
            used.add(n)
    for _, p in mats:
        used.update(aliases[id(p)])
    return used


def _runner(model: nn.Module, config: ModelConfig,
            run_model: Callable[[nn.Module], object] | None) -> Callable[[str], Runner]:
    """For a layer's path: the runner that runs it with hooks (the model's forward, else the layer alone)."""
    def for_layer(path: str) -> Runner:
        return lambda sublayers, norms: run_layer(model, path, config.d_model, run_model, sublayers, norms)
    return for_layer


def _place_layers(out: Proposal, params: list[tuple[str, torch.Tensor]], config: ModelConfig,
                  ffn: tuple[int, str] | None, runner: Callable[[str], Runner]) -> set[str]:
    """The layers: parameters under encoder.../decoder... with a layer number, mapped through the first layer's
    template. Returns the names placed."""
    by_layer: dict[tuple[str, int], list[Member]] = {}
    prefixes: dict[tuple[str, int], str] = {}
    for n, p in params:
        parts = n.split(".")
        found = stack_of(parts)
        if found is None:
            continue
        stack, pos = found
        key = (stack, int(parts[pos]))
        by_layer.setdefault(key, []).append((n, parts[pos + 1:], p))
        prefixes[key] = ".".join(parts[:pos])
    used: set[str] = set()
    for stack in ("encoder", "decoder"):
        layers = sorted(i for s, i in by_layer if s == stack)
        if not layers:
            out.stack_checks[stack] = f"no {stack} layers found (no parameter under a name with '{stack[:3]}' and a " \
                                      "layer number)"
            continue
        if layers != list(range(config.n_layers)):
            out.stack_checks[stack] = f"layer numbers {layers} are not 0..{config.n_layers - 1}"
        _place_stack(out, stack, {i: by_layer[(stack, i)] for i in layers},
                     {i: prefixes[(stack, i)] for i in layers}, config, ffn, runner)
        for i in layers:
            used.update(n for n, _, _ in by_layer[(stack, i)])
    return used


def _place_stack(out: Proposal, stack: str, members: dict[int, list[Member]], prefixes: dict[int, str],
                 config: ModelConfig, ffn: tuple[int, str] | None, runner: Callable[[str], Runner]) -> None:
    """One stack's lines: the first layer's template with its path prefix, and a check when a later layer has
    other parameter names or shapes than the first."""
    first, *later = members
    width, ignored = ffn or (config.d_ff, "")
    prefix = prefixes[first]
    run = runner(f"{prefix}.{first}" if prefix else str(first))
    lines, zero, one, left = layer_template(stack, members[first], config.d_model, width, ignored, run)
    template = (prefix + ".{i}.") if prefix else "{i}."
    shapes0 = {".".join(rel): tuple(p.shape) for _, rel, p in members[first]}
    for i in later:
        if {".".join(rel): tuple(p.shape) for _, rel, p in members[i]} != shapes0 or prefixes[i] != prefix:
            out.stack_checks[stack] = f"layer {i} does not have layer {first}'s parameter names and shapes"
    out.layers[stack] = [Line(c, template + t if t else "", why) for c, t, why in lines]
    out.layer_zero[stack] = [(template + t, why) for t, why in zero]
    out.layer_one[stack] = [(template + t, why) for t, why in one]
    out.left += [(template + t, why) for t, why in left]


def _place_the_rest(out: Proposal, rest: list[tuple[str, torch.Tensor]], d: int) -> None:
    """What is left outside the layers: norms the paper lacks (gain 1, bias 0), anything else as built."""
    norm_modules: dict[str, list[str]] = {}
    for n, p in rest:
        if tuple(p.shape) == (d,):
            norm_modules.setdefault(n.rpartition(".")[0], []).append(n)
    for n, p in rest:
        leaf = n.rpartition(".")[2].lower()
        if tuple(p.shape) == (d,) and leaf in GAIN and n.rpartition(".")[0] in norm_modules:
            out.one.append((n, "a norm the paper lacks (at the top of a stack, or after the embeddings?): gain 1; "
                               "declare norm.no-extra-norm"))
        elif tuple(p.shape) == (d,) and leaf in SHIFT and n.rpartition(".")[0] in norm_modules:
            out.zero.append((n, "a norm the paper lacks: bias 0"))
        else:
            out.left.append((n, f"shape {tuple(p.shape)}: not in the paper's schema, left as built (a learned "
                                "positional table? declare what it changes)"))


# -- encode -----------------------------------------------------------------------------------------------------
@dataclass
class Encode:
    """How the adapter's encode() reads the encoder output: the class's own encode, or what the first decoder
    layer's cross-attention key projection reads (``module``), captured with a hook."""

    own: str = ""  # "self.model.encode(src)" when the class has one
    module: str = ""  # the module whose input is the encoder output
    check: str = ""


def read_memory(model: nn.Module, path: str, src: torch.Tensor, run: Any) -> torch.Tensor | None:
    """The last [B, S, d] (or [S, B, d], transposed) tensor the module ``path`` receives while ``run()`` runs."""
    seen: list[torch.Tensor] = []
    B, S = src.shape

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not seen:
            for t in [*args, *kwargs.values()]:
                if isinstance(t, torch.Tensor) and t.dim() == 3 and tuple(t.shape[:2]) in ((B, S), (S, B)):
                    seen[:] = [t if t.shape[0] == B else t.transpose(0, 1)]

    handle = model.get_submodule(path).register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run()
    finally:
        handle.remove()
    return seen[0] if seen else None


def encode_hook(model: nn.Module, proposal: Proposal, config: ModelConfig, lines: list[str], call: str,
                own: str) -> Encode:
    """The encode() the adapter will have: the class's own, else what cross-attention reads (the input of the first
    decoder layer's key projection, [B, S, d_model])."""
    if own:
        return Encode(own=own, check="the class's own encode(src): does it mask the source padding?")
    keys = [ln.target for ln in proposal.layers.get("decoder", []) if ln.target and (
        ln.canonical == "decoder.{i}.cross_attn.k.weight" or (isinstance(ln.canonical, tuple)
                                                              and "decoder.{i}.cross_attn.k.weight" in ln.canonical))]
    if not keys:
        return Encode(check="no cross-attention key projection found: write encode(src) by hand (what "
                            "cross-attention reads, [B, S, d_model])")
    path = keys[0].replace("{i}", "0").rpartition(".")[0]
    src, _ = probe_batch(config)
    bos = torch.full_like(src[:, :1], (config.pad_id + 1) % config.tgt_vocab)
    try:
        out = read_memory(model, path, src, lambda: run_call(model, config, lines, call, src, bos))
    except Exception:
        out = None
    if out is None or list(out.shape) != [2, 7, config.d_model]:
        return Encode(check=f"{path} did not receive a [B, S, d_model] tensor: write encode(src) by hand")
    return Encode(module=path)
