"""The plugin registry: implementations and components, discovered through pluggy.

Plugin authors need only ``hookimpl``, ``Implementation`` and ``Component``;
see ``implementations/hookspecs.py`` for the hooks and docs/plugins.md.
"""

from .hookspecs import hookimpl, hookspec
from .registry import (
    COMPONENT_KINDS,
    DEFAULT_PLUGINS,
    ENTRY_POINT_GROUP,
    Component,
    Implementation,
    PluginError,
    Registry,
    UnknownImplementationError,
    get_registry,
    reset_registry,
)

__all__ = [
    "COMPONENT_KINDS", "DEFAULT_PLUGINS", "ENTRY_POINT_GROUP", "Component", "Implementation",
    "PluginError", "Registry", "UnknownImplementationError", "get_registry", "hookimpl", "hookspec",
    "reset_registry",
]
