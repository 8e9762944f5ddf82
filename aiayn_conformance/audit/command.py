"""``aiayn audit``: the conformance matrix across implementations and components.

The conformance suite runs in subprocesses, ``--results-json`` giving one record per
test and subject: by default one process per job slot (``--jobs``, default the number of
CPUs), each auditing a share of the implementations (and the components), so that the
start-up is paid once per core; ``--isolate`` gives every implementation its own process,
and a grouped process that dies is re-run one implementation at a time. Job slots left over (one
implementation on several CPUs) split each process's test files over pytest-xdist workers where the
memory holds them at the audit's sizes. The records are
folded into one status per (subject, clause):

``pass``             a check judged the clause and every check that ran passed;
``fail``             a check found a violation the implementation does not declare;
``deviation``        a declared deviation, observed;
``unexpected-pass``  declared as a deviation, but no check observed it;
``not-judged``       every check skipped (each reason listed: no GPU, no ``encode`` ...): no finding;
``not-applicable``   every check said the clause does not apply (no decoding method, no recipe method);
``error``            not judged: the implementation crashed, returned NaN or the wrong shape, or timed out,
                     or the check failed to run; never a departure.

A subject is *conforming* when every applicable ``must`` clause was judged and none is ``fail``
or ``deviation``: it computes the paper's function. ``should`` clauses (inputs the paper never
defines, portability, conventions) are counted in the verdict but do not decide it. Exit status,
whatever the severity: 0 when every failure is a declared deviation, 1 when any clause is
``fail``, ``error`` or ``unexpected-pass``, 2 for usage errors and for a suite run that could not
audit at all (one line with its cause).

Beyond one machine: ``--shard I/N`` audits the subjects of one shard (``aiayn_conformance.audit.shards``),
``--merge FILE ...`` renders one report from JSON audits made elsewhere (``aiayn_conformance.audit.merge``),
and ``--format junit|github`` reports each finding on the subject's own source line
(``aiayn_conformance.audit.ci_report``); docs/ci.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from aiayn_conformance.implementations import PluginError, UnknownNameError, get_registry
from aiayn_conformance.spec.clauses import parse_clause_ids
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import parameter_count

from . import report
from .merge import MergeError, merge_files
from .results import AuditResult
from .runner import Progress, audit, plan, run_job, take_shard
from .shards import Shard, parse_shard

__all__ = ["add_parser", "run"]


# -- the command ---------------------------------------------------------------------------------------------
def add_parser(sub) -> None:
    p = sub.add_parser("audit", help="run the conformance suite and print the conformance matrix",
                       description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--impl", default=None, help="implementations: a name, a comma-separated list, or 'all' "
                   "(default: all, plus every component unless --component is given)")
    p.add_argument("--component", default=None, help="components: 'all', NAME, KIND:NAME or a comma-separated list "
                   "(default: all when --impl is not given)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_PATH",
                   help="load an extra plugin from a module name or a .py file (repeatable)")
    p.add_argument("--clause", default=None, metavar="ID",
                   help="re-run only this clause (comma-separated ids allowed) and show its full diagnostics")
    p.add_argument("--config", default=None, metavar="SPEC",
                   help="audit at these sizes: a Table 3 preset (base, big, tiny) optionally followed by pairs "
                        "(base,N=2), key=value pairs (d_model=64,h=4,src_vocab=40; keys: ModelConfig's fields, h "
                        "and N), a .json or .toml file, or a Hugging Face config.json or model directory")
    p.add_argument("--weights", default=None, metavar="PATH",
                   help="audit one implementation (--impl) holding these trained weights: a torch state_dict "
                        "(.pt/.pth), a .safetensors file or a Hugging Face model directory; sizes from --config, "
                        "else the directory's config.json; checks that need the suite's own weights are skipped")
    p.add_argument("--device", default="cpu", metavar="DEVICE",
                   help="where the models the checks build run: cpu (default), cuda or cuda:N (the suite's --device)")
    p.add_argument("--format", choices=report.FORMATS, default="text",
                   help="report format (default: text, the colored matrix; junit: JUnit XML, github: GitHub "
                        "annotations on the adapter's lines)")
    p.add_argument("--brief", action="store_true",
                   help="text format: one line per unexpected result, without its measured and expected values "
                        "and hint")
    p.add_argument("--output", "-o", default=None, metavar="PATH", help="write the report here instead of stdout")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1,
                   help="suite processes in parallel (default: the number of CPUs); slots left over by fewer "
                        "implementations split each one's test files over pytest-xdist workers from 5M parameters, "
                        "as far as the available memory holds them")
    p.add_argument("--timeout", type=float, default=1800.0, metavar="SECONDS",
                   help="wall-time limit per implementation's suite run (default 1800)")
    p.add_argument("--isolate", action="store_true",
                   help="one suite process per implementation (default: one per job slot, the start-up paid once; "
                        "a grouped run that dies is re-run one implementation at a time anyway)")
    p.add_argument("--no-color", action="store_true", help="no ANSI colors (also: the NO_COLOR variable)")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="audit only shard I of N (I from 1): each subject belongs to one shard, by a hash of its "
                        "name; merge the shards' JSON reports with --merge")
    p.add_argument("--merge", nargs="+", default=None, metavar="AUDIT_JSON",
                   help="run nothing: build the report from these audits (--format json files, schema 3)")
    p.add_argument("--figures", action="store_true",
                   help="draw the HTML report's pictures into a json report too, so a --merge can show them")
    p.set_defaults(func=run)


def _usage(msg: str) -> int:
    print(f"aiayn audit: {msg}", file=sys.stderr)
    return 2


def _check_output(path: str | None) -> str:
    """Why ``--output`` cannot be written ("" when it can): refused before a long audit, not after it."""
    if not path:
        return ""
    target = Path(path)
    if target.is_dir():
        return f"--output {path}: is a directory; give a file path"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    except OSError as exc:
        return f"--output {path}: cannot write there ({exc.strerror or exc})"
    return ""


def _absolute_plugin(spec: str) -> str:
    """A plugin given as a file path, made absolute against the caller's directory (a module name is kept: the
    suite runs with the caller's directory on its path)."""
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        return str(Path(spec).expanduser().resolve())
    return spec


def _emit(result: AuditResult, args: argparse.Namespace, *, clause_ids: Sequence[str] = ()) -> int:
    result.command = " ".join(["aiayn", "audit", *(sys.argv[2:] if sys.argv[1:2] == ["audit"] else [])])
    color = report.use_color(sys.stdout, args.no_color) and args.output is None
    text = report.render(result, args.format, color=color, brief=args.brief)
    if args.output:
        Path(args.output).write_text(text)
        print(f"aiayn audit: {args.format} report written to {args.output}", file=sys.stderr)
        print(report.summary_line(result), file=sys.stderr)
    elif not (clause_ids and args.format == "text"):
        sys.stdout.write(text)
    return result.exit_code


def _audit_configuration(args: argparse.Namespace, registry,
                         impl_sel: str | None) -> tuple[str, str, ModelConfig]:
    """(why --config / --weights cannot be used, "" when they can; what the audit runs at, "" for the suite's
    own; the configuration): checked here, before the suite runs, as the suite's plugin checks them again
    (conformance.helpers.user_config, conformance.helpers.user_weights)."""
    from aiayn_conformance.spec.config import TINY as CONFIG

    if not args.config and not args.weights:
        return "", "", CONFIG
    from aiayn_conformance.conformance.helpers.user_config import ConfigError
    from aiayn_conformance.conformance.helpers.user_weights import WeightsError, fit_problem, resolve

    if args.weights and (args.impl is None or args.component is not None):
        return "--weights audits one implementation: give --impl NAME (and no --component)", "", CONFIG
    try:
        impls = registry.select(impl_sel) if args.weights else None
        config, weights, sizes = resolve(args.config, args.weights, CONFIG, impls)
    except (ConfigError, WeightsError, UnknownNameError) as exc:
        return str(exc), "", CONFIG
    config = config or CONFIG
    at = f"audit configuration (sizes from {sizes}): {config}"
    if weights is None:
        return "", at, config
    described = f" ({weights.describes})" if weights.describes else ""
    return fit_problem(impls or [], config, weights), f"{at}; weights: {weights.path}{described}", config


def _merge(args: argparse.Namespace) -> int:
    given = [opt for opt, value in (("--impl", args.impl), ("--component", args.component),
                                    ("--clause", args.clause), ("--shard", args.shard), ("--config", args.config),
                                    ("--weights", args.weights)) if value]
    if given:
        return _usage(f"--merge reads audits and runs none; {', '.join(given)} cannot be given with it")
    if why := _check_output(args.output):
        return _usage(why)
    try:
        registry = get_registry(args.plugin)  # only for the order of the rows: the registry's, as an audit's
        order = [*registry.implementations, *(f"{k}:{n}" for k, n in registry.components)]
        result, notes = merge_files(args.merge, order)
    except (PluginError, MergeError) as exc:
        return _usage(str(exc))
    for note in notes:
        print(f"aiayn audit: {note}", file=sys.stderr)
    if args.format == "html":
        _figures_from_data(result)
    return _emit(result, args)


def _figures_from_data(result: AuditResult) -> None:
    """The pictures a merged HTML report can have: those the audits carried (--figures), and the learning
    curves, drawn from the records' data; measuring an implementation again is the audit's job."""
    for s in result.subjects:
        if s.kind != "implementation" or s.unavailable or s.figures:
            continue
        s.figure_errors.append("the merged audit file carries no pictures of this implementation "
                               "(audit it with --figures, or with --format html)")
        if s.learning_curves:
            try:
                from .figures import learning_curves_figure

                s.figures.update(learning_curves_figure(s.name, s.learning_curves))
            except Exception as exc:  # a picture lost, never the report
                s.figure_errors.append(f"learning curves: {type(exc).__name__}: {exc}")


def run(args: argparse.Namespace) -> int:
    if args.merge:
        return _merge(args)
    if args.jobs < 1:
        return _usage(f"--jobs must be at least 1, got {args.jobs}")
    if args.timeout <= 0:
        return _usage(f"--timeout must be positive, got {args.timeout}")
    clause_ids: list[str] = []
    shard: Shard | None = None
    try:
        if args.clause:
            clause_ids = parse_clause_ids(args.clause)
        if args.shard is not None:
            shard = parse_shard(args.shard)
    except ValueError as exc:
        return _usage(str(exc))
    impl_sel = args.impl if args.impl is not None else ("all" if args.component is None else None)
    comp_sel = args.component if args.component is not None else ("all" if args.impl is None else None)
    try:
        registry = get_registry(args.plugin)
        jobs = plan(registry, impl_sel, comp_sel)
    except (PluginError, UnknownNameError) as exc:  # an unknown name, or a --plugin that cannot be loaded
        return _usage(str(exc))
    for err in registry.errors:
        print(f"aiayn audit: plugin error: {err}", file=sys.stderr)
    if not jobs:
        return _usage("nothing to audit: no implementation or component selected")
    if why := _check_output(args.output):
        return _usage(why)
    if shard is not None:
        selected = sum(len(j.subjects) for j in jobs)
        jobs = take_shard(jobs, shard)
        held = sum(len(j.subjects) for j in jobs)
        print(f"aiayn audit: shard {shard} holds {held} of the {selected} subjects selected", file=sys.stderr)
    extra = [f"--clause={','.join(clause_ids)}"] if clause_ids else []
    if args.device != "cpu":
        from aiayn_conformance.conformance.helpers.devices import device_problem

        if why := device_problem(args.device):
            return _usage(why)
        extra.append(f"--device={args.device}")
    why, at, config = _audit_configuration(args, registry, impl_sel)
    if why:
        return _usage(why)
    # Files named relative to here: the suite runs in another directory.
    args.plugin = [_absolute_plugin(p) for p in args.plugin]
    extra += [f"--{opt}={Path(value).expanduser().resolve() if Path(value).expanduser().exists() else value}"
              for opt, value in (("config", args.config), ("weights", args.weights)) if value]
    progress = Progress()
    if at:
        progress.log(f"aiayn audit: {at}")
    with_figures = args.format == "html" or args.figures
    if clause_ids and args.format == "text" and args.output is None:
        # Debugging one clause: the suite's own verbose output on the terminal, then the folded statuses.
        extra += ["-v", "-rfEsxX", "--tb=short"]
        result = AuditResult([], 0.0)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="aiayn-audit-") as tmp:
            for job in jobs:
                if job.runnable:
                    run_job(job, plugins=args.plugin, extra=extra, workdir=Path(tmp), timeout=args.timeout,
                            progress=Progress(enabled=False), stream_output=True)
                result.subjects += job.subjects
        result.seconds = time.monotonic() - started
        print(report.clause_details(result, clause_ids))
    else:
        n_impl = sum(s.kind == "implementation" for j in jobs for s in j.subjects)
        n_comp = sum(s.kind == "component" for j in jobs for s in j.subjects)
        progress.log(f"aiayn audit: {n_impl} implementation(s), {n_comp} component(s); "
                     f"{min(args.jobs, len(jobs))} suite process(es) at a time")
        result = audit(jobs, plugins=args.plugin, extra=extra, jobs_n=args.jobs, timeout=args.timeout,
                       progress=progress, with_figures=with_figures, isolate=args.isolate,
                       parameters=parameter_count(config))
    result.shard = str(shard) if shard else ""
    failed = [s for s in result.subjects if s.could_not_audit]
    if failed:  # no check ran: a usage problem, not a finding
        others = f" (and {len(failed) - 1} other subject(s) likewise)" if len(failed) > 1 else ""
        print(f"aiayn audit: could not audit {failed[0].name}: {failed[0].could_not_audit}{others}", file=sys.stderr)
        if args.output and Path(args.output).is_file() and not Path(args.output).stat().st_size:
            Path(args.output).unlink()  # touched by _check_output: no report is written
        return 2
    return _emit(result, args, clause_ids=clause_ids)
