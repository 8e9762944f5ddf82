"""The repository's own initialisation of the class's parameters, read from the code next to it: a loop over
``X.parameters()`` / ``X.named_parameters()`` calling ``nn.init`` (or ``X.apply(fn)`` with ``fn`` of the same file
calling it), outside any class, in the class's file or a ``.py`` / ``.ipynb`` file next to it that names the class;
else none needed when the class calls ``nn.init`` itself."""

from __future__ import annotations

import ast
import inspect
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn


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
