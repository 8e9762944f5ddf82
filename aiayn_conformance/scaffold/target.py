"""Stage 1: ``MODULE:NAME`` imported (a dotted module, a ``.py`` file or a notebook's code cells), NAME checked to be
an ``nn.Module`` class or a factory function -> :class:`Loaded`, with the import lines the plugin will carry."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from .errors import ScaffoldError, short
from .notebook import notebook_module

ACCEPTED = ("MODULE:NAME, where MODULE is a dotted module, a .py file or a .ipynb notebook and NAME an nn.Module "
            "class or a function returning one")


@dataclass(kw_only=True)
class Loaded:
    """The scaffold's target: the class or factory function, where it came from, and how the plugin imports it."""

    obj: Any  # an nn.Module class or a factory function
    name: str  # the implementation's name (--name, else from NAME)
    module: ModuleType
    where: str  # MODULE:NAME as given
    kind: str  # "module", "file" or "notebook"
    location: str  # the dotted module name, or the file's resolved path
    notes: list[str] = field(default_factory=list)  # what loading left out (a notebook's skipped cells), one a line
    path_entry: str | None = None  # a folder the module imports only from (the directory aiayn ran in)
    roots: list[tuple[str, str]] = field(default_factory=list)  # a file's (folder above it, top package it imports
    # from there): found by the scaffold in the file's ancestors, such as a checkout's root

    @property
    def header(self) -> list[str]:
        """Comment lines for the plugin: what was left out of the target's source."""
        if not self.notes:
            return []
        return ["# Left out of the notebook (neither the scaffold nor this plugin runs them):",
                *(f"#   {n}" for n in self.notes)]

    def import_line(self, callables: list[Any]) -> str:
        """The plugin's import lines for ``callables`` (the target and the classes its construction names)."""
        named: list[tuple[str, str]] = [(str(c.__name__), str(c.__module__)) for c in callables]
        here = [n for (n, _), c in zip(named, callables) if vars(self.module).get(n) is c]
        elsewhere = [f"from {m} import {n}" for (n, m), c in zip(named, callables) if vars(self.module).get(n) is not c]
        names = ", ".join(here)
        if self.kind == "module":
            lines = [f"from {self.location} import {names}"]
            if self.path_entry:
                lines = [f"sys.path.insert(0, {self.path_entry!r})  # CHECK: the folder {self.location} imports from",
                         lines[0] + "  # noqa: E402"]
        elif self.kind == "file":
            path = Path(self.location)
            lines = [*(f"sys.path.insert(0, {root!r})  # CHECK: where {path.name} imports {top} from"
                       for root, top in self.roots),
                     f"sys.path.insert(0, {str(path.parent)!r})  # CHECK: where {path.name} lives",
                     f"from {path.stem} import {names}  # noqa: E402"]
        else:
            path = Path(self.location)
            lines = ["from aiayn_conformance.scaffold.notebook import load_notebook  # noqa: E402",
                     f"_notebook = load_notebook({str(path)!r})  # CHECK: where {path.name} lives",
                     f"{names} = {', '.join(f'_notebook.{n}' for n in here)}"]
        late = "" if self.kind == "module" else "  # noqa: E402"
        return "\n".join([*self.header, *lines, *(line + late for line in elsewhere)])


def load_class(target: str) -> tuple[type, str, str]:
    """``MODULE:CLASS`` -> (the class or factory, the import line for the plugin, a description of where it is)."""
    loaded = load_target(target)
    return loaded.obj, loaded.import_line([loaded.obj]), loaded.where


def load_target(target: str, name: str | None = None) -> Loaded:
    """``MODULE:NAME`` (a dotted module, a ``.py`` file or a ``.ipynb`` notebook) imported, NAME checked; ``name``
    is the implementation's name (default: NAME's, as a slug)."""
    module_name, sep, class_name = target.rpartition(":")
    if not sep or not module_name or not class_name:
        raise ScaffoldError(f"{target!r} is not MODULE:CLASS (e.g. my_package.model:Transformer, "
                            "path/to/model.py:Transformer, notebook.ipynb:make_model)")
    notes: list[str] = []
    roots: list[tuple[str, str]] = []
    if module_name.endswith(".ipynb"):
        module, notes = notebook_module(module_name)
        kind, location = "notebook", str(Path(module_name).expanduser().resolve())
    elif module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        module, roots = _import_file(module_name)
        kind, location = "file", str(Path(module_name).expanduser().resolve())
    else:
        module, entry = _import_module(module_name)
        kind, location = "module", module_name
    obj = _module_object(module, module_name, class_name)
    slug = re.sub(r"[^a-z0-9]+", "-", (name or obj.__name__).lower()).strip("-") or "my-transformer"
    return Loaded(obj=obj, name=slug, module=module, where=f"{module_name}:{class_name}", kind=kind,
                  location=location, notes=notes, path_entry=entry if kind == "module" else None, roots=roots)


def _import_file(module_name: str) -> tuple[ModuleType, list[tuple[str, str]]]:
    """The module at the file path ``module_name`` (its folder on sys.path while it imports), and the folders above
    it that it imports from: a top-level package it imports that is found nowhere else but in one of the file's
    ancestor folders (a checkout's root, where ``python -m`` would have been run) is imported from there."""
    path = Path(module_name).expanduser().resolve()
    if not path.is_file():
        raise ScaffoldError(f"cannot import {module_name}: no such file")
    name = f"aiayn_scaffold_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ScaffoldError(f"cannot import {module_name}: not a Python module")
    roots: list[tuple[str, str]] = []
    while True:
        module = importlib.util.module_from_spec(spec)
        folders = [str(path.parent), *(root for root, _ in roots)]
        sys.path[:0] = folders  # its own sibling imports, then the packages found above it
        sys.modules[name] = module  # its classes' __module__ resolves (sub-modules are found through it)
        try:
            spec.loader.exec_module(module)
            return module, roots
        except ModuleNotFoundError as exc:
            sys.modules.pop(name, None)
            top = (exc.name or "").split(".")[0]
            root = _ancestor_with(top, path.parent) if top else None
            if root is None or any(r == root for r, _ in roots):
                raise ScaffoldError(f"cannot import {module_name}: {short(exc)} (not found beside the file or in "
                                    f"a folder above it; put the folder that holds it on PYTHONPATH)") from None
            roots.append((root, top))
        except Exception as exc:
            sys.modules.pop(name, None)
            raise ScaffoldError(f"cannot import {module_name}: {short(exc)}") from None
        finally:
            for folder in folders:
                sys.path.remove(folder)


def _ancestor_with(top: str, folder: Path) -> str | None:
    """The nearest folder above ``folder`` holding the package or module ``top``, when it is not importable as
    things are; else None."""
    try:
        if importlib.util.find_spec(top) is not None:
            return None
    except (ImportError, ValueError):
        return None
    for parent in folder.parents:
        if (parent / top).is_dir() or (parent / f"{top}.py").is_file():
            return str(parent)
    return None


def _import_module(module_name: str) -> tuple[ModuleType, str | None]:
    """The dotted module, and the folder put on sys.path for it: the current directory, as ``python -m`` would,
    when the module is found only there (the ``aiayn`` script, unlike ``python -m``, does not search it)."""
    cwd = os.getcwd()
    entry = None
    if cwd not in sys.path and "" not in sys.path and _found_only_in(module_name, cwd):
        sys.path.insert(0, cwd)
        entry = cwd
    try:
        return importlib.import_module(module_name), entry
    except Exception as exc:
        raise ScaffoldError(f"cannot import module {module_name!r}: {short(exc)}") from None


def _found_only_in(module_name: str, folder: str) -> bool:
    """Whether the top package of ``module_name`` is not importable as things are but lies in ``folder``."""
    top = module_name.split(".")[0]
    try:
        if importlib.util.find_spec(top) is not None:
            return False
    except (ImportError, ValueError):
        return False
    return (Path(folder) / top).is_dir() or (Path(folder) / f"{top}.py").is_file()


def _module_object(module: ModuleType, module_name: str, class_name: str) -> Any:
    """``module.class_name``, checked to be an ``nn.Module`` class or a function (a factory)."""
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(n for n, v in vars(module).items()
                       if inspect.isclass(v) and issubclass(v, nn.Module) and v.__module__ == module.__name__)
        raise ScaffoldError(f"module {module_name!r} has no {class_name!r}; its nn.Module classes: "
                            f"{', '.join(found) or '(none)'} (accepted: {ACCEPTED})")
    if inspect.isfunction(cls) or inspect.ismethod(cls):
        return cls
    if not inspect.isclass(cls):
        raise ScaffoldError(f"{module_name}:{class_name} is a {type(cls).__name__}, not a torch.nn.Module class "
                            f"(accepted: {ACCEPTED})")
    if not issubclass(cls, nn.Module):
        raise ScaffoldError(f"{module_name}:{class_name} is a class but not a torch.nn.Module subclass "
                            f"(accepted: {ACCEPTED})")
    return cls
