"""Built-in plugin ``joeynmt-defaults``: joeynmt's Transformer at its defaults, built by its own builder.

The adapter, the decoding, the recipe and the checkpoint reader are ``tk_joeynmt``'s; this module gives the
configuration of the defaults and their declarations (citing joeynmt as ``tk_joeynmt`` does;
tests/test_toolkit_joeynmt.py checks every cited line against the installed file).
"""

from __future__ import annotations

from ..declarations import Implementation
from ..hookspecs import hookimpl
from .tk_citations import cited
from .tk_joeynmt import (
    BEAM,
    BU,
    CF,
    DE,
    EM,
    EN,
    EXTRA_DROPOUT,
    FINITE,
    GREEDY,
    INSTALL,
    LINES,
    MAX_LENGTH,
    MO,
    PARAMETERS,
    SOURCE,
    WRITTEN_FOR,
    build_defaults,
    joeynmt_unavailable,
    read_checkpoint,
)

__all__ = ["DEVIATIONS", "NOTES", "CITED", "WRITTEN_FOR", "build"]

DEVIATIONS: dict[str, str] = {
    "model.reference-equivalence": (
        f"at its defaults JoeyNMT builds pre-norm encoder layers ({EN}:208) without the final norm a pre-norm stack "
        f"needs (built only when layer_norm is set to 'pre' explicitly, {EN}:218) beside post-norm decoder layers "
        f"({DE}:537), and does not scale the embeddings by sqrt(d_model) (Embeddings(scale=False), {EM}:28)"),
    "norm.post-norm": (
        f"the encoder layers are pre-norm at the defaults, x + Dropout(Sublayer(LayerNorm(x))) ({EN}:208), beside "
        f"post-norm decoder layers ({DE}:537)"),
    "embedding.scale": (
        f"Embeddings' `scale` defaults to False ({EM}:28): the lookup is not multiplied by sqrt(d_model) "
        f"({EM}:63 runs only with scale: True)"),
    "embedding.shared-weights": (
        f"tied_embeddings and tied_softmax default to False ({MO}:352, :418): three matrices whatever the "
        "configuration asks"),
    "config.parameters": PARAMETERS + "; untied source and target embeddings and output layer",
    "dropout.extra-sites": EXTRA_DROPOUT,
    "mask.finite": FINITE,
    "decode.beam": BEAM,
    "decode.greedy": GREEDY,
    "decode.max-length": MAX_LENGTH,
    "train.optimizer": (
        f"the default optimizer is Adam with torch's betas (0.9, 0.999) ({BU}:110) and epsilon 1e-8 ({BU}:111)"),
    "train.label-smoothing": f"label_smoothing defaults to 0.0 ({CF}:312): plain cross-entropy",
}

NOTES = (
    "What JoeyNMT builds from a `model` section giving only the architecture and sizes (`type: transformer`, "
    "num_layers, num_heads, hidden_size, ff_size, dropout, embedding_dim): pre-norm encoder layers without a final "
    "norm beside post-norm decoder layers, unscaled and untied embeddings; training at its defaults (Adam 0.9/0.999 "
    f"at 0.005 ({CF}:315), no label smoothing, loss divided by the sentences) and `batch_size`, which has no "
    "default; testing at "
    "its defaults but the audit's beam size and alpha. No learning-rate schedule is exposed: the trainer refuses a "
    f"training section without `scheduling` (None is not a scheduler, {BU}:173, :226), and `plateau`, the first "
    f"it lists, fails beside torch 2.13 (it passes verbose=False to ReduceLROnPlateau, {BU}:179, :185, which "
    "torch 2.13 no longer accepts: TypeError), so train.lr-schedule is skipped and train.learns trains with the "
    "reference's schedule. The criterion is left summed: "
    "`normalization: batch` divides by the sentences of the batch, which the contract's flattened call cannot count. "
    "Reproduce: `aiayn audit --impl joeynmt-defaults`."
)
CITED: dict[str, str] = cited(LINES, [*DEVIATIONS.values(), NOTES], "joeynmt/")

build = build_defaults


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="joeynmt-defaults", build=build_defaults, output="logits", deviations=DEVIATIONS,
        notes=NOTES,
        summary="JoeyNMT 2.3.0 Transformer at its configuration defaults (pre-norm encoder layers without a final "
                "norm, post-norm decoder, no embedding scale, untied)",
        source=SOURCE, written_for=WRITTEN_FOR, unavailable=joeynmt_unavailable(), read_checkpoint=read_checkpoint,
        install=INSTALL))
