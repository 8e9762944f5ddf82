"""What makes the generated adapter complete (issue 24): ``encode()``, ``positional_encoding()`` for a sinusoid
buffer or a learned table, the repository's own initialisation, and the sizes the model ignores.

- ``encode(src)`` is the class's own ``encode(src)`` when it has one; otherwise what cross-attention reads: the
  ``[B, S, d_model]`` input (``[S, B, d_model]`` transposed back) of the first decoder layer's cross-attention key
  projection, captured with a hook during a forward on a one-token target (a norm after the last encoder layer
  included, as the decoder sees it).
- ``positional_encoding(length)``: a ``[max_len, d_model]`` buffer, or a learned table (an ``nn.Embedding`` or a
  parameter with ``max_len`` rows or more that is not a vocabulary matrix). With two learned tables (the encoder's
  and the decoder's) it returns the encoder's, marked.
- the initialisation: a loop over ``X.parameters()`` / ``X.named_parameters()`` calling ``nn.init`` (or
  ``X.apply(fn)`` with ``fn`` a function of the same file calling it), outside any class, in the class's file or a
  ``.py`` / ``.ipynb`` file next to it that names the class; else none when the class calls ``nn.init`` itself.
- a size the model ignores: the class built at two ``d_ff`` values with the very same parameter shapes.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn_conformance.spec.config import ModelConfig

from .construct import Constructor
from .masks import probe_batch, run_call
from .naming import POSITION, tokens
from .proposal import Proposal


# -- encode ---------------------------------------------------------------------------------------------------------
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


# -- positional tables ------------------------------------------------------------------------------------------
@dataclass
class Positional:
    path: str = ""  # the table positional_encoding reads
    learned: list[str] | None = None  # the learned tables' parameter names (the probe loads sinusoids into them)
    check: str = ""


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


def positional(buffer: str, model: nn.Module, config: ModelConfig) -> Positional:
    if buffer:  # checked against the sinusoid by the value probe (proof.py)
        return Positional(buffer, [], "the table both stacks add?")
    learned = learned_tables(model, config)
    if not learned:
        return Positional(check="no positional table found (a buffer or a learned table with max_len rows)")
    check = ("a learned table: the paper's is the sinusoid of section 3.5" + (
        f"; the decoder adds its own ({', '.join(learned[1:])}): this returns the encoder's (docs/plugins.md)"
        if len(learned) > 1 else ""))
    return Positional(learned[0], learned, check)


# -- the repository's initialisation ------------------------------------------------------------------------------
@dataclass
class Init:
    code: str = ""  # the body of _init(model), or "" when the constructor initialises or nothing was found
    origin: str = ""
    check: str = ""


def _sources(cls: type) -> list[tuple[Path, str]]:
    """(file, code) for the class's file and the .py / .ipynb files next to it that name the class (notebooks: their
    code cells)."""
    try:
        here = Path(inspect.getsourcefile(cls) or "")
    except TypeError:
        return []
    if not here.is_file():
        return []
    files = [here] + sorted(p for p in here.parent.iterdir() if p != here and p.suffix in (".py", ".ipynb"))[:40]
    out = []
    for f in files:
        try:
            if f.stat().st_size > 2_000_000:
                continue
            text = f.read_text(errors="replace")
            if f.suffix == ".ipynb":
                cells = json.loads(text).get("cells", [])
                text = "\n".join("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "code")
                text = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith(("%", "!")))
            if f == here or re.search(rf"\b{re.escape(cls.__name__)}\b", text):  # a sibling that uses the class
                out.append((f, text))
        except (OSError, ValueError):
            continue
    return out


def _calls_init(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and "init." in ast.unparse(n.func) for n in ast.walk(node))


def _in_classes(tree: ast.AST) -> set[int]:
    """The nodes inside a class body: a module's own methods initialise it when it is built (nothing to add)."""
    return {id(n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for n in ast.walk(c)}


def _init_loop(tree: ast.AST) -> ast.For | None:
    inside = _in_classes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and id(node) not in inside and isinstance(node.iter, ast.Call) \
                and isinstance(node.iter.func, ast.Attribute) \
                and node.iter.func.attr in ("parameters", "named_parameters") and _calls_init(node):
            node.iter.func.value = ast.Name("model", ast.Load())
            return node
    return None


def _init_apply(tree: ast.Module) -> str:
    """``def fn ...`` + ``model.apply(fn)`` for an ``X.apply(fn)`` outside the classes whose ``fn`` is defined in
    the file and calls nn.init, else ""."""
    inside = _in_classes(tree)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and _calls_init(n)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and id(node) not in inside and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "apply" and len(node.args) == 1 and isinstance(node.args[0], ast.Name) \
                and node.args[0].id in defs:
            fn = defs[node.args[0].id]
            return ast.unparse(fn) + f"\nmodel.apply({fn.name})"
    return ""


def find_init(cls: type) -> Init:
    """The repository's initialisation of ``cls``'s parameters, from the code next to it: a loop (or an apply)
    outside the classes, which runs after the model is built; else none needed when the class calls nn.init."""
    trees = []
    for path, text in _sources(cls):
        try:
            trees.append((path, ast.parse(text)))
        except SyntaxError:
            continue
    for path, tree in trees:
        loop = _init_loop(tree)
        code = ast.unparse(loop) if loop is not None else _init_apply(tree)
        if code:
            return Init(code, f"{path.name}{':' + str(loop.lineno) if loop is not None else ''}")
    for path, tree in trees[:1]:
        own = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__), None)
        if own is not None and _calls_init(own):
            return Init(origin=f"{cls.__name__} initialises its own parameters ({path.name} calls nn.init in it)")
    return Init(check="no initialisation found next to the class (a loop over model.parameters() calling nn.init, "
                      "in a training script?): put the one your training uses here; as written the model keeps "
                      "its constructor's initialisation, which train.learns trains from")


def init_works(init: Init, model: nn.Module) -> str:
    """"" when the proposed _init runs on ``model``, else why not."""
    if not init.code:
        return ""
    ns: dict[str, Any] = {"torch": torch, "nn": nn, "init": nn.init, "model": model}
    try:
        exec(init.code, ns)  # noqa: S102 - the repository's own code, about to be written into the plugin
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        return f"the proposed initialisation raised {type(exc).__name__}: {first}"
    return ""


# -- sizes the model ignores ------------------------------------------------------------------------------------
def ignored_sizes(cls: type, ctor: Constructor, model: nn.Module, config: ModelConfig) -> tuple[int, str] | None:
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
