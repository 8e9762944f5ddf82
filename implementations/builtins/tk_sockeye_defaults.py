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
    INSTALL,
    LINES,
    SOURCE,
    WRITTEN_FOR,
    build_defaults,
    read_checkpoint,
    sockeye_unavailable,
)

__all__ = ["DEVIATIONS", "NOTES", "CITED", "WRITTEN_FOR", "build"]

DEVIATIONS: dict[str, str] = {}

NOTES = (
    "What `sockeye-train` builds from the sizes alone (`--num-layers N:N --transformer-model-size d_model:d_model "
    "--transformer-attention-heads h:h --transformer-feed-forward-num-hidden d_ff:d_ff --transformer-dropout-prepost "
    "P_drop:P_drop`), every other option at its parser's default. "
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
