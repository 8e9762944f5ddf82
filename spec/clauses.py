"""The clause catalogue: what the paper requires, one stable id per requirement.

Each clause has a slug id (``area.name``; ids never change meaning once
published), the paper section and equation it comes from (arXiv:1706.03762 v7
numbering), a severity and a statement in our own words.

Severities:
  ``must``    the paper states it; breaking it computes a different function.
  ``should``  portability, exportability and conventions a user relies on.
  ``info``    recorded in reports, never a failure of conformance.

Every conformance test carries ``@pytest.mark.clause("<id>")``; the suite
rejects a marker naming an unknown id, and a meta-test fails when a clause has
no test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Clause", "CLAUSES", "SEVERITIES", "get_clause", "clauses_in_area", "AREAS"]

Severity = Literal["must", "should", "info"]
SEVERITIES: tuple[str, ...] = ("must", "should", "info")


@dataclass(frozen=True)
class Clause:
    id: str
    section: str
    severity: Severity
    statement: str
    equation: str = ""

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def citation(self) -> str:
        """Short citation, e.g. '§3.2.1, Eq. (1)'."""
        return f"§{self.section}" + (f", {self.equation}" if self.equation else "")


_RECORDS: tuple[Clause, ...] = (
    # --- whole model -------------------------------------------------------
    Clause("model.shape", "3", "must",
           "forward(src [B, S], tgt [B, T]) returns one score vector over the target vocabulary "
           "per target position: a floating tensor of shape [B, T, tgt_vocab], for any batch size "
           "and any lengths from 1 to max_len."),
    Clause("model.reference-equivalence", "3", "must",
           "Loaded with the same parameters (canonical schema), the implementation computes the "
           "same next-token distribution as the reference model, in eval mode, on padded batches."),
    Clause("model.batch-independence", "3", "must",
           "A sample's outputs do not depend on the other samples of its batch or on their order "
           "(padding is the subject of the mask clauses)."),
    Clause("model.eval-determinism", "5.4", "must",
           "In eval mode two identical calls agree exactly; in train mode dropout is the only "
           "source of randomness, so with dropout 0 train mode equals eval mode."),
    Clause("model.output-normalization", "3.4", "must",
           "The output is what the implementation declares: log-probabilities or probabilities "
           "normalize over the vocabulary; declared logits are not already normalized (exactly one "
           "softmax, at the very end)."),
    # --- attention ---------------------------------------------------------
    Clause("attention.scale", "3.2.1", "must",
           "Dot products of queries and keys are divided by sqrt(d_k), the per-head key size, "
           "before the softmax (not by sqrt(d_model), not omitted).", "Eq. (1)"),
    Clause("attention.softmax-over-keys", "3.2.1", "must",
           "For each query the softmax runs over the keys, so the weights of one query sum to 1 "
           "over the keys it may attend to.", "Eq. (1)"),
    Clause("attention.heads", "3.2.2", "must",
           "h heads of size d_k = d_model / h: head j uses rows j*d_k..(j+1)*d_k of the Q, K, V "
           "projections, attends separately, and the heads are concatenated per position before "
           "W^O; projections carry no bias."),
    Clause("attention.cross-source", "3.2.3", "must",
           "In encoder-decoder attention the queries come from the decoder's previous sub-layer and "
           "the keys and values from the output of the final encoder layer."),
    # --- masks -------------------------------------------------------------
    Clause("mask.causal", "3.2.3", "must",
           "Decoder self-attention lets position i attend to positions up to and including i: "
           "the output at i depends on target tokens 0..i and on no later token.", "Fig. 2"),
    Clause("mask.source-padding", "3.2.3", "must",
           "Source padding is invisible: changing the padded source tokens or appending more "
           "padding changes no output at a real target position (masked scores are -inf before "
           "the softmax, in encoder self-attention and in cross-attention)."),
    Clause("mask.target-padding", "3.2.3", "must",
           "Appending target padding leaves the outputs at the real target positions unchanged."),
    Clause("mask.finite", "3.2.3", "must",
           "No NaN or infinity appears for any padded input, including a fully padded sequence "
           "and low-precision (bfloat16) autocast; a query with no admissible key attends to "
           "nothing."),
    # --- normalization and residuals ----------------------------------------
    Clause("norm.post-norm", "3.1", "must",
           "Each sub-layer's output is LayerNorm(x + Dropout(Sublayer(x))): the residual sum is "
           "normalized after the addition (post-norm), not before the sub-layer (pre-norm).",
           "§5.4"),
    Clause("norm.no-extra-norm", "3.1", "must",
           "There is exactly one layer norm per sub-layer: none after the embeddings, none at the "
           "top of either stack."),
    Clause("norm.layer-norm", "3.1", "must",
           "Layer normalization runs over the d_model features of each position, with the biased "
           "variance, epsilon inside the square root, and a per-feature gain and bias."),
    # --- feed-forward --------------------------------------------------------
    Clause("ffn.formula", "3.3", "must",
           "The position-wise feed-forward network is max(0, x W1 + b1) W2 + b2: two affine maps "
           "with biases and one ReLU between them, inner size d_ff.", "Eq. (2)"),
    # --- embeddings and positions ---------------------------------------------
    Clause("embedding.scale", "3.4", "must",
           "Token embeddings are multiplied by sqrt(d_model) before the positional encoding is "
           "added."),
    Clause("embedding.shared-weights", "3.4", "must",
           "When configured (share_embeddings), one matrix serves as the source embedding, the "
           "target embedding and the pre-softmax projection, with no bias on that projection."),
    Clause("position.formula", "3.5", "must",
           "PE(pos, 2i) = sin(pos / 10000^(2i/d_model)) and PE(pos, 2i+1) = cos(pos / "
           "10000^(2i/d_model)): sines on even and cosines on odd dimensions, interleaved, "
           "positions counted from 0."),
    Clause("position.added", "3.5", "must",
           "The positional encoding is added (not concatenated) exactly once to the scaled "
           "embeddings at the bottom of both the encoder and the decoder stacks."),
    # --- regularization --------------------------------------------------------
    Clause("dropout.residual", "5.4", "must",
           "Dropout with rate P_drop acts on every sub-layer output before the residual addition "
           "and on the sums of embeddings and positional encodings, in training only."),
    # --- stacks ----------------------------------------------------------------
    Clause("layers.independent", "3.1", "must",
           "Each stack has N layers with their own parameters (no sharing between layers or "
           "between sub-layers), applied in sequence, and the decoder's output is its last "
           "layer's output."),
    # --- portability -------------------------------------------------------------
    Clause("device.portable", "-", "should",
           "Every tensor the model uses follows module.to(device): tables are buffers, masks are "
           "built on the input's device."),
    Clause("device.parity", "-", "should",
           "The same weights and inputs give the same outputs and gradients on CPU and on an "
           "accelerator, within the float32 tolerance."),
    Clause("export.onnx", "-", "should",
           "The model exports to ONNX with dynamic batch and sequence lengths, and onnxruntime "
           "reproduces the PyTorch outputs on shapes other than the export example."),
    # --- training ----------------------------------------------------------------
    Clause("train.gradients", "5", "must",
           "A loss on a padded batch gives every parameter a finite gradient, non-zero for every "
           "parameter that the paper's model uses."),
    Clause("train.lr-schedule", "5.3", "must",
           "Update step_num = 1, 2, ... runs at the learning rate d_model^-0.5 * min(step_num^-0.5, "
           "step_num * warmup_steps^-1.5) with warmup_steps = 4000 (d_model the model's): linear warmup to a "
           "peak at update 4000, then decay as step_num^-0.5. step_num counts updates from 1 and advances "
           "once per update (not per epoch).", "Eq. (3)"),
    Clause("train.optimizer", "5.3", "must",
           "The optimizer's updates are Adam's with beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9 and no weight "
           "decay (the paper gives Adam's three settings and names no weight decay among its regularizers, "
           "§5.4)."),
    Clause("train.label-smoothing", "5.4", "must",
           "The criterion trains each real target position towards 1 - eps_ls on the true class, eps_ls = 0.1, "
           "with eps_ls spread evenly over the classes, and padding targets towards nothing. The paper does "
           "not say how the mass is spread, so each common convention passes and is reported: eps/V on every "
           "class, the target included (Szegedy et al.), eps/(V-1) on every other class (tensor2tensor, the "
           "reference), eps/(V-2) on every other class but padding (the Annotated Transformer)."),
    Clause("train.loss-padding", "5.4", "should",
           "Padding targets contribute nothing: appending padding to a batch changes neither the loss nor "
           "the gradient of any score (should: the paper is silent on padding; tensor2tensor weights padding "
           "targets 0 and normalizes by the real tokens, and a loss that counts padding weighs each batch "
           "by its padding)."),
    Clause("train.shift", "3.1", "must",
           "Teacher forcing offsets the target by one position: the decoder input is a start symbol followed "
           "by the target without its last token and the labels are the target, so the output at position i "
           "is trained to predict target token i without seeing it."),
    Clause("train.learns", "5", "should",
           "With its own recipe (the reference's for any piece it does not expose), the implementation at a "
           "tiny size (N = 1, d_model 32, h 4, d_ff 64, no dropout) learns to copy and to reverse 2 to 5 "
           "symbols in 150 updates of 64 sequences (Eq. (3) with warmup 75): greedy decoding from the source "
           "alone reproduces at least 50% of 200 held-out sequences exactly (should: a capability the paper "
           "implies, not a sentence of it)."),
    # --- configuration -----------------------------------------------------------
    Clause("config.parameters", "3", "must",
           "The parameters match the canonical schema's shapes for the configuration, and the "
           "base preset's total is Table 3's 65M within 5% (the paper's figure is rounded and "
           "depends on the vocabulary).", "Table 3"),
)

CLAUSES: dict[str, Clause] = {c.id: c for c in _RECORDS}
if len(CLAUSES) != len(_RECORDS):  # pragma: no cover - guards the data above
    raise RuntimeError("duplicate clause id in spec/clauses.py")

AREAS: tuple[str, ...] = tuple(dict.fromkeys(c.area for c in _RECORDS))


def get_clause(clause_id: str) -> Clause:
    """The clause with this id; KeyError listing the known ids otherwise."""
    try:
        return CLAUSES[clause_id]
    except KeyError:
        raise KeyError(
            f"unknown clause id {clause_id!r}; known ids: {', '.join(CLAUSES)}"
        ) from None


def clauses_in_area(area: str) -> list[Clause]:
    return [c for c in CLAUSES.values() if c.area == area]
