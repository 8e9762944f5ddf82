"""``aiayn scaffold MODULE:NAME``: write a starting plugin for a Transformer of one's own.

    aiayn scaffold my_package.model:Transformer -o my_plugin.py
    aiayn scaffold path/to/models.py:Seq2Seq --name my-seq2seq > my_plugin.py
    aiayn scaffold path/to/tutorial.ipynb:make_model -o my_plugin.py

The plugin's adapter builds NAME (an ``nn.Module`` class or a factory function) and maps every canonical parameter
to one of the model's in ``load_reference_state``; a line the scaffold could not decide is marked ``# CHECK:``
with the reason, one it could not place fails in one line naming it. Bad input is one line, exit 2.

One record flows through the stages, each module reading only the modules above it:

    errors.py          the one-line error every stage raises
    naming.py          tables: the words in parameter paths that tell embeddings, projections and norms apart
    synonyms.py        tables: constructor argument names and the ModelConfig field each means
    runtime.py         what a written plugin calls when it runs: options objects, vocabularies
    notebook.py        a notebook's code cells as a module (for target.py, and for a written plugin)
    target.py          stage 1: MODULE:NAME imported -> Loaded
    calls.py           the constructor call the plugin writes: generated code and nested calls
    options.py         the options object or config dict a builder reads, learned by building it (for construct.py)
    vocab.py           vocabulary objects of the ModelConfig's sizes, for builders taking them (for construct.py)
    construct.py       stage 2: the constructor calls worth trying, and the one that builds -> Built
    masks.py           the mask convention of a forward that takes masks (for probe.py)
    positions.py       the positional table: a sinusoid buffer or learned tables (for probe.py)
    initialisation.py  the repository's own initialisation, read from the code next to the class (for probe.py)
    probe.py           stage 3: the built model called once: forward call, output kind, sizes it ignores -> Probed
    norms.py           which sub-layer each layer norm serves, read from the values a run of the layer computes
    layer.py           one layer's template: projections, feed-forward network, norms (for proposal.py)
    proposal.py        stage 4: where each canonical parameter goes, and how encode() reads -> Proposed
    render.py          stage 5: the plugin file's text
    proof.py           stage 6: the written plugin run against the reference; the final text -> Scaffold
    __init__.py        scaffold(): the stages in order, and the sub-command
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from .construct import PROBE, Constructor, build, build_with_config
from .errors import ScaffoldError
from .probe import probe
from .proof import Scaffold, prove
from .proposal import Line, Proposal, propose
from .target import load_class, load_target

__all__ = ["ScaffoldError", "Scaffold", "add_parser", "load_class", "build_with_config", "propose", "render", "run",
           "scaffold", "PROBE", "Constructor", "Line", "Proposal"]


def scaffold(target: str, name: str | None = None) -> Scaffold:
    """The scaffold of ``MODULE:NAME``: imported, built with PROBE, probed, its mapping proposed and proved."""
    return prove(propose(probe(build(load_target(target, name)))))


def render(result: Scaffold) -> str:
    """The plugin file's text."""
    return result.text


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
    text, checks = result.text, result.checks
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
