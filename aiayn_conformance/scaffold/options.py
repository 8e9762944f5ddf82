"""The options a builder reads, learned by building it with a stand-in that records each read: an options object
(``opt.heads``, any number of attributes) or a config dict (``cfg["encoder"]["num_layers"]``, its sections and the
keys the functions it is unpacked into take). A name read gets the ``ModelConfig`` field it means, else the paper's
value of an architecture option, else the default of the toolkit's own option parser (functions of the target's
package adding options to an argparse parser, such as OpenNMT-py's ``onmt.opts.model_opts``), else None, marked."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiayn_conformance.spec.config import ModelConfig

from .calls import value_of
from .runtime import option_defaults
from .synonyms import PAPER, meaning

MAX_TRIES = 200  # builds tried while learning what a builder reads (each adds at least one name)
OPTION_MODULES = ("opts", "options", "arguments", "args", "flags")  # where packages keep their argparse options


# -- the toolkit's option parser ---------------------------------------------------------------------------------------
@dataclass
class Parser:
    """A package's own option parser: the parser class, the functions adding the model's options, their defaults."""

    cls: type
    adders: list[Callable[..., Any]]
    defaults: dict[str, Any] = field(default_factory=dict)
    choices: dict[str, list[Any] | str] = field(default_factory=dict)  # each option's choices, else its help

    @property
    def said(self) -> str:
        return ", ".join(f"{a.__module__}.{a.__name__}" for a in self.adders)


_PARSERS: dict[str, Parser | None] = {}


def find_parser(target: Any) -> Parser | None:
    """The option parser of the package ``target`` belongs to: in the nearest package above its module that has an
    options module (``onmt.opts``), the functions whose name says ``model`` taking one parser argument."""
    module = getattr(target, "__module__", "") or ""
    parts = module.split(".")
    for n in range(len(parts) - 1, 0, -1):
        package = ".".join(parts[:n])
        if package not in _PARSERS:
            _PARSERS[package] = _parser_in(package)
        if _PARSERS[package] is not None:
            return _PARSERS[package]
    return None


def _parser_in(package: str) -> Parser | None:
    for name in OPTION_MODULES:
        try:
            found = importlib.util.find_spec(f"{package}.{name}")
            module = importlib.import_module(f"{package}.{name}") if found is not None else None
        except Exception:  # noqa: BLE001 - an options module that does not import offers no defaults
            module = None
        if module is None:
            continue
        adders: list[Callable[..., Any]] = [
            f for n, f in vars(module).items() if inspect.isfunction(f) and f.__module__ == module.__name__
            and "model" in n.lower() and not n.startswith("_") and _one_parameter(f)]
        for cls in _parser_classes(package, module):
            try:
                return Parser(cls, adders, option_defaults(cls, adders), _choices(cls, adders)) if adders else None
            except Exception:  # noqa: BLE001 - the adders need another parser class
                continue
    return None


def _choices(cls: type, adders: list[Callable[..., Any]]) -> dict[str, list[Any] | str]:
    parser = cls()
    for add in adders:
        add(parser)
    return {a.dest: list(a.choices) if a.choices is not None else str(a.help or "") for a in parser._actions}


def _one_parameter(f: Callable[..., Any]) -> bool:
    params = list(inspect.signature(f).parameters.values())
    return len([p for p in params if p.default is p.empty]) == 1


def _parser_classes(package: str, module: Any) -> list[type]:
    """argparse parser classes to try: the package's own subclasses, the parser of a library the options module
    imports (configargparse), argparse's."""
    top = package.split(".")[0]
    own = [c for m, mod in list(sys.modules.items()) if mod is not None and (m == top or m.startswith(f"{top}."))
           for c in vars(mod).values() if inspect.isclass(c) and issubclass(c, argparse.ArgumentParser)
           and c.__module__ == m]
    found = [getattr(v, "ArgumentParser", None) for v in vars(module).values() if inspect.ismodule(v)]
    libraries = [c for c in found if inspect.isclass(c) and issubclass(c, argparse.ArgumentParser)]
    return list(dict.fromkeys([*own, *libraries, argparse.ArgumentParser]))


# -- answering a name --------------------------------------------------------------------------------------------------
Entry = tuple[str, str]  # (the expression written into the plugin, its CHECK note)


def answer(name: str, config: ModelConfig, defaults: dict[str, Any], extra: dict[str, str] | None = None,
           choices: dict[str, list[Any] | str] | None = None) -> tuple[Entry | None, Any] | None:
    """What a name read gets: (the entry to write, or None for the parser's default; the value), or None when
    nothing answers it. ``extra`` (name -> expression) answers first; a paper value the parser does not offer
    (``choices``) is not one of its options."""
    if extra and name in extra:
        return (extra[name], ""), value_of(extra[name], config)
    found = meaning(name)
    if found is not None:
        return found, value_of(found[0], config)
    if name in PAPER:
        expr, note = PAPER[name]
        value = ast.literal_eval(expr)
        if name in defaults and not offered(value, defaults[name], (choices or {}).get(name)):
            return None, defaults[name]
        return (expr, note + (f" (the toolkit's default: {defaults[name]!r})" if name in defaults else "")), value
    if name in defaults:
        return None, defaults[name]
    return None


def offered(value: Any, default: Any, offers: list[Any] | str | None) -> bool:
    """Whether a paper value is one the parser's option takes, other than its default: the other value of a flag,
    one of its choices, or a word its help names (a free-text option may mean something else by the same word)."""
    if value == default:
        return False
    if isinstance(value, bool) or isinstance(offers, list):
        return isinstance(default, bool) if isinstance(value, bool) else value in (offers or [])
    return bool(re.search(rf"\b{re.escape(str(value))}\b", offers or ""))


# -- an options object -------------------------------------------------------------------------------------------------
class _Options:
    """A stand-in options object: each attribute read is answered (:func:`answer`) and recorded; one nothing
    answers raises AttributeError (so ``getattr(opt, name, default)`` keeps its default) unless it is one of
    ``absent``, read as None. Attributes the builder sets are kept."""

    def __init__(self, config: ModelConfig, parser: Parser | None, absent: frozenset[str],
                 extra: dict[str, str] | None = None):
        object.__setattr__(self, "_st", {"config": config, "defaults": parser.defaults if parser else {},
                                         "choices": parser.choices if parser else {}, "absent": absent, "set": {},
                                         "read": {}, "missed": None, "extra": extra})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        st = self._st
        if name in st["set"]:
            return st["set"][name]
        found = answer(name, st["config"], st["defaults"], st["extra"], st["choices"])
        if found is not None:
            if found[0] is not None:
                st["read"][name] = found[0]
            return found[1]
        if name in st["absent"]:
            nor = " nor an option of the toolkit's parser" if st["defaults"] else ""
            st["read"][name] = ("None", f"{name} is no ModelConfig field{nor}: the scaffold built the model with None")
            return None
        error = AttributeError(f"the options have no {name!r}")
        st["missed"] = (name, error)
        raise error

    def __setattr__(self, name: str, value: Any) -> None:
        self._st["set"][name] = value

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError as exc:
            raise KeyError(str(exc)) from None

    def __contains__(self, name: str) -> bool:
        return hasattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)


def read_options(call: Callable[[Any], object], config: ModelConfig, parser: Parser | None,
                 extra: dict[str, str] | None = None) -> dict[str, Entry] | None:
    """The entries of the options object ``call`` (the builder, given the object) reads until it builds; None when
    it does not build. An attribute read bare that nothing answers is read as None on the next try."""
    absent: frozenset[str] = frozenset()
    for _ in range(MAX_TRIES):
        reader = _Options(config, parser, absent, extra)
        try:
            call(reader)
            return dict(reader._st["read"])
        except AttributeError as exc:  # the reader's own, not caught by getattr(opt, name, default): read bare
            missed = reader._st["missed"]
            if missed is None or exc is not missed[1] or missed[0] in absent:
                return None
            absent |= {missed[0]}
        except Exception:  # noqa: BLE001 - not buildable this way: the caller reports the other calls
            return None
    return None


# -- a config dict -----------------------------------------------------------------------------------------------------
Path = tuple[str, ...]


class _Learner:
    """What the config dict learned across tries: the keys each section gets, and the section last unpacked."""

    def __init__(self, config: ModelConfig):
        self.config = config
        self.learned: dict[Path, dict[str, Entry]] = {}
        self.banned: set[str] = set()
        self.pending: _Section | None = None
        self.new = False

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        """After a section is unpacked (``f(**cfg)``), the keys of the function it was unpacked into that it
        lacks: the first function called whose arguments hold every key of the section."""
        section = self.pending
        if event != "call" or section is None or frame.f_code.co_filename == __file__:
            return
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        names = list(code.co_varnames[:count])
        rest: dict[str, Any] = {}
        if code.co_flags & inspect.CO_VARKEYWORDS:
            keywords = code.co_varnames[count + bool(code.co_flags & inspect.CO_VARARGS)]
            rest = frame.f_locals.get(keywords, {})
            names += _keys_read(code, keywords)
        if not all(k in rest or (k in names and frame.f_locals.get(k) is dict.__getitem__(section, k))
                   for k in dict.keys(section)):
            return  # another call (an argument computed after the unpacking)
        learned = {}
        for name in names:
            if name in ("self", "cls") or name in self.banned or dict.__contains__(section, name):
                continue
            found = answer(name, self.config, {})
            if found is not None and found[0] is not None:
                learned[name] = found[0]
        if not learned and not dict.__len__(section):
            return  # nothing to learn from a call an empty section may not have gone to
        self.pending = None
        if learned:
            self.learned.setdefault(section.path, {}).update(learned)
            self.new = True


_KEYS: dict[Any, list[str]] = {}


def _keys_read(code: Any, keywords: str) -> list[str]:
    """The keys a function reads of its ``**keywords`` by name (``kwargs.get("layer_norm", "pre")``), from its
    source."""
    if code not in _KEYS:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(code)))
        except (OSError, TypeError, SyntaxError):
            tree = ast.Module([], [])
        found = []
        for node in ast.walk(tree):
            key = node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("get", "pop") and node.args and isinstance(node.func.value, ast.Name) and \
                node.func.value.id == keywords else \
                node.slice if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                node.value.id == keywords else None
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                found.append(key.value)
        _KEYS[code] = list(dict.fromkeys(found))
    return _KEYS[code]


class _Section(dict):
    """A stand-in config dict: a key read is answered (:func:`answer`), or becomes a nested section when read with
    ``[key]``; ``.get(key, default)`` keeps its default for a key nothing answers."""

    def __init__(self, path: Path, learner: _Learner):
        super().__init__()
        self.path, self.learner = path, learner
        self.entries: dict[str, Entry | _Section] = {}
        for key, entry in learner.learned.get(path, {}).items():
            self._store(key, entry, value_of(entry[0], learner.config))

    def _store(self, key: str, entry: Entry | _Section, value: Any) -> Any:
        self.entries[key] = entry
        dict.__setitem__(self, key, value)
        return value

    def _answer(self, key: Any) -> bool:
        if not isinstance(key, str) or dict.__contains__(self, key) or key in self.learner.banned:
            return dict.__contains__(self, key)
        found = answer(key, self.learner.config, {})
        if found is None or found[0] is None:
            return False
        self._store(key, found[0], found[1])
        return True

    def __getitem__(self, key: Any) -> Any:
        if not self._answer(key):
            section = _Section((*self.path, key), self.learner)
            self._store(key, section, section)
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        return dict.__getitem__(self, key) if self._answer(key) else default

    def __contains__(self, key: object) -> bool:
        return self._answer(key)

    def keys(self) -> Any:
        self.learner.pending = self
        return dict.keys(self)

    def __iter__(self) -> Any:
        self.learner.pending = self
        return dict.__iter__(self)


def read_dict(call: Callable[[Any], object], config: ModelConfig) -> _Section | None:
    """The config dict ``call`` (the builder, given the dict) reads until it builds, learning across tries the keys
    of the functions each section is unpacked into; None when it does not build."""
    learner = _Learner(config)
    for _ in range(MAX_TRIES):
        learner.new = False
        root = _Section((), learner)
        before = sys.getprofile()
        sys.setprofile(learner.profile)
        try:
            call(root)
            built = True
        except TypeError as exc:
            built = False
            twice = re.search(r"got multiple values for keyword argument '(\w+)'", str(exc))
            if twice and twice.group(1) not in learner.banned:  # a key learned that the call passes itself
                learner.banned.add(twice.group(1))
                for keys in learner.learned.values():
                    keys.pop(twice.group(1), None)
                learner.new = True
        except Exception:  # noqa: BLE001 - not buildable this way: the caller reports the other calls
            built = False
        finally:
            sys.setprofile(before)
        if not learner.new:
            return root if built else None
    return None


Section = _Section
