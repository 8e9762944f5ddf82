"""The scaffold's one-line errors (the command prints them and exits 2)."""

from __future__ import annotations


class ScaffoldError(ValueError):
    """A one-line reason the scaffold cannot go on (the command prints it and exits 2)."""


def short(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
