"""What a plugin registers: an ``Implementation`` (a whole model) or a ``Component`` (one part of it).

Both are plain frozen records; ``validated`` is the one place that checks them and
returns the read-only copy the registry keeps (see ``implementations/hookspecs.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from aiayn_conformance.spec.clauses import CLAUSES
from aiayn_conformance.spec.contract import OUTPUT_KINDS

from .availability import parse_written_for

__all__ = ["COMPONENT_KINDS", "Checkpoint", "Component", "ComponentUnavailable", "Implementation", "validated"]

COMPONENT_KINDS: tuple[str, ...] = ("attention", "positional_encoding", "layer_norm", "feed_forward",
                                     "length_penalty", "search", "optimizer", "lr_schedule", "criterion")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+=\-]*$")


@dataclass(frozen=True)
class Checkpoint:
    """What an implementation's ``read_checkpoint`` found in a file its toolkit saved.

    config      the sizes the model was trained at (ModelConfig); ``--config`` is then not needed
    state       the weights, in the parameter names of the model ``build`` returns (or of the toolkit model the
                adapter wraps), loaded into every model the suite builds at ``config``
    build       ``ModelConfig -> adapter`` built with the checkpoint's own options (its norm placement, its
                activation...); None keeps the registration's ``build``
    describes   one line on what was read, shown in the report header ("OpenNMT-py checkpoint, step 200")
    """

    config: Any
    state: Mapping[str, Any]
    build: Callable[[Any], Any] | None = None
    describes: str = ""


@dataclass(frozen=True)
class Implementation:
    """One auditable implementation of the whole model.

    name        used with ``--impl``; letters, digits and ``-_.+=``
    build       ``ModelConfig -> adapter`` (a ``torch.nn.Module``, see ``spec.contract``)
    summary     one line for ``aiayn list``
    source      where the code comes from (repository, file and commit; or a citation)
    output      ``"logits"``, ``"log_probs"`` or ``"probs"``
    deviations  clause id -> why this implementation departs from it
    notes       optional prose for docs/audits.md (what is reproduced, what is not a deviation and why)
    written_for "DISTRIBUTION VERSION" of the installed package whose source the deviation reasons cite
                (e.g. "transformers 5.24.0"); on another installed version the implementation still runs and
                the listing, the suite's header and the audit say which version the declarations describe
    unavailable why it cannot be built on this machine, with the install command (e.g. its package is not
                installed); non-empty: listed as unavailable, skipped by the suite with this reason
    install     the command that installs what it needs beside this project's torch (``aiayn install NAME`` runs
                it; ``aiayn list`` shows it while ``unavailable``)
    read_checkpoint
                optional ``path -> Checkpoint``: reads a checkpoint as the implementation's toolkit saves it
                (``--weights PATH``); raises ValueError, one line naming what it found and what it accepts
    free_head_dims
                True when ``build`` honours ``config.d_k`` and ``config.d_v`` where they differ from d_model / h
                (Table 3's row (B)); left False, the registry's ``build`` refuses such a configuration with one
                line before the model's code runs (a model that derives its head size from d_model and h would
                otherwise build another model than the one asked for)
    plugin      the plugin that registered it (filled in by the registry)
    """

    name: str
    build: Callable[[Any], Any]
    summary: str = ""
    source: str = ""
    output: str = "logits"
    deviations: Mapping[str, str] = field(default_factory=dict)
    notes: str = ""
    written_for: str = ""
    unavailable: str = ""
    install: str = ""
    read_checkpoint: Callable[[str], Checkpoint] | None = None
    free_head_dims: bool = False
    plugin: str = ""


@dataclass(frozen=True)
class Component:
    """One reusable part: ``kind`` is one of ``COMPONENT_KINDS``; what ``factory`` is called with and
    returns depends on the kind (``implementations/hookspecs.py``, ``register_components``)."""

    kind: str
    name: str
    factory: Callable[..., Any]
    summary: str = ""
    source: str = ""
    deviations: Mapping[str, str] = field(default_factory=dict)
    notes: str = ""
    plugin: str = ""


class ComponentUnavailable(RuntimeError):
    """Raised by a component that cannot run on this machine (its checks skip with this message)."""


Declared = TypeVar("Declared", bound="Implementation | Component")


def _check_name(owner: str, name: object) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{owner} name {name!r} is invalid; use letters, digits and -_.+= (no commas or spaces)")


def validated(item: Declared, plugin: str = "") -> Declared:
    """``item`` checked, as a copy with read-only ``deviations`` (and ``plugin`` filled in when empty).

    Raises a one-line ValueError naming what is wrong and what is accepted."""
    if isinstance(item, Implementation):
        owner = f"implementation {item.name!r}"
        _check_name("implementation", item.name)
        if item.name == "all":
            raise ValueError("implementation name 'all' is reserved (it selects every implementation)")
        if item.read_checkpoint is not None and not callable(item.read_checkpoint):
            raise ValueError(f"{owner}: read_checkpoint must be callable (path -> Checkpoint) or None, got "
                             f"{type(item.read_checkpoint).__name__}")
        if not callable(item.build):
            raise ValueError(f"{owner}: build must be callable (config -> adapter)")
        if item.output not in OUTPUT_KINDS:
            raise ValueError(f"{owner}: output {item.output!r} is not one of {', '.join(OUTPUT_KINDS)}")
        if not isinstance(item.install, str):
            raise ValueError(f"{owner}: install must be a string (a shell command, or \"\")")
        if not isinstance(item.unavailable, str):
            raise ValueError(f"{owner}: unavailable must be a string (the reason, or \"\" when available)")
        if item.written_for:
            try:
                parse_written_for(item.written_for)
            except ValueError as exc:
                raise ValueError(f"{owner}: {exc}") from None
    else:
        owner = f"component {item.name!r}"
        if item.kind not in COMPONENT_KINDS:
            raise ValueError(f"component kind {item.kind!r} is not one of {', '.join(COMPONENT_KINDS)}")
        _check_name("component", item.name)
        if not callable(item.factory):
            raise ValueError(f"{owner}: factory must be callable")
    if not isinstance(item.deviations, Mapping):
        raise ValueError(f"{owner}: deviations must be a mapping clause id -> reason, "
                         f"got {type(item.deviations).__name__}")
    for clause_id, why in item.deviations.items():
        if clause_id not in CLAUSES:
            raise ValueError(f"{owner}: deviations names unknown clause {clause_id!r}; known clauses: "
                             f"{', '.join(CLAUSES)}")
        if not isinstance(why, str) or not why.strip():
            raise ValueError(f"{owner}: deviation {clause_id!r} needs a reason (a non-empty string)")
    changes: dict[str, Any] = {}
    if isinstance(item, Implementation):
        if not isinstance(item.free_head_dims, bool):
            raise ValueError(f"{owner}: free_head_dims must be a bool, got {type(item.free_head_dims).__name__}")
        if not item.free_head_dims and not isinstance(item.build, _PaperHeadsOnly):
            changes["build"] = _PaperHeadsOnly(item.name, item.build)
    return dataclasses.replace(item, deviations=MappingProxyType(dict(item.deviations)),
                               plugin=item.plugin or plugin, **changes)


class _PaperHeadsOnly:
    """An implementation's ``build`` that refuses d_k or d_v other than d_model / h (its registration does not
    set ``free_head_dims``); otherwise calls the registered build."""

    def __init__(self, name: str, build: Callable[[Any], Any]):
        self.name, self.build = name, build
        functools.update_wrapper(self, build, updated=())  # its module, name and docstring; __wrapped__

    def __call__(self, config: Any) -> Any:
        if not getattr(config, "paper_heads", True):  # a ModelConfig with d_k, d_v other than d_model / h
            raise ValueError(f"{self.name} cannot build d_k={config.d_k}, d_v={config.d_v} with d_model="
                             f"{config.d_model}, h={config.n_heads}: it builds d_k = d_v = d_model / h only (its "
                             f"registration does not set free_head_dims)")
        return self.build(config)
