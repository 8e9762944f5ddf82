"""Plugins that wrap an installed library: is it here, and is it the version the declarations describe?

A built-in plugin for a third-party package (``implementations/builtins/hf_marian.py``, ``x_transformers.py``, ...)
always registers, so that its name, summary and declared deviations are known on every machine
(``aiayn list``, docs/audits.md). When the package cannot be used here it registers with
``Implementation(unavailable=REASON)``: ``aiayn list`` shows the reason (with the install command), the suite
skips the implementation with it, and ``aiayn audit`` reports it as unavailable. Nothing is imported to decide:
importing transformers or x-transformers costs seconds, and the registry loads in every ``aiayn`` and pytest
process; the package is imported when the model is first built.

``Implementation(written_for="DISTRIBUTION VERSION")`` records the version whose source the deviation reasons
cite (file and line); ``version_note`` says when the installed version differs, for the listing, the suite's
report header and the audit.
"""

from __future__ import annotations

import importlib.util
import re
from importlib import metadata

__all__ = ["INSTALL", "installed_version", "parse_written_for", "unavailable_reason", "version_note"]

INSTALL = "pip install 'aiayn-conformance[libraries]'"
"""The install command named in every reason: the extra that brings the wrapped libraries."""

_RELEASE = re.compile(r"^(\d+(?:\.\d+)*)")
_VERSION = re.compile(r"^\d+(?:\.\d+)*(?:(?:a|b|rc|\.post|\.dev)\d+)*(?:\+[A-Za-z0-9.]+)?$")  # PEP 440, roughly


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (its name on the package index), or None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    match = _RELEASE.match(version)
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def unavailable_reason(module: str, distribution: str, *, at_least: str, below: str, install: str = INSTALL) -> str:
    """"" when ``module`` can be imported from an installed ``distribution`` in ``[at_least, below)``; otherwise
    one line saying why not and how to install it (``install``, the libraries extra by default). Nothing is
    imported (``importlib.util.find_spec`` only)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails, or a module that is set to None
        found = False
    wanted = f"{distribution}>={at_least},<{below}"
    if not found:
        return f"{distribution} is not installed (needs {wanted}): {install}"
    version = installed_version(distribution)
    if version is None:
        return f"{module} is importable but {distribution}'s metadata is missing (needs {wanted}): {install}"
    if not _release(at_least) <= _release(version) < _release(below):
        return f"{distribution} {version} is installed; this plugin needs {wanted}: {install}"
    return ""


def parse_written_for(written_for: str) -> tuple[str, str]:
    """``"transformers 5.24.0"`` -> ``("transformers", "5.24.0")``; ValueError naming the accepted form."""
    parts = written_for.split()
    if len(parts) != 2 or not _VERSION.match(parts[1]):
        raise ValueError(f"written_for {written_for!r} is not 'DISTRIBUTION VERSION' (e.g. 'transformers 5.24.0')")
    return parts[0], parts[1]


def version_note(written_for: str) -> str:
    """"" when the installed version is the one the declarations were written for (or none is recorded);
    otherwise a line such as "declarations written for transformers 5.24.0; 5.25.1 is installed"."""
    if not written_for:
        return ""
    distribution, version = parse_written_for(written_for)
    installed = installed_version(distribution)
    if installed == version:
        return ""
    now = f"{installed} is installed" if installed else "it is not installed"
    return f"declarations written for {distribution} {version}; {now}"
