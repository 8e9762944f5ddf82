"""Vocabulary objects of the ``ModelConfig``'s sizes, for a builder that takes them (``build_model(cfg, src_vocab:
Vocabulary, trg_vocab: Vocabulary)``): the class a parameter's annotation names, built by its own constructor from
made-up tokens (the special-token ids it accepts are tried), or a toolkit's own vocabulary builder
(synonyms.VOCABULARIES: OpenNMT-py's ``vocabs``)."""

from __future__ import annotations

import importlib
import inspect
import itertools
import sys
import typing
from typing import Any

import torch

from aiayn_conformance.spec.config import ModelConfig

from .calls import Constructor
from .options import read_options
from .runtime import ConfigNamespace, token_parameter, tokens, vocabulary
from .synonyms import SPECIAL_IDS, SPECIALS, VOCABULARIES, meaning

Argument = tuple[str, Constructor, str]  # (keyword, the call, its CHECK note)


def vocabulary_argument(target: Any, p: inspect.Parameter, config: ModelConfig) -> Argument | None:
    """The vocabulary object the parameter ``p`` of ``target`` takes, or None when it takes none."""
    top = (getattr(target, "__module__", "") or "").split(".")[0]
    if (top, p.name) in VOCABULARIES:
        return _toolkit_vocabularies(p.name, *VOCABULARIES[(top, p.name)], config)
    found = meaning(p.name)
    cls = _annotated_class(target, p)
    if found is None or found[0] not in ("config.src_vocab", "config.tgt_vocab") or cls is None:
        return None
    return _vocabulary_of(p.name, cls, found[0], config)


def _annotated_class(target: Any, p: inspect.Parameter) -> type | None:
    """The class ``p``'s annotation names (``Vocabulary``, ``Optional[Vocabulary]``), when it is not a number."""
    ann = p.annotation
    if isinstance(ann, str):
        module = sys.modules.get(getattr(target, "__module__", "") or "")
        ann = vars(module).get(ann.replace("Optional[", "").rstrip("]").split(" | ")[0].strip()) if module else None
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    ann = args[0] if len(args) == 1 else ann
    if not inspect.isclass(ann) or ann in (int, float, str, bool) or token_parameter(ann) is None:
        return None
    return ann


def _toolkit_vocabularies(name: str, module: str, function: str, argument: str, config: ModelConfig) -> Argument | None:
    try:
        build = getattr(importlib.import_module(module), function)
        call = Constructor([(None, argument, "")], build, function, uses=[tokens])
        call.build(config)
    except Exception:  # noqa: BLE001 - the toolkit's builder does not work here: the int sizes are tried instead
        return None
    return name, call, (f"the toolkit's own vocabularies ({module}.{function}) of made-up tokens, of the ModelConfig's "
                        "sizes, the pad token at config.pad_id")


def _vocabulary_of(name: str, cls: type, size: str, config: ModelConfig) -> Argument | None:
    """``vocabulary(cls, size, ...)``: the class's other required arguments read as its special tokens, with the
    first ids it accepts (the pad token's at config.pad_id if it can be)."""
    token = token_parameter(cls)
    others = [p for p in inspect.signature(cls).parameters.values()
              if p.default is p.empty and p.name != token and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(others) > 1:
        return None
    orders = sorted(itertools.permutations(range(len(SPECIAL_IDS))), key=lambda ids: ids[1] != config.pad_id)
    for ids in orders if others else [()]:
        extra = {**SPECIALS, **{k: str(i) for k, i in zip(SPECIAL_IDS, ids)}}
        args: list[tuple[str | None, Any, str]] = [(None, cls.__name__, ""), (None, size, "")]
        if others:
            holder = others[0].name

            def call(reader: Any, holder: str = holder) -> object:
                return vocabulary(cls, int(getattr(config, size.split(".")[1])), **{holder: reader})

            read = read_options(call, config, None, extra)
            if read is None:
                continue
            fields = Constructor([(k, e, "") for k, (e, _) in read.items()], ConfigNamespace, "ConfigNamespace")
            args.append((holder, fields, ""))
        built = Constructor(args, vocabulary, "vocabulary", uses=[cls])
        try:
            torch.manual_seed(0)
            built.build(config)
        except Exception:  # noqa: BLE001 - these ids are not the class's: the next are tried
            continue
        pad = ids[1] if ids else None
        said = "" if pad in (None, config.pad_id) else (f"; its pad token is at {pad}, not config.pad_id "
                                                        f"({config.pad_id}): the adapter pads with config.pad_id")
        return name, built, f"a {cls.__name__} of made-up tokens built by its own constructor{said}"
    return None
