"""``aiayn install``: install the library an implementation wraps, with the command its plugin documents.

    aiayn install opennmt-py        # OpenNMT-py beside this project's torch (its own pins would replace it)
    aiayn install all               # every implementation listed as unavailable that says how to install it
    aiayn install all --dry-run     # print the commands only

Each command is the plugin's ``install`` (``aiayn list`` shows it while the implementation is unavailable), run
with this interpreter's pip. Exit status: 0 when every command succeeded (or nothing was missing), 1 when one
failed, 2 for usage errors (an unknown name, an implementation that documents no install command).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("install", help="install the libraries registered implementations wrap (the toolkits), "
                                       "beside this project's torch", description=__doc__.split("\n\n", 1)[0])
    p.add_argument("names", nargs="*", default=["all"], metavar="NAME",
                   help="implementations to install, or 'all' (default): those unavailable here")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_PATH", help="load an extra plugin")
    p.add_argument("--dry-run", action="store_true", help="print the commands without running them")
    p.set_defaults(func=run)


def _say(message: str) -> None:
    print(f"aiayn install: {message}", file=sys.stderr, flush=True)


ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def steps(command: str) -> list[tuple[dict[str, str], list[str]]]:
    """``(environment, argv)`` of each ``&&``-joined step of ``command``: leading ``VAR=value`` words are set in the
    step's environment, as a shell would (``READTHEDOCS=1 pip install ...``), and ``pip`` runs as this interpreter's
    ``-m pip``."""
    out = []
    for part in command.split("&&"):
        argv = shlex.split(part)
        env: dict[str, str] = {}
        while argv and ASSIGNMENT.match(argv[0]):
            name, value = argv.pop(0).split("=", 1)
            env[name] = value
        if env and not argv:
            raise ValueError(f"`{part.strip()}` sets {', '.join(env)} but runs nothing; accepted: VAR=value before "
                             "a command")
        if argv[:1] in (["pip"], ["pip3"]):
            argv = [sys.executable, "-m", "pip", *argv[1:]]
        elif argv[:3] in (["python3", "-m", "pip"], ["python", "-m", "pip"]):
            argv = [sys.executable, *argv[1:]]
        if argv:
            out.append((env, argv))
    return out


def run(args: argparse.Namespace) -> int:
    from aiayn_conformance.implementations import PluginError, UnknownNameError, get_registry

    try:
        registry = get_registry(args.plugin)
        if args.names == ["all"]:
            chosen = [i for i in registry.implementations.values() if i.unavailable and i.install]
        else:
            chosen = [registry.get(name) for name in args.names]
    except (PluginError, UnknownNameError) as exc:
        _say(str(exc))
        return 2
    silent = [i.name for i in chosen if not i.install]
    if silent:
        _say(f"{', '.join(silent)} documents no install command (an implementation of this project, or a plugin "
             "without `install`); accepted: implementations whose plugin sets Implementation(install=...)")
        return 2
    commands = list(dict.fromkeys(i.install for i in chosen if i.unavailable or args.names != ["all"]))
    if not commands:
        _say("nothing to install: every implementation is available")
        return 0
    for command in commands:
        names = ", ".join(i.name for i in chosen if i.install == command)
        _say(f"{names}: {command}")
        try:
            parsed = steps(command)
        except ValueError as exc:
            _say(f"{names}: {exc}")
            return 2
        if args.dry_run:
            continue
        for env, argv in parsed:
            result = subprocess.run(argv, env={**os.environ, **env} if env else None)
            if result.returncode != 0:
                shown = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(argv)])
                _say(f"{names}: `{shown}` failed with exit status {result.returncode}")
                return 1
    return 0
