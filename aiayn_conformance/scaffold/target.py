"""The scaffold's target: ``MODULE:CLASS`` imported (a dotted module, or a ``.py`` file), with the import line
the plugin will carry. Every failure is a :class:`ScaffoldError` of one line."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

from torch import nn


class ScaffoldError(ValueError):
    """A one-line reason the scaffold cannot go on (the command prints it and exits 2)."""


def short(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def load_class(target: str) -> tuple[type, str, str]:
    """``MODULE:CLASS`` -> (the class, the import line for the plugin, a description of where it is)."""
    module_name, sep, class_name = target.rpartition(":")
    if not sep or not module_name or not class_name:
        raise ScaffoldError(f"{target!r} is not MODULE:CLASS (e.g. my_package.model:Transformer or "
                            "path/to/model.py:Transformer)")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        module, import_line = _import_file(module_name, class_name)
    else:
        module, import_line = _import_module(module_name, class_name)
    return _module_class(module, module_name, class_name), import_line, f"{module_name}:{class_name}"


def _import_file(module_name: str, class_name: str) -> tuple[ModuleType, str]:
    """The module at the file path ``module_name``, and a plugin import line that puts its folder on sys.path."""
    path = Path(module_name).expanduser().resolve()
    if not path.is_file():
        raise ScaffoldError(f"cannot import {module_name}: no such file")
    spec = importlib.util.spec_from_file_location(f"aiayn_scaffold_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ScaffoldError(f"cannot import {module_name}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # its own sibling imports
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ScaffoldError(f"cannot import {module_name}: {short(exc)}") from None
    finally:
        sys.path.remove(str(path.parent))
    import_line = (f"sys.path.insert(0, {str(path.parent)!r})  # CHECK: where {path.name} lives\n"
                   f"from {path.stem} import {class_name}  # noqa: E402")
    return module, import_line


def _import_module(module_name: str, class_name: str) -> tuple[ModuleType, str]:
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ScaffoldError(f"cannot import module {module_name!r}: {short(exc)}") from None
    return module, f"from {module_name} import {class_name}"


def _module_class(module: ModuleType, module_name: str, class_name: str) -> type:
    """``module.class_name``, checked to be an ``nn.Module`` class."""
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(n for n, v in vars(module).items()
                       if inspect.isclass(v) and issubclass(v, nn.Module) and v.__module__ == module.__name__)
        raise ScaffoldError(f"module {module_name!r} has no {class_name!r}; its nn.Module classes: "
                            f"{', '.join(found) or '(none)'}")
    if not inspect.isclass(cls):
        raise ScaffoldError(f"{module_name}:{class_name} is a {type(cls).__name__}, not a torch.nn.Module class")
    if not issubclass(cls, nn.Module):
        raise ScaffoldError(f"{module_name}:{class_name} is a class but not a torch.nn.Module subclass")
    return cls
