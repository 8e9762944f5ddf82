"""What a written plugin calls when it runs (the scaffold builds the model through the same code): the options
object a builder reads, and vocabulary objects of a given size."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any


class ConfigNamespace(SimpleNamespace):
    """An options object for a builder that reads attributes of its own names (``Model(args)`` reading
    ``args.encoder_embed_dim``): attributes, ``[name]``, ``name in`` and ``.get(name, default)``."""

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)

    def __contains__(self, name: str) -> bool:
        return hasattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)


def option_defaults(parser_class: type, adders: list[Callable[..., Any]]) -> dict[str, Any]:
    """The defaults of the options ``adders`` add to a new ``parser_class`` (required options included)."""
    parser = parser_class()
    for add in adders:
        add(parser)
    return {a.dest: a.default for a in parser._actions
            if a.dest != argparse.SUPPRESS and a.default is not argparse.SUPPRESS and a.dest != "help"}


def options(parser_class: type, adders: list[Callable[..., Any]], **values: Any) -> ConfigNamespace:
    """A toolkit's options object: the defaults of its own parser (``adders`` adding their options to a
    ``parser_class``), with ``values`` set."""
    return ConfigNamespace(**{**option_defaults(parser_class, adders), **values})
