"""The plugin host: finds plugins, calls their hooks, and keeps what they register, validated in one place.

Loading is lazy and idempotent: nothing is imported until the registry is first asked for,
and asking again returns the same registry. Plugins load one at a time, in this order: the
built-ins, installed entry points (group ``aiayn``), the ``AIAYN_PLUGINS`` variable, then the
plugins named explicitly (``--plugin``). A discovered plugin that fails is reported in one line
(``Registry.errors``) and the others still load; an explicit plugin that fails raises
``PluginError`` (the user asked for it), as does every plugin under ``AIAYN_STRICT_PLUGINS=1``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pluggy

from . import builtins as builtin_plugins
from . import hookspecs
from .composition import compose, parse_composition
from .declarations import Component, Implementation, validated

__all__ = [
    "DEFAULT_PLUGINS", "ENTRY_POINT_GROUP", "PluginError", "Registry", "UnknownComponentError",
    "UnknownImplementationError", "UnknownNameError", "get_registry", "reset_registry",
]

ENTRY_POINT_GROUP = "aiayn"
DISTRIBUTION = "aiayn-conformance"  # its own entry points are built-ins (a built-in above the registry's layer)
ENV_PLUGINS = "AIAYN_PLUGINS"
ENV_STRICT = "AIAYN_STRICT_PLUGINS"

# Built-ins are plugins like any other, registered through the same manager.
DEFAULT_PLUGINS: tuple[str, ...] = tuple(builtin_plugins.module_name(m) for m in builtin_plugins.PLUGINS)


def own_entry_points() -> list[metadata.EntryPoint]:
    """This project's own ``aiayn`` entry points: its built-ins that live above the registry's layer."""
    return [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)
            if ep.dist is not None and ep.dist.metadata["Name"] == DISTRIBUTION]


class PluginError(RuntimeError):
    """A plugin named explicitly (or any plugin, in strict mode) failed to load or to register."""


class UnknownNameError(LookupError):
    """A name that no plugin registered; the message lists the known names and the plugins that failed."""

    what = "name"

    def __init__(self, name: str, known: Iterable[str], *, detail: str = "", plugin_errors: Iterable[str] = (),
                 what: str = ""):
        self.name, self.known, self.plugin_errors = name, sorted(known), list(plugin_errors)
        why = f" ({detail})" if detail else ""
        # The name may be one a broken plugin would have registered: say so, or the cause stays hidden.
        failed = (f"; {len(self.plugin_errors)} plugin(s) failed to load: {' | '.join(self.plugin_errors)}"
                  if self.plugin_errors else "")
        super().__init__(f"unknown {what or self.what} {name!r}{why}; known: {', '.join(self.known) or '(none)'}"
                         f"{failed}")

    def __str__(self) -> str:  # LookupError would repr() the message
        return str(self.args[0])


class UnknownImplementationError(UnknownNameError):
    what = "implementation"


class UnknownComponentError(UnknownNameError):
    what = "component"


def _short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _import_path_or_module(spec: str) -> ModuleType:
    """Import a module by dotted name, or a ``.py`` file by path. A module name found nowhere on the path is looked
    for in the caller's directory last (``AIAYN_CALLER_DIR``, which ``aiayn audit`` sets for the suite it runs
    elsewhere, else the working directory), so that ``--plugin my_plugin`` works from the folder holding it
    without that folder shadowing an installed package."""
    if not (spec.endswith(".py") or os.sep in spec or "/" in spec):
        top = spec.split(".", 1)[0]
        caller = os.environ.get("AIAYN_CALLER_DIR") or os.getcwd()
        if importlib.util.find_spec(top) is None and caller not in sys.path:
            sys.path.append(caller)
        return importlib.import_module(spec)
    path = Path(spec).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no such plugin file: {path}")
    mod_name = "aiayn_plugin_" + re.sub(r"\W", "_", str(path.with_suffix("")))
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]
        raise
    return module


class Registry:
    """Implementations and components registered by all plugins."""

    def __init__(self, extra_plugins: Iterable[str] = (), *, strict: bool | None = None,
                 builtins: Iterable[str] = DEFAULT_PLUGINS, entry_points: bool = True,
                 env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        self.strict = (env.get(ENV_STRICT, "") not in ("", "0")) if strict is None else strict
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.implementations: dict[str, Implementation] = {}
        self.components: dict[tuple[str, str], Component] = {}
        self.errors: list[str] = []
        self._composed: dict[str, Implementation] = {}
        self._builtins = tuple(builtins)
        self._entry_points = entry_points
        self._discovered = [p.strip() for p in env.get(ENV_PLUGINS, "").split(",") if p.strip()]
        self._explicit = [p for p in extra_plugins if p]
        self._loaded = False

    # -- loading -------------------------------------------------------------------------------------------
    def load(self) -> Registry:
        """Load every plugin (once; later calls return at once)."""
        if self._loaded:
            return self
        self._loaded = True
        for modname in self._builtins:
            self._add(modname, "built-in", partial(importlib.import_module, modname))
        if self._builtins == DEFAULT_PLUGINS:
            for ep in own_entry_points():
                self._add(ep.name, f"built-in (entry point {ep.name} = {ep.value})", ep.load)
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if self._entry_points else ():
            dist = f" from {ep.dist.metadata['Name']} {ep.dist.version}" if ep.dist is not None else ""
            self._add(ep.name, f"entry point {ep.name} = {ep.value}{dist}", ep.load)
        for spec in self._discovered:
            self._add(spec, f"from {ENV_PLUGINS}", partial(_import_path_or_module, spec))
        for spec in self._explicit:
            self._add(spec, "--plugin", partial(_import_path_or_module, spec), explicit=True)
        return self

    def add_plugin(self, spec: str) -> None:
        """Load one more explicit plugin (module name or .py path); a failure raises PluginError."""
        self.load()
        if spec not in self._explicit:
            self._add(spec, "--plugin", partial(_import_path_or_module, spec), explicit=True)
            self._explicit.append(spec)

    def _fail(self, message: str, explicit: bool, exc: BaseException | None = None) -> None:
        if self.strict or explicit:
            raise PluginError(message) from exc
        self.errors.append(message)

    def _add(self, name: str, origin: str, loader: Callable[[], object], explicit: bool = False) -> None:
        """Import one plugin, register it with pluggy, and call its hooks."""
        if self.pm.has_plugin(name):
            return
        try:
            plugin = loader()
        except Exception as exc:
            return self._fail(f"plugin {name!r} ({origin}) failed to import: {_short(exc)}", explicit, exc)
        try:
            self.pm.register(plugin, name=name)
        except Exception as exc:  # pluggy's validation (a hookimpl with arguments its spec lacks ...)
            return self._fail(f"plugin {name!r} ({origin}) could not be registered: {_short(exc)}", explicit, exc)
        unknown = [c.name for c in self.pm.get_hookcallers(plugin) or () if not c.has_spec()]
        if unknown:
            self._fail(f"plugin {name!r} ({origin}) implements an unknown hook: {', '.join(unknown)} (known: "
                       "register_implementations, register_components)", explicit)
        others = [p for _, p in self.pm.list_name_plugin() if p is not None and p is not plugin]
        for hook in ("register_implementations", "register_components"):
            try:  # this plugin's hook alone, so that one failing plugin cannot hide the others
                self.pm.subset_hook_caller(hook, remove_plugins=others)(register=self._callback(name, hook, explicit))
            except PluginError:
                raise
            except Exception as exc:
                self._fail(f"plugin {name!r} raised in {hook}: {_short(exc)}", explicit, exc)

    def _callback(self, plugin: str, hook: str, explicit: bool) -> Callable[[Implementation | Component], None]:
        """The ``register`` a plugin's hook receives: it validates and records what ``plugin`` registers."""
        kind = Implementation if hook == "register_implementations" else Component

        def register(item: Implementation | Component, /) -> None:
            try:
                if not isinstance(item, kind):
                    raise TypeError(f"register() takes {kind.__name__}(...), got {type(item).__name__}")
                item = validated(item, plugin)
            except (TypeError, ValueError) as exc:
                return self._fail(f"plugin {plugin!r} registered an invalid {kind.__name__.lower()}: {_short(exc)}",
                                  explicit, exc)
            table: dict = self.implementations if isinstance(item, Implementation) else self.components
            key = item.name if isinstance(item, Implementation) else (item.kind, item.name)
            if key in table:
                what = f"implementation {item.name!r}" if isinstance(item, Implementation) else \
                    f"{item.kind} component {item.name!r}"
                return self._fail(f"plugin {plugin!r} registered {what}, already registered by plugin "
                                  f"{table[key].plugin!r}; the first registration is kept", explicit)
            table[key] = item

        return register

    # -- queries -------------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self.load().implementations)

    def get(self, name: str) -> Implementation:
        """A registered implementation, or a composition ``reference+KIND=NAME[+KIND=NAME...]``."""
        impls = self.load().implementations
        if name in impls:
            return impls[name]
        if "+" not in name:
            raise UnknownImplementationError(name, impls, plugin_errors=self.errors)
        if name not in self._composed:
            try:
                pairs = parse_composition(name)
            except ValueError as exc:
                raise UnknownImplementationError(name, impls, detail=str(exc), plugin_errors=self.errors) from None
            self._composed[name] = compose(name, [self.component(kind, comp) for kind, comp in pairs])
        return self._composed[name]

    def select(self, selection: str) -> list[Implementation]:
        """``"all"``, a name, or a comma-separated list of names, in that order."""
        names = [s.strip() for s in selection.split(",") if s.strip()]
        if not names:
            raise UnknownImplementationError(selection, self.names(), plugin_errors=self.errors)
        if names == ["all"]:
            return list(self.load().implementations.values())
        return [self.get(n) for n in dict.fromkeys(names)]

    def component(self, kind: str, name: str) -> Component:
        comps = self.load().components
        if (kind, name) not in comps:
            raise UnknownComponentError(name, [n for k, n in comps if k == kind], what=f"{kind} component",
                                        plugin_errors=self.errors)
        return comps[(kind, name)]

    def select_components(self, selection: str) -> list[Component]:
        """``all``, or comma-separated ``NAME`` (every kind with that name), ``KIND:NAME`` or ``KIND:all``."""
        comps = self.load().components
        wanted = [s.strip() for s in selection.split(",") if s.strip()]
        if wanted == ["all"]:
            return list(comps.values())
        chosen: dict[tuple[str, str], Component] = {}
        for item in wanted:
            kind, sep, name = item.rpartition(":")
            found = [c for (k, n), c in comps.items()
                     if (n == name or (sep and name == "all")) and (not sep or k == kind)]
            if not found:
                raise UnknownComponentError(item, {f"{k}:{n}" for k, n in comps}, plugin_errors=self.errors)
            chosen.update({(c.kind, c.name): c for c in found})
        return list(chosen.values())


_REGISTRY: Registry | None = None


def get_registry(extra_plugins: Iterable[str] = ()) -> Registry:
    """The process-wide registry, loaded on first use; ``extra_plugins`` are added to it as explicit plugins."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry()
    registry = _REGISTRY.load()
    for spec in extra_plugins:
        registry.add_plugin(spec)
    return registry


def reset_registry() -> None:
    """Forget the process-wide registry (tests use this after changing the environment)."""
    global _REGISTRY
    _REGISTRY = None
