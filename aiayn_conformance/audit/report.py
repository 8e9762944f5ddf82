"""Renderers of an audit: the terminal matrix, Markdown, JSON (schema 3) and a self-contained HTML page."""

from __future__ import annotations

import html
import json
import os

from aiayn_conformance.spec import AREAS, CLAUSES

from .results import AuditResult, SubjectResult

# One character per clause in the matrix, and its color (ANSI SGR).
SYMBOL = {"pass": ".", "fail": "F", "deviation": "D", "unexpected-pass": "U", "not-judged": "?",
          "not-applicable": "-", "error": "E"}
COLOR = {"pass": "32", "fail": "1;31", "deviation": "33", "unexpected-pass": "1;35", "not-judged": "1;33",
         "not-applicable": "2", "error": "1;31"}
LEGEND = (". passed  F failed  D declared deviation (failed)  U declared but not observed  ? not judged (every "
          "check skipped)  E error (not judged: the suite could not check it)  - not applicable  (blank: not run)")
AREA_CLAUSES = {a: [c for c in CLAUSES if c.split(".", 1)[0] == a] for a in AREAS}


def use_color(stream, no_color: bool = False) -> bool:
    """ANSI colors only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    if no_color or os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def _paint(text: str, code: str, color: bool) -> str:
    return f"\033[{code}m{text}\033[0m" if color and code else text


def _cells(subject: SubjectResult, area: str, color: bool) -> str:
    out = []
    for c in AREA_CLAUSES[area]:
        r = subject.clauses.get(c)
        out.append(" " if r is None else _paint(SYMBOL[r.status], COLOR[r.status], color))
    return "".join(out)


def _width(area: str) -> int:
    return max(len(area), len(AREA_CLAUSES[area]))


def failures(result: AuditResult) -> list[tuple[SubjectResult, str, str, str]]:
    """(subject, clause, status, message) for every clause that is not pass, skip or deviation."""
    return [(s, c, r.status, r.message) for s in result.subjects for c, r in s.clauses.items()
            if r.status in ("fail", "error", "unexpected-pass")]


def summary_line(result: AuditResult) -> str:
    n = len(result.subjects)
    ok = sum(s.conforming for s in result.subjects)
    bad = len(failures(result))
    unjudged = sum(bool(s.unjudged("must")) and not s.broken("must") for s in result.subjects)
    tail = f"{bad} unexpected result(s)" if bad else "no unexpected result (deviations are all declared)"
    judged = f", {unjudged} not judged (a must clause no check judged)" if unjudged else ""
    return f"{ok} of {n} conforming{judged}; {tail}; {result.seconds:.0f} s"


def not_judged(result: AuditResult) -> list[tuple[SubjectResult, str, str]]:
    """(subject, clause, reason) for every applicable must clause no check judged (errors are listed as
    failures, with their cause)."""
    return [(s, c, r.message) for s in result.subjects for c, r in s.clauses.items()
            if r.status == "not-judged" and CLAUSES[c].severity == "must"]


# -- terminal --------------------------------------------------------------------------------------------------
FINDING_FIELDS = ("measured", "expected", "call", "hint")  # the lines of a violation (conformance.helpers.harness)


def finding_fields(detail: str) -> list[tuple[str, str]]:
    """(field, value) for the measured / expected / call / hint lines of a diagnostic, in its order; a value
    continued on the following indented lines is joined to one."""
    out: list[tuple[str, str]] = []
    for raw in detail.splitlines():
        line = raw.strip()
        key, sep, value = line.partition(":")
        if sep and key in FINDING_FIELDS:
            out.append((key, value.strip()))
        elif out and raw.startswith("    ") and line:
            out[-1] = (out[-1][0], f"{out[-1][1]} {line}")
        elif out:
            break
    return out


def findings(result: AuditResult, color: bool = False) -> list[str]:
    """The terminal's Findings: each unexpected result, then what was measured and expected and the hint."""
    lines: list[str] = []
    for s, c, status, msg in failures(result):
        lines.append(f"  {_paint(status.upper(), COLOR[status], color)} {s.name} {c} ({CLAUSES[c].citation}): {msg}")
        r = s.clauses[c]
        lines += [f"      {key + ':':<9} {value}" for key, value in finding_fields(r.detail)]
    return lines


def text(result: AuditResult, color: bool = False, *, brief: bool = False) -> str:
    """The matrix, then (unless ``brief``) each unexpected result with its measured and expected values and hint;
    ``brief``: one line per unexpected result."""
    if not result.subjects:
        return "nothing audited\n"
    name_w = max(len(s.name) for s in result.subjects)
    areas = [a for a in AREAS if any(c in s.clauses for s in result.subjects for c in AREA_CLAUSES[a])]
    lines = [" " * name_w + "  " + " ".join(a.ljust(_width(a)) for a in areas) + "  verdict"]
    for s in result.subjects:
        cells = " ".join(_cells(s, a, color) + " " * (_width(a) - len(AREA_CLAUSES[a])) for a in areas)
        verdict = _paint(s.verdict, "32" if s.conforming else "31", color)
        lines.append(f"{s.name.ljust(name_w)}  {cells}  {verdict}")
    lines += ["", LEGEND]
    lines.append("columns: clauses of each area in catalogue order (`python -m aiayn_conformance.spec` lists them)")
    fails = failures(result)
    if fails and not brief:
        lines += ["", "Findings:", *findings(result, color)]
        lines.append("Re-run one with full detail: aiayn audit --impl NAME --clause ID")
    elif fails:
        lines += ["", "Unexpected results:"]
        for s, c, status, msg in fails:
            lines.append(f"  {_paint(status.upper(), COLOR[status], color)} {s.name} {c} "
                         f"({CLAUSES[c].citation}): {msg}")
        lines.append("Re-run one with full detail: aiayn audit --impl NAME --clause ID")
    unjudged = not_judged(result)
    if unjudged:
        lines += ["", "Not judged (must clauses whose every check skipped):"]
        lines += [f"  {s.name} {c} ({CLAUSES[c].citation}): {msg}" for s, c, msg in unjudged]
    devs = [(s, c) for s in result.subjects for c, r in s.clauses.items() if r.status == "deviation"]
    if devs:
        lines += ["", f"Declared deviations observed: {len(devs)} (see the md, json or html report for each)"]
    notes = [f"  {s.name}: {s.note}" for s in result.subjects if s.note]
    if notes:
        lines += ["", "Notes:", *notes]
    lines += ["", summary_line(result)]
    return "\n".join(lines) + "\n"


def clause_details(result: AuditResult, clause_ids: list[str]) -> str:
    lines = []
    for s in result.subjects:
        for c in clause_ids:
            r = s.clauses.get(c)
            head = f"{s.name} {c} ({CLAUSES[c].citation}, {CLAUSES[c].severity}): "
            if r is None:
                lines.append(head + "no check ran")
                continue
            lines.append(head + r.status.upper() + (f": {r.message}" if r.message else ""))
            if r.detail:
                lines += ["    " + ln for ln in r.detail.splitlines()]
    return "\n".join(lines) + "\n"


# -- Markdown --------------------------------------------------------------------------------------------------
def markdown(result: AuditResult) -> str:
    areas = [a for a in AREAS if any(c in s.clauses for s in result.subjects for c in AREA_CLAUSES[a])]
    out = ["# Conformance audit", "", f"`{result.command or 'aiayn audit'}`: {summary_line(result)}", "",
           "| subject | " + " | ".join(areas) + " | verdict |", "|---|" + "---|" * len(areas) + "---|"]
    for s in result.subjects:
        cells = [("`" + _cells(s, a, False).replace(" ", "\u00b7") + "`") for a in areas]
        out.append(f"| {s.name} | " + " | ".join(cells) + f" | {s.verdict} |")
    out += ["", f"Legend: `{LEGEND}` (`\u00b7`: not run). Columns hold the clauses of each area in catalogue "
            "order.", ""]
    fails = failures(result)
    out += ["## Unexpected results", ""]
    out += [f"- **{s.name}** `{c}` ({CLAUSES[c].citation}) {status}: {_md(msg)}" for s, c, status, msg in fails] \
        or ["None."]
    out += ["", "## Declared deviations", ""]
    devs = [(s, c, r) for s in result.subjects for c, r in s.clauses.items() if r.status == "deviation"]
    out += [f"- **{s.name}** `{c}` ({CLAUSES[c].citation}): {_md(r.message)}" for s, c, r in devs] or ["None."]
    unjudged = [(s, c, r) for s in result.subjects for c, r in s.clauses.items() if r.status == "not-judged"]
    if unjudged:
        out += ["", "## Not judged", "", "Every check of these clauses skipped: no finding either way.", ""]
        out += [f"- **{s.name}** `{c}` ({CLAUSES[c].severity}): {_md(r.message)}" for s, c, r in unjudged]
    na = sorted({(c, r.message) for s in result.subjects for c, r in s.clauses.items()
                 if r.status == "not-applicable"})
    if na:
        out += ["", "## Not applicable", ""] + [f"- `{c}`: {_md(m)}" for c, m in na]
    notes = [f"- **{s.name}**: {_md(s.note)}" for s in result.subjects if s.note]
    notes += [f"- **{s.name}** `{c}`: {_md(r.message)}" for s in result.subjects for c, r in s.clauses.items()
              if r.status == "pass" and r.message]
    if notes:
        out += ["", "## Notes", "", *notes]
    return "\n".join(out) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# -- JSON ------------------------------------------------------------------------------------------------------
def as_json(result: AuditResult) -> str:
    return json.dumps(result.to_json(), indent=2) + "\n"


# -- HTML ------------------------------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}
th.area{writing-mode:vertical-rl;transform:rotate(180deg);font-weight:normal}
td.pass{background:#c8e6c9}td.fail,td.error{background:#ef9a9a}td.deviation{background:#ffe082}
td.unexpected-pass{background:#ce93d8}td.not-judged{background:#fff59d}td.not-applicable{background:#eee;color:#888}td.none{background:#fff}
.ok{color:#1b5e20;font-weight:bold}.bad{color:#b71c1c;font-weight:bold}
pre{background:#f6f6f6;padding:.5em;white-space:pre-wrap;font-size:12px}
figure{display:inline-block;margin:0 1em 1em 0;vertical-align:top}figcaption{font-size:12px;max-width:520px}
"""


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)


def as_html(result: AuditResult) -> str:
    clauses = [c for c in CLAUSES if any(c in s.clauses for s in result.subjects)]
    head = "".join(f'<th class="area" title="{_e(CLAUSES[c].statement)}">{_e(c)}</th>' for c in clauses)
    rows = []
    for s in result.subjects:
        cells = []
        for c in clauses:
            r = s.clauses.get(c)
            if r is None:
                cells.append('<td class="none"></td>')
            else:
                tip = _e(f"{c}: {r.status}" + (f": {r.message}" if r.message else ""))
                cells.append(f'<td class="{r.status}" title="{tip}">{SYMBOL[r.status]}</td>')
        verdict = f'<span class="{"ok" if s.conforming else "bad"}">{_e(s.verdict)}</span>'
        rows.append(f'<tr><th><a href="#{_e(s.name)}">{_e(s.name)}</a></th>{"".join(cells)}<td>{verdict}</td></tr>')
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>aiayn conformance audit</title>", f"<style>{_CSS}</style></head><body>",
        "<h1>Conformance audit</h1>",
        f"<p><code>{_e(result.command or 'aiayn audit')}</code>: {_e(summary_line(result))}</p>",
        f'<table id="matrix"><tr><th></th>{head}<th>verdict</th></tr>{"".join(rows)}</table>',
        f"<p>{_e(LEGEND)}. Hover a cell for its message.</p>",
    ]
    for s in result.subjects:
        parts.append(f'<section id="{_e(s.name)}"><h2>{_e(s.name)}: {_e(s.verdict)}</h2>')
        if s.summary or s.source:
            parts.append(f"<p>{_e(s.summary)} <small>{_e(s.source)}</small></p>")
        if s.note:
            parts.append(f"<p><small>{_e(s.note)}</small></p>")
        notable = [(c, r) for c, r in s.clauses.items() if r.status != "pass" or r.message]
        if notable:
            parts.append("<ul>")
            for c, r in notable:
                parts.append(f"<li><b>{_e(c)}</b> ({_e(CLAUSES[c].citation)}, {_e(CLAUSES[c].severity)}): "
                             f"{_e(r.status)}: {_e(r.message)}")
                if r.detail and r.status in ("fail", "error", "deviation"):
                    parts.append(f"<pre>{_e(r.detail)}</pre>")
                parts.append("</li>")
            parts.append("</ul>")
        for title, png in s.figures.items():
            parts.append(f'<figure><img alt="{_e(title)}" src="data:image/png;base64,{png}">'
                         f"<figcaption>{_e(title)}</figcaption></figure>")
        for err in s.figure_errors:
            parts.append(f"<p><small>figure not drawn: {_e(err)}</small></p>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


FORMATS = ("text", "md", "json", "html", "junit", "github")


def render(result: AuditResult, fmt: str, *, color: bool = False, brief: bool = False) -> str:
    """The report in format ``fmt``; ``brief`` shortens the text format's findings to one line each."""
    if fmt == "text":
        return text(result, color, brief=brief)
    if fmt == "md":
        return markdown(result)
    if fmt == "json":
        return as_json(result)
    if fmt == "html":
        return as_html(result)
    if fmt in ("junit", "github"):
        from .ci_report import github_annotations, junit

        return junit(result) if fmt == "junit" else github_annotations(result) + summary_line(result) + "\n"
    raise ValueError(f"unknown report format {fmt!r}; accepted: {', '.join(FORMATS)}")
