"""Stage 2: the target built with a small ``ModelConfig`` (:data:`PROBE`) -> :class:`Built`, holding the model and
the constructor call the plugin will write.

Each parameter of the target's signature gets, in this order: the whole configuration, for a parameter named like
one (a library's own config class when the target names one, else the ``ModelConfig``); the ``ModelConfig`` field
its name means (synonyms.py); a built sub-module, for a parameter that takes one; nothing, when it has a default.
Where the ``ModelConfig`` does not suit a parameter named like a configuration, the call passes a ``ConfigNamespace``
of exactly the attributes the target read. A required parameter none of these fills makes that call impossible;
the error names every call tried.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn_conformance.spec.config import TINY, ModelConfig

from .calls import Constructor
from .errors import ScaffoldError, short
from .options import Parser, Section, find_parser, offered, read_dict, read_options
from .runtime import ConfigNamespace, options
from .synonyms import ASSUMED, CONFIG_PARAMETERS, PAPER, meaning
from .target import Loaded
from .vocab import vocabulary_argument

PROBE: ModelConfig = TINY.replace(d_ff=48)
"""The configuration the model is built with to read its parameters: h > 1, N = 2, tied embeddings, and sizes
that tell the parameters apart (d_ff = 48 is neither d_model = 32 nor a stacked 2 or 3 x d_model)."""

MAX_DEPTH = 3  # sub-modules of sub-modules of ... (Seq2Seq -> TransformerEncoder -> TransformerEncoderLayer)


# -- what each parameter gets -----------------------------------------------------------------------------------
def _namespace(target: Any) -> dict[str, Any]:
    """The names visible where ``target`` is defined (its module's, or a function's globals)."""
    if hasattr(target, "__globals__"):
        return target.__globals__
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    return vars(module) if module is not None else {}


def _norm(name: str) -> str:
    return name.lower().replace("_", "")


def _module_classes(namespace: dict[str, Any]) -> dict[str, type]:
    return {n: v for n, v in namespace.items()
            if inspect.isclass(v) and issubclass(v, nn.Module) and not n.startswith("_")}


def _package_classes(owner: Any, want: str) -> dict[str, type]:
    """The ``nn.Module`` classes defined in the owner's package: its sibling modules that define a class named
    for ``want`` (imported here; a script beside them is not run) and every module of its top-level package
    already imported (``onmt.encoders`` for ``onmt.models.model:NMTModel``). Of two classes of one name, the one
    in the module nearer the owner's is kept."""
    name = getattr(owner, "__module__", "") or ""
    parent, top = name.rpartition(".")[0], name.split(".")[0]
    if top in ("torch", "builtins"):  # the building blocks models are written with, not a model's package
        return {}
    package = sys.modules.get(parent)
    for info in pkgutil.iter_modules(getattr(package, "__path__", None) or []):
        try:
            spec = importlib.util.find_spec(f"{parent}.{info.name}")
            source = Path(spec.origin).read_text(errors="replace") if spec and spec.origin else ""
            if re.search(rf"^class\s+\w*{re.escape(want)}\b", source.replace("_", ""), re.I | re.M):
                importlib.import_module(f"{parent}.{info.name}")
        except Exception:  # noqa: BLE001 - a sibling that does not import holds no class to build
            continue

    def nearness(module_name: str) -> int:
        return sum(1 for _ in takewhile(lambda ab: ab[0] == ab[1], zip(module_name.split("."), name.split("."))))

    found: list[tuple[int, str, type]] = []
    for module_name, module in list(sys.modules.items()):
        if module is not None and (module_name == top or module_name.startswith(f"{top}.")):
            found += [(nearness(module_name), n, c) for n, c in _module_classes(vars(module)).items()
                      if c.__module__ == module_name]
    out: dict[str, type] = {}
    for _, n, c in sorted(found, key=lambda x: -x[0]):
        out.setdefault(n, c)
    return out


def _submodule_classes(p: inspect.Parameter, owner: Any) -> list[tuple[type, str]]:
    """The ``nn.Module`` classes a parameter may take an instance of, best first, each with a CHECK note when it is
    not certain: its annotation; else the class named as the parameter (``encoder`` -> ``Encoder``); else those
    whose name ends with the parameter's (``layer`` -> ``EncoderLayer``): those nearest the owner's module first,
    then those sharing most words with the owner's name, then those named for the Transformer. The owner's module
    is searched first, then its package."""
    namespace = _namespace(owner)
    ann = namespace.get(p.annotation) if isinstance(p.annotation, str) else p.annotation
    if inspect.isclass(ann) and issubclass(ann, nn.Module) and ann is not nn.Module:
        subclasses = sorted((c for c in _package_classes(owner, _norm(ann.__name__)).values()
                             if issubclass(c, ann) and c is not ann),
                            key=lambda c: ("transformer" not in c.__name__.lower(), len(c.__name__)))
        return [(ann, ""), *((c, f"{p.name} built as a {c.__name__} ({c.__module__}), a subclass of its annotation "
                                 f"{ann.__name__}") for c in subclasses)]
    want = _norm(p.name)
    want = {"enc": "encoder", "dec": "decoder", "gen": "generator"}.get(want, want)
    words = [w for w in re.split(r"(?<=[a-z])(?=[A-Z])|_", getattr(owner, "__name__", "")) if len(w) >= 3]
    here = (getattr(owner, "__module__", "") or "").split(".")
    for classes, where in ((_module_classes(namespace), ""), (_package_classes(owner, want), "package")):
        def rank(n: str, classes: dict[str, type] = classes) -> tuple[int, bool, int, bool, int]:
            near = sum(1 for _ in takewhile(lambda ab: ab[0] == ab[1], zip(classes[n].__module__.split("."), here)))
            return (-near, _norm(n) != want, -sum(w.lower() in n.lower() for w in words),
                    "transformer" not in n.lower(), len(n))

        found = sorted((n for n in classes if _norm(n) == want or (
            len(want) >= 3 and _norm(n).endswith(want) and ("layer" in want or "layer" not in _norm(n)))), key=rank)
        if found and _norm(found[0]) == want and not where:
            return [(classes[found[0]], "")]
        if found:
            return [(classes[n], _suggested(p.name, classes[n], where, [m for m in found if m != n])) for n in found]
    return []


def _suggested(name: str, cls: type, where: str, others: list[str]) -> str:
    place = f" ({cls.__module__})" if where else ""
    return (f"{name} built as a {cls.__name__}{place}, the class its name suggests"
            + (f" (others: {', '.join(others[:4])}{', ...' if len(others) > 4 else ''})" if others else ""))


def _submodule(p: inspect.Parameter, owner: Any, depth: int, config: ModelConfig) -> tuple[str, Any, str] | None:
    """The first candidate class that builds with ``config`` (its constructor call), for a parameter taking one."""
    for cls, note in _submodule_classes(p, owner) if depth < MAX_DEPTH else []:
        for ctor in constructors(cls, config, depth + 1):
            if ctor.missing():
                continue
            try:
                torch.manual_seed(0)
                if isinstance(ctor.build(config), nn.Module):
                    return p.name, ctor, note
            except Exception:  # noqa: BLE001 - a call that does not build is one not to write
                continue
    return None


def _library_config(target: Any, p: inspect.Parameter) -> type | None:
    """The library config class ``p`` takes: the target's ``config_class`` or ``p``'s annotation (any class that is
    neither ``ModelConfig`` nor a module, such as a Hugging Face ``PretrainedConfig`` subclass or a dataclass)."""
    candidates = [getattr(target, "config_class", None), p.annotation]
    for c in candidates:
        if c is inspect.Parameter.empty:
            continue
        if isinstance(c, str):
            c = _namespace(target).get(c)
        if inspect.isclass(c) and c is not ModelConfig and not issubclass(c, nn.Module) and \
                c not in (int, float, str, bool, dict):
            return c
    return None


def _argument(target: Any, p: inspect.Parameter, depth: int, config: ModelConfig) -> tuple[str | None, Any, str] | None:
    """The argument for the parameter ``p`` (keyword, expression, CHECK note); None to leave it out. A required
    parameter nothing fills gets an empty expression: that call cannot be made."""
    if p.name in CONFIG_PARAMETERS and p.default is p.empty:
        lib = _library_config(target, p)
        if lib is None:
            return p.name, "config", ""
        return p.name, _keywords(lib, depth + 1, config), (
            f"a {lib.__name__} filled from ModelConfig's fields; its other fields keep the library's defaults "
            "(activation, embedding scale, ...): the audit reports what they change")
    vocab = vocabulary_argument(target, p, config)
    if vocab is not None:
        return vocab
    found = meaning(p.name)
    if found is not None:
        return (p.name, *found)
    if p.name in PAPER and _paper_value(target, p):
        return (p.name, *PAPER[p.name])
    if p.default is p.empty:
        sub = _submodule(p, target, depth, config)
        if sub is not None:
            return sub
        parser = find_parser(target)
        if parser is not None and p.name in parser.defaults:
            return p.name, repr(parser.defaults[p.name]), f"the default of the option {p.name} ({parser.said})"
        return p.name, "", f"no ModelConfig field matches the required parameter {p.name!r}"
    return None


def _paper_value(target: Any, p: inspect.Parameter) -> bool:
    """Whether a parameter named like an architecture option (synonyms.PAPER) gets the paper's value: when it is
    required, or the package's option of that name offers it (options.offered), or it is a flag set otherwise."""
    value = ast.literal_eval(PAPER[p.name][0])
    if p.default is p.empty:
        return True
    parser = find_parser(target)
    if parser is not None and p.name in parser.defaults:
        return offered(value, p.default, parser.choices.get(p.name))
    return offered(value, p.default, None)


def _parameters(target: Any) -> list[inspect.Parameter] | None:
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return None
    return [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _keywords(target: Any, depth: int, config: ModelConfig) -> Constructor:
    named = _parameters(target) or []
    args = [a for a in (_argument(target, p, depth, config) for p in named) if a is not None]
    return Constructor(_one_vocabulary_in_context(args), target, getattr(target, "__name__", "model"))


def _one_vocabulary_in_context(args: list[tuple[str | None, Any, str]]) -> list[tuple[str | None, Any, str]]:
    """A vocabulary size named for no side (``vocab_size``) beside one named for the target
    (``decoder_vocab_size``, as Marian's config has): the unnamed one is the source's."""
    target = [k for k, e, note in args if e == "config.tgt_vocab" and not note]
    source = [k for k, e, note in args if e == "config.src_vocab" and not note]
    if not target or source:
        return args
    unsided = {n for n, (e, _) in ASSUMED.items() if e == "config.tgt_vocab"}
    return [(k, "config.src_vocab", f"{k} read as the source vocabulary ({target[0]} is the target's)")
            if e == "config.tgt_vocab" and note and str(k).lower() in unsided else (k, e, note)
            for k, e, note in args]


def constructors(target: Any, config: ModelConfig, depth: int = 0) -> list[Constructor]:
    """The calls worth trying: ``target(config)`` first when the signature allows one argument (a library
    config when the target names one), then keywords."""
    name = getattr(target, "__name__", "model")
    named = _parameters(target)
    if named is None:
        return [Constructor([(None, "config", "")], target, name)]
    required = [p for p in named if p.default is p.empty]
    out = []
    lib = _library_config(target, required[0]) if len(required) == 1 and required[0].name in CONFIG_PARAMETERS \
        else None
    if lib is not None:
        out.append(_keywords(target, depth, config))
    elif len(required) <= 1 and named and (not required or required[0].name in CONFIG_PARAMETERS
                                           or meaning(required[0].name) is None):
        out.append(Constructor([(None, "config", "")], target, name))
    keywords = _keywords(target, depth, config)
    if keywords.args and not all(e == "config" or k == "device" for k, e, _ in keywords.args) and lib is None:
        out.append(keywords)
    elif keywords.args and not out:
        out.append(keywords)
    return out


def _read_config(target: Any, config: ModelConfig, depth: int = 0) -> Constructor | None:
    """For a target taking one config-like argument (``Model(args)``, ``build_base_model(model_opt, vocabs)``,
    ``build_model(cfg, src_vocab, trg_vocab)``) that ``ModelConfig`` does not suit: the call passing an options
    object or a config dict of what the target read (options.py), its other arguments filled as ``_argument``
    fills them."""
    named = _parameters(target) or []
    required = [p for p in named if p.default is p.empty or (p.default is None and (  # build_model(cfg=None, ...)
        p.name in CONFIG_PARAMETERS or meaning(p.name) is not None))]
    holders = [p for p in required if p.name in CONFIG_PARAMETERS]
    if len(holders) != 1:
        return None
    holder = holders[0]
    others = [a for a in (_argument(target, p, depth, config) for p in required if p is not holder) if a is not None]
    rest = Constructor(others, target)
    if rest.missing():
        return None

    def call(stand_in: Any) -> object:
        torch.manual_seed(0)
        args, kwargs = rest.call(config)
        return target(*args, **{holder.name: stand_in}, **kwargs)

    parser = find_parser(target)
    read = read_options(call, config, parser)
    if read is not None:
        built = _options_call(read, parser)
    else:
        section = read_dict(call, config)
        if section is None:
            return None
        built = (_dict_call(section), "the keys the builder read, each from the ModelConfig field its name means, and "
                                      "the keys of the functions each section is unpacked into")
    return Constructor([(None if len(required) == 1 else holder.name, built[0], built[1]), *others], target,
                       getattr(target, "__name__", "model"))


def _options_call(read: dict[str, tuple[str, str]], parser: Parser | None) -> tuple[Constructor, str]:
    fields: list[tuple[str | None, Any, str]] = [(k, e, note) for k, (e, note) in read.items()]
    if parser is None:
        return Constructor(fields, ConfigNamespace, "ConfigNamespace"), (
            "the attributes the constructor read, each from the ModelConfig field its name means (what it reads with "
            "a default under another name keeps that default)")
    adders = ", ".join(a.__name__ for a in parser.adders)
    call = Constructor([(None, parser.cls.__name__, ""), (None, f"[{adders}]", ""), *fields], options, "options",
                       uses=[parser.cls, *parser.adders])
    return call, (f"the defaults of {parser.said}, with the options the builder read that a ModelConfig field or "
                  "the paper decides")


def _dict_call(section: Section) -> Constructor:
    args: list[tuple[str | None, Any, str]] = []
    for key, entry in section.entries.items():
        args.append((key, _dict_call(entry), "") if isinstance(entry, Section) else (key, *entry))
    return Constructor(args, dict, "dict", kind="dict")


@dataclass
class Built:
    """Stage 2's record: the target, the model built with ``config``, and the call that built it."""

    loaded: Loaded
    model: nn.Module
    constructor: Constructor
    config: ModelConfig


def build(loaded: Loaded, config: ModelConfig = PROBE) -> Built:
    """The target built with ``config``; a function that builds nothing is named as one."""
    try:
        model, ctor = build_with_config(loaded.obj, config)
    except ScaffoldError as exc:
        if inspect.isclass(loaded.obj):
            raise
        raise ScaffoldError(f"{loaded.where} is a function, not a torch.nn.Module class, and no call of it as a "
                            f"factory returned a module: {exc}") from None
    return Built(loaded, model, ctor, config)


def build_with_config(target: Any, config: ModelConfig = PROBE) -> tuple[nn.Module, Constructor]:
    """``target`` built with ``config``; ScaffoldError naming each call tried when none works."""
    tried = []
    for ctor in [*constructors(target, config), _read_config(target, config)]:
        if ctor is None:
            continue
        missing = ctor.missing()
        if missing:
            tried.append(f"{ctor.shown()}: {missing}")
            continue
        try:
            torch.manual_seed(0)
            model = ctor.build(config)
        except Exception as exc:  # noqa: BLE001 - the user's constructor: any failure is reported
            tried.append(f"{ctor.shown()}: {short(exc)}")
            continue
        if not isinstance(model, nn.Module):
            tried.append(f"{ctor.shown()} returned {type(model).__name__}")
            continue
        return model, ctor
    name = getattr(target, "__name__", "the target")
    factories = sorted(n for n, v in _namespace(target).items() if inspect.isfunction(v) and v is not target and
                       re.match(r"(make|build|create|get|new)_?(\w*model|\w*transformer|\w*seq2seq)", n, re.I))
    hint = f" (a factory function is accepted as NAME too: {', '.join(factories)})" if factories else ""
    raise ScaffoldError(f"cannot build {name} with a ModelConfig: tried " + "; ".join(tried or
                        [f"{name}(config): no signature to read"]) + hint)
