"""``aiayn audit``: run the conformance suite on registered implementations."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("audit", help="run the conformance suite on implementations")
    p.add_argument("--impl", default="all", help="a name, a comma-separated list, or 'all' (default)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_PATH",
                   help="load an extra plugin (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import conformance
    from implementations import UnknownImplementationError, get_registry

    try:
        get_registry(args.plugin).select(args.impl)
    except UnknownImplementationError as exc:
        print(f"aiayn audit: {exc}", file=sys.stderr)
        return 2
    suite = Path(conformance.__file__).resolve().parent
    cmd = [sys.executable, "-m", "pytest", str(suite), f"--impl={args.impl}", "-q", "-p", "no:cacheprovider"]
    cmd += [f"--plugin={p}" for p in args.plugin]
    return 0 if subprocess.call(cmd) == 0 else 1
