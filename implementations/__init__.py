"""The plugin registry: implementations and components, discovered through pluggy.

Plugin authors need only ``hookimpl``, ``Implementation`` and ``Component`` (and
``ComponentUnavailable`` for a kernel that cannot run here); the hooks are documented in
``implementations/hookspecs.py``, the adapter contract in ``spec.contract``, and a guide is
docs/plugins.md. ``python -m aiayn_conformance.implementations`` writes docs/audits.md from what is registered.
"""

from .declarations import COMPONENT_KINDS, Checkpoint, Component, ComponentUnavailable, Implementation, validated
from .hookspecs import hookimpl, hookspec
from .registry import (
    DEFAULT_PLUGINS,
    ENTRY_POINT_GROUP,
    PluginError,
    Registry,
    UnknownComponentError,
    UnknownImplementationError,
    UnknownNameError,
    get_registry,
    reset_registry,
)

__all__ = [
    "COMPONENT_KINDS", "Checkpoint", "DEFAULT_PLUGINS", "ENTRY_POINT_GROUP", "Component", "ComponentUnavailable",
    "Implementation", "PluginError", "Registry", "UnknownComponentError", "UnknownImplementationError",
    "UnknownNameError", "get_registry", "hookimpl", "hookspec", "reset_registry", "validated",
]
