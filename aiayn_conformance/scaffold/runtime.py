"""What a written plugin calls when it runs (the scaffold builds the model through the same code): the options
object a builder reads, and vocabulary objects of a given size."""

from __future__ import annotations

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
