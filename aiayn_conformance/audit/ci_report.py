"""Audit reports for CI systems: JUnit XML (``--format junit``) and GitHub annotations (``--format github``).

Both put a finding on the line of the subject's own source that the audit recorded
(``SubjectResult.location``, see ``aiayn_conformance.audit.locations``): a declared deviation, observed or not, on the
line that declares it; a failure or an error on the definition of the implementation's ``build`` (the
component's ``factory``). Without a location (an audit file written before locations were recorded)
the JUnit test case has no ``file``, and the annotation no ``file``: GitHub shows it on the run.

JUnit: one ``testsuite`` per subject, one ``testcase`` per clause (``classname`` the subject,
``name`` the clause id): ``fail`` and ``unexpected-pass`` are ``<failure>``, ``error`` is ``<error>``,
``not-judged`` and ``not-applicable`` are ``<skipped>`` (its ``type`` says which), ``pass`` and ``deviation``
(declared, hence expected) pass, the deviation's reason in ``<system-out>``. GitHub: ``::error`` for each
``fail``, ``error`` and ``unexpected-pass``, ``::warning`` for each must clause not judged, ``::notice`` for
each observed declared deviation, then the summary line; the same exit status as every other format.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from aiayn_conformance.spec import CLAUSES

from .results import AuditResult, ClauseResult, SubjectResult

__all__ = ["github_annotations", "junit", "where"]


def where(subject: SubjectResult, clause: str, result: ClauseResult) -> tuple[str, int] | None:
    """(file, line) of the subject's source a finding belongs on, or None when none was recorded."""
    loc = subject.location
    if not loc.get("file"):
        return None
    line = loc.get("line", 1)
    if result.status in ("deviation", "unexpected-pass"):
        line = loc.get("deviations", {}).get(clause, line)
    return str(loc["file"]), int(line)


def _headline(subject: SubjectResult, clause: str, result: ClauseResult) -> str:
    c = CLAUSES[clause]
    return f"{subject.name} {clause} ({c.citation}, {c.severity}) {result.status}: {result.message}"


# -- JUnit XML -------------------------------------------------------------------------------------------------
def _testcase(subject: SubjectResult, clause: str, r: ClauseResult) -> ET.Element:
    case = ET.Element("testcase", classname=subject.name, name=clause, time="0")
    at = where(subject, clause, r)
    if at:
        case.set("file", at[0])
        case.set("line", str(at[1]))
    body = "\n".join(x for x in (_headline(subject, clause, r), r.detail) if x)
    if r.status in ("fail", "unexpected-pass"):
        ET.SubElement(case, "failure", message=_headline(subject, clause, r), type=r.status).text = body
    elif r.status == "error":
        ET.SubElement(case, "error", message=_headline(subject, clause, r), type="error").text = body
    elif r.status in ("not-judged", "not-applicable"):
        ET.SubElement(case, "skipped", message=f"{r.status}: {r.message}", type=r.status)
    elif r.status == "deviation" or r.message:
        ET.SubElement(case, "system-out").text = body
    return case


def junit(result: AuditResult) -> str:
    root = ET.Element("testsuites", name=result.command or "aiayn audit")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for s in result.subjects:
        cases = [_testcase(s, c, r) for c, r in s.clauses.items()]
        counts = {"tests": len(cases),
                  "failures": sum(r.status in ("fail", "unexpected-pass") for r in s.clauses.values()),
                  "errors": sum(r.status == "error" for r in s.clauses.values()),
                  "skipped": sum(r.status in ("not-judged", "not-applicable") for r in s.clauses.values())}
        suite = ET.SubElement(root, "testsuite", {"name": s.name, "time": f"{s.seconds:.2f}",
                                                  **{k: str(v) for k, v in counts.items()}})
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="verdict", value=s.verdict)
        ET.SubElement(props, "property", name="kind", value=s.kind)
        suite.extend(cases)
        totals = {k: totals[k] + counts[k] for k in totals}
    root.attrib.update({k: str(v) for k, v in totals.items()}, time=f"{result.seconds:.2f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# -- GitHub workflow commands ----------------------------------------------------------------------------------
def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(result: AuditResult) -> str:
    """The workflow commands, one line per finding (``report.render`` adds the summary line)."""
    lines = []
    for s in result.subjects:
        for clause, r in s.clauses.items():
            if r.status in ("fail", "error", "unexpected-pass"):
                level = "error"
            elif r.status == "deviation":
                level = "notice"
            elif r.status == "not-judged" and CLAUSES[clause].severity == "must":
                level = "warning"
            else:
                continue
            at = where(s, clause, r)
            props = ([f"file={_prop(at[0])}", f"line={at[1]}"] if at else [])
            props.append(f"title={_prop(f'{s.name} {clause} ({CLAUSES[clause].citation}): {r.status}')}")
            body = "\n".join(x for x in (_headline(s, clause, r), r.detail) if x)
            lines.append(f"::{level} {','.join(props)}::{_data(body)}")
    return "".join(ln + "\n" for ln in lines)
