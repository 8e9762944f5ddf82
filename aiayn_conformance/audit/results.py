"""The data of an audit: one status per (subject, clause), folded from the suite's per-test records.

Shared by ``aiayn.audit`` (which runs the suite) and ``aiayn.report`` (which renders the result).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiayn_conformance import spec
from aiayn_conformance.spec import CLAUSES
from aiayn_conformance.spec.clauses import NOT_APPLICABLE

__all__ = ["AuditResult", "BAD", "BROKEN", "ClauseResult", "NOT_APPLICABLE", "OUTCOME", "SCHEMA", "STATUSES",
           "SubjectResult", "UNJUDGED", "fold"]

# The four outcomes of a clause: passed (a check judged it: "pass"), failed ("fail"; "deviation" when declared,
# "unexpected-pass" when declared but every check passed), not judged (every check skipped, "not-judged", or one
# errored, "error": the suite could not check it, which is no finding), and not applicable ("not-applicable": the
# adapter lacks the capability the clause is about, e.g. no decoding method).
STATUSES: tuple[str, ...] = ("pass", "fail", "deviation", "unexpected-pass", "not-judged", "not-applicable", "error")
BROKEN = ("fail", "deviation")  # statuses that make a subject nonconforming: findings
UNJUDGED = ("not-judged", "error")  # applicable, but no check judged it: never a pass, never a finding
BAD = ("fail", "error", "unexpected-pass")  # statuses that make the audit exit 1
OUTCOME = {"pass": "passed", "fail": "failed", "deviation": "failed", "unexpected-pass": "passed",
           "not-judged": "not judged", "error": "not judged", "not-applicable": "not applicable"}
# 3: four outcomes (statuses not-judged and not-applicable replace skip; `outcome` per clause); errors are not
# findings; `conforming` needs every applicable must clause judged and passed.
# 2: `conforming` and the verdict's first word are decided by must clauses only.
SCHEMA = 3


# -- the data ------------------------------------------------------------------------------------------------
@dataclass
class ClauseResult:
    status: str
    message: str = ""
    detail: str = ""
    tests: int = 0

    def to_json(self, clause_id: str) -> dict:
        c = CLAUSES[clause_id]
        return {"status": self.status, "outcome": OUTCOME[self.status], "severity": c.severity,
                "section": c.citation, "message": self.message,
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
    could_not_audit: str = ""  # why the suite run wrote no results (not one check ran): the audit exits 2

    def broken(self, severity: str) -> list[str]:
        return [c for c, r in self.clauses.items() if r.status in BROKEN and CLAUSES[c].severity == severity]

    def unjudged(self, severity: str) -> list[str]:
        """The applicable clauses of ``severity`` that no check judged (every check skipped or errored)."""
        return [c for c, r in self.clauses.items() if r.status in UNJUDGED and CLAUSES[c].severity == severity]

    @property
    def conforming(self) -> bool:
        """Available, every applicable ``must`` clause judged, and none broken; ``should`` clauses do not decide
        (spec/clauses.py, Severities)."""
        return not self.unavailable and bool(self.clauses) and not self.broken("must") and not self.unjudged("must")

    @property
    def verdict(self) -> str:
        if self.unavailable:
            return f"unavailable: {self.unavailable}"
        if not self.clauses:
            return "not audited"
        must, should = len(self.broken("must")), len(self.broken("should"))
        unjudged = len(self.unjudged("must"))
        tail = f"; {unjudged} must not judged" if unjudged else ""
        if must:
            return f"nonconforming ({must} must, {should} should{tail})"
        if unjudged:
            return f"not judged ({unjudged} must; {should} should broken)"
        if should:
            return f"conforming ({must} must, {should} should)"
        return "conforming"

    @property
    def bad(self) -> list[str]:
        return [c for c, r in self.clauses.items() if r.status in BAD]

    def to_json(self) -> dict:
        return {"kind": self.kind, "verdict": self.verdict, "conforming": self.conforming,
                "source": self.source, "summary": self.summary, "seconds": round(self.seconds, 2),
                "broken": {"must": len(self.broken("must")), "should": len(self.broken("should"))},
                "not_judged": {"must": len(self.unjudged("must")), "should": len(self.unjudged("should"))},
                "unavailable": self.unavailable, "note": self.note,
                "clauses": {c: r.to_json(c) for c, r in self.clauses.items()},
                **({"learning_curves": self.learning_curves} if self.learning_curves else {}),
                **({"location": self.location} if self.location else {}),
                **({"figures": self.figures} if self.figures else {}),
                **({"figure_errors": self.figure_errors} if self.figure_errors else {})}

    @classmethod
    def from_json(cls, name: str, data: dict) -> SubjectResult:
        """The subject back from its schema-3 entry (``to_json``); its verdict is recomputed from the clauses."""
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

        # A failed check is a finding whatever its siblings did; an error (the suite could not check) outranks a
        # pass, since the clause was not checked whole.
        if clause in deviations:
            if "xfailed" in outcomes or "failed" in outcomes:
                r = first("xfailed", "failed")
                out[clause] = ClauseResult("deviation", f"declared: {deviations[clause]}",
                                           f"observed: {r['detail']}", len(recs))
            elif "error" in outcomes:
                r = first("error")
                out[clause] = ClauseResult("error", r["message"], r["detail"], len(recs))
            elif "passed" in outcomes or "xpassed" in outcomes:
                out[clause] = ClauseResult("unexpected-pass", f"declared but not observed: {deviations[clause]}",
                                           "every check of this clause passed; remove the declaration or make "
                                           "the suite see the deviation", len(recs))
            else:
                out[clause] = _unjudged(recs)
        elif "failed" in outcomes or "xfailed" in outcomes:
            r = first("failed", "xfailed")
            out[clause] = ClauseResult("fail", r["message"], r["detail"], len(recs))
        elif "error" in outcomes:
            r = first("error")
            out[clause] = ClauseResult("error", r["message"], r["detail"], len(recs))
        elif "passed" in outcomes or "xpassed" in outcomes:
            note = "; ".join(dict.fromkeys(r["note"] for r in recs if r.get("note")))  # e.g. a convention found
            out[clause] = ClauseResult("pass", note, "", len(recs))
        else:
            out[clause] = _unjudged(recs)
    return out


def _unjudged(recs: list[dict]) -> ClauseResult:
    """A clause whose every check skipped: not applicable when each says so (``NOT_APPLICABLE``), else not
    judged, with every distinct reason listed in the detail."""
    reasons = list(dict.fromkeys(r["message"] for r in recs))
    if all(m.startswith(NOT_APPLICABLE) for m in reasons):
        return ClauseResult("not-applicable", reasons[0][len(NOT_APPLICABLE):], "\n".join(reasons), len(recs))
    applicable = [m for m in reasons if not m.startswith(NOT_APPLICABLE)]
    return ClauseResult("not-judged", applicable[0],
                        f"no check judged this clause ({len(recs)} skipped):\n" + "\n".join(reasons), len(recs))
