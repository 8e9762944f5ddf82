"""Built-in plugin ``opennmt-py-defaults``: OpenNMT-py's Transformer at its defaults, built by its own builder.

The adapter, the decoding, the recipe and the checkpoint reader are ``tk_opennmt``'s; this module gives the
configuration of the defaults and their declarations (citing OpenNMT-py as ``tk_opennmt`` does;
tests/test_toolkit_opennmt.py checks every cited line against the installed file).
"""

from __future__ import annotations

from ..declarations import Implementation
from ..hookspecs import hookimpl
from .tk_citations import cited
from .tk_opennmt import (
    BEAM,
    DEC,
    EMB,
    ENC,
    FFN,
    FINAL_NORMS,
    INSTALL,
    LIBRARY_MODULE,
    LINES,
    LOSS,
    MAX_LENGTH,
    MB,
    ONNX,
    OPT,
    OPTS,
    PRE_NORM,
    SOURCE,
    WRITTEN_FOR,
    build_defaults,
    opennmt_unavailable,
    read_checkpoint,
)

__all__ = ["DEVIATIONS", "NOTES", "CITED", "WRITTEN_FOR", "LIBRARY_MODULE", "build"]

DEVIATIONS: dict[str, str] = {
    "norm.post-norm": PRE_NORM,
    "norm.no-extra-norm": FINAL_NORMS,
    "model.reference-equivalence": (
        "loaded with the canonical weights it computes another function than the paper's: no positional encoding "
        f"and no sqrt(d_model) scale (both live in PositionalEncoding, built only with -position_encoding: "
        f"{EMB}:70, :296), no FFN biases (-add_ffnbias is off by default; the canonical ones cannot be loaded), "
        f"pre-norm sub-layers and a final norm per stack ({ENC}:119, :267; {DEC}:389, :711)"),
    "config.parameters": (
        f"beyond the schema: untied source and target embeddings and generator (-share_embeddings and "
        f"-share_decoder_embeddings are off by default), the generator bias ({MB}:380-383) and the stacks' final "
        f"LayerNorms ({ENC}:219, {DEC}:441); missing: the FFN biases (-add_ffnbias is off by default)"),
    "embedding.shared-weights": (
        "at the defaults nothing is tied whatever the configuration asks (-share_embeddings and "
        f"-share_decoder_embeddings are off), and the generator has a bias ({MB}:380-383)"),
    "position.formula": (
        f"-position_encoding is off by default: Embeddings adds no positional table at all ({EMB}:296), so the "
        "table the model adds is zero"),
    "position.added": (
        f"-position_encoding is off by default ({EMB}:296): no positional encoding is added to either stack's "
        "embeddings"),
    "dropout.extra-sites": (
        f"-attention_dropout defaults to 0.1 ({OPTS}:1449), apart from -dropout: the attention weights are dropped "
        f"(and the FFN's hidden units at the residual rate, {FFN}:109)"),
    "dropout.residual": (
        f"with P_drop = 0 the model still draws random masks in training: the attention dropout keeps its own "
        f"default of 0.1 ({OPTS}:1449)"),
    "model.eval-determinism": (
        f"train mode with P_drop = 0 differs from eval mode: the attention dropout keeps its default 0.1 "
        f"({OPTS}:1449) whatever -dropout says"),
    "export.onnx": ONNX,
    "decode.beam": (
        "the translator's BeamSearch keeps finished hypotheses in the K slots and stops a source when its best beam "
        f"has finished ({BEAM}:235, :214), and its default length penalty is 'avg' ({OPTS}:1690), dividing by "
        f"(|Y| + 1)^alpha (the start symbol counted, {BEAM}:308, :317), not GNMT's ((5 + |Y|) / 6)^alpha"),
    "decode.max-length": MAX_LENGTH,
    "train.optimizer": (
        f"the default optimizer is plain SGD ({OPTS}:1404), not Adam; with -optim adam its epsilon would be the "
        f"1e-8 written in the code ({OPT}:58)"),
    "train.lr-schedule": (
        "the default schedule is no warmup: -learning_rate 1.0 from the first update, halved every 10000 updates "
        f"from update 50000 ({OPTS}:1554; -decay_method none), not Eq. (3)"),
    "train.label-smoothing": (
        f"-label_smoothing defaults to 0.0: the criterion is plain cross-entropy ({LOSS}:104)"),
    "train.learns": (
        f"with its default recipe, plain SGD ({OPTS}:1404) at a constant rate of 1.0 ({OPTS}:1536), the loss "
        "becomes NaN within the first updates (measured: at update 4 on the suite's copy task; at update 8 with the "
        "loss divided by the batch's sentences as -normalization sents does)"),
}

NOTES = (
    "What `-encoder_type transformer -decoder_type transformer` builds with every other option at OpenNMT-py's "
    "parser default (the sizes and -dropout P_drop given): no positional encoding and hence no sqrt(d_model) scale, "
    "no FFN biases, untied embeddings and generator, attention dropout 0.1, plain SGD at a constant rate 1.0, no "
    "label smoothing, gradient norms clipped at 5 (-max_grad_norm, not audited by a clause), and the translator's "
    "defaults (beam 5, `avg` length penalty; the audit passes its own beam size and alpha). "
    "The missing sqrt(d_model) scale is not judged by the input probe (with no table added, a layer norm of "
    "s E[tokens] does not depend on s). "
    "The criterion is the toolkit's summed cross-entropy: with -normalization sents (the default) its trainer "
    "divides by the sentences of the batch, which the contract's flattened call cannot count. "
    "Reproduce: `aiayn audit --impl opennmt-py-defaults`."
)

CITED: dict[str, str] = cited(LINES, [*DEVIATIONS.values(), NOTES], "onmt/")

build = build_defaults


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="opennmt-py-defaults", build=build_defaults, output="logits", deviations=DEVIATIONS,
        notes=NOTES,
        summary="OpenNMT-py 3.5.1 Transformer at its option parser's defaults (no positional encoding, no FFN "
                "biases, untied, SGD): what -encoder_type/-decoder_type transformer alone builds",
        source=SOURCE, written_for=WRITTEN_FOR, unavailable=opennmt_unavailable(), read_checkpoint=read_checkpoint,
        install=INSTALL))
