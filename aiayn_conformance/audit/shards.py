"""``aiayn audit --shard I/N``: a deterministic split of the audit's subjects, for a CI job matrix.

A subject (an implementation's name, or a component's ``KIND:NAME``) belongs to shard
``1 + sha256(name) mod N``. Its shard depends on its own name only, never on which other subjects
exist or in what order they were registered: every subject lands in exactly one shard of N, and a
subject added later moves no other. I is 1-based, as CI matrices count (``1/3``, ``2/3``, ``3/3``).
Hashing balances shards only on average: with few subjects a shard may hold none, and its report
is then empty (exit 0), so that the merged report still covers every subject.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = ["Shard", "parse_shard", "shard_of"]

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, name: str) -> bool:
        return shard_of(name, self.count) == self.index


def shard_of(name: str, count: int) -> int:
    """The 1-based shard of ``count`` that the subject ``name`` belongs to."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return 1 + int.from_bytes(digest[:8], "big") % count


def parse_shard(text: str) -> Shard:
    """``"I/N"`` with 1 <= I <= N; a ValueError naming what is wrong and what is accepted otherwise."""
    m = _SPEC.match(text)
    accepted = "accepted: I/N with 1 <= I <= N, I counted from 1 (e.g. 1/3, 2/3, 3/3)"
    if not m:
        raise ValueError(f"--shard {text!r} is not of the form I/N; {accepted}")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1:
        raise ValueError(f"--shard {text}: N must be at least 1; {accepted}")
    if not 1 <= index <= count:
        raise ValueError(f"--shard {text}: I must lie between 1 and N={count}; {accepted}")
    return Shard(index, count)
