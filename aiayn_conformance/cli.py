"""``aiayn``: list implementations, audit them, export them, train one, scaffold a plugin for your own, install the
toolkits the built-ins wrap.

Exit codes: 0 success, 1 a check or command failed, 2 a usage error.
Each sub-command lives in its own module with ``add_parser(subparsers)``
that sets ``func`` (``args -> exit code``).
"""

from __future__ import annotations

import argparse
import json
import sys

from aiayn_conformance.implementations import PluginError, get_registry
from aiayn_conformance.implementations.availability import version_note

from . import commands


def _list(args: argparse.Namespace) -> int:
    try:
        registry = get_registry(args.plugin or ())
    except PluginError as exc:  # an explicit --plugin that cannot be loaded is a usage error
        print(f"aiayn list: {exc}", file=sys.stderr)
        return 2
    impls = list(registry.implementations.values())
    comps = list(registry.components.values())
    if args.json:
        payload = {
            "implementations": [
                {"name": i.name, "summary": i.summary, "source": i.source, "output": i.output,
                 "plugin": i.plugin, "deviations": dict(i.deviations), "available": not i.unavailable,
                 "unavailable": i.unavailable, "written_for": i.written_for,
                 "version_note": version_note(i.written_for)} for i in impls],
            "components": [
                {"kind": c.kind, "name": c.name, "summary": c.summary, "source": c.source,
                 "plugin": c.plugin, "deviations": dict(c.deviations)} for c in comps],
            "errors": registry.errors,
        }
        print(json.dumps(payload, indent=2))
    else:
        width = max([len(i.name) for i in impls] + [4])
        missing = [i for i in impls if i.unavailable]
        print(f"{len(impls)} implementation(s)" + (f", {len(missing)} unavailable here:" if missing else ":"))
        for i in impls:
            dev = f" [declares {len(i.deviations)} deviation(s)]" if i.deviations else ""
            print(f"  {i.name:<{width}}  {i.summary}{dev}")
            if i.source:
                print(f"  {'':<{width}}  source: {i.source}")
            if i.unavailable:
                print(f"  {'':<{width}}  UNAVAILABLE: {i.unavailable}")
            elif version_note(i.written_for):
                print(f"  {'':<{width}}  note: {version_note(i.written_for)}")
        if comps:
            cwidth = max(len(f"{c.kind}:{c.name}") for c in comps)
            print(f"{len(comps)} component(s):")
            for c in comps:
                print(f"  {c.kind + ':' + c.name:<{cwidth}}  {c.summary}")
    for err in registry.errors:
        print(f"aiayn: plugin error: {err}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiayn", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("list", help="list registered implementations and components")
    p.add_argument("--plugin", action="append", metavar="MODULE_OR_PATH", help="load an extra plugin (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_list)
    for module in commands.MODULES:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("aiayn: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
