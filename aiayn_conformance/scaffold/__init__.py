"""``aiayn scaffold MODULE:NAME``: write a starting plugin for a Transformer of one's own.

    aiayn scaffold my_package.model:Transformer -o my_plugin.py
    aiayn scaffold path/to/models.py:Seq2Seq --name my-seq2seq > my_plugin.py
    aiayn scaffold path/to/tutorial.ipynb:make_model -o my_plugin.py

The scaffold imports ``MODULE`` (a dotted module name, a ``.py`` file, or a ``.ipynb`` notebook's code cells
without those that train, download or run shell commands), builds ``NAME`` (an ``nn.Module`` class or a factory
function) with a small ``ModelConfig`` (``NAME(config)``, a library config object built from it, or keyword
arguments matched to the constructor's parameter names, with built sub-modules for parameters that take one), and
writes a plugin (docs/plugins.md): an adapter whose ``load_reference_state`` maps every canonical parameter
(``spec.schema.parameter_schema``) to one of the model's, proposed from the parameter names, shapes and
registration order, with ``zero=`` for the biases the paper lacks and ``one=`` for the norms it lacks. Every
line it could not decide from a name is marked ``# CHECK:`` with the reason; a canonical parameter it found no
home for gets a target that fails in one line naming it, so the plugin cannot load silently wrong.

Errors are one line (exit 2): a module that cannot be imported, a name that is not an ``nn.Module`` class or a
function returning one, a notebook whose kept cells do not run (naming the cell), a target that cannot be built
with a ``ModelConfig`` (naming each constructor call tried).

The work is split by job, each module feeding the next:

    naming.py    the naming conventions read in parameter paths: tables only
    synonyms.py  constructor argument names and the ModelConfig field each means: tables only
    target.py    ``MODULE:NAME`` imported, and the import lines the plugin carries (notebook.py: a notebook's cells)
    construct.py the constructor calls worth trying (sub-modules, library configs), and the one that builds
    probe.py     the model built with a small ``ModelConfig``, and its forward call, output kind, positional table
    proposal.py  where each canonical parameter goes, and which lines are uncertain (layer.py: one layer's template)
    render.py    the plugin file's text
    this module  :func:`scaffold` (the steps in order) and the ``aiayn scaffold`` sub-command
    errors.py    the one-line error every step raises
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

from torch import nn

from .finish import finish
from .masks import find_convention
from .probe import PROBE, Constructor, build_with_config, encode_call, positional_table, probe_forward
from .proposal import Line, Proposal, propose
from .render import Scaffold, render
from .target import Loaded, ScaffoldError, load_class, load_target

__all__ = ["ScaffoldError", "Scaffold", "add_parser", "load_class", "build_with_config", "propose", "render", "run",
           "scaffold", "PROBE", "Constructor", "Line", "Proposal"]


def scaffold(target: str, name: str | None = None) -> Scaffold:
    """The scaffold of ``MODULE:NAME``: imported, built with PROBE, probed, its mapping proposed."""
    loaded = load_target(target)
    model, ctor = _built(loaded)
    proposal = propose(model, PROBE)
    found = find_convention(model, PROBE)
    forward = probe_forward(model, PROBE, (found.lines, found.call) if found else None)
    slug = re.sub(r"[^a-z0-9]+", "-", (name or loaded.obj.__name__).lower()).strip("-") or "my-transformer"
    base = Scaffold(loaded.obj, loaded.where, loaded.import_line(ctor.callables()), ctor, proposal, slug,
                    forward.body, forward.check, forward.output, forward.output_check, encode_call(type(model)),
                    positional_table(model, PROBE), notes=loaded.notes)
    return finish(base, model, found)


def _built(loaded: Loaded) -> tuple[nn.Module, Constructor]:
    """The target built with PROBE; a function that builds nothing is named as one."""
    try:
        return build_with_config(loaded.obj, PROBE)
    except ScaffoldError as exc:
        if inspect.isclass(loaded.obj):
            raise
        raise ScaffoldError(f"{loaded.where} is a function, not a torch.nn.Module class, and no call of it as a "
                            f"factory returned a module: {exc}") from None


# -- the command ------------------------------------------------------------------------------------------------
def add_parser(sub) -> None:
    p = sub.add_parser("scaffold", help="write a starting plugin for your own Transformer class",
                       description=__doc__.split("\n\n", 1)[0])
    p.add_argument("target", metavar="MODULE:NAME", help="the model: a dotted module, a .py file or a .ipynb "
                   "notebook, a colon, and an nn.Module class or a function that returns one")
    p.add_argument("--name", default=None, help="the implementation's name for --impl (default: from the class)")
    p.add_argument("--output", "-o", default=None, metavar="PATH", help="write the plugin here (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, stdout: Callable[[str], object] | None = None) -> int:
    try:
        result = scaffold(args.target, args.name)
    except ScaffoldError as exc:
        print(f"aiayn scaffold: {exc}", file=sys.stderr)
        return 2
    for note in result.notes:
        print(f"aiayn scaffold: {note}", file=sys.stderr)
    text = render(result)
    checks = text.count("# CHECK:")
    if args.output:
        path = Path(args.output)
        if path.exists() and not args.force:
            print(f"aiayn scaffold: {path} exists; pass --force to overwrite it", file=sys.stderr)
            return 2
        path.write_text(text)
        print(f"aiayn scaffold: wrote {path} ({checks} line(s) marked # CHECK: to review); then run "
              f"python3 -m pytest conformance/ --plugin={path} --impl={result.name}", file=sys.stderr)
    else:
        (stdout or sys.stdout.write)(text)
        print(f"aiayn scaffold: {checks} line(s) marked # CHECK: to review", file=sys.stderr)
    return 0
