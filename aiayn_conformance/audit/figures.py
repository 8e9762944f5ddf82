"""Pictures for the HTML audit report, drawn with matplotlib (Agg) in a guarded subprocess.

``python -m aiayn_conformance.audit.figures --impl NAME --out DIR [--plugin P]`` writes PNGs and ``index.json``
(``{"figures": {file: title}, "errors": [...]}``). Each picture is measured on the
implementation itself, built with the suite's tiny configuration:

* the positional-encoding table it uses (``positional_encoding``), beside the paper's (§3.5)
  and their difference;
* the target-influence pattern: which output positions change when target token j changes,
  against the causal pattern the decoder mask must produce (§3.2.3);
* per-position statistics of the encoder output (``encode``): mean 0 and standard deviation 1
  at every position after a post-norm layer with unit gains (§3.1, §5.4 layer norm).

A crash, a hang or a missing probe costs a picture (recorded as an error), never the report.

The learning curves of the ``train.learns`` check are drawn from the suite's own records
(``learning_curves_figure``, in the audit's process: data only, no implementation runs), with
the same drawing as ``aiayn train``'s plot (``draw_learning_curves``).
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
from pathlib import Path

from aiayn_conformance.spec.contract import has_capability

TIMEOUT_S = 180


def figures_for(name: str, *, plugins: list[str], workdir: Path) -> tuple[dict[str, str], list[str]]:
    """Draw the pictures of one implementation in a subprocess: ({title: base64 PNG}, [errors])."""
    out = workdir / f"figures-{name.replace('/', '_')}"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "aiayn_conformance.audit.figures", "--impl", name, "--out", str(out)]
    cmd += [f"--plugin={p}" for p in plugins]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {}, [f"drawing the figures timed out after {TIMEOUT_S} s"]
    index = out / "index.json"
    if not index.exists():
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return {}, [f"the figure process failed (exit {res.returncode}): {tail}"]
    data = json.loads(index.read_text())
    figs = {title: base64.b64encode((out / file).read_bytes()).decode("ascii")
            for file, title in data["figures"].items()}
    return figs, data["errors"]


# -- measurements (in the subprocess) ------------------------------------------------------------------------
def _model(impl, config):
    from aiayn_conformance.conformance.helpers.harness import build_model, checking

    with checking("model.shape"):  # a failure to build reads as the suite's "could not be checked"
        return build_model(impl, config)


def positional_table(impl, config, length: int = 24):
    """(the implementation's table, the paper's table), both [length, d_model] float64."""
    from aiayn_conformance.reference.model import sinusoid_table

    model = _model(impl, config)
    if not has_capability(model, "positional_encoding"):
        raise LookupError("the adapter has no positional_encoding(length) probe")
    import torch

    with torch.no_grad():
        table = model.positional_encoding(length)
    table = table.detach().to(torch.float64).reshape(length, config.d_model)
    return table, sinusoid_table(length, config.d_model, dtype=torch.float64)


def target_influence(impl, config, length: int = 10):
    """[i, j] = largest change of output position i's log-probabilities when target token j changes."""
    import torch

    from aiayn_conformance.conformance.helpers.harness import as_log_probs, checking, run_forward
    from aiayn_conformance.conformance.helpers.inputs import random_tokens

    model = _model(impl, config)
    src = random_tokens(config, [7, 7], 7, vocab=config.src_vocab, seed=1)
    tgt = random_tokens(config, [length, length], length, vocab=config.tgt_vocab, seed=2)
    with checking("mask.causal"):
        base = as_log_probs(run_forward(model, src, tgt, vocab=config.tgt_vocab, pad_id=config.pad_id), impl.output)
        influence = torch.zeros(length, length, dtype=torch.float64)
        for j in range(length):
            changed = tgt.clone()
            changed[:, j] = changed[:, j] % (config.tgt_vocab - 1) + 1  # another real token
            out = as_log_probs(run_forward(model, src, changed, vocab=config.tgt_vocab, pad_id=config.pad_id),
                               impl.output)
            influence[:, j] = (out - base).abs().amax(dim=(0, 2))
    return influence


def encoder_statistics(impl, config):
    """(mean, std) of the encoder output per position, averaged over a batch without padding: [S] each."""
    import torch

    from aiayn_conformance.conformance.helpers.inputs import random_tokens

    model = _model(impl, config)
    if not has_capability(model, "encode"):
        raise LookupError("the adapter has no encode(src) probe")
    src = random_tokens(config, [16] * 4, 16, vocab=config.src_vocab, seed=3)
    with torch.no_grad():
        enc = model.encode(src).detach().to(torch.float64)  # (B, S, d_model)
    return enc.mean(dim=-1).mean(dim=0), enc.std(dim=-1, unbiased=False).mean(dim=0)


def draw(name: str, out: Path, plugins: list[str]) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from aiayn_conformance.implementations import get_registry
    from aiayn_conformance.spec.config import TINY as CONFIG

    impl = get_registry(plugins).get(name)
    figures: dict[str, str] = {}
    errors: list[str] = []

    def save(fig, file: str, title: str) -> None:
        fig.tight_layout()
        fig.savefig(out / file, dpi=80)
        plt.close(fig)
        figures[file] = title

    try:
        table, paper = positional_table(impl, CONFIG)
        diff = table - paper
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
        for ax, data, title, cmap in ((axes[0], table, f"{name}: positional_encoding(24)", "RdBu"),
                                      (axes[1], paper, "paper §3.5", "RdBu"),
                                      (axes[2], diff, f"difference (max |d| = {diff.abs().max():.2g})", "PuOr")):
            lim = max(float(data.abs().max()), 1e-12)
            im = ax.imshow(data.numpy(), aspect="auto", cmap=cmap, vmin=-lim, vmax=lim)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("dimension")
            ax.set_ylabel("position")
            fig.colorbar(im, ax=ax)
        save(fig, "position.png", f"Positional encoding (d_model {CONFIG.d_model}): the implementation's table, "
                                  f"the paper's, and their difference")
    except Exception as exc:  # a probe missing or crashing costs this picture only
        errors.append(f"positional encoding: {type(exc).__name__}: {exc}".splitlines()[0])

    try:
        influence = target_influence(impl, CONFIG)
        T = influence.size(0)
        expected = torch.tril(torch.ones(T, T))
        seen = (influence > 1e-6).to(torch.float64)
        fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
        im = axes[0].imshow(torch.log10(influence + 1e-12).numpy(), cmap="viridis", vmin=-12)
        axes[0].set_title("observed: log10 max |change| of output i\nwhen target token j changes", fontsize=9)
        fig.colorbar(im, ax=axes[0])
        axes[1].imshow((seen - expected).numpy(), cmap="bwr", vmin=-1, vmax=1)
        leaks = int(((seen == 1) & (expected == 0)).sum())
        blind = int(((seen == 0) & (expected == 1)).sum())
        axes[1].set_title(f"observed - causal: {leaks} future leak(s) (red),\n{blind} blind cell(s) (blue)",
                          fontsize=9)
        for ax in axes:
            ax.set_xlabel("changed target position j")
            ax.set_ylabel("output position i")
        save(fig, "causal.png", "Attention mask actually applied in the decoder: output i may change only when "
                                "a token at j <= i changes (lower triangle, diagonal included)")
    except Exception as exc:
        errors.append(f"target influence: {type(exc).__name__}: {exc}".splitlines()[0])

    try:
        mean, std = encoder_statistics(impl, CONFIG)
        fig, ax = plt.subplots(figsize=(6, 3.2))
        pos = range(mean.numel())
        ax.plot(pos, mean.numpy(), "o-", label="mean over features")
        ax.plot(pos, std.numpy(), "s-", label="std over features")
        ax.axhline(0, color="gray", lw=0.8, ls="--")
        ax.axhline(1, color="gray", lw=0.8, ls="--")
        ax.set_xlabel("source position")
        ax.set_title("encoder output statistics per position", fontsize=9)
        ax.legend(fontsize=8)
        save(fig, "encoder.png", "Encoder output per position, as built (initial weights): a post-norm encoder "
                                 "with unit gains and zero biases gives mean 0 and std 1 at every position")
    except Exception as exc:
        errors.append(f"encoder statistics: {type(exc).__name__}: {exc}".splitlines()[0])

    return {"figures": figures, "errors": errors}


# -- learning curves (train.learns records, aiayn train) ---------------------------------------------------------
def draw_learning_curves(curves: list[dict], title: str):
    """One panel per run: loss per update (left axis), teacher-forced token accuracy per update and greedy
    exact-match accuracy on held-out sources (right axis), the pass threshold dashed. ``curves`` are
    ``conformance.helpers.learning.LearningCurve.to_json()`` dicts. Returns a matplotlib Figure (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import textwrap

    import matplotlib.pyplot as plt

    width = max(6.5, 5.2 * len(curves))
    fig, axes = plt.subplots(1, len(curves), figsize=(width, 3.9), squeeze=False)
    for ax, curve in zip(axes[0], curves):
        steps = range(1, len(curve["loss"]) + 1)
        loss = [v if v is not None else float("nan") for v in curve["loss"]]
        ax.plot(steps, loss, color="tab:red", lw=1.2, label="loss")
        ax.set_xlabel("update")
        ax.set_ylabel("loss", color="tab:red")
        acc = ax.twinx()
        tf = [v if v is not None else float("nan") for v in curve["teacher_forced"]]
        acc.plot(steps, tf, color="tab:gray", lw=0.8, alpha=0.7, label="teacher-forced token accuracy")
        acc.plot(curve["eval_steps"], curve["greedy"], "o-", color="tab:blue", ms=4,
                 label="greedy exact match (held-out)")
        acc.axhline(curve["threshold"], color="tab:blue", ls="--", lw=0.8, label=f"pass: {curve['threshold']:.0%}")
        acc.set_ylim(-0.02, 1.02)
        acc.set_ylabel("accuracy")
        verdict = "passed" if curve["accuracy"] >= curve["threshold"] else "FAILED"
        ax.set_title(f"{curve['task']}: {curve['accuracy']:.0%} held-out ({verdict}), seed {curve['seed']}",
                     fontsize=9)
        lines = ax.get_legend_handles_labels()[0] + acc.get_legend_handles_labels()[0]
        acc.legend(lines, [ln.get_label() for ln in lines], fontsize=7, loc="center right")
    fig.suptitle("\n".join(textwrap.wrap(title, int(width * 14))), fontsize=9)
    fig.tight_layout()
    return fig


def learning_curves_figure(name: str, curves: list[dict]) -> dict[str, str]:
    """{title: base64 PNG} of the train.learns curves of one implementation."""
    import io

    import matplotlib.pyplot as plt

    fig = draw_learning_curves(curves, f"{name}: train.learns")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    recipe = curves[0].get("recipe", "")
    title = (f"train.learns: loss and accuracy per update on the tiny tasks, trained with {recipe}. Greedy decoding "
             "from the source alone must reach the dashed line; a decoder that reads the future shows a high "
             "teacher-forced accuracy and a low greedy one")
    return {title: base64.b64encode(buffer.getvalue()).decode("ascii")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m aiayn_conformance.audit.figures", description=__doc__.splitlines()[0])
    p.add_argument("--impl", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--plugin", action="append", default=[])
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    index = draw(args.impl, args.out, args.plugin)
    (args.out / "index.json").write_text(json.dumps(index, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
