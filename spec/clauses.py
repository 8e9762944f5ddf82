"""The clause catalogue: what the paper requires, one stable id per requirement.

Each clause has a slug id (``area.name``; ids never change meaning once
published), the paper section and equation it comes from (arXiv:1706.03762 v7
numbering), a severity, a statement in our own words, and the reason for its
severity (``severity_reason``, one line, shown in docs/clauses.md).

Severities:
  ``must``    the paper states it; breaking it computes a different function.
              A subject that breaks a ``must`` clause is nonconforming.
  ``should``  the paper is silent: robustness on inputs it never defines (a
              fully padded sequence), portability (devices, low precision,
              export) and conventions a user relies on (the configured
              epsilon). Reported, but a model that computes the paper's
              function is conforming whatever its ``should`` results.
  ``info``    recorded in reports, never a failure of conformance.

Outcomes: each clause of a subject is passed (a check judged it and found the
paper's behaviour), failed, not judged (every check skipped or errored: no
finding either way), or not applicable (the adapter lacks what the clause is
about, e.g. a decoding method; each check says so with ``NOT_APPLICABLE``).
A subject is conforming only when every applicable ``must`` clause was judged
and passed.

Every conformance test carries ``@pytest.mark.clause("<id>")``; the suite
rejects a marker naming an unknown id, and a meta-test fails when a clause has
no test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Clause", "CLAUSES", "NOT_APPLICABLE", "SEVERITIES", "get_clause", "clauses_in_area", "parse_clause_ids",
           "AREAS"]

Severity = Literal["must", "should", "info"]
SEVERITIES: tuple[str, ...] = ("must", "should", "info")
NOT_APPLICABLE = "not applicable: "  # how a check's skip reason says the clause does not apply to the subject


@dataclass(frozen=True)
class Clause:
    id: str
    section: str
    severity: Severity
    statement: str
    equation: str = ""
    severity_reason: str = field(kw_only=True)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"clause {self.id}: severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")
        if not self.severity_reason:
            raise ValueError(f"clause {self.id}: severity_reason is empty (say why it is {self.severity})")

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
           "and any lengths from 1 to max_len.",
           severity_reason=(
               "§3 and §3.4 define the output as a next-token distribution over the target vocabulary at every "
               "target position; another shape is not that output.")),
    Clause("model.reference-equivalence", "3", "must",
           "Loaded with the same parameters (canonical schema), the implementation computes the "
           "same next-token distribution as the reference model, in eval mode, on padded batches.",
           severity_reason=(
               "The reference computes the paper's function to the letter; loaded with the same weights, "
               "another distribution is another function.")),
    Clause("model.batch-independence", "3", "must",
           "A sample's outputs do not depend on the other samples of its batch or on their order "
           "(padding is the subject of the mask clauses).",
           severity_reason=(
               "§3 defines the model on one source and one target sequence; an output that depends on the rest "
               "of the batch is a function of something else.")),
    Clause("model.eval-determinism", "5.4", "must",
           "In eval mode two identical calls agree exactly; in train mode dropout is the only "
           "source of randomness, so with dropout 0 train mode equals eval mode.",
           severity_reason=(
               "§5.4 applies dropout as a training regularizer; outside training the paper's model is a "
               "deterministic function of its input.")),
    Clause("model.output-normalization", "3.4", "must",
           "The output is what the implementation declares: log-probabilities or probabilities "
           "normalize over the vocabulary; declared logits are not already normalized (exactly one "
           "softmax, at the very end).",
           severity_reason=(
               "§3.4 ends with exactly one softmax over the vocabulary; a second one, or none where one is "
               "declared, gives another distribution.")),
    # --- attention ---------------------------------------------------------
    Clause("attention.scale", "3.2.1", "must",
           "Dot products of queries and keys are divided by sqrt(d_k), the per-head key size, "
           "before the softmax (not by sqrt(d_model), not omitted).", "Eq. (1)",
           severity_reason=(
               "Eq. (1) divides by sqrt(d_k); any other divisor changes every attention weight.")),
    Clause("attention.softmax-over-keys", "3.2.1", "must",
           "For each query the softmax runs over the keys, so the weights of one query sum to 1 "
           "over the keys it may attend to.", "Eq. (1)",
           severity_reason=(
               "Eq. (1) normalizes each query's scores over the keys; another axis gives other weights.")),
    Clause("attention.heads", "3.2.2", "must",
           "h heads of size d_k = d_model / h: head j uses rows j*d_k..(j+1)*d_k of the Q, K, V "
           "projections, attends separately, and the heads are concatenated per position before "
           "W^O; projections carry no bias.",
           severity_reason=(
               "§3.2.2 defines h heads of size d_model / h, each with its own slice of bias-free parameter "
               "matrices, concatenated before W^O; another split or layout is another function.")),
    Clause("attention.cross-source", "3.2.3", "must",
           "In encoder-decoder attention the queries come from the decoder's previous sub-layer and "
           "the keys and values from the output of the final encoder layer.",
           severity_reason=(
               "§3.2.3 states where encoder-decoder attention takes its queries, keys and values; other sources "
               "compute another function.")),
    # --- masks -------------------------------------------------------------
    Clause("mask.causal", "3.2.3", "must",
           "Decoder self-attention lets position i attend to positions up to and including i: "
           "the output at i depends on target tokens 0..i and on no later token.", "Fig. 2",
           severity_reason=(
               "§3.2.3 and Fig. 2 mask the subsequent positions and keep the diagonal; a decoder that sees "
               "later tokens, or not its own, computes another function.")),
    Clause("mask.source-padding", "3.2.3", "must",
           "Source padding is invisible: changing the padded source tokens or appending more "
           "padding changes no output at a real target position (masked scores are -inf before "
           "the softmax, in encoder self-attention and in cross-attention).",
           severity_reason=(
               "The paper's model reads the source sequence itself (§3); padding is batching, not input, so an "
               "output that padding moves is not the paper's function of that sequence.")),
    Clause("mask.target-padding", "3.2.3", "must",
           "Appending target padding leaves the outputs at the real target positions unchanged.",
           severity_reason=(
               "The prediction at a real target position is a function of the real target prefix (§3.1, "
               "§3.2.3); appended padding is not part of it.")),
    Clause("mask.finite", "3.2.3", "should",
           "No NaN or infinity appears for any padded input, including a fully padded sequence "
           "and low-precision (bfloat16) autocast; a query with no admissible key attends to "
           "nothing.",
           severity_reason=(
               "The paper never defines a fully padded (empty) sequence, and bfloat16 autocast is a portability "
               "matter; NaN at the real positions of an ordinary batch already fails the must clauses.")),
    # --- normalization and residuals ----------------------------------------
    Clause("norm.post-norm", "3.1", "must",
           "Each sub-layer's output is LayerNorm(x + Dropout(Sublayer(x))): the residual sum is "
           "normalized after the addition (post-norm), not before the sub-layer (pre-norm).",
           "§5.4",
           severity_reason=(
               "§3.1 and §5.4 state LayerNorm(x + Dropout(Sublayer(x))); pre-norm computes another function.")),
    Clause("norm.no-extra-norm", "3.1", "must",
           "There is exactly one layer norm per sub-layer: none after the embeddings, none at the "
           "top of either stack.",
           severity_reason=(
               "§3.1 and Fig. 1 name every layer norm of the model; an extra one (after the embeddings, on top "
               "of a stack) changes the output.")),
    Clause("norm.layer-norm", "3.1", "must",
           "Layer normalization runs over the d_model features of each position, with the biased "
           "variance and a per-feature gain and bias.",
           severity_reason=(
               "§3.1 cites the layer normalization of Ba et al.: biased statistics over the features of each "
               "position and a per-feature gain and bias; other statistics or a scalar gain compute another "
               "function.")),
    Clause("norm.epsilon", "3.1", "should",
           "Every layer norm adds the configured epsilon (ModelConfig.norm_eps) to the biased variance, "
           "inside the square root: (x - mean) / sqrt(var + eps).",
           severity_reason=(
               "The paper gives no epsilon (tensor2tensor adds 1e-6 to the variance inside the square root); "
               "using the configured value in that place is a convention that loaded weights and tolerances "
               "rely on.")),
    # --- feed-forward --------------------------------------------------------
    Clause("ffn.formula", "3.3", "must",
           "The position-wise feed-forward network is max(0, x W1 + b1) W2 + b2: two affine maps "
           "with biases and one ReLU between them, inner size d_ff.", "Eq. (2)",
           severity_reason=(
               "Eq. (2) gives the feed-forward network exactly; another activation, a missing bias or another "
               "inner size is another function.")),
    # --- embeddings and positions ---------------------------------------------
    Clause("embedding.scale", "3.4", "must",
           "Token embeddings are multiplied by sqrt(d_model) before the positional encoding is "
           "added.",
           severity_reason=(
               "§3.4 multiplies the embedding weights by sqrt(d_model); without it the embeddings and the "
               "positional encodings are mixed in other proportions.")),
    Clause("embedding.shared-weights", "3.4", "must",
           "When configured (share_embeddings), one matrix serves as the source embedding, the "
           "target embedding and the pre-softmax projection, with no bias on that projection.",
           severity_reason=(
               "§3.4 shares one weight matrix among both embeddings and the pre-softmax transformation; untied "
               "matrices are another model. (The check also rejects a pre-softmax bias, which §3.4 does not "
               "mention; tensor2tensor has none.)")),
    Clause("position.formula", "3.5", "must",
           "PE(pos, 2i) = sin(pos / 10000^(2i/d_model)) and PE(pos, 2i+1) = cos(pos / "
           "10000^(2i/d_model)): sines on even and cosines on odd dimensions, interleaved, "
           "positions counted from 0.",
           severity_reason=(
               "§3.5 gives the sinusoids exactly (sin on even, cos on odd dimensions, base 10000); another "
               "layout or frequency is another function, and weights do not carry over.")),
    Clause("position.added", "3.5", "must",
           "The positional encoding is added (not concatenated) exactly once to the scaled "
           "embeddings at the bottom of both the encoder and the decoder stacks.",
           severity_reason=(
               "§3.5 sums the encodings with the embeddings, once, at the bottom of each stack; concatenating "
               "or adding them elsewhere is another function.")),
    # --- regularization --------------------------------------------------------
    Clause("dropout.residual", "5.4", "must",
           "Dropout with rate P_drop acts on every sub-layer output before the residual addition "
           "and on the sums of embeddings and positional encodings, in training only.",
           severity_reason=(
               "§5.4 states the dropout sites and P_drop; dropping elsewhere, at another rate or not at all "
               "trains another model (outputs outside training are unaffected).")),
    Clause("dropout.extra-sites", "5.4", "should",
           "Dropout acts only at §5.4's sites: not on the attention weights and not between the feed-forward "
           "network's two layers.",
           severity_reason=(
               "§5.4 names two dropout sites for the base model and §6.3 mentions attention dropout only as tuned "
               "for parsing; tensor2tensor v1's transformer_base set attention and ReLU dropout to 0, later versions "
               "to 0.1. Extra sites depart from the paper's text but are common practice, and outputs outside "
               "training are unaffected.")),
    # --- stacks ----------------------------------------------------------------
    Clause("layers.independent", "3.1", "must",
           "Each stack has N layers with their own parameters (no sharing between layers or "
           "between sub-layers), applied in sequence, and the decoder's output is its last "
           "layer's output.",
           severity_reason=(
               "§3.1 stacks N layers and §3.3 gives each its own parameters; shared or skipped layers compute "
               "another function.")),
    # --- portability -------------------------------------------------------------
    Clause("device.portable", "-", "should",
           "Every tensor the model uses follows module.to(device): tables are buffers, masks are "
           "built on the input's device, and the model moved to the audit's device runs there.",
           severity_reason=(
               "The paper is silent on devices; following module.to(device) is PyTorch portability.")),
    Clause("device.parity", "-", "should",
           "The same weights and inputs give the same outputs and gradients on CPU and on an "
           "accelerator, within the float32 tolerance.",
           severity_reason=(
               "The paper is silent on hardware; the same results on CPU and on an accelerator, within the "
               "float32 tolerance, is portability.")),
    Clause("export.onnx", "-", "should",
           "The model exports to ONNX with dynamic batch and sequence lengths, and onnxruntime "
           "reproduces the PyTorch outputs on shapes other than the export example.",
           severity_reason=(
               "The paper is silent on deployment; an ONNX graph with dynamic shapes that reproduces the model "
               "is portability.")),
    # --- training ----------------------------------------------------------------
    Clause("train.gradients", "5", "must",
           "A loss on a padded batch gives every parameter a finite gradient, non-zero for every "
           "parameter that the paper's model uses.",
           severity_reason=(
               "§5 trains every parameter by gradient descent; a parameter that gets no gradient, or a "
               "non-finite one on an ordinary padded batch, is never learned as in the paper.")),
    Clause("train.equivalence", "5", "must",
           "Loaded with the reference's initial state (canonical schema) and trained with the reference's recipe "
           "(Adam with the paper's settings, Eq. (3), label smoothing 0.1, the shifted target) on the same batches "
           "with dropout 0, the implementation trains in lockstep with the reference: the loss of every update "
           "and the outputs after the last agree within the training tolerance (widened, where Adam amplifies "
           "float32 rounding beyond it, to a multiple of the reference's own rounding floor). The forward and "
           "the backward pass are judged together, the recipe apart (the other train clauses judge the "
           "implementation's own). Parameters the paper's model lacks (those load_reference_state sets to a "
           "fixed value) are held fixed.",
           severity_reason=(
               "§5 trains the paper's model by gradient descent on its loss; a backward pass that is not the "
               "forward's gradient (a detached path, a scaled branch, a parameter that never updates) trains "
               "another model from the same start.")),
    Clause("train.lr-schedule", "5.3", "must",
           "Update step_num = 1, 2, ... runs at the learning rate d_model^-0.5 * min(step_num^-0.5, "
           "step_num * warmup_steps^-1.5) with warmup_steps = 4000 (d_model the model's): linear warmup to a "
           "peak at update 4000, then decay as step_num^-0.5. step_num counts updates from 1 and advances "
           "once per update (not per epoch).", "Eq. (3)",
           severity_reason=(
               "§5.3 states Eq. (3) and warmup_steps = 4000; another schedule (another scale, a step counted "
               "from 0, a step per epoch) trains with other rates than the paper's results come from.")),
    Clause("train.optimizer", "5.3", "must",
           "The optimizer's updates are Adam's with beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9 and no weight "
           "decay for every parameter, whatever parameter group holds it (a matrix and a vector are probed: "
           "recipes often group them apart). The paper gives Adam's three settings and names no weight decay "
           "among its regularizers (§5.4).",
           severity_reason=(
               "§5.3 states Adam with beta1 = 0.9, beta2 = 0.98 and epsilon = 1e-9; torch's defaults (0.999, "
               "1e-8) or a weight decay change every update.")),
    Clause("train.label-smoothing", "5.4", "must",
           "The criterion trains each real target position towards 1 - eps_ls on the true class, eps_ls = 0.1, "
           "with eps_ls spread evenly over the classes, and padding targets towards nothing. The paper does "
           "not say how the mass is spread, so each common convention passes and is reported: eps/V on every "
           "class, the target included (Szegedy et al.), eps/(V-1) on every other class (tensor2tensor, the "
           "reference), eps/(V-2) on every other class but padding (the Annotated Transformer).",
           severity_reason=(
               "§5.4 states label smoothing of value 0.1 among the regularizers behind its BLEU; only how the "
               "mass is spread is left open, and every common spread passes.")),
    Clause("train.loss-padding", "5.4", "should",
           "Padding targets contribute nothing: appending padding to a batch changes neither the loss nor "
           "the gradient of any score.",
           severity_reason=(
               "The paper is silent on padding; tensor2tensor weights padding targets 0 and normalizes by the "
               "real tokens, and a loss that counts padding weighs each batch by its padding.")),
    Clause("train.shift", "3.1", "must",
           "Teacher forcing offsets the target by one position: the decoder input is a start symbol followed "
           "by the target without its last token and the labels are the target, so the output at position i "
           "is trained to predict target token i without seeing it.",
           severity_reason=(
               "§3.1 offsets the output embeddings by one position so that position i depends only on the "
               "outputs before it; an unshifted decoder input trains the model to copy the token it must "
               "predict.")),
    Clause("train.learns", "5", "should",
           "With its own recipe (the reference's for any piece it does not expose), starting from the "
           "reference's initial state when it can load canonical weights (from its own initialisation "
           "otherwise), the implementation at a tiny size (N = 1, d_model 32, h 4, d_ff 64, no dropout) "
           "learns to copy and to reverse 2 to 5 symbols in 150 updates of 64 sequences (Eq. (3) with warmup "
           "75): greedy decoding from the source alone, from the start symbol its recipe trains with, reproduces "
           "at least 50% of 200 held-out sequences exactly.",
           severity_reason=(
               "A capability the paper implies, not a sentence of it: the task, size, step budget and initial "
               "state are ours (the paper fixes no initialisation, and a tiny model's result hangs on it), and the "
               "clauses above say which piece fails when a model does not learn.")),
    # --- decoding (optional adapter methods, spec/contract.py) --------------------------
    Clause("decode.incremental", "3", "must",
           "A cached (incremental) decoder computes, at every step, the next-token distribution the full "
           "forward computes on the same prefix: the new token at position t, the prefix length (§3.5), "
           "self-attention over every earlier position, cross-attention over the final encoder output of the "
           "row's own source, at every position up to max_len, across padded sources, rows finished early and "
           "beam reordering.", "§3.5",
           severity_reason=(
               "§3's decoder is auto-regressive over the model's own function; a cache that computes another "
               "next-token distribution than the forward on the same prefix decodes with another model.")),
    Clause("decode.greedy", "6.1", "should",
           "Greedy decoding emits at each step the most probable token (padding excluded) under the full "
           "forward, stops a sequence at its end symbol and keeps it finished (padding only) while the others "
           "go on. The paper decodes with beam search; greedy search is the convention its beam of 1 reduces "
           "to.",
           severity_reason=(
               "The paper reports beam search only (§6.1); greedy search is the convention a beam of 1 reduces "
               "to, which users rely on but the paper never states.")),
    Clause("decode.beam", "6.1", "must",
           "Beam search with beam size 4 and length penalty alpha = 0.6 ranks hypotheses by their summed "
           "log-probabilities divided by GNMT's ((5 + |Y|) / 6)^alpha, keeps finished hypotheses aside and "
           "stops early when no live hypothesis can beat them, bounding the live ones by lp(maximum length) "
           "(tensor2tensor's procedure, 2K candidates per step): its outputs equal the reference beam search's "
           "on the same scores, token for token, wherever no tie decides.",
           severity_reason=(
               "§6.1 states beam 4 and GNMT's length penalty with alpha = 0.6; another ranking chooses other "
               "outputs than the procedure the paper's BLEU scores come from.")),
    Clause("decode.max-length", "6.1", "must",
           "Unless told otherwise, an output (end symbol included) is at most its source's real (non-pad) "
           "length + 50 tokens long, for greedy and beam search alike.",
           severity_reason=(
               "§6.1 states the maximum output length, input length + 50; another limit cuts or extends "
               "outputs the paper's procedure would not.")),
    # --- configuration -----------------------------------------------------------
    Clause("config.parameters", "3", "must",
           "The parameters match the canonical schema's shapes for the configuration, and the "
           "base preset's total is Table 3's 65M within 5% (the paper's figure is rounded and "
           "depends on the vocabulary).", "Table 3",
           severity_reason=(
               "Table 3, §3.2.2 and §3.3 fix every matrix's shape, and the attention equations carry no bias; "
               "extra or missing parameters are another model.")),
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


def parse_clause_ids(value: str) -> list[str]:
    """The clause ids of a ``--clause`` value (``ID`` or ``a,b``): ValueError naming the unknown ones and the
    known ids otherwise. The one parser of ``pytest conformance/ --clause`` and ``aiayn audit --clause``."""
    ids = [c.strip() for c in value.split(",") if c.strip()]
    unknown = [c for c in ids if c not in CLAUSES]
    if unknown or not ids:
        raise ValueError(f"unknown clause {', '.join(map(repr, unknown)) or repr(value)}; known: {', '.join(CLAUSES)}")
    return ids
