"""``python -m spec``: print the clause catalogue and the tolerance policy as Markdown (docs/clauses.md)."""

from __future__ import annotations

from . import AREAS, CLAUSES, ELEMENTWISE, MODEL, PAPER, SPEC_VERSION


def catalogue_markdown() -> str:
    lines = [
        "# The clause catalogue",
        "",
        f"Spec version {SPEC_VERSION}, following {PAPER}. Generated from `spec/clauses.py` by `python -m spec`; "
        "a test keeps this file in sync.",
        "",
        "Severities: `must`: the paper states it, and breaking it computes another function; an implementation "
        "that breaks a `must` clause is nonconforming. `should`: the paper is silent (inputs it never defines, "
        "portability, conventions); reported, but never makes an implementation that computes the paper's "
        "function nonconforming. `info`: recorded only. Each clause says why it has its severity.",
        "",
    ]
    for area in AREAS:
        lines += [f"## {area}", "", "| id | section | severity | statement | why this severity |",
                  "|---|---|---|---|---|"]
        for clause in CLAUSES.values():
            if clause.area == area:
                lines.append(f"| `{clause.id}` | {clause.citation} | {clause.severity} | {clause.statement} "
                             f"| {clause.severity_reason} |")
        lines.append("")
    lines += ["## Tolerance policy (`spec/tolerance.py`)", "",
              "A value passes when `|actual - expected| <= atol + rtol * |expected|`; messages report the largest "
              "difference and its index.", "", "| dtype | element-wise rtol | atol | whole model rtol | atol |",
              "|---|---|---|---|---|"]
    for dtype, tol in ELEMENTWISE.items():
        m = MODEL[dtype]
        lines.append(f"| {str(dtype).replace('torch.', '')} | {tol.rtol:g} | {tol.atol:g} | {m.rtol:g} | {m.atol:g} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(catalogue_markdown(), end="")
