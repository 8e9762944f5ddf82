"""The import names of release 0.1, kept for one more release: ``import spec`` gives ``aiayn_conformance.spec``.

Plugins written against 0.1 import ``from implementations import hookimpl, Implementation`` and
``from spec.config import ModelConfig``. Once ``aiayn_conformance`` is imported (the registry, the ``aiayn``
command and the pytest plugin all import it before any plugin loads), a finder at the front of
``sys.meta_path`` resolves those names to the same module objects as the new names, with a
``DeprecationWarning`` that names the new import.

A module of the user's own with one of these names wins: the finder aliases a name only when nothing on
``sys.path`` provides it, or when what ``sys.path`` provides is this project's own folder (a checkout's root
on the path, as pytest puts it when it collects ``conformance/`` from a checkout). Loading the folder a second
time under its old name would make two copies of every class.

pytest derives the name ``conformance.test_<area>`` for the suite's modules when it collects them from a
checkout; those imports, and the package ``conformance`` itself, alias silently.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["OLD_NAMES", "REMOVED_IN", "install", "new_name"]

PACKAGE = "aiayn_conformance"
REMOVED_IN = "0.3"
OLD_NAMES = {
    "spec": f"{PACKAGE}.spec",
    "reference": f"{PACKAGE}.reference",
    "implementations": f"{PACKAGE}.implementations",
    "conformance": f"{PACKAGE}.conformance",
    "export": f"{PACKAGE}.export",
    "aiayn": PACKAGE,
}
"""Each 0.1 top-level package and the package it is now."""

# 0.1's built-in plugin modules, now in implementations/builtins/.
_BUILTIN_MODULES = ("reference", "building_blocks", "sections_notebook", "annotated_notebook", "jadore801120",
                    "hyunwoongko", "torch_nn", "prenorm", "fused", "hf_marian", "hf_fsmt", "hf_bart",
                    "x_transformers", "components", "hf_decoding")


def new_name(old: str) -> str | None:
    """The current name of a 0.1 module name (``spec.config`` -> ``aiayn_conformance.spec.config``), or None."""
    top, _, rest = old.partition(".")
    if top not in OLD_NAMES:
        return None
    if top == "implementations" and rest.split(".")[0] in _BUILTIN_MODULES:
        return f"{PACKAGE}.implementations.builtins.{rest}"
    return OLD_NAMES[top] + (f".{rest}" if rest else "")


def _own_folder(top: str) -> Path:
    here = Path(__file__).resolve().parent
    module = importlib.util.find_spec(OLD_NAMES[top])
    if module is not None and module.submodule_search_locations:
        return Path(list(module.submodule_search_locations)[0]).resolve()
    return here


def _silent(old: str) -> bool:
    """pytest collecting conformance/ from a checkout imports ``conformance`` and ``conformance.test_*``."""
    top, _, rest = old.partition(".")
    return top == "conformance" and (not rest or rest.startswith("test_") or rest == "conftest")


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        if not _silent(self.old):
            warnings.warn(f"'{self.old}' is the import name of aiayn-conformance 0.1; import '{self.new}' instead "
                          f"(the old names are removed in {REMOVED_IN})", DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:  # already executed under its new name
        pass


class _OldNameFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        top = fullname.partition(".")[0]
        if "." not in fullname:
            found = importlib.machinery.PathFinder.find_spec(fullname)
            if found is not None and found.origin is not None:
                location = Path(found.origin).resolve().parent if found.submodule_search_locations else \
                    Path(found.origin).resolve()
                if location != _own_folder(top):
                    return None  # the user's own module of that name wins
        elif not isinstance(sys.modules.get(top), ModuleType) or \
                getattr(sys.modules[top], "__name__", "") != OLD_NAMES[top]:
            return None  # the parent is not our alias (the user's own package): not ours to resolve
        return importlib.util.spec_from_loader(fullname, _AliasLoader(fullname, new))


_FINDER = _OldNameFinder()


def install() -> None:
    """Put the finder at the front of ``sys.meta_path`` (idempotent)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
