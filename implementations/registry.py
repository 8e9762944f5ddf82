"""The plugin host: discovers plugins, validates what they register, in one place.

Loading is lazy and idempotent: nothing is imported until the registry is
first asked for, and asking again returns the same registry. Plugins load one
at a time, so one broken plugin is reported (``Registry.errors``) and the
others still load.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import pluggy

from spec.clauses import CLAUSES
from spec.contract import OUTPUT_KINDS

from . import hookspecs

__all__ = [
    "Implementation",
    "Component",
    "COMPONENT_KINDS",
    "Registry",
    "PluginError",
    "UnknownImplementationError",
    "DEFAULT_PLUGINS",
    "ENTRY_POINT_GROUP",
    "get_registry",
    "reset_registry",
]

ENTRY_POINT_GROUP = "aiayn"
ENV_PLUGINS = "AIAYN_PLUGINS"
ENV_STRICT = "AIAYN_STRICT_PLUGINS"

# Built-ins are plugins like any other, registered through the same manager.
DEFAULT_PLUGINS: tuple[str, ...] = (
    "implementations.reference",
    "implementations.building_blocks",
    "implementations.sections_notebook",
    "implementations.annotated_notebook",
    "implementations.jadore801120",
    "implementations.hyunwoongko",
    "implementations.torch_nn",
    "implementations.prenorm",
    "implementations.fused",
    "implementations.components",
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+=\-]*$")
COMPONENT_KINDS: tuple[str, ...] = ("attention", "positional_encoding", "layer_norm", "feed_forward")


def _check_deviations(owner: str, deviations: Mapping[str, str]) -> Mapping[str, str]:
    if not isinstance(deviations, Mapping):
        raise ValueError(f"{owner}: deviations must be a mapping clause id -> reason, got {type(deviations).__name__}")
    for clause_id, why in deviations.items():
        if clause_id not in CLAUSES:
            raise ValueError(
                f"{owner}: deviations names unknown clause {clause_id!r}; known clauses: {', '.join(CLAUSES)}"
            )
        if not isinstance(why, str) or not why.strip():
            raise ValueError(f"{owner}: deviation {clause_id!r} needs a reason (a non-empty string)")
    return MappingProxyType(dict(deviations))


@dataclass(frozen=True)
class Implementation:
    """One auditable implementation of the whole model.

    name        used with ``--impl``; letters, digits and ``-_.+=``
    build       ``ModelConfig -> adapter`` (a ``torch.nn.Module``, see ``spec.contract``)
    summary     one line for ``aiayn list``
    source      where the code comes from (URL or citation)
    output      ``"logits"``, ``"log_probs"`` or ``"probs"``
    deviations  clause id -> why this implementation departs from it
    plugin      the plugin that registered it (filled in by the host)
    """

    name: str
    build: Callable[[Any], Any]
    summary: str = ""
    source: str = ""
    output: str = "logits"
    deviations: Mapping[str, str] = field(default_factory=dict)
    plugin: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(
                f"implementation name {self.name!r} is invalid; use letters, digits and -_.+= (no commas or spaces)"
            )
        if self.name == "all":
            raise ValueError("implementation name 'all' is reserved (it selects every implementation)")
        if not callable(self.build):
            raise ValueError(f"implementation {self.name!r}: build must be callable (config -> adapter)")
        if self.output not in OUTPUT_KINDS:
            raise ValueError(
                f"implementation {self.name!r}: output {self.output!r} is not one of {', '.join(OUTPUT_KINDS)}"
            )
        object.__setattr__(self, "deviations", _check_deviations(f"implementation {self.name!r}", self.deviations))


@dataclass(frozen=True)
class Component:
    """One reusable part: ``kind`` is one of ``COMPONENT_KINDS``; ``factory``'s
    call contract depends on the kind (see ``implementations.components``)."""

    kind: str
    name: str
    factory: Callable[..., Any]
    summary: str = ""
    source: str = ""
    deviations: Mapping[str, str] = field(default_factory=dict)
    plugin: str = ""

    def __post_init__(self) -> None:
        if self.kind not in COMPONENT_KINDS:
            raise ValueError(f"component kind {self.kind!r} is not one of {', '.join(COMPONENT_KINDS)}")
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"component name {self.name!r} is invalid; use letters, digits and -_.+=")
        if not callable(self.factory):
            raise ValueError(f"component {self.name!r}: factory must be callable")
        object.__setattr__(self, "deviations", _check_deviations(f"component {self.name!r}", self.deviations))


class PluginError(RuntimeError):
    """A plugin failed to load or to register (raised only in strict mode)."""


class UnknownImplementationError(LookupError):
    def __init__(self, name: str, known: Iterable[str], what: str = "implementation", detail: str = "",
                 plugin_errors: Iterable[str] = ()):
        self.name = name
        self.known = sorted(known)
        self.plugin_errors = list(plugin_errors)
        why = f" ({detail})" if detail else ""
        # The name may be one a broken plugin would have registered: say so, or the cause stays hidden.
        failed = (f"; {len(self.plugin_errors)} plugin(s) failed to load: {' | '.join(self.plugin_errors)}"
                  if self.plugin_errors else "")
        super().__init__(f"unknown {what} {name!r}{why}; known: {', '.join(self.known) or '(none)'}{failed}")

    def __str__(self) -> str:  # LookupError would repr() the message
        return self.args[0]


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _import_path_or_module(spec: str) -> ModuleType:
    """Import a module by dotted name, or a ``.py`` file by path."""
    if spec.endswith(".py") or os.sep in spec or "/" in spec:
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
    return importlib.import_module(spec)


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
        self.composed: dict[str, Implementation] = {}
        self.errors: list[str] = []
        self._builtins = tuple(builtins)
        self._entry_points = entry_points
        self._extra = [p.strip() for p in env.get(ENV_PLUGINS, "").split(",") if p.strip()]
        self._extra += [p for p in extra_plugins if p]
        self._loaded = False
        self._lock = threading.Lock()

    # -- loading -------------------------------------------------------------
    def _error(self, message: str, exc: BaseException | None = None) -> None:
        if self.strict:
            raise PluginError(message) from exc
        self.errors.append(message)

    def _register_plugin(self, obj: object, name: str, origin: str) -> None:
        if self.pm.has_plugin(name) or self.pm.is_registered(obj):
            return
        try:
            self.pm.register(obj, name=name)
        except Exception as exc:  # pluggy validation errors (bad hookimpl signature ...)
            self._error(f"plugin {name!r} ({origin}) could not be registered: {_short(exc)}", exc)

    def _load_builtins(self) -> None:
        for modname in self._builtins:
            try:
                module = importlib.import_module(modname)
            except Exception as exc:
                self._error(f"built-in plugin {modname!r} failed to import: {_short(exc)}", exc)
                continue
            self._register_plugin(module, modname, "built-in")

    def _load_entry_points(self) -> None:
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if self.pm.has_plugin(ep.name):
                continue
            dist = getattr(ep, "dist", None)
            origin = f"entry point {ep.name} = {ep.value}"
            if dist is not None:
                origin += f" from {dist.metadata['Name']} {dist.version}"
            try:
                obj = ep.load()
            except Exception as exc:
                self._error(f"plugin {ep.name!r} ({origin}) failed to import: {_short(exc)}", exc)
                continue
            self._register_plugin(obj, ep.name, origin)

    def _load_extra(self) -> None:
        for spec in self._extra:
            try:
                module = _import_path_or_module(spec)
            except Exception as exc:
                self._error(f"plugin {spec!r} (from {ENV_PLUGINS} or --plugin) failed to import: {_short(exc)}", exc)
                continue
            self._register_plugin(module, spec, f"{ENV_PLUGINS} or --plugin")

    def _collect(self, only: list[object] | None = None) -> None:
        """Call every plugin's hooks (or only those of the plugins in ``only``)."""
        for hookname, record in (("register_implementations", self._add_implementation),
                                 ("register_components", self._add_component)):
            caller = getattr(self.pm.hook, hookname)
            if only is not None:
                caller = self.pm.subset_hook_caller(hookname, [p for p in self.pm.get_plugins() if p not in only])
            # Call each plugin's hook alone, so one failing plugin cannot hide the others.
            for hookimpl in caller.get_hookimpls():  # registration order: built-ins first
                plugin_name = hookimpl.plugin_name

                def register(item: Any = None, /, _plugin: str = plugin_name, _record=record, **fields: Any) -> None:
                    _record(_plugin, item, fields)

                try:
                    hookimpl.function(register=register)
                except Exception as exc:
                    self._error(f"plugin {plugin_name!r} raised in {hookname}: {_short(exc)}", exc)

    def _add_implementation(self, plugin: str, item: Any, fields: dict) -> None:
        try:
            impl = item if item is not None else Implementation(**fields)
            if not isinstance(impl, Implementation):
                raise TypeError(f"register() takes an Implementation, got {type(impl).__name__}")
            impl = _with_plugin(impl, plugin)
        except Exception as exc:
            self._error(f"plugin {plugin!r} registered an invalid implementation: {_short(exc)}", exc)
            return
        if impl.name in self.implementations:
            first = self.implementations[impl.name].plugin
            self._error(
                f"plugin {plugin!r} registered implementation {impl.name!r}, already registered by plugin "
                f"{first!r}; the first registration is kept"
            )
            return
        self.implementations[impl.name] = impl

    def _add_component(self, plugin: str, item: Any, fields: dict) -> None:
        try:
            comp = item if item is not None else Component(**fields)
            if not isinstance(comp, Component):
                raise TypeError(f"register() takes a Component, got {type(comp).__name__}")
            comp = _with_plugin(comp, plugin)
        except Exception as exc:
            self._error(f"plugin {plugin!r} registered an invalid component: {_short(exc)}", exc)
            return
        key = (comp.kind, comp.name)
        if key in self.components:
            first = self.components[key].plugin
            self._error(
                f"plugin {plugin!r} registered {comp.kind} component {comp.name!r}, already registered by "
                f"plugin {first!r}; the first registration is kept"
            )
            return
        self.components[key] = comp

    def load(self) -> Registry:
        """Discover and collect everything (once; later calls return at once)."""
        with self._lock:
            if self._loaded:
                return self
            self._load_builtins()
            if self._entry_points:
                self._load_entry_points()
            self._load_extra()
            try:
                self.pm.check_pending()
            except Exception as exc:
                self._error(f"a plugin implements an unknown hook: {_short(exc)}", exc)
            self._collect()
            self._loaded = True
            return self

    def add_plugin(self, spec: str) -> None:
        """Load one more plugin (module name or .py path) after the first load."""
        self.load()
        before = set(self.pm.get_plugins())
        self._extra.append(spec)
        self._load_extra()
        new = [p for p in self.pm.get_plugins() if p not in before]
        if new:
            self._collect(only=new)

    # -- queries -------------------------------------------------------------
    def _unknown(self, name: str, known: Iterable[str], **kwargs: str) -> UnknownImplementationError:
        """The lookup error, naming the plugins that failed to load (the name may have been theirs)."""
        return UnknownImplementationError(name, known, plugin_errors=self.errors, **kwargs)

    def names(self) -> list[str]:
        return list(self.load().implementations)

    def get(self, name: str) -> Implementation:
        """A registered implementation, or a composition ``reference+KIND=NAME[+KIND=NAME...]``."""
        impls = self.load().implementations
        if name in impls:
            return impls[name]
        if "+" in name:
            return self._composed(name)
        raise self._unknown(name, impls)

    def _composed(self, name: str) -> Implementation:
        if name not in self.composed:
            from .components import compose, parse_composition

            try:
                _, pairs = parse_composition(name)
            except ValueError as exc:
                raise self._unknown(name, self.implementations, detail=str(exc)) from None
            self.composed[name] = compose(name, [self.component(kind, comp) for kind, comp in pairs])
        return self.composed[name]

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
                known = sorted({f"{k}:{n}" for k, n in comps})
                raise self._unknown(item, known, what="component")
            chosen.update({(c.kind, c.name): c for c in found})
        return list(chosen.values())

    def select(self, selection: str) -> list[Implementation]:
        """``"all"``, a name, or a comma-separated list of names, in that order."""
        names = [s.strip() for s in selection.split(",") if s.strip()]
        if not names:
            raise self._unknown(selection, self.names())
        if names == ["all"]:
            return list(self.load().implementations.values())
        return [self.get(n) for n in dict.fromkeys(names)]

    def component(self, kind: str, name: str) -> Component:
        comps = self.load().components
        if (kind, name) not in comps:
            raise self._unknown(name, [n for k, n in comps if k == kind], what=f"{kind} component")
        return comps[(kind, name)]


def _with_plugin(obj: Any, plugin: str) -> Any:
    if getattr(obj, "plugin", ""):
        return obj
    object.__setattr__(obj, "plugin", plugin)
    return obj


_REGISTRY: Registry | None = None
_REGISTRY_LOCK = threading.Lock()


def get_registry(extra_plugins: Iterable[str] = ()) -> Registry:
    """The process-wide registry, loaded on first use; ``extra_plugins`` are added to it."""
    global _REGISTRY
    with _REGISTRY_LOCK:
        if _REGISTRY is None:
            _REGISTRY = Registry()
        registry = _REGISTRY
    registry.load()
    for spec in extra_plugins:
        if spec not in registry._extra:
            registry.add_plugin(spec)
    return registry


def reset_registry() -> None:
    """Forget the process-wide registry (tests use this after changing the environment)."""
    global _REGISTRY
    with _REGISTRY_LOCK:
        _REGISTRY = None
