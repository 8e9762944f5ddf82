"""``aiayn export``: write an implementation for a runtime (a target of ``export.TARGETS``), optionally verified by it.

    aiayn export --impl reference --preset base --out model.onnx [--verify]
    aiayn export --impl reference --preset tiny --generation --out-dir onnx/ [--verify]             (KV cache)
    aiayn export --impl reference --preset tiny --generation --no-cache --out-dir onnx/ [--verify]  (full prefix)
    aiayn export --format ctranslate2 --impl reference --preset tiny --out-dir ct2/ [--verify]

The ``--format`` choices and the options after the command's own come from the table of targets; a target adds
its options to the parser (docs/export.md, "Adding a target").
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from aiayn_conformance.implementations import PluginError, UnknownNameError, get_registry
from aiayn_conformance.spec import preset


def targets() -> tuple[dict[str, Any], str]:
    """(``export.TARGETS``, "") or, when the export package cannot be imported here ({}, why not, in one line)."""
    try:
        from aiayn_conformance.export import TARGETS
    except ImportError as exc:  # numpy and the runtimes come with the extras
        return {}, f"the export extras are not installed ({exc}); pip install 'aiayn-conformance[onnx]'"
    return dict(TARGETS), ""


def add_parser(sub) -> None:
    table, _ = targets()
    names = list(table) or ["onnx"]
    p = sub.add_parser("export", help=f"export an implementation for a runtime ({', '.join(names)}) and verify it",
                       description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="reference", help="a registered implementation (default: reference)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_PATH", help="load an extra plugin")
    p.add_argument("--preset", default="base", help="configuration preset: base, big or tiny (default: base)")
    p.add_argument("--format", default=names[0], metavar="{" + ",".join(names) + "}",
                   help="the export target (default: %(default)s): "
                        + "; ".join(f"{name}: {target.description}" for name, target in table.items()))
    p.add_argument("--out-dir", default=None, help="output folder, for what is written as several files")
    p.add_argument("--verify", action="store_true",
                   help="run the target's runtime against PyTorch on what was written (what each target compares: "
                        "docs/export.md)")
    owners: list[tuple[str, str, str, Any]] = []  # (target, option dest, its first flag, its default)
    for name, target in table.items():
        group = p.add_argument_group(f"--format {name}")
        before = len(p._actions)
        target.add_options(group)
        owners += [(name, a.dest, a.option_strings[0], a.default) for a in p._actions[before:] if a.option_strings]
    p.set_defaults(func=run, target_options=owners)


def _say(message: str) -> None:
    print(f"aiayn export: {message}", file=sys.stderr, flush=True)


def _print_checks(checks) -> bool:
    ok = True
    for check in checks:
        print(("verified: " if check.ok else "MISMATCH: ") + check.describe(), flush=True)
        ok = ok and check.ok
    return ok


def usage_error(args: argparse.Namespace, table: dict[str, Any], unreadable: str = "") -> str:
    """The one-line usage error of ``args`` ("" when none): an unknown target, an option of another target given,
    or what the chosen target refuses."""
    if args.format not in table:
        return f"unknown export target {args.format!r}; known: {', '.join(table) or 'none: ' + unreadable}"
    foreign = [(owner, flag) for owner, dest, flag, default in args.target_options
               if owner != args.format and getattr(args, dest) != default]
    if foreign:
        return (f"--format {args.format} does not take {', '.join(flag for _, flag in foreign)} "
                f"(options of --format {', '.join(sorted({owner for owner, _ in foreign}))})")
    return table[args.format].usage(args)


def run(args: argparse.Namespace) -> int:
    table, unreadable = targets()
    problem = usage_error(args, table, unreadable)
    if problem:
        _say(problem)
        return 2
    try:
        config = preset(args.preset)
        impl = get_registry(args.plugin).get(args.impl)
    except (ValueError, PluginError, UnknownNameError) as exc:
        _say(str(exc))
        return 2
    if impl.unavailable:
        _say(f"{impl.name} is unavailable here: {impl.unavailable}")
        return 2
    target = table[args.format]
    missing = target.missing()
    if missing:
        _say(missing)
        return 2
    from aiayn_conformance.export import ExportError, resolve_model

    started = time.perf_counter()
    try:
        model, output = resolve_model(impl, config)
        print(f"wrote {target.export(model, output, config, args, _say)}", flush=True)
        if args.verify and not _print_checks(target.verify(model, output, config, args, _say)):
            return 1
    except ExportError as exc:
        _say(str(exc))
        return 1
    _say(f"done in {time.perf_counter() - started:.1f} s")
    return 0
