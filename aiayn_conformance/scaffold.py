"""``aiayn scaffold MODULE:CLASS``: write a starting plugin for a Transformer of one's own.

    aiayn scaffold my_package.model:Transformer -o my_plugin.py
    aiayn scaffold path/to/models.py:Seq2Seq --name my-seq2seq > my_plugin.py

The scaffold imports ``MODULE`` (a dotted module name, or a ``.py`` file), builds ``CLASS`` with a small
``ModelConfig`` (``CLASS(config)``, or keyword arguments matched to the constructor's parameter names), and
writes a plugin (docs/plugins.md): an adapter whose ``load_reference_state`` maps every canonical parameter
(``spec.schema.parameter_schema``) to one of the model's, proposed from the parameter names, shapes and
registration order, with ``zero=`` for the biases the paper lacks and ``one=`` for the norms it lacks. Every
line it could not decide from a name is marked ``# CHECK:`` with the reason; a canonical parameter it found no
home for gets a target that fails in one line naming it, so the plugin cannot load silently wrong.

Errors are one line (exit 2): a module that cannot be imported, a name that is not an ``nn.Module`` class, a
class that cannot be built with a ``ModelConfig`` (naming each constructor call tried).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn_conformance.spec.config import TINY, ModelConfig
from aiayn_conformance.spec.schema import NORMS

__all__ = ["ScaffoldError", "Scaffold", "add_parser", "load_class", "build_with_config", "propose", "render", "run"]

PROBE: ModelConfig = TINY.replace(d_ff=48)
"""The configuration the model is built with to read its parameters: h > 1, N = 2, tied embeddings, and sizes
that tell the parameters apart (d_ff = 48 is neither d_model = 32 nor a stacked 2 or 3 x d_model)."""


class ScaffoldError(ValueError):
    """A one-line reason the scaffold cannot go on (the command prints it and exits 2)."""


# -- 1. the class ----------------------------------------------------------------------------------------------
def load_class(target: str) -> tuple[type, str, str]:
    """``MODULE:CLASS`` -> (the class, the import line for the plugin, a description of where it is)."""
    module_name, sep, class_name = target.rpartition(":")
    if not sep or not module_name or not class_name:
        raise ScaffoldError(f"{target!r} is not MODULE:CLASS (e.g. my_package.model:Transformer or "
                            "path/to/model.py:Transformer)")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise ScaffoldError(f"cannot import {module_name}: no such file")
        spec = importlib.util.spec_from_file_location(f"aiayn_scaffold_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ScaffoldError(f"cannot import {module_name}: not a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.parent))  # its own sibling imports
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise ScaffoldError(f"cannot import {module_name}: {_short(exc)}") from None
        finally:
            sys.path.remove(str(path.parent))
        import_line = (f"sys.path.insert(0, {str(path.parent)!r})  # CHECK: where {path.name} lives\n"
                       f"from {path.stem} import {class_name}  # noqa: E402")
    else:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise ScaffoldError(f"cannot import module {module_name!r}: {_short(exc)}") from None
        import_line = f"from {module_name} import {class_name}"
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(n for n, v in vars(module).items()
                       if inspect.isclass(v) and issubclass(v, nn.Module) and v.__module__ == module.__name__)
        raise ScaffoldError(f"module {module_name!r} has no {class_name!r}; its nn.Module classes: "
                            f"{', '.join(found) or '(none)'}")
    if not inspect.isclass(cls):
        raise ScaffoldError(f"{module_name}:{class_name} is a {type(cls).__name__}, not a torch.nn.Module class")
    if not issubclass(cls, nn.Module):
        raise ScaffoldError(f"{module_name}:{class_name} is a class but not a torch.nn.Module subclass")
    return cls, import_line, f"{module_name}:{class_name}"


def _short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


# Constructor parameter names and the ModelConfig expression each takes (the generated code's spelling).
ALIASES: dict[str, tuple[str, ...]] = {
    "config.src_vocab": ("src_vocab", "src_vocab_size", "n_src_vocab", "enc_voc_size", "enc_vocab_size",
                         "source_vocab_size", "input_vocab_size", "src_vocab_len", "num_src_tokens"),
    "config.tgt_vocab": ("tgt_vocab", "trg_vocab", "tgt_vocab_size", "trg_vocab_size", "n_trg_vocab", "n_tgt_vocab",
                         "dec_voc_size", "dec_vocab_size", "target_vocab_size", "output_vocab_size", "tgt_vocab_len",
                         "vocab_size", "vocab", "n_vocab", "ntoken", "num_tokens"),
    "config.d_model": ("d_model", "dim", "hidden_size", "d_word_vec", "embed_dim", "emb_dim", "model_dim", "n_embd",
                       "d_embed", "embedding_dim"),
    "config.n_heads": ("n_heads", "nhead", "n_head", "num_heads", "heads", "h", "num_attention_heads"),
    "config.d_ff": ("d_ff", "dim_feedforward", "ffn_hidden", "d_inner", "ff_dim", "ffn_dim", "d_hidden", "d_ffn",
                    "feed_forward_dim", "pf_dim", "hidden_dim", "inner_dim"),
    "config.n_layers": ("n_layers", "num_layers", "N", "n_layer", "layers", "depth", "num_encoder_layers",
                        "num_decoder_layers", "n_enc_layers", "n_dec_layers", "enc_layers", "dec_layers"),
    "config.dropout": ("dropout", "drop_prob", "p_drop", "dropout_rate", "dropout_p", "drop_rate"),
    "config.max_len": ("max_len", "max_seq_len", "n_position", "max_length", "max_position_embeddings", "seq_len",
                       "max_seq_length", "src_seq_len", "tgt_seq_len", "context_length"),
    "config.pad_id": ("pad_id", "pad_idx", "src_pad_idx", "trg_pad_idx", "tgt_pad_idx", "padding_idx",
                      "pad_token_id", "src_pad_id", "tgt_pad_id", "trg_pad_id"),
    "config.norm_eps": ("norm_eps", "eps", "layer_norm_eps", "ln_eps"),
    "config.d_k": ("d_k", "d_v", "dim_head", "head_dim", "d_head"),
    "config.share_embeddings": ("share_embeddings", "tie_embeddings", "emb_src_trg_weight_sharing",
                                "trg_emb_prj_weight_sharing", "tie_word_embeddings", "shared_embeddings",
                                "weight_sharing", "share_emb"),
    '"cpu"': ("device",),
}
# Names whose meaning is not in ModelConfig: a value that lets the model build, always marked for the user.
GUESSES: dict[str, tuple[str, str]] = {
    name: ("1", "not in ModelConfig: a token id other than pad_id (used by generation, not by forward)")
    for name in ("trg_sos_idx", "sos_idx", "bos_idx", "bos_id", "sos_id", "trg_bos_idx", "tgt_sos_idx",
                 "start_token", "start_symbol")
}
UNCERTAIN = {"vocab_size", "vocab", "n_vocab", "ntoken", "num_tokens", "hidden_dim", "inner_dim", "layers", "depth",
             "dim", "h", "d_v"}  # names that more than one config field could mean


def _value(expr: str, config: ModelConfig) -> Any:
    if expr == "config":
        return config
    if expr.startswith("config."):
        return getattr(config, expr.split(".", 1)[1])
    return {'"cpu"': "cpu"}.get(expr, expr if not expr.isdigit() else int(expr))


@dataclass
class Constructor:
    """How the scaffold built the class: the call for the generated plugin and its CHECK notes."""

    args: list[tuple[str | None, str, str]]  # (keyword or None for positional, expression, CHECK note or "")

    def call(self, config: ModelConfig) -> tuple[list[Any], dict[str, Any]]:
        positional = [_value(e, config) for k, e, _ in self.args if k is None]
        keywords = {k: _value(e, config) for k, e, _ in self.args if k is not None}
        return positional, keywords


def _constructors(cls: type) -> list[Constructor]:
    """The calls worth trying: ``cls(config)`` first when the signature allows one argument, then keywords."""
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return [Constructor([(None, "config", "")])]
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    required = [p for p in named if p.default is p.empty]
    out = []
    if len(required) <= 1 and named:
        out.append(Constructor([(None, "config", "")]))
    keywords: list[tuple[str | None, str, str]] = []
    for p in named:
        expr = next((e for e, names in ALIASES.items() if p.name in names), None)
        if p.name in ("config", "cfg", "model_config", "hparams") and p.default is p.empty:
            keywords.append((p.name, "config", ""))
        elif expr is not None:
            note = f"{p.name} read as {expr}" if p.name in UNCERTAIN else ""
            keywords.append((p.name, expr, note))
        elif p.name in GUESSES:
            keywords.append((p.name, *GUESSES[p.name]))
        elif p.default is p.empty:
            keywords.append((p.name, "", f"no ModelConfig field matches the required parameter {p.name!r}"))
    if keywords and not all(e == "config" or k == "device" for k, e, _ in keywords):
        out.append(Constructor(keywords))
    elif keywords and not out:
        out.append(Constructor(keywords))
    return out


def build_with_config(cls: type, config: ModelConfig = PROBE) -> tuple[nn.Module, Constructor]:
    """The class built with ``config``; ScaffoldError naming each call tried when none works."""
    tried = []
    for ctor in _constructors(cls):
        missing = [note for _, e, note in ctor.args if not e]
        shown = ", ".join(("" if k is None else f"{k}=") + (e or "?") for k, e, _ in ctor.args)
        if missing:
            tried.append(f"{cls.__name__}({shown}): {missing[0]}")
            continue
        args, kwargs = ctor.call(config)
        try:
            torch.manual_seed(0)
            model = cls(*args, **kwargs)
        except Exception as exc:
            tried.append(f"{cls.__name__}({shown}): {_short(exc)}")
            continue
        if not isinstance(model, nn.Module):
            tried.append(f"{cls.__name__}({shown}) returned {type(model).__name__}")
            continue
        return model, ctor
    raise ScaffoldError(f"cannot build {cls.__name__} with a ModelConfig: tried " + "; ".join(tried or
                        [f"{cls.__name__}(config): no signature to read"]))


# -- 2. the mapping ----------------------------------------------------------------------------------------------
@dataclass
class Line:
    """One proposed line of ``load_reference_state``."""

    canonical: str | tuple[str, ...]  # canonical name(s), with {i} for the layer index
    target: str  # the model's parameter name, with {i}; "" when none was found
    check: str = ""  # why the user must check it ("" when decided from names)


@dataclass
class Proposal:
    mapping: list[Line] = field(default_factory=list)  # non-layer lines
    layers: dict[str, list[Line]] = field(default_factory=dict)  # stack -> per-layer template lines
    layer_zero: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # stack -> (name, check)
    layer_one: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    zero: list[tuple[str, str]] = field(default_factory=list)  # (name, check) outside the layers
    one: list[tuple[str, str]] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)  # (name, why) parameters left as built
    stack_checks: dict[str, str] = field(default_factory=dict)


def _tokens(text: str) -> set[str]:
    return {t for t in re.split(r"[._\-]|(?<=[a-z])(?=[A-Z])", text.lower()) if t}


GENERATOR = {"generator", "proj", "prj", "projection", "head", "logits", "out", "output", "classifier", "linear", "fc",
             "lm", "logit", "vocab"}
SOURCE = {"src", "source", "enc", "encoder", "input", "inp"}
TARGET = {"tgt", "trg", "target", "dec", "decoder"}
SELF = {"self", "slf", "masked", "causal", "selfattn", "self_attn"}
CROSS = {"cross", "enc", "encoder", "src", "context", "memory", "mem", "encdec", "inter", "source"}
FFN = {"ff", "ffn", "feed", "feedforward", "mlp", "pos", "final", "fc", "pwff", "positionwise"}
PROJ = {"q": {"q", "qs", "query", "queries", "wq", "wqs"}, "k": {"k", "ks", "key", "keys", "wk", "wks"},
        "v": {"v", "vs", "value", "values", "wv", "wvs"},
        "o": {"o", "out", "output", "fc", "concat", "wo", "dense", "proj", "outproj"}}
GAIN = {"weight", "gamma", "a_2", "alpha", "g", "scale", "w", "gain"}
SHIFT = {"bias", "beta", "b_2", "b", "shift"}


def _stack_of(parts: list[str]) -> tuple[str, int] | None:
    """("encoder" or "decoder", index of the layer number in ``parts``) for a parameter inside a layer."""
    for pos, part in enumerate(parts):
        toks = _tokens(part)
        stack = "encoder" if toks & {"encoder", "enc"} else "decoder" if toks & {"decoder", "dec"} else None
        if stack is None:
            continue
        for j in range(pos + 1, len(parts)):
            if parts[j].isdigit():
                return stack, j
        return None
    return None


def _vocab_role(name: str) -> str | None:
    toks = _tokens(name)
    if toks & GENERATOR and not toks & {"emb", "embed", "embedding", "embeddings", "lut", "tok", "token"}:
        return "generator"
    if toks & SOURCE:
        return "src_embed"
    if toks & TARGET:
        return "tgt_embed"
    return None


def propose(model: nn.Module, config: ModelConfig = PROBE) -> Proposal:
    """Where each canonical parameter goes in ``model`` (built with ``config``)."""
    d, d_ff = config.d_model, config.d_ff
    vocab_shapes = {(config.src_vocab, d), (config.tgt_vocab, d)}
    params = list(model.named_parameters())  # one name per tensor, registration order
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    out = Proposal()
    used: set[str] = set()

    # Embeddings and the pre-softmax projection: [vocab, d_model] matrices, by name, then by order.
    mats = [(n, p) for n, p in params if tuple(p.shape) in vocab_shapes]
    chosen: dict[str, tuple[str, str]] = {}
    for role in ("src_embed", "tgt_embed", "generator"):
        for _, p in mats:
            names = [a for a in aliases[id(p)] if _vocab_role(a) == role]
            if names:
                chosen[role] = (names[0], "")
                break
    taken = {c[0] for c in chosen.values()}
    rest = [n for n, _ in mats if not set(aliases[id(dict(params)[n])]) & taken]
    for role in ("src_embed", "tgt_embed", "generator"):
        if role in chosen:
            continue
        if rest:
            chosen[role] = (rest.pop(0), "chosen by registration order among the [vocab, d_model] matrices")
        elif mats:
            first = mats[0][0] if role != "generator" else mats[-1][0]
            chosen[role] = (first, f"no matrix named like a {role.replace('_', ' ')}: the same tensor is reused "
                                   "(a tie?)")
    for role in ("src_embed", "tgt_embed", "generator"):
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

    # The layers: parameters under encoder.../decoder... with a layer number.
    by_layer: dict[tuple[str, int], list[tuple[str, list[str], torch.Tensor]]] = {}
    prefixes: dict[tuple[str, int], str] = {}
    for n, p in params:
        if n in used:
            continue
        parts = n.split(".")
        found = _stack_of(parts)
        if found is None:
            continue
        stack, pos = found
        key = (stack, int(parts[pos]))
        by_layer.setdefault(key, []).append((n, parts[pos + 1:], p))
        prefixes[key] = ".".join(parts[:pos])
    for stack in ("encoder", "decoder"):
        layers = sorted(i for s, i in by_layer if s == stack)
        if not layers:
            out.stack_checks[stack] = f"no {stack} layers found (no parameter under a name with '{stack[:3]}' and a " \
                                      "layer number)"
            continue
        if layers != list(range(config.n_layers)):
            out.stack_checks[stack] = f"layer numbers {layers} are not 0..{config.n_layers - 1}"
        members0 = by_layer[(stack, layers[0])]
        lines, zero, one, left = _layer(stack, members0, d, d_ff)
        prefix = prefixes[(stack, layers[0])]
        template = (prefix + ".{i}.") if prefix else "{i}."
        shapes0 = {".".join(rel): tuple(p.shape) for _, rel, p in members0}
        for i in layers[1:]:
            if {".".join(rel): tuple(p.shape) for _, rel, p in by_layer[(stack, i)]} != shapes0 \
                    or prefixes[(stack, i)] != prefix:
                out.stack_checks[stack] = f"layer {i} does not have layer {layers[0]}'s parameter names and shapes"
        out.layers[stack] = [Line(c, template + t if t else "", why) for c, t, why in lines]
        out.layer_zero[stack] = [(template + t, why) for t, why in zero]
        out.layer_one[stack] = [(template + t, why) for t, why in one]
        out.left += [(template + t, why) for t, why in left]
        for i in layers:
            used.update(n for n, _, _ in by_layer[(stack, i)])

    # What is left outside the layers: norms the paper lacks (gain 1, bias 0), anything else as built.
    rest_params = [(n, p) for n, p in params if n not in used]
    norm_modules: dict[str, list[str]] = {}
    for n, p in rest_params:
        if tuple(p.shape) == (d,):
            norm_modules.setdefault(n.rpartition(".")[0], []).append(n)
    for n, p in rest_params:
        leaf = n.rpartition(".")[2].lower()
        if tuple(p.shape) == (d,) and leaf in GAIN and n.rpartition(".")[0] in norm_modules:
            out.one.append((n, "a norm the paper lacks (at the top of a stack, or after the embeddings?): gain 1; "
                               "declare norm.no-extra-norm"))
        elif tuple(p.shape) == (d,) and leaf in SHIFT and n.rpartition(".")[0] in norm_modules:
            out.zero.append((n, "a norm the paper lacks: bias 0"))
        else:
            out.left.append((n, f"shape {tuple(p.shape)}: not in the paper's schema, left as built (a learned "
                                "positional table? declare what it changes)"))
    return out


def _norm_slot(mod: str, owner: dict[str, str], sublayers: list[str], stack: str) -> int | None:
    """Which sub-layer's norm the norm module ``mod`` (a path inside the layer) is, from its names alone."""
    where = mod.split(".")
    if where[0] in owner and len(where) > 1:  # the norm lives inside its sub-layer's module
        return sublayers.index(owner[where[0]])
    suffix = re.search(r"(\d+)$", where[-1])  # norm1, ln_2: 1-based
    numbered = [int(x) + 1 for x in where if x.isdigit()]  # sublayers.0.norm: 0-based
    number = int(suffix.group(1)) if suffix else (numbered[-1] if numbered else None)
    if number is not None and 1 <= number <= len(sublayers):
        return number - 1
    toks = _tokens(mod)
    if toks & FFN:
        return sublayers.index("ffn")
    if stack == "decoder" and (toks & CROSS or "cross" in mod.lower()):
        return sublayers.index("cross_attn")
    if toks & {"attn", "attention", "att", "self", "slf"}:
        return 0
    return None


def _layer(stack: str, members: list[tuple[str, list[str], torch.Tensor]], d: int, d_ff: int):
    """Template lines for one layer: (canonical with {i}, model name relative to the layer, check)."""
    rel = [(".".join(r), r, p) for _, r, p in members]
    shape = {name: tuple(p.shape) for name, _, p in rel}
    lines: list[tuple[str | tuple[str, ...], str, str]] = []
    zero: list[tuple[str, str]] = []
    one: list[tuple[str, str]] = []
    done: set[str] = set()
    canon = f"{stack}.{{i}}"

    # attention groups: the first component holding [d, d], [3d, d] or [2d, d] weights
    groups: dict[str, list[str]] = {}
    for name, parts, p in rel:
        if parts[-1].endswith("weight") and p.dim() == 2 and p.shape[1] == d and p.shape[0] in (d, 2 * d, 3 * d) \
                and p.shape[0] != d_ff:
            groups.setdefault(parts[0], []).append(name)
    names = list(groups)
    roles: dict[str, tuple[str, str]] = {}
    wanted = ["self_attn"] if stack == "encoder" else ["self_attn", "cross_attn"]
    if stack == "encoder":
        if names:
            roles[names[0]] = ("self_attn", "" if len(names) == 1 else "the first of several attention modules")
    else:
        for g in names:
            toks = _tokens(g)
            if toks & SELF or "self" in g.lower():
                roles[g] = ("self_attn", "")
            elif toks & CROSS or "cross" in g.lower():
                roles[g] = ("cross_attn", "")
        claimed = [r for r, _ in roles.values()]
        if len(set(claimed)) != len(claimed):
            roles = {}
        free = [g for g in names if g not in roles]
        left_roles = [r for r in wanted if r not in [x for x, _ in roles.values()]]
        by_elimination = len(left_roles) == 1 and len(free) == 1 and len(roles) == 1
        for g, r in zip(free, left_roles):
            roles[g] = (r, "" if by_elimination else "self/cross chosen by registration order")
    for g, (role, why) in roles.items():
        weights = groups[g]
        packed = [w for w in weights if shape[w][0] == 3 * d]
        kv = [w for w in weights if shape[w][0] == 2 * d]
        square = [w for w in weights if shape[w][0] == d]
        if packed:
            w = packed[0]
            ok = "in_proj" in w or "qkv" in w.lower()
            lines.append((tuple(f"{canon}.{role}.{x}.weight" for x in "qkv"), w,
                          why or ("" if ok else "a [3 d_model, d_model] weight read as q|k|v stacked")))
            proj = {"o": square[0]} if square else {}
        else:
            proj = {}
            for w in square:
                mod = w.rpartition(".")[0][len(g):]
                hits = [x for x, keys in PROJ.items() if _tokens(mod) & keys]
                if len(hits) == 1 and hits[0] not in proj:
                    proj[hits[0]] = w
            if kv and "q" in proj:
                lines.append((tuple(f"{canon}.{role}.{x}.weight" for x in "kv"), kv[0],
                              why or "a [2 d_model, d_model] weight read as k|v stacked"))
                proj = {"q": proj["q"], **({"o": proj["o"]} if "o" in proj else {})}
                order_needed = [x for x in "qo" if x not in proj]
            else:
                order_needed = [x for x in "qkvo" if x not in proj]
            if order_needed:
                rest = [w for w in square if w not in proj.values()]
                if len(rest) == len(order_needed):
                    for x, w in zip(order_needed, rest):
                        proj[x] = w
                    why = why or "q, k, v, o chosen by registration order"
        for x in ("q", "k", "v", "o"):
            if x in proj:
                lines.append((f"{canon}.{role}.{x}.weight", proj[x], why))
        for w in weights:
            done.add(w)
            b = w[: -len("weight")] + "bias"
            if b in shape:
                zero.append((b, ""))
                done.add(b)
        for x in ("q", "k", "v", "o"):
            if x not in proj and not packed and not (kv and x in "kv"):
                lines.append((f"{canon}.{role}.{x}.weight", "", f"no {x} projection found in {g}"))
    for role in wanted:
        if role not in [r for r, _ in roles.values()]:
            for x in "qkvo":
                lines.append((f"{canon}.{role}.{x}.weight", "", f"no {role.replace('_', '-')} module found"))

    # feed-forward network: [d_ff, d] then [d, d_ff]
    ffn_group = ""
    for k, rows in (("w1", (d_ff, d)), ("w2", (d, d_ff))):
        w = next((n for n, _, _ in rel if shape[n] == rows and n.endswith("weight") and n not in done), "")
        lines.append((f"{canon}.ffn.{k}.weight", w, "" if w else f"no {list(rows)} weight found"))
        b = w[: -len("weight")] + "bias" if w else ""
        lines.append((f"{canon}.ffn.{k}.bias", b if b in shape else "",
                      "" if b in shape else "no bias found: Eq. (2) has one (map it to a callable, or declare "
                      "ffn.formula)"))
        done.update({w, b})
        ffn_group = ffn_group or (w.split(".")[0] if w else "")

    # layer norms: [d] parameters grouped by their module, each assigned to its sub-layer
    sublayers = [*wanted, "ffn"]
    owner = {g: r for g, (r, _) in roles.items()}
    if ffn_group:
        owner[ffn_group] = "ffn"
    norms: dict[str, dict[str, str]] = {}
    for name, parts, _ in rel:
        if name in done or shape[name] != (d,):
            continue
        leaf = parts[-1].lower()
        part = "gain" if leaf in GAIN else "bias" if leaf in SHIFT else None
        if part is not None:
            norms.setdefault(".".join(parts[:-1]), {})[part] = name
    slot: dict[str, int] = {}
    for mod in norms:
        found = _norm_slot(mod, owner, sublayers, stack)
        if found is not None:
            slot[mod] = found
    order_note = ""
    if len(set(slot.values())) != len(slot) or len(slot) != len(norms):
        slot = {mod: n for n, mod in enumerate(norms) if n < len(sublayers)}
        order_note = "the norm of each sub-layer chosen by registration order"
    for mod, n in slot.items():
        for part, canon_part in (("gain", "weight"), ("bias", "bias")):
            name = norms[mod].get(part, "")
            lines.append((f"{canon}.{NORMS[stack][n]}.{canon_part}", name,
                          order_note if name else f"{mod} has no {part} of shape [{d}]"))
            done.add(name)
    for n, norm in enumerate(NORMS[stack]):
        if n not in slot.values():
            others = ", ".join(f"{x} {list(shape[x])}" for x, _, _ in rel if x not in done) or "none"
            for part in ("weight", "bias"):
                lines.append((f"{canon}.{norm}.{part}", "", f"no [{d}] layer-norm parameter found (left in this "
                              f"layer: {others})"))
    left = [(n, f"shape {list(shape[n])}: not in the paper's schema, left as built") for n, _, _ in rel
            if n not in done]
    return lines, zero, one, left


# -- 3. the plugin file ---------------------------------------------------------------------------------------------
@dataclass
class Scaffold:
    """Everything the generated plugin needs."""

    cls: type
    where: str
    import_line: str
    constructor: Constructor
    proposal: Proposal
    name: str
    forward_call: list[str]
    forward_check: str
    output: str
    output_check: str
    encode: str
    positional: str

    @property
    def checks(self) -> int:
        return render(self).count("# CHECK:")


def _probe_forward(model: nn.Module, config: ModelConfig) -> tuple[list[str], str, str, str]:
    """The forward call for the adapter, a CHECK note, the output kind and its CHECK note."""
    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    required = [p for p in params if p.default is p.empty]
    names = [p.name for p in required]
    body: list[str] = []
    call = "self.model(src, tgt)"
    if len(required) > 2:
        masks = {n: n for n in names[2:] if "mask" in n.lower()}
        if len(masks) == len(names) - 2:
            body += ["pad = self.config.pad_id",
                     "src_mask = (src != pad)[:, None, None, :]  # (B, 1, 1, S), True = may attend",
                     "T = tgt.size(1)",
                     "causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).tril()  # (T, T)",
                     "tgt_mask = causal & (tgt != pad)[:, None, None, :]  # (B, 1, T, T)"]
            extra = ["src_mask" if "src" in n.lower() or "enc" in n.lower() or "memory" in n.lower() else "tgt_mask"
                     for n in names[2:]]
            call = f"self.model(src, tgt, {', '.join(extra)})"
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
        note = (f"the scaffold's probe call {call} raised {_short(exc)}: adapt the call (and the masks: this "
                "project's are True where attention is allowed)")
        return [*body, f"return {call}"], note, "logits", "unknown: the probe call failed"
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        out = out[0]
        call += "[0]"
    if not isinstance(out, torch.Tensor):
        return [*body, f"return {call}"], f"the probe call {call} returned {type(out).__name__}, not a tensor", \
            "logits", "unknown"
    shape = list(out.shape)
    ok = shape == [2, 5, config.tgt_vocab]
    note = (f"the scaffold called {call} on src [2, 7], tgt [2, 5] and got {shape}"
            + ("" if ok else f", not [2, 5, {config.tgt_vocab}] (B, T, tgt_vocab)")
            + "; check that padding (config.pad_id) and the causal mask are handled as your model expects")
    flat = out.double()
    if torch.allclose(flat.exp().sum(-1), torch.ones_like(flat[..., 0]), atol=1e-4):
        kind, why = "log_probs", "the probe's outputs exponentiate to distributions"
    elif bool((flat >= 0).all()) and torch.allclose(flat.sum(-1), torch.ones_like(flat[..., 0]), atol=1e-4):
        kind, why = "probs", "the probe's outputs sum to 1"
    else:
        kind, why = "logits", "the probe's outputs are not normalized"
    return [*body, f"return {call}"], note, kind, why


def _tables(model: nn.Module, config: ModelConfig) -> str:
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


def scaffold(target: str, name: str | None = None) -> Scaffold:
    cls, import_line, where = load_class(target)
    model, ctor = build_with_config(cls, PROBE)
    proposal = propose(model, PROBE)
    body, fcheck, output, ocheck = _probe_forward(model, PROBE)
    encode = ""
    enc = getattr(cls, "encode", None)
    if callable(enc):
        try:
            required = [p for p in list(inspect.signature(enc).parameters.values())[1:] if p.default is p.empty]
        except (TypeError, ValueError):
            required = []
        if len(required) == 1:
            encode = "self.model.encode(src)"
    slug = re.sub(r"[^a-z0-9]+", "-", (name or cls.__name__).lower()).strip("-") or "my-transformer"
    return Scaffold(cls, where, import_line, ctor, proposal, slug, body, fcheck, output, ocheck, encode,
                    _tables(model, PROBE))


def _key(canonical: str | tuple[str, ...], layer: bool) -> str:
    f = "f" if layer else ""
    if isinstance(canonical, tuple):
        return "(" + ", ".join(f'{f}"{c}"' for c in canonical) + ")"
    return f'{f}"{canonical}"'


def _target(name: str, canonical: str | tuple[str, ...], why: str, layer: bool) -> str:
    f = "f" if layer else ""
    if name:
        return f'get({f}"{name}")'
    what = canonical if isinstance(canonical, str) else "+".join(canonical)
    return f'_unmapped({f}"{what}", {why!r})'


def _listing(lines: list[str]) -> str:
    return "[\n" + "\n".join(lines) + "\n        ]" if lines else "[]"


def render(s: Scaffold) -> str:
    """The plugin file's text."""
    p = s.proposal
    ctor_lines = []
    for k, expr, note in s.constructor.args:
        arg = expr if k is None else f"{k}={expr}"
        ctor_lines.append(f"            {arg},{'  # CHECK: ' + note if note else ''}")
    map_lines = []
    for ln in p.mapping:
        check = f"  # CHECK: {ln.check}" if ln.check or not ln.target else ""
        target = _target(ln.target, ln.canonical, ln.check, False)
        map_lines.append(f"            {_key(ln.canonical, False)}: {target},{check}")
    zero_lines = [f"            get(\"{n}\"),{'  # CHECK: ' + why if why else ''}" for n, why in p.zero]
    one_lines = [f"            get(\"{n}\"),{'  # CHECK: ' + why if why else ''}" for n, why in p.one]
    layer_lines: list[str] = []
    for stack in ("encoder", "decoder"):
        if stack in p.stack_checks:
            layer_lines.append(f"            # CHECK: {p.stack_checks[stack]}")
        for ln in p.layers.get(stack, []):
            check = ln.check or ("" if ln.target else "no parameter found")
            layer_lines.append(f"            mapping[{_key(ln.canonical, True)}] = "
                               f"{_target(ln.target, ln.canonical, check, True)}"
                               f"{'  # CHECK: ' + check if check else ''}")
        for n, why in p.layer_zero.get(stack, []):
            layer_lines.append(f"            zero.append(get(f\"{n}\"))  # a bias the paper lacks"
                               f"{'; CHECK: ' + why if why else ''}")
        for n, why in p.layer_one.get(stack, []):
            layer_lines.append(f"            one.append(get(f\"{n}\"))  # CHECK: {why}")
    left = [f"#   {n}: {why}" for n, why in p.left]
    fwd = "\n".join(f"        {ln}" for ln in s.forward_call[:-1])
    fwd_return = s.forward_call[-1]
    encode = (f"\n    def encode(self, src: Tensor) -> Tensor:\n        \"\"\"The last encoder layer's output "
              f"(B, S, d_model).\"\"\"\n        return {s.encode}  # CHECK: does it mask the source padding?\n"
              if s.encode else "")
    positional = ""
    if s.positional:
        attr_path = s.positional
        positional = (f"\n    def positional_encoding(self, length: int) -> Tensor:\n"
                      f"        \"\"\"The table added to the scaled embeddings: (length, d_model).\"\"\"\n"
                      f"        table = _attribute(self.model, {attr_path!r})  # CHECK: the table both stacks add?\n"
                      f"        return table.reshape(-1, table.size(-1))[:length]\n")
    header_checks = "{checks}"
    text = f'''"""aiayn plugin for {s.where}, started by `aiayn scaffold`.

Review every line marked `# CHECK:` ({header_checks} of them): correct it, then delete the marker. Then audit:

    python3 -m pytest conformance/ --plugin=THIS_FILE --impl={s.name}
    aiayn audit --plugin THIS_FILE --impl {s.name}

The scaffold built {s.cls.__name__} with a ModelConfig (d_model {PROBE.d_model}, h {PROBE.n_heads}, \
d_ff {PROBE.d_ff}, N {PROBE.n_layers}, vocabularies {PROBE.src_vocab}, tied)
and proposed where each canonical parameter (spec.schema.parameter_schema) goes, from the model's parameter
names, shapes and registration order. A canonical parameter it found no home for goes to `_unmapped(...)`,
which fails in one line naming it. docs/plugins.md explains each part; spec/contract.py is the contract.
"""

from __future__ import annotations

import sys  # noqa: F401  (a model loaded from a file path is imported through sys.path)
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from aiayn_conformance.implementations import Implementation, hookimpl
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import CanonicalKey, Target, load_canonical

{s.import_line}


def _unmapped(name: str, why: str) -> Callable[[Tensor], None]:
    """The target of a canonical parameter the scaffold could not place: loading fails, naming it."""
    def store(value: Tensor) -> None:
        raise ValueError(f"{{name}} is not mapped yet ({{why}}): edit load_reference_state")
    return store


def _attribute(model: nn.Module, path: str) -> Tensor:
    *modules, attr = path.split(".")
    for part in modules:
        model = getattr(model, part)
    return getattr(model, attr)


class Adapter(nn.Module):
    """{s.cls.__name__} behind the adapter contract (spec/contract.py)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = {s.cls.__name__}(
{chr(10).join(ctor_lines)}
        )

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src [B, S], tgt [B, T]: token ids right-padded with config.pad_id, tgt already shifted right."""
{fwd + chr(10) if fwd else ""}        {fwd_return}  # CHECK: {s.forward_check}
{encode}{positional}
    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Copy a canonical state dict (spec.schema) into the model; biases the paper lacks get 0."""
        get = self.model.get_parameter
        mapping: dict[CanonicalKey, Target] = {{
{chr(10).join(map_lines)}
        }}
        zero: list[Tensor] = {_listing(zero_lines)}
        one: list[Tensor] = {_listing(one_lines)}
        for i in range(self.config.n_layers):
{chr(10).join(layer_lines) or "            pass  # CHECK: no layers found"}
        load_canonical(state, mapping, zero=zero, one=one)

{"# Parameters not in the paper's schema, left as the model built them:" + chr(10) + chr(10).join(left) + chr(10)
 if left else ""}

@hookimpl
def register_implementations(register):
    register(Implementation(
        name={s.name!r},
        build=Adapter,
        summary="{s.cls.__name__} from {s.where} (scaffolded)",
        source="{s.where}",
        output={s.output!r},  # CHECK: {s.output_check}
        deviations={{}},  # after a first audit: {{clause id: why}} for what the model knowingly departs from
    ))
'''
    text = re.sub(r"\n{3,}(?=@hookimpl)", "\n\n\n", text)
    return text.replace("{checks}", str(text.count("# CHECK:")))


# -- 4. the command ---------------------------------------------------------------------------------------------
def add_parser(sub) -> None:
    p = sub.add_parser("scaffold", help="write a starting plugin for your own Transformer class",
                       description=__doc__.split("\n\n", 1)[0])
    p.add_argument("target", metavar="MODULE:CLASS", help="the model class: a dotted module or a .py file, a colon, "
                   "the class name")
    p.add_argument("--name", default=None, help="the implementation's name for --impl (default: from the class)")
    p.add_argument("--output", "-o", default=None, metavar="PATH", help="write the plugin here (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, stdout: Callable[[str], object] | None = None) -> int:
    try:
        result = scaffold(args.target, args.name)
    except ScaffoldError as exc:
        print(f"aiayn scaffold: {exc}", file=sys.stderr)
        return 2
    text = render(result)
    checks = text.count("# CHECK:")
    if args.output:
        path = Path(args.output)
        if path.exists() and not args.force:
            print(f"aiayn scaffold: {path} exists; pass --force to overwrite it", file=sys.stderr)
            return 2
        path.write_text(text)
        print(f"aiayn scaffold: wrote {path} ({checks} line(s) marked # CHECK: to review); then run "
              f"python3 -m pytest conformance/ --plugin={path} --impl={result.name}", file=sys.stderr)
    else:
        (stdout or sys.stdout.write)(text)
        print(f"aiayn scaffold: {checks} line(s) marked # CHECK: to review", file=sys.stderr)
    return 0
