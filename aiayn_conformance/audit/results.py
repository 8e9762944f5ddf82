"""The data of an audit: one status per (subject, clause), folded from the suite's per-test records.

Shared by ``aiayn.audit`` (which runs the suite) and ``aiayn.report`` (which renders the result).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiayn_conformance import spec
from aiayn_conformance.spec import CLAUSES

__all__ = ["AuditResult", "BAD", "BROKEN", "ClauseResult", "SCHEMA", "STATUSES", "SubjectResult", "fold"]

STATUSES: tuple[str, ...] = ("pass", "fail", "deviation", "unexpected-pass", "skip", "error")
BROKEN = ("fail", "deviation", "error")  # statuses that make a subject nonconforming
BAD = ("fail", "error", "unexpected-pass")  # statuses that make the audit exit 1
SCHEMA = 2  # 2: `conforming` and the verdict's first word are decided by must clauses only


# -- the data ------------------------------------------------------------------------------------------------
@dataclass
class ClauseResult:
    status: str
    message: str = ""
    detail: str = ""
    tests: int = 0

    def to_json(self, clause_id: str) -> dict:
        c = CLAUSES[clause_id]
        return {"status": self.status, "severity": c.severity, "section": c.citation, "message": self.message,
                "detail": self.detail, "tests": self.tests}


@dataclass
class SubjectResult:
    name: str  # "reference", or "attention:sdpa-math" for a component
    kind: str  # "implementation" | "component"
    source: str = ""
    summary: str = ""
    deviations: dict[str, str] = field(default_factory=dict)
    clauses: dict[str, ClauseResult] = field(default_factory=dict)
    seconds: float = 0.0
    figures: dict[str, str] = field(default_factory=dict)  # title -> base64 PNG (HTML report)
    figure_errors: list[str] = field(default_factory=list)
    learning_curves: list[dict] = field(default_factory=list)  # train.learns runs (conformance.helpers.learning)
    unavailable: str = ""  # why the implementation cannot be built here (not audited; see Implementation)
    note: str = ""  # e.g. "declarations written for transformers 5.24.0; 5.25.1 is installed"
    # Where the subject is written: {"file", "line", "deviations": {clause: line of its declaration}}
    # (aiayn_conformance.audit.locations), so that CI annotations point at the adapter's own lines.
    location: dict = field(default_factory=dict)

    def broken(self, severity: str) -> list[str]:
        return [c for c, r in self.clauses.items() if r.status in BROKEN and CLAUSES[c].severity == severity]

    @property
    def conforming(self) -> bool:
        """Available and no ``must`` clause broken; ``should`` clauses do not decide (spec/clauses.py,
        Severities)."""
        return not self.unavailable and not self.broken("must")

    @property
    def verdict(self) -> str:
        if self.unavailable:
            return f"unavailable: {self.unavailable}"
        if not self.clauses:
            return "not audited"
        must, should = len(self.broken("must")), len(self.broken("should"))
        if not must and not should:
            return "conforming"
        return f"{'conforming' if self.conforming else 'nonconforming'} ({must} must, {should} should)"

    @property
    def bad(self) -> list[str]:
        return [c for c, r in self.clauses.items() if r.status in BAD]

    def to_json(self) -> dict:
        return {"kind": self.kind, "verdict": self.verdict, "conforming": self.conforming,
                "source": self.source, "summary": self.summary, "seconds": round(self.seconds, 2),
                "broken": {"must": len(self.broken("must")), "should": len(self.broken("should"))},
                "unavailable": self.unavailable, "note": self.note,
                "clauses": {c: r.to_json(c) for c, r in self.clauses.items()},
                **({"learning_curves": self.learning_curves} if self.learning_curves else {}),
                **({"location": self.location} if self.location else {}),
                **({"figures": self.figures} if self.figures else {}),
                **({"figure_errors": self.figure_errors} if self.figure_errors else {})}

    @classmethod
    def from_json(cls, name: str, data: dict) -> SubjectResult:
        """The subject back from its schema-2 entry (``to_json``); its verdict is recomputed from the clauses."""
        clauses = {c: ClauseResult(r["status"], r.get("message", ""), r.get("detail", ""), r.get("tests", 0))
                   for c, r in data.get("clauses", {}).items()}
        return cls(name, data["kind"], data.get("source", ""), data.get("summary", ""), clauses=clauses,
                   seconds=float(data.get("seconds", 0.0)), figures=dict(data.get("figures", {})),
                   figure_errors=list(data.get("figure_errors", [])),
                   learning_curves=list(data.get("learning_curves", [])), unavailable=data.get("unavailable", ""),
                   note=data.get("note", ""), location=dict(data.get("location", {})))


@dataclass
class AuditResult:
    subjects: list[SubjectResult]
    seconds: float = 0.0
    command: str = ""
    shard: str = ""  # "I/N" when the audit ran one shard (aiayn_conformance.audit.shards)
    merged: list[dict] = field(default_factory=list)  # the audits a --merge read: file, command, shard, seconds

    @property
    def exit_code(self) -> int:
        return 1 if any(s.bad for s in self.subjects) else 0

    def to_json(self) -> dict:
        impls = {s.name: s.to_json() for s in self.subjects if s.kind == "implementation"}
        comps = {s.name: s.to_json() for s in self.subjects if s.kind == "component"}
        return {"schema": SCHEMA, "spec": spec.SPEC_VERSION, "paper": spec.PAPER, "command": self.command,
                "seconds": round(self.seconds, 2), "exit_code": self.exit_code,
                **({"shard": self.shard} if self.shard else {}), **({"merged": self.merged} if self.merged else {}),
                "implementations": impls, "components": comps}


# -- folding test records into clause statuses ---------------------------------------------------------------
def fold(records: list[dict], deviations: dict[str, str]) -> dict[str, ClauseResult]:
    """One status per clause from the suite's per-test records (see ``conformance/helpers/results.py``)."""
    by_clause: dict[str, list[dict]] = {}
    for rec in records:
        if rec.get("clause") in CLAUSES:
            by_clause.setdefault(rec["clause"], []).append(rec)
    out: dict[str, ClauseResult] = {}
    for clause in CLAUSES:  # catalogue order
        recs = by_clause.get(clause)
        if not recs:
            continue
        outcomes = [r["outcome"] for r in recs]

        def first(*kinds: str, recs: list[dict] = recs) -> dict:
            return next(r for r in recs if r["outcome"] in kinds)

        if "error" in outcomes:
            r = first("error")
            out[clause] = ClauseResult("error", r["message"], r["detail"], len(recs))
        elif clause in deviations:
            if "xfailed" in outcomes or "failed" in outcomes:
                r = first("xfailed", "failed")
                out[clause] = ClauseResult("deviation", f"declared: {deviations[clause]}",
                                           f"observed: {r['detail']}", len(recs))
            elif "passed" in outcomes or "xpassed" in outcomes:
                out[clause] = ClauseResult("unexpected-pass", f"declared but not observed: {deviations[clause]}",
                                           "every check of this clause passed; remove the declaration or make "
                                           "the suite see the deviation", len(recs))
            else:
                r = first("skipped")
                out[clause] = ClauseResult("skip", r["message"], r["detail"], len(recs))
        elif "failed" in outcomes or "xfailed" in outcomes:
            r = first("failed", "xfailed")
            out[clause] = ClauseResult("fail", r["message"], r["detail"], len(recs))
        elif "passed" in outcomes or "xpassed" in outcomes:
            note = "; ".join(dict.fromkeys(r["note"] for r in recs if r.get("note")))  # e.g. a convention found
            out[clause] = ClauseResult("pass", note, "", len(recs))
        else:
            r = first("skipped")
            out[clause] = ClauseResult("skip", r["message"], r["detail"], len(recs))
    return out
