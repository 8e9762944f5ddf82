"""``aiayn train``: watch an implementation learn a tiny task, with a progress bar and a plot of its curves.

    aiayn train --impl reference --task copy
    aiayn train --impl NAME --task reverse --steps 300 --seed 1 --plot curves.png
    aiayn train --impl NAME --recipe reference     # the paper's recipe even where NAME exposes its own
    aiayn train --impl reference --config base,src_vocab=37 --steps 300 --save base.pt   # a checkpoint to audit

The task, the model size and the budget are those of the ``train.learns`` check
(``conformance.helpers.learning``); the recipe is the implementation's own where it exposes the recipe
capabilities of ``spec.contract`` and the paper's (``reference/training.py``) for the rest, and
the output says which. Exit status: 0 when greedy decoding reaches the check's threshold on the
held-out sources, 1 when it does not or the implementation fails, 2 for usage errors (an unknown
implementation, matplotlib missing for the plot).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_parser(sub) -> None:
    from aiayn_conformance.conformance.helpers.learning import TASKS

    p = sub.add_parser("train", help="train a tiny model of an implementation on a copy or reversal task, "
                                     "with a progress bar and a plot of its learning curves",
                       description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--impl", default="reference", help="a registered implementation (default: reference)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_PATH", help="load an extra plugin")
    p.add_argument("--task", choices=list(TASKS), default="copy", help="copy or reverse the source (default: copy)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"number of updates (default: the train.learns budget, {TASKS['copy'].steps})")
    p.add_argument("--seed", type=int, default=0, help="seeds the model's initialization and the data (default 0)")
    p.add_argument("--recipe", choices=("auto", "reference"), default="auto",
                   help="auto: the implementation's own recipe pieces where it exposes them, the paper's for the "
                        "rest (default); reference: the paper's recipe only")
    p.add_argument("--config", default=None, metavar="SPEC",
                   help="train a model of these sizes instead of the check's tiny one (a preset such as base, "
                        "key=value pairs, or a file: as aiayn audit --config); the vocabulary must hold the task's "
                        "symbols")
    p.add_argument("--save", default=None, metavar="PATH",
                   help="save the trained model's state_dict (its own parameter names) there, for aiayn audit "
                        "--weights PATH --config SPEC")
    p.add_argument("--plot", default=None, metavar="PATH",
                   help="where to save the loss/accuracy plot (default: aiayn-train-IMPL-TASK.png)")
    p.add_argument("--no-plot", action="store_true", help="draw no plot (no matplotlib needed)")
    p.set_defaults(func=run)


def _say(message: str) -> None:
    print(f"aiayn train: {message}", file=sys.stderr, flush=True)


class ProgressBar:
    """One terminal line redrawn in place (a line every tenth of the run when not on a terminal)."""

    def __init__(self, stream=None, width: int = 30):
        self.stream, self.width = stream or sys.stderr, width
        self.tty = bool(getattr(stream, "isatty", lambda: False)())

    def __call__(self, k: int, total: int, curve) -> None:
        done = int(self.width * k / total)
        greedy = f"  held-out {curve.greedy[-1]:.0%}" if curve.eval_steps and curve.eval_steps[-1] == k else ""
        line = (f"[{'#' * done}{'.' * (self.width - done)}] {k}/{total}  loss {curve.loss[-1]:.3f}  "
                f"teacher-forced acc {curve.teacher_forced[-1]:.0%}  lr {curve.lr[-1]:.2e}{greedy}")
        if self.tty:
            self.stream.write("\r" + line.ljust(110))
            if k == total:
                self.stream.write("\n")
        elif k == total or k % max(1, total // 10) == 0:
            self.stream.write(line + "\n")
        self.stream.flush()


def _recipe_line(impl, config) -> str:
    """Which recipe pieces are the implementation's own, without training (a throwaway build)."""
    from aiayn_conformance.conformance.helpers.harness import seeded
    from aiayn_conformance.conformance.helpers.learning import PAD
    from aiayn_conformance.conformance.helpers.recipe import recipe_for
    from aiayn_conformance.spec.training import TrainConfig

    with seeded(0):
        probe = impl.build(config)
    return recipe_for(probe, impl.output, TrainConfig(), d_model=config.d_model, vocab=config.tgt_vocab,
                      pad_id=PAD).describe()


def run(args: argparse.Namespace) -> int:
    from aiayn_conformance.conformance.helpers.harness import checking
    from aiayn_conformance.conformance.helpers.learning import (
        BOS,
        EOS,
        PAD,
        TASKS,
        greedy_decode,
        task_batch,
        train_implementation,
    )
    from aiayn_conformance.implementations import PluginError, UnknownNameError, get_registry

    if args.steps is not None and args.steps < 1:
        _say(f"--steps must be at least 1, got {args.steps}")
        return 2
    try:
        impl = get_registry(args.plugin).get(args.impl)
    except (ValueError, PluginError, UnknownNameError) as exc:  # an unknown name, a bad composition or --plugin
        _say(str(exc))
        return 2
    plot = None if args.no_plot else Path(args.plot or f"aiayn-train-{impl.name.replace('/', '_')}-{args.task}.png")
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            _say("the plot needs matplotlib, the report extra: pip install 'aiayn-conformance[report]' "
                 "(or pass --no-plot)")
            return 2
    task = TASKS[args.task]
    if args.config:
        import dataclasses

        from aiayn_conformance.conformance.helpers.user_config import ConfigError, read_config
        from aiayn_conformance.spec.config import TINY

        try:
            sizes = read_config(args.config, TINY)  # the sizes an audit reads from the same --config
        except ConfigError as exc:
            _say(f"--config: {exc}")
            return 2
        if min(sizes.src_vocab, sizes.tgt_vocab) < task.vocab:
            _say(f"--config: vocabularies of {sizes.src_vocab} and {sizes.tgt_vocab} cannot hold the task's "
                 f"{task.vocab} tokens (pad, start, end and {task.symbols} symbols); accepted: {task.vocab} or more")
            return 2
        task = dataclasses.replace(task, sizes=sizes)
    config = task.config
    print(f"aiayn train: {impl.name}, task {task.name} ({task.summary}, {task.min_len}-{task.max_len} of "
          f"{task.symbols} symbols), seed {args.seed}")
    heads = "" if config.paper_heads else f" (d_k {config.d_k}, d_v {config.d_v})"
    print(f"model: N={config.n_layers}, d_model {config.d_model}, h {config.n_heads}{heads}, d_ff {config.d_ff}, "
          f"vocab {config.tgt_vocab} (pad {PAD}, BOS {BOS}, EOS {EOS}), dropout {config.dropout:g}")
    started = time.perf_counter()
    try:
        if args.recipe == "auto":
            print(f"recipe: {_recipe_line(impl, config)}")
        else:
            print("recipe: the reference's recipe (the paper's §5.3-5.4), as asked")
        with checking("train.learns"):  # a crash is reported as the check would report it
            model, curve = train_implementation(impl, task, seed=args.seed, own=args.recipe == "auto",
                                                steps=args.steps, on_step=ProgressBar())
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        text = str(exc).strip().splitlines()
        _say(f"{impl.name} failed: {type(exc).__name__}: {text[0] if text else ''}")
        return 1
    print(f"initial state: {curve.start}")
    if curve.stopped:
        print(f"stopped early: {curve.stopped}")
    verdict = "reaches" if curve.passed else "does NOT reach"
    print(f"held-out greedy exact match: {curve.accuracy:.1%} of {task.eval_size} sources after {len(curve.loss)} "
          f"updates ({curve.seconds:.1f} s); {verdict} the train.learns threshold of {task.threshold:.0%}")
    src, target = task_batch(task, 4, __import__("torch").Generator().manual_seed(10_000 + args.seed))
    decoded = greedy_decode(model, src, target.size(1))
    for s, t, d in zip(src.tolist(), target.tolist(), decoded.tolist()):
        show = [x for x in s if x != PAD]
        ok = [x for x in t if x != PAD] == [x for x in d if x != PAD]
        print(f"  {' '.join(map(str, show)):<12} -> {' '.join('<eos>' if x == EOS else str(x) for x in d if x != PAD)}"
              f"  {'ok' if ok else 'wrong'}")
    if args.save:
        import torch

        try:
            Path(args.save).parent.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), args.save)
        except OSError as exc:
            _say(f"cannot write the weights to {args.save}: {exc.strerror or exc}")
            return 2
        audit_at = args.config or ",".join(f"{k}={getattr(config, k)}" for k in ("src_vocab", "d_model", "n_heads",
                                                                                  "d_ff", "n_layers"))
        print(f"weights: {args.save} (audit them: aiayn audit --impl {impl.name} --config {audit_at} "
              f"--weights {args.save})")
    if plot is not None:
        import matplotlib.pyplot as plt

        from aiayn_conformance.audit.figures import draw_learning_curves

        fig = draw_learning_curves([curve.to_json()], f"aiayn train --impl {impl.name} --task {task.name}: "
                                                      f"{curve.recipe}")
        try:
            plot.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(plot, dpi=100)
        except OSError as exc:
            _say(f"cannot write the plot to {plot}: {exc.strerror or exc}")
            return 2
        finally:
            plt.close(fig)
        print(f"plot: {plot}")
    _say(f"done in {time.perf_counter() - started:.1f} s")
    return 0 if curve.passed else 1
