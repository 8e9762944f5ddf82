"""What a written plugin calls when it runs (the scaffold builds the model through the same code): the options
object a builder reads, and vocabulary objects of a given size."""

from __future__ import annotations

import argparse
import inspect
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


TOKEN_PARAMETERS = ("tokens", "words", "itos", "symbols", "token_list", "vocab_list", "vocabulary", "words_list")


def token_parameter(cls: type) -> str | None:
    """The parameter of a vocabulary class's constructor taking its list of tokens: annotated as a list of
    strings, or named like one; None when it has none."""
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return None
    for p in params:
        text = str(p.annotation).replace("typing.", "")
        if "str" in text and any(w in text for w in ("List", "list", "Sequence", "Iterable")):
            return p.name
    return next((p.name for p in params if p.name in TOKEN_PARAMETERS), None)


def tokens(size: int, specials: list[str] | None = None, pad_id: int = 0) -> list[str]:
    """``size`` made-up tokens, the first of ``specials`` (the pad token) at ``pad_id`` and the others first."""
    first, *others = specials or ["<pad>"]
    words = [*others, *(f"tok{n}" for n in range(size))][: size - 1]
    return [*words[:pad_id], first, *words[pad_id:]]


def vocabulary(cls: type, size: int, **kwargs: Any) -> Any:
    """An instance of the vocabulary class ``cls`` of ``size`` entries: made-up tokens as its token list (its
    constructor adds its own special tokens), ``kwargs`` its other arguments."""
    name = token_parameter(cls)
    if name is None:
        raise TypeError(f"{cls.__name__} takes no list of tokens")
    words = [f"tok{n}" for n in range(size)]
    built = cls(**{name: words}, **kwargs)
    if len(built) != size:  # the special tokens it adds
        built = cls(**{name: words[: size - (len(built) - size)]}, **kwargs)
    if len(built) != size:
        raise ValueError(f"{cls.__name__} of {size} entries could not be built (got {len(built)})")
    return built
