"""Models that accept only some input shapes: one finding under model.shape, a verdict on the rest.

A plugin for the suite's own tests (``--plugin tests/shape_limited_models.py``). Each model computes the
paper's function exactly, but only at some shapes, as tutorial code often does; elsewhere its forward raises.
On each the suite must report model.shape once (the accepted and rejected shapes, the model's own error),
judge the other clauses at the shapes the model accepts, and skip the checks that need a rejected shape,
naming model.shape: no check errors. ``SHAPE_LIMITED`` says what each accepts and which clauses must still be
judged (passed) on it; ``tests/test_shape_limited.py`` runs the suite over them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
from torch import Tensor, nn

from aiayn_conformance.implementations import Implementation, hookimpl
from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.spec.config import ModelConfig

REJECTIONS_LOG = "AIAYN_TEST_REJECTIONS_LOG"  # a file path: every rejected call appends one line to it
EXAMPLE_LENGTH = 5  # the tutorial's example sentence has 5 tokens
TABLE_LENGTH = 4  # a positional table built for 4 positions


class _CountsRejections(Transformer):
    """Appends a line to $AIAYN_TEST_REJECTIONS_LOG for each forward call that raises: what a crash costs."""

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        try:
            return super().forward(src, tgt)
        except Exception:
            if os.environ.get(REJECTIONS_LOG):
                with open(os.environ[REJECTIONS_LOG], "a") as log:
                    log.write(f"forward(src {list(src.shape)}, tgt {list(tgt.shape)})\n")
            raise


class FixedPositionIds(_CountsRejections):
    """Position ids made once, for the 5-token example sentence the code was written around."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.register_buffer("position_ids", torch.arange(EXAMPLE_LENGTH), persistent=False)  # BUG: fixed ids

    def embed(self, tokens: Tensor, embedding: nn.Embedding) -> Tensor:
        x = embedding(tokens) * math.sqrt(self.config.d_model)  # (B, L, d_model)
        x += self.pe[self.position_ids]  # (5, d_model): any other length fails to broadcast
        return self.dropout(x)


class ShortTable(_CountsRejections):
    """A positional table of 4 rows (a constant of the tutorial), not config.max_len; forward slices it."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.register_buffer("table", self._table(TABLE_LENGTH), persistent=False)  # BUG: 4 positions

    def embed(self, tokens: Tensor, embedding: nn.Embedding) -> Tensor:
        x = embedding(tokens) * math.sqrt(self.config.d_model)  # (B, L, d_model)
        return self.dropout(x + self.table[: tokens.size(1)])  # (min(L, 4), d_model): L > 4 fails


class OneSentence(_CountsRejections):
    """Code written to translate one sentence at a time: the embeddings are viewed as a batch of one."""

    def embed(self, tokens: Tensor, embedding: nn.Embedding) -> Tensor:
        L = tokens.size(1)
        x = embedding(tokens).view(1, L, self.config.d_model) * math.sqrt(self.config.d_model)  # BUG: B = 1
        return self.dropout(x + self.positional_encoding(L))


# name -> (build, what it accepts, the clauses that must still pass on it)
JUDGED = ["mask.causal", "mask.finite", "attention.scale", "norm.post-norm", "norm.layer-norm", "embedding.scale"]
SHAPE_LIMITED: dict[str, tuple[Callable[[ModelConfig], nn.Module], str, list[str]]] = {
    "fixed-length": (FixedPositionIds, f"source and target length {EXAMPLE_LENGTH} only", JUDGED),
    "max-length-4": (ShortTable, f"lengths up to {TABLE_LENGTH} only",
                     JUDGED + ["mask.source-padding", "mask.target-padding"]),
    "batch-of-one": (OneSentence, "batch size 1 only", JUDGED + ["mask.source-padding", "mask.target-padding"]),
}


@hookimpl
def register_implementations(register: Callable[[Implementation], None]) -> None:
    for name, (build, accepts, _) in SHAPE_LIMITED.items():
        register(Implementation(name=f"shape-{name}", build=build, output="logits",
                                summary=f"the paper's function, accepting {accepts}",
                                source="tests/shape_limited_models.py"))
