"""The source lines the toolkit plugins' reasons cite (``tk_opennmt``, ``tk_joeynmt`` and their ``_defaults``).

Not a plugin: it registers nothing. Each toolkit module keeps ``LINES``, a table ``{"path/in/site-packages.py:N":
fragment of that line}`` of every line its declarations may cite; ``cited(LINES, *texts)`` is the ``CITED`` of one
registration: the entries its reasons and notes cite (``path.py:N``, ``:N`` after a path, both ends of ``:N-M``),
each looked up in the table, so that a citation without its fragment fails at import. The tests check every
fragment against the installed release.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = ["CITATION", "cited"]

CITATION = re.compile(r"(?:([\w/]+\.py))?:(\d+)(?:-(\d+))?")


def cited(lines: Mapping[str, str], texts: Iterable[str], prefix: str) -> dict[str, str]:
    """``{where: fragment}`` for every ``prefix...py:N`` the ``texts`` cite; KeyError naming a line ``lines`` lacks."""
    found: dict[str, str] = {}
    for text in texts:
        path = None
        for m in CITATION.finditer(text):
            path = m.group(1) or path
            if path is None or not path.startswith(prefix):
                continue
            for n in (m.group(2), m.group(3)):
                if n:
                    where = f"{path}:{n}"
                    if where not in lines:
                        raise KeyError(f"{where} is cited but has no fragment in LINES")
                    found[where] = lines[where]
    return found
