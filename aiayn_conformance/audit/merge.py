"""``aiayn audit --merge a.json b.json ...``: one matrix from audits run elsewhere (shards, machines, CI jobs).

Each file must be a schema-3 audit (``aiayn audit --format json``, docs/audit-json-schema.md) of the
same clause catalogue as this installation (``spec``): the verdicts are recomputed from the clauses
with this catalogue's severities, so another catalogue would be read wrongly. A subject found in
two files must carry the same results in both (an identical duplicate, e.g. a file given twice, is
kept once); different results (a clause's status, or its availability) are refused with the subject,
the files and the first difference.
Anything else wrong with a file (unreadable, not JSON, not an audit) is a ``MergeError`` naming
the file and what was wrong, one line, which the command reports with exit status 2.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from aiayn_conformance import spec
from aiayn_conformance.spec import CLAUSES

from .results import SCHEMA, STATUSES, AuditResult, SubjectResult

__all__ = ["MergeError", "load_audit", "merge", "merge_files"]


class MergeError(ValueError):
    """A merge input that cannot be used: the message names the file and what is wrong, in one line."""


def _fail(path: str, why: str) -> MergeError:
    return MergeError(f"--merge {path}: {why}")


def load_audit(path: str) -> dict:
    """The parsed audit file, checked: readable JSON, an audit, schema 3, this clause catalogue."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(path, f"cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _fail(path, f"not JSON ({exc}); expected an audit written by aiayn audit --format json") from None
    if not isinstance(data, dict) or "schema" not in data or "implementations" not in data:
        raise _fail(path, "not an aiayn audit (no 'schema' and 'implementations' fields); expected a file "
                          "written by aiayn audit --format json")
    if data["schema"] != SCHEMA:
        raise _fail(path, f"audit schema {data['schema']!r}, this aiayn reads schema {SCHEMA} only "
                          f"(re-run that audit with this version)")
    if str(data.get("spec")) != spec.SPEC_VERSION:
        raise _fail(path, f"clause catalogue (spec) version {data.get('spec')!r}, this aiayn has version "
                          f"{spec.SPEC_VERSION!r}; audits of different catalogues cannot share a matrix")
    for group in ("implementations", "components"):
        entries = data.get(group, {})
        if not isinstance(entries, dict):
            raise _fail(path, f"'{group}' is not an object of subjects")
        for name, entry in entries.items():
            _check_subject(path, name, entry)
    return data


def _check_subject(path: str, name: str, entry: object) -> None:
    if not isinstance(entry, dict) or entry.get("kind") not in ("implementation", "component") \
            or not isinstance(entry.get("clauses", {}), dict):
        raise _fail(path, f"subject {name!r} is not an audit entry (needs 'kind' and 'clauses')")
    for clause, result in entry.get("clauses", {}).items():
        if clause not in CLAUSES:
            raise _fail(path, f"subject {name!r} has clause {clause!r}, unknown to this catalogue")
        if not isinstance(result, dict) or result.get("status") not in STATUSES:
            raise _fail(path, f"subject {name!r} clause {clause!r} has no valid status "
                              f"(accepted: {', '.join(STATUSES)})")


def _results(entry: dict) -> dict:
    """What two copies of one subject must agree on: each clause's status, and whether it could be built.
    Messages may differ in their measured digits from one machine to another; timings and pictures do."""
    return {"unavailable": entry.get("unavailable", ""),
            "clauses": {c: r["status"] for c, r in entry.get("clauses", {}).items()}}


def _difference(a: dict, b: dict) -> str:
    ca, cb = a["clauses"], b["clauses"]
    if a["unavailable"] != b["unavailable"]:
        return "unavailable in one, not the other"
    clause = next(c for c in dict.fromkeys([*ca, *cb]) if ca.get(c) != cb.get(c))
    return f"clause {clause}: {ca.get(clause, 'not run')} vs {cb.get(clause, 'not run')}"


def merge(audits: list[tuple[str, dict]], order: Sequence[str] = ()) -> tuple[AuditResult, list[str]]:
    """One audit from checked files ``(path, data)``; the notes say what the caller may want to know
    (duplicates kept once, shards missing). Subjects follow ``order`` (e.g. the registry's), the others
    by name after them, implementations before components."""
    seen: dict[str, tuple[str, dict]] = {}
    notes: list[str] = []
    for path, data in audits:
        for group in ("implementations", "components"):
            for name, entry in data.get(group, {}).items():
                if name in seen:
                    first, other = seen[name]
                    if _results(other) != _results(entry):
                        raise MergeError(f"--merge: subject {name!r} is in {first} and {path} with different "
                                         f"results ({_difference(_results(other), _results(entry))}); "
                                         "merge one audit of it")
                    notes.append(f"{name}: the same results in {first} and {path}, the first kept")
                    continue
                seen[name] = (path, entry)
    rank = {n: i for i, n in enumerate(order)}

    def key(name: str) -> tuple[int, int, str]:
        return (seen[name][1]["kind"] != "implementation", rank.get(name, len(rank)), name)

    subjects = [SubjectResult.from_json(n, seen[n][1]) for n in sorted(seen, key=key)]
    result = AuditResult(subjects, seconds=sum(float(d.get("seconds", 0.0)) for _, d in audits))
    result.merged = [{"file": Path(p).name, "command": d.get("command", ""), "seconds": d.get("seconds", 0.0),
                      **({"shard": d["shard"]} if d.get("shard") else {})} for p, d in audits]
    notes += _missing_shards(audits)
    return result, notes


def _missing_shards(audits: list[tuple[str, dict]]) -> list[str]:
    """A note per shard count whose shards are not all present (a CI job that failed to upload, say)."""
    by_count: dict[int, set[int]] = {}
    for _, data in audits:
        try:
            index, count = (int(x) for x in str(data.get("shard", "")).split("/"))
        except ValueError:
            continue
        by_count.setdefault(count, set()).add(index)
    return [f"shards of {n}: {', '.join(f'{i}/{n}' for i in range(1, n + 1) if i not in got)} missing; the matrix "
            "lacks their subjects" for n, got in sorted(by_count.items()) if len(got) < n]


def merge_files(paths: list[str], order: Sequence[str] = ()) -> tuple[AuditResult, list[str]]:
    return merge([(p, load_audit(p)) for p in paths], order)
