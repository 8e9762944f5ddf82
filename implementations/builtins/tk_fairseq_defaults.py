"""Built-in plugin ``fairseq-defaults``: fairseq's ``transformer`` architecture at its defaults, built by its own task.

The adapter, the decoding, the recipe and the checkpoint reader are ``tk_fairseq``'s; this module gives the
configuration of the defaults and their declarations (citing fairseq as ``tk_fairseq`` does;
tests/test_toolkit_fairseq.py checks every cited line against the installed file).
"""

from __future__ import annotations

from ..declarations import Implementation
from ..hookspecs import hookimpl
from .tk_citations import cited
from .tk_fairseq import (
    ADAM,
    ARCH,
    BEAM,
    CF,
    CRI,
    DEC,
    EPSILON,
    FINITE,
    FORCED_END,
    GREEDY,
    INCREMENTAL,
    INSTALL,
    LIBRARY_MODULE,
    LINES,
    LRS,
    MHA,
    ONNX,
    POSITIONS,
    REFERENCE,
    SG,
    SHIFT,
    SOURCE,
    WRITTEN_FOR,
    build_defaults,
    fairseq_unavailable,
    read_checkpoint,
)

__all__ = ["DEVIATIONS", "NOTES", "CITED", "WRITTEN_FOR", "LIBRARY_MODULE", "build"]

DEVIATIONS: dict[str, str] = {
    "config.parameters": (
        f"beyond the schema: untied source and target embeddings and output projection (--share-all-embeddings is "
        f"off by default, {ARCH}:196; the output projection is a matrix of its own, {DEC}:162) and a bias on every "
        f"attention projection ({MHA}:76); measured at the base preset: 100.97M parameters against Table 3's 65M"),
    "embedding.shared-weights": (
        f"at the defaults nothing is tied whatever the configuration asks: --share-all-embeddings is off "
        f"({ARCH}:196), and the output projection is its own matrix ({DEC}:162)"),
    "position.formula": POSITIONS,
    "model.reference-equivalence": REFERENCE,
    "norm.epsilon": EPSILON,
    "mask.finite": FINITE,
    "export.onnx": ONNX,
    "decode.incremental": INCREMENTAL,
    "decode.greedy": GREEDY,
    "decode.beam": BEAM,
    "decode.max-length": (
        f"fairseq-generate's default limit, max_len_b = 200 tokens ({CF}:830) capped at the decoder's positions - 1 "
        f"({SG}:273; 63 at the audit's 64), is one number for every source, not each source's real length + 50; and "
        + FORCED_END + ": measured, sources of 6, 3 and 1 real tokens each decode 64 tokens"),
    "train.optimizer": (
        f"fairseq-train has no default optimizer ({CF}:1142); --optimizer adam at its own defaults is Adam with "
        f"betas (0.9, 0.999) and eps 1e-8 ({ADAM}:27, :30), epsilon added before the bias correction ({ADAM}:223, "
        ":227)"),
    "train.lr-schedule": (
        f"the default schedule is `fixed` ({LRS}:24) at the default --lr 0.25 ({CF}:616): a constant rate from the "
        "first update, no warmup and no decay, not Eq. (3)"),
    "train.label-smoothing": (
        f"the default criterion is `cross_entropy` ({CRI}:24): the target is one-hot, no label smoothing"),
    "train.shift": SHIFT,
    "train.learns": (
        f"with its default recipe, Adam at a constant rate of 0.25 ({LRS}:24, {CF}:616), the loss falls slowly "
        "(measured 2.76 -> 1.94 on the copy task) and greedy decoding, from </s> as it was trained (its shift is "
        "declared under train.shift), reproduces none of the held-out sequences after 150 updates"),
}

NOTES = (
    "What `fairseq-train DATA --task translation --arch transformer --optimizer adam` builds with every other option "
    "at fairseq's defaults (the sizes, -dropout P_drop and the longest positions given; fairseq-train refuses to run "
    f"without an optimizer, {CF}:1142): post-norm ({ARCH}:175), sinusoidal positions ({ARCH}:176), the sqrt(d_model) "
    "scale, no attention or activation dropout, untied embeddings and output projection, Adam at (0.9, 0.999, 1e-8), "
    "a fixed rate of 0.25, plain cross-entropy, no gradient clipping; SequenceGenerator at fairseq-generate's "
    f"defaults (max_len_a 0 and max_len_b 200, {CF}:824, :830; beam 5 and lenpen 1, {CF}:812, :868; the audit "
    "passes its own beam size and alpha as --beam and --lenpen). "
    "Reproduce: `aiayn audit --impl fairseq-defaults`."
)

CITED: dict[str, str] = cited(LINES, [*DEVIATIONS.values(), NOTES], "fairseq/")

build = build_defaults


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="fairseq-defaults", build=build_defaults, output="logits", deviations=DEVIATIONS, notes=NOTES,
        summary="fairseq 0.12 (fairseq-fixed) `--arch transformer` at its defaults (untied embeddings, Adam at "
                "its defaults, fixed rate, plain cross-entropy): what fairseq-train builds from the sizes alone",
        source=SOURCE, written_for=WRITTEN_FOR, unavailable=fairseq_unavailable(), read_checkpoint=read_checkpoint,
        install=INSTALL))
