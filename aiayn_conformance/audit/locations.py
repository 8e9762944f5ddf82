"""Where a registered subject is written, so that CI can show a finding on the adapter's own line.

``locate(obj, deviations)`` returns ``{"file", "line", "deviations": {clause: line}}``:

* ``file``/``line``: the definition of the implementation's ``build`` (or the component's ``factory``),
  found with ``inspect`` (a ``functools.partial`` is followed to its function); a failing clause is
  shown there, the code that broke it;
* ``deviations``: for each declared deviation, the first line of that file holding the clause id as a
  string literal (``"norm.post-norm"``), where the registration declares it; a declaration built
  elsewhere (another module, an id assembled at run time) falls back to ``line``.

``file`` is relative to the working directory when it lies below it (a CI job runs from the
repository's root, and GitHub resolves annotation paths from there), absolute otherwise.
Nothing is located when the source cannot be found (a builtin, a lambda typed at a prompt): ``{}``.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["locate"]


def _target(obj: object) -> object:
    """The function or class behind partials and wrappers (the registry's guard keeps the build as __wrapped__)."""
    while isinstance(obj, functools.partial) or hasattr(obj, "__wrapped__"):
        obj = obj.func if isinstance(obj, functools.partial) else obj.__wrapped__
    return obj


def _display(path: Path, cwd: Path) -> str:
    try:
        return path.relative_to(cwd).as_posix()
    except ValueError:
        return str(path)


def locate(obj: object, deviations: Mapping[str, str], cwd: str | None = None) -> dict:
    target = _target(obj)
    try:
        file = inspect.getsourcefile(target)  # type: ignore[arg-type]
        lines, line = inspect.getsourcelines(target)  # type: ignore[arg-type]
    except (TypeError, OSError):
        return {}
    if file is None:
        return {}
    path = Path(file).resolve()
    try:
        text = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        text = []
    line = max(line, 1)
    declared = {}
    for clause in deviations:
        needles = (f'"{clause}"', f"'{clause}'")
        declared[clause] = next((i for i, ln in enumerate(text, 1) if any(n in ln for n in needles)), line)
    return {"file": _display(path, Path(cwd or os.getcwd()).resolve()), "line": line, "deviations": declared}
