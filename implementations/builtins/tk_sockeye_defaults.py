"""Built-in plugin ``sockeye-defaults``: Sockeye's Transformer at its defaults, built by its own model code.

The adapter, the decoding, the recipe and the checkpoint reader are ``tk_sockeye``'s; this module gives the
configuration of the defaults and their declarations (citing Sockeye as ``tk_sockeye`` does;
tests/test_toolkit_sockeye.py checks every cited line against the installed file).
"""

from __future__ import annotations

from ..declarations import Implementation
from ..hookspecs import hookimpl
from .tk_citations import cited
from .tk_sockeye import (
    AR,
    BS,
    DE,
    EN,
    GREEDY,
    INSTALL,
    LA,
    LINES,
    LR,
    MAX_LENGTH,
    MO,
    PARAMETERS,
    PORTABLE,
    POSITION,
    SEARCH,
    SOURCE,
    TF,
    WRITTEN_FOR,
    build_defaults,
    read_checkpoint,
    sockeye_unavailable,
)

__all__ = ["DEVIATIONS", "NOTES", "CITED", "WRITTEN_FOR", "build"]

PRE_NORM = (
    f"--transformer-preprocess defaults to 'n' and --transformer-postprocess to 'dr' ({AR}:703, :713): every "
    "sub-layer is x + Dropout(Sublayer(LayerNorm(x))), pre-norm"
)
FINAL_NORMS = (
    f"each stack ends with a final process block that applies the preprocess sequence ({EN}:196, {DE}:166): with "
    "the default 'n' a LayerNorm at the top of each stack, the pre-norm design's final norm, which §3.1 does not have"
)
DROPOUTS = (
    f"--transformer-dropout-attention and --transformer-dropout-act default to 0.1 ({AR}:973, :978), apart from "
    f"--transformer-dropout-prepost (P_drop): the attention weights ({LA}:315) and the FFN's hidden units ({TF}:344) "
    "are dropped"
)

DEVIATIONS: dict[str, str] = {
    "model.reference-equivalence": (
        "loaded with the canonical weights it computes another function than the paper's: pre-norm sub-layers and a "
        f"final norm per stack ({AR}:703, {EN}:196, {DE}:166) and the positional table's two halves ({LA}:697)"),
    "norm.post-norm": PRE_NORM,
    "norm.no-extra-norm": FINAL_NORMS,
    "position.formula": POSITION,
    "config.parameters": PARAMETERS + f"; and the stacks' final LayerNorms ({EN}:196, {DE}:166; 4 x d_model)",
    "embedding.shared-weights": (
        f"--weight-tying-type defaults to src_trg_softmax ({AR}:780): one matrix whatever the configuration asks; "
        "with two vocabulary sizes, which that tying cannot hold, this registration passes trg_softmax, and the "
        f"target embedding is still the output layer's matrix ({MO}:553); the output layer has a bias ({LA}:84)"),
    "dropout.extra-sites": DROPOUTS,
    "dropout.residual": (
        f"with P_drop = 0 the model still draws random masks in training: the attention and activation dropouts keep "
        f"their default 0.1 ({AR}:973, :978)"),
    "model.eval-determinism": (
        f"train mode with P_drop = 0 differs from eval mode: the attention and activation dropouts keep their "
        f"default 0.1 ({AR}:973, :978) whatever --transformer-dropout-prepost says"),
    "device.portable": PORTABLE,
    "decode.greedy": GREEDY,
    "decode.max-length": MAX_LENGTH,
    "decode.beam": SEARCH + (
        f"; --length-penalty-beta defaults to 0 ({AR}:1416): the penalty is |Y|^alpha ({BS}:286, :295), not "
        "GNMT's ((5 + |Y|) / 6)^alpha"),
    "train.optimizer": (
        f"Adam with --optimizer-betas 0.9:0.999 and --optimizer-eps 1e-8 by default ({AR}:993, :997), not §5.3's "
        "(0.9, 0.98, 1e-9)"),
    "train.lr-schedule": (
        f"the default scheduler is plateau-reduce ({AR}:1030) without warmup: the initial rate 0.0002 ({AR}:1009) "
        f"until validation stops improving ({LR}:233), never Eq. (3)"),
    "train.learns": (
        f"with its default recipe, Adam (0.9, 0.999) at a constant 0.0002 ({AR}:1009, {LR}:233) with attention and "
        f"activation dropout 0.1 ({AR}:973, :978), greedy decoding reproduces almost none of the held-out copies "
        "or reversals after the suite's 150 updates (measured: 0.5% for both)"),
}

NOTES = (
    "What `sockeye-train` builds from the sizes alone (`--num-layers N:N --transformer-model-size d_model:d_model "
    "--transformer-attention-heads h:h --transformer-feed-forward-num-hidden d_ff:d_ff --transformer-dropout-prepost "
    "P_drop:P_drop`), every other option at its parser's default: pre-norm sub-layers with a final norm per stack, "
    "attention and activation dropout 0.1, fixed sinusoids (in two halves), source, target and output embeddings "
    "tied, Adam (0.9, 0.999, 1e-8) at a constant 0.0002 (plateau-reduce lowers it only on validation checkpoints, "
    "which the audit does not run), label smoothing 0.1; decoding with the audit's beam size and alpha and "
    "Sockeye's default --length-penalty-beta 0. "
    "Reproduce: `aiayn audit --impl sockeye-defaults`."
)

CITED: dict[str, str] = cited(LINES, [*DEVIATIONS.values(), NOTES], "sockeye/")

build = build_defaults


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="sockeye-defaults", build=build_defaults, output="logits", deviations=DEVIATIONS, notes=NOTES,
        summary="Sockeye 3.1.34 Transformer at its training parser's defaults (pre-norm 'n'/'dr' with final norms, "
                "attention and activation dropout, tied, Adam 0.9/0.999 at a constant 2e-4)",
        source=SOURCE, written_for=WRITTEN_FOR, unavailable=sockeye_unavailable(), read_checkpoint=read_checkpoint,
        install=INSTALL))
