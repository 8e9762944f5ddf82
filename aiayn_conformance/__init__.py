"""aiayn-conformance: the conformance suite for the Transformer of "Attention Is All You Need".

A plugin author needs one import::

    from aiayn_conformance import Implementation, ModelConfig, hookimpl, load_canonical

Every name in ``PUBLIC`` is importable from here; each is loaded on first use, so ``import aiayn_conformance``
stays cheap. The repository's folders install as sub-packages (``spec/`` is ``aiayn_conformance.spec``, and so
on); the top-level names of release 0.1 still import, with a ``DeprecationWarning``, until 0.3 (``_compat``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._compat import install as _install_old_names

__version__ = "0.2.0"

# name -> the module that defines it (relative to this package)
PUBLIC: dict[str, str] = {
    # registering a plugin
    "hookimpl": ".implementations",
    "Implementation": ".implementations",
    "Component": ".implementations",
    "Checkpoint": ".implementations",
    "ComponentUnavailable": ".implementations",
    "unavailable_reason": ".implementations.availability",
    # what build() and the recipe methods receive
    "ModelConfig": ".spec.config",
    "TINY": ".spec.config",
    "BASE": ".spec.config",
    "BIG": ".spec.config",
    "DecodeConfig": ".spec.decoding",
    "TRANSLATION": ".spec.decoding",
    "TrainConfig": ".spec.training",
    # loading the canonical weights (load_reference_state)
    "CanonicalKey": ".spec.schema",
    "Target": ".spec.schema",
    "load_canonical": ".spec.schema",
    "parameter_schema": ".spec.schema",
    "has_capability": ".spec.contract",
    # pieces of the reference an adapter may reuse
    "Transformer": ".reference.model",
    "sinusoid_table": ".reference.model",
    "padding_mask": ".reference.model",
    "causal_mask": ".reference.model",
    "generate": ".reference.decoding",
    "greedy_search": ".reference.decoding",
    "beam_search": ".reference.decoding",
    "PrefixDecoding": ".reference.decoding",
    "PaperRecipe": ".reference.training",
    "adam": ".reference.training",
    "lrate_scheduler": ".reference.training",
    "label_smoothed_cross_entropy": ".reference.training",
    # the suite inside your own tests
    "parametrize_with_checks": ".checks",
}

__all__ = [
    "PUBLIC", "__version__",
    "hookimpl", "Implementation", "Component", "Checkpoint", "ComponentUnavailable", "unavailable_reason",
    "ModelConfig", "TINY",
    "BASE", "BIG", "DecodeConfig", "TRANSLATION", "TrainConfig", "CanonicalKey", "Target", "load_canonical",
    "parameter_schema", "has_capability", "Transformer", "sinusoid_table", "padding_mask", "causal_mask",
    "generate", "greedy_search", "beam_search", "PrefixDecoding", "PaperRecipe", "adam", "lrate_scheduler",
    "label_smoothed_cross_entropy", "parametrize_with_checks",
]


def __getattr__(name: str) -> Any:
    module = PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *PUBLIC})


if TYPE_CHECKING:
    from .checks import parametrize_with_checks
    from .implementations import Checkpoint, Component, ComponentUnavailable, Implementation, hookimpl
    from .implementations.availability import unavailable_reason
    from .reference.decoding import PrefixDecoding, beam_search, generate, greedy_search
    from .reference.model import Transformer, causal_mask, padding_mask, sinusoid_table
    from .reference.training import PaperRecipe, adam, label_smoothed_cross_entropy, lrate_scheduler
    from .spec.config import BASE, BIG, TINY, ModelConfig
    from .spec.contract import has_capability
    from .spec.decoding import TRANSLATION, DecodeConfig
    from .spec.schema import CanonicalKey, Target, load_canonical, parameter_schema
    from .spec.training import TrainConfig

_install_old_names()
