"""The call a written plugin makes to build the model (:class:`Constructor`): each argument generated code
(``config.d_model``, ``"transformer"``) or a nested call or dict literal, with the CHECK note of its line."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

from aiayn_conformance.spec.config import ModelConfig


def value_of(expr: str, config: ModelConfig, names: dict[str, Any] | None = None) -> Any:
    """The value of an expression the scaffold writes: ``config``, ``config.FIELD``, a literal, or a name it
    imports (``[model_opts]``)."""
    if expr == "config":
        return config
    if expr.startswith("config."):
        return getattr(config, expr.split(".", 1)[1])
    try:
        return ast.literal_eval(expr)
    except (ValueError, SyntaxError):
        return eval(expr, {"config": config, **(names or {})})  # noqa: S307 - an expression the scaffold wrote


@dataclass
class Constructor:
    """How the scaffold built the target: the call for the generated plugin and its CHECK notes. An argument's
    expression is generated code (``config.d_model``) or a nested :class:`Constructor` (a built sub-module, a
    library config, an options object or a config dict: ``kind`` "dict" writes a dict literal)."""

    args: list[tuple[str | None, Any, str]]  # (keyword or None for positional, expression, CHECK note or "")
    target: Any = None  # the class or function called
    name: str = field(default="")  # its name in the plugin
    uses: list[Any] = field(default_factory=list)  # the classes and functions the expressions name
    kind: str = "call"

    def call(self, config: ModelConfig) -> tuple[list[Any], dict[str, Any]]:
        names = {u.__name__: u for u in self.uses}

        def value(e: Any) -> Any:
            return e.build(config) if isinstance(e, Constructor) else value_of(e, config, names)
        positional = [value(e) for k, e, _ in self.args if k is None]
        keywords = {k: value(e) for k, e, _ in self.args if k is not None}
        return positional, keywords

    def build(self, config: ModelConfig) -> Any:
        args, kwargs = self.call(config)
        return kwargs if self.kind == "dict" else self.target(*args, **kwargs)

    def callables(self) -> list[Any]:
        """Every class or function the call names, this one first (for the plugin's import lines)."""
        out = [self.target] if self.target is not None and self.kind == "call" else []
        out += [u for u in self.uses if u not in out]
        for _, e, _ in self.args:
            if isinstance(e, Constructor):
                out += [c for c in e.callables() if c not in out]
        return out

    def _key(self, k: str | None) -> str:
        return "" if k is None else f"{json.dumps(k)}: " if self.kind == "dict" else f"{k}="

    def shown(self) -> str:
        """The call in one line, ``?`` for what could not be filled."""
        def one(e: Any) -> str:
            return e.shown() if isinstance(e, Constructor) else (e or "?")
        inner = ", ".join(self._key(k) + one(e) for k, e, _ in self.args)
        return "{" + inner + "}" if self.kind == "dict" else f"{self.name}({inner})"

    def missing(self) -> str:
        """The first reason this call cannot be made, or ""."""
        for _, e, note in self.args:
            if isinstance(e, Constructor):
                if e.missing():
                    return e.missing()
            elif not e:
                return note
        return ""

    def lines(self, indent: int = 12) -> list[str]:
        """The arguments as the plugin writes them, one a line, nested calls indented."""
        pad, out = " " * indent, []
        for k, e, note in self.args:
            key = self._key(k)
            mark = f"  # CHECK: {note}" if note else ""
            if isinstance(e, Constructor):
                opening, closing = ("{", "}") if e.kind == "dict" else (f"{e.name}(", ")")
                out += [f"{pad}{key}{opening}{mark}", *e.lines(indent + 4), f"{pad}{closing},"]
            else:
                out.append(f"{pad}{key}{e},{mark}")
        return out
