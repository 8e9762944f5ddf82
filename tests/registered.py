"""The built-in plugins as the registry has them: tests read names from here, never from hand-kept lists.

Adding a built-in (a module in implementations/builtins/ named in its ``PLUGINS``) needs no edit here or in
the tests that use it.
"""

from __future__ import annotations

from functools import cache

from aiayn_conformance.implementations import Registry
from aiayn_conformance.implementations.builtins import PLUGINS, module_name

BUILTINS_PACKAGE = "aiayn_conformance.implementations.builtins"


def builtin_module(module: str) -> str:
    """The import name of a built-in plugin module (``"fused"`` -> ``aiayn_conformance...builtins.fused``; a full
    module name as it is)."""
    return module_name(module)


@cache
def builtin_registry() -> Registry:
    """The built-ins alone: no entry points, no ``AIAYN_PLUGINS``."""
    return Registry(entry_points=False, env={}).load()


def library_plugins() -> dict[str, str]:
    """Implementation name -> plugin module, for the built-ins that wrap an installed library (``written_for``)."""
    return {i.name: i.plugin for i in builtin_registry().implementations.values() if i.written_for}


def library_module(name: str) -> str:
    """The import name of the library a built-in wraps: its plugin module's ``LIBRARY_MODULE`` where it names one
    (OpenNMT-py's is ``onmt``), else its ``written_for`` distribution with ``-`` read as ``_``."""
    import importlib

    impl = builtin_registry().get(name)
    named = getattr(importlib.import_module(impl.plugin), "LIBRARY_MODULE", None)
    return named if isinstance(named, str) else impl.written_for.split()[0].replace("-", "_")


__all__ = ["BUILTINS_PACKAGE", "PLUGINS", "builtin_module", "builtin_registry", "library_module", "library_plugins"]
