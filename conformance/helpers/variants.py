"""Reference variants: the paper's model with named departures, to say what an implementation does instead.

``run_variant(knobs, state, config, src, tgt)`` computes the paper's Transformer
(§3) functionally, in float64, from a canonical state dict (``spec.schema``
names), with each ``Knobs`` field switching one part to a departure seen in
real code. The default ``Knobs()`` is the paper's model (it agrees with
``reference/model.py``: tests/test_variants.py keeps them equal, and the
reference's own diagnosis would show any difference as a departure). Variants exist to *name* a
failure ("matches the reference with attention scale 1/sqrt(d_model)"),
never to accept one; the reference itself holds no flags.

``diagnose`` searches the variants for one that reproduces an
implementation holding the same weights: single departures first, then
greedy combinations, each step keeping the departure that brings the
variant closest to the implementation. Where a part of the implementation
cannot be named by any variant (a learned positional table, a table offset by
a padding index), ``Parts`` substitutes what the implementation exposes of
itself (its own table, its own encoder output), so the rest can still be
named; ``conformance.helpers.diagnosis`` chains these substitutions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.tolerance import compare

from . import oracles

__all__ = ["Knobs", "KNOBS", "Parts", "run_variant", "float64_state", "Diagnosis", "diagnose", "IMPROVEMENT",
           "MAX_VARIANTS"]


@dataclass(frozen=True)
class Knob:
    """One departure axis: the paper's value first, the clause it belongs to, and what each value means."""

    name: str
    clause: str
    values: dict[str, str]  # value -> description, the paper's value first


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("scale", "attention.scale", {
        "1/sqrt(d_k)": "scores divided by sqrt(d_k)",
        "1/sqrt(d_model)": "scores divided by sqrt(d_model) instead of sqrt(d_k) (an extra factor 1/sqrt(h))",
        "1": "scores not scaled at all",
        "sqrt(d_k)": "scores multiplied by sqrt(d_k) (the scale inverted)"}),
    Knob("softmax_axis", "attention.softmax-over-keys", {
        "keys": "softmax over the keys", "queries": "softmax over the queries instead of the keys"}),
    Knob("weights", "attention.softmax-over-keys", {
        "per key": "each value weighted by its key's softmax weight",
        "summed out": "the weights summed out (einsum 'bhqk,bvhd' with two key letters): every query gets the sum "
                      "of ALL values, whatever the scores"}),
    Knob("heads", "attention.heads", {
        "transpose": "heads split and merged per position",
        "merge-without-transpose": "heads merged with reshape but no transpose (positions mixed)",
        "split-without-transpose": "heads split and merged with view/reshape but no transpose (positions mixed)"}),
    Knob("cross_memory", "attention.cross-source", {
        "final": "cross-attention keys/values from the final encoder output",
        "first-layer": "cross-attention keys/values from the FIRST encoder layer's output"}),
    Knob("cross_query", "attention.cross-source", {
        "previous": "cross-attention queries from the decoder's previous sub-layer",
        "layer-input": "cross-attention queries from the decoder layer's input (before self-attention)"}),
    Knob("norm_place", "norm.post-norm", {
        "post": "LayerNorm(x + Sublayer(x)) (post-norm)", "pre": "x + Sublayer(LayerNorm(x)) (pre-norm)"}),
    Knob("residual", "norm.post-norm", {
        "once": "each sub-layer adds its input once", "twice": "the residual added twice in every sub-layer: "
                                                                "LayerNorm(x + x + Sublayer(x))"}),
    Knob("ffn_residual", "norm.post-norm", {
        "input": "the FFN residual adds the sub-layer input",
        "sublayer-output": "the FFN residual adds the FFN output to itself (LayerNorm(F(x) + F(x)))"}),
    Knob("final_norm", "norm.no-extra-norm", {
        "no": "no norm at the top of the stacks", "yes": "an extra LayerNorm at the top of each stack"}),
    Knob("embed_norm", "norm.no-extra-norm", {
        "no": "no norm after the embeddings", "yes": "an extra LayerNorm right after embedding + PE"}),
    Knob("ln_form", "norm.layer-norm", {
        "paper": "(x - mean) / sqrt(biased var + eps)",
        "unbiased-std": "(x - mean) / (unbiased std + eps)"}),
    Knob("ln_bias", "norm.layer-norm", {
        "applied": "every layer norm adds its per-feature bias",
        "none": "layer norms without a bias term (gain only: the canonical norm biases are not applied)"}),
    Knob("cross_norm", "layers.independent", {
        "own": "the cross-attention sub-layer has its own norm",
        "self-attention's": "the cross-attention sub-layer reuses the self-attention sub-layer's norm"}),
    Knob("enc_ffn_norm", "layers.independent", {
        "own": "the encoder's FFN sub-layer has its own norm",
        "self-attention's": "the encoder's FFN sub-layer reuses the self-attention sub-layer's norm (norm1 "
                            "applied twice, norm2 never)"}),
    Knob("dec_ffn_norm", "layers.independent", {
        "own": "the decoder's FFN sub-layer has its own norm",
        "cross-attention's": "the decoder's FFN sub-layer reuses the cross-attention sub-layer's norm (norm2 "
                             "applied twice, norm3 never)"}),
    Knob("activation", "ffn.formula", {
        "relu": "max(0, x W1 + b1) W2 + b2", "gelu": "GELU instead of ReLU", "silu": "SiLU (swish) instead of ReLU",
        "identity": "no activation between W1 and W2",
        "relu-after-w2": "ReLU after W2 instead of between W1 and W2"}),
    Knob("embed_scale", "embedding.scale", {
        "sqrt(d_model)": "embeddings multiplied by sqrt(d_model)", "1": "embeddings not scaled",
        "1/sqrt(d_model)": "embeddings divided by sqrt(d_model)"}),
    Knob("pe", "position.added", {
        "once": "PE added once at the bottom of both stacks", "absent": "no positional encoding at all",
        "twice": "PE added twice in both stacks", "encoder-only": "PE added to the encoder input only",
        "decoder-only": "PE added to the decoder input only"}),
    Knob("pe_form", "position.formula", dict(oracles.PE_FORMS)),
    Knob("mask_fill", "mask.source-padding", {
        "-inf": "masked scores set to -inf", "~0": "masked scores set to a tiny value (1e-9) instead of -inf"}),
    Knob("causal", "mask.causal", {
        "inclusive": "position i attends to 0..i", "none": "no causal mask",
        "strict": "position i attends to 0..i-1 (diagonal excluded)",
        "strict, finite fill": "position i attends to 0..i-1 (diagonal excluded) with a finite mask fill such as "
                               "-1e9, so position 0, left with no admissible key, attends to every target position"}),
    Knob("cross_mask", "mask.source-padding", {
        "yes": "source padding masked in cross-attention", "no": "no source mask in cross-attention"}),
    Knob("logit_scale", "embedding.shared-weights", {
        "1": "logits = h E^T", "1/sqrt(d_model)": "logits multiplied by 1/sqrt(d_model) (a scaled tied projection)"}),
    Knob("output_softmax", "model.output-normalization", {
        "no": "the declared output", "yes": "a softmax applied to the declared logits (probabilities returned)"}),
)}

PAPER: dict[str, str] = {name: next(iter(k.values)) for name, k in KNOBS.items()}


@dataclass(frozen=True)
class Knobs:
    """One variant: a value per knob (``KNOBS``); the defaults are the paper's."""

    scale: str = "1/sqrt(d_k)"
    softmax_axis: str = "keys"
    weights: str = "per key"
    heads: str = "transpose"
    cross_memory: str = "final"
    cross_query: str = "previous"
    norm_place: str = "post"
    residual: str = "once"
    ffn_residual: str = "input"
    final_norm: str = "no"
    embed_norm: str = "no"
    ln_form: str = "paper"
    ln_bias: str = "applied"
    cross_norm: str = "own"
    enc_ffn_norm: str = "own"
    dec_ffn_norm: str = "own"
    activation: str = "relu"
    embed_scale: str = "sqrt(d_model)"
    pe: str = "once"
    pe_form: str = "paper"
    mask_fill: str = "-inf"
    causal: str = "inclusive"
    cross_mask: str = "yes"
    logit_scale: str = "1"
    output_softmax: str = "no"

    def departures(self) -> dict[str, str]:
        """knob -> value for every knob that is not the paper's."""
        return {n: v for n, v in dataclasses.asdict(self).items() if v != PAPER[n]}

    def describe(self) -> str:
        return "; ".join(KNOBS[n].values[v] for n, v in self.departures().items()) or "the paper's model"


if {f.name: f.default for f in dataclasses.fields(Knobs)} != PAPER:  # one list of knobs, two spellings
    raise RuntimeError("conformance.helpers.variants: Knobs' fields and defaults must be KNOBS' names and first values")


# --------------------------------------------------------------------------------------------------
# The functional model
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Parts:
    """Parts of an implementation substituted into the variants: what it shows of itself.

    ``pe`` is its own positional table (``positional_encoding(length)``, [L, d_model], L at least the
    longest input): the variants add it instead of a §3.5 form (``pe_form`` is then moot). ``memory`` is its
    own encoder output on the diagnosed source batch (``encode(src)``, [B, S, d_model]): the decoder is
    diagnosed alone, reading it. A substituted part is judged by its own clause (position.formula reads the
    table), so the rest of the model can still be attributed.
    """

    pe: Tensor | None = None
    memory: Tensor | None = None

    def describe(self) -> list[str]:
        """What is substituted, one phrase per part ("its own positional table (positional_encoding)")."""
        out = []
        if self.pe is not None:
            out.append("its own positional table (positional_encoding(length))")
        if self.memory is not None:
            out.append("its own encoder output (encode(src)), so that the decoder is diagnosed alone")
        return out


def float64_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``state`` in float64; tensors already float64 are kept, not copied. One such copy serves every variant of a
    search (converting the weights costs several forwards of a variant: at base 0.25 s against 0.07 s)."""
    return {name: t.detach().to(torch.float64) for name, t in state.items()}


class _Run:
    """One forward pass of a variant over a canonical state dict, in float64."""

    def __init__(self, knobs: Knobs, state: Mapping[str, Tensor], config: ModelConfig,
                 parts: Parts | None = None) -> None:
        self.k, self.cfg, self.parts = knobs, config, parts or Parts()
        self.p = float64_state(state)

    def norm(self, x: Tensor, prefix: str | None) -> Tensor:
        """§3.1 layer norm (``ln_form``, ``ln_bias``); prefix None: a parameter-free norm (gain 1, bias 0)."""
        zeros = torch.zeros(x.size(-1), dtype=x.dtype)
        if prefix is None:
            weight, bias = torch.ones(x.size(-1), dtype=x.dtype), zeros
        else:
            weight, bias = self.p[f"{prefix}.weight"], self.p[f"{prefix}.bias"]
        if self.k.ln_bias == "none":
            bias = zeros
        return oracles.layer_norm(x, weight, bias, self.cfg.norm_eps, form=self.k.ln_form)

    def attention(self, prefix: str, query: Tensor, memory: Tensor, mask: Tensor | None,
                  fill: float | None = None) -> Tensor:
        """§3.2.2 multi-head attention; mask (B|1, 1, Lq|1, Lk), True = may attend; ``fill`` a finite value for
        masked scores (None: -inf, a row with no admissible key attends to nothing)."""
        h, d, d_k, d_v = self.cfg.n_heads, self.cfg.d_model, self.cfg.d_k, self.cfg.d_v
        B, Lq, Lk = query.size(0), query.size(1), memory.size(1)

        def split(x: Tensor, L: int, width: int) -> Tensor:
            if self.k.heads == "split-without-transpose":
                return x.reshape(B, h, L, width)  # (B, h, L, d_k or d_v), positions mixed
            return x.reshape(B, L, h, width).transpose(1, 2)  # (B, h, L, d_k or d_v)

        q = split(query @ self.p[f"{prefix}.q.weight"].T, Lq, d_k)
        k = split(memory @ self.p[f"{prefix}.k.weight"].T, Lk, d_k)
        v = split(memory @ self.p[f"{prefix}.v.weight"].T, Lk, d_v)
        scale = {"1/sqrt(d_k)": d_k ** -0.5, "1/sqrt(d_model)": d ** -0.5, "1": 1.0,
                 "sqrt(d_k)": d_k ** 0.5}[self.k.scale]
        if self.k.mask_fill == "~0":
            fill = 1e-9
        weights = oracles.attention_weights(q, k, mask, scale=scale, axis=self.k.softmax_axis,
                                            fill=fill)  # (B, h, Lq, Lk)
        if self.k.weights == "per key":
            heads = weights @ v  # (B, h, Lq, d_v)
        else:
            heads = weights.sum(-1, keepdim=True) * v.sum(-2, keepdim=True)  # (B, h, Lq, d_v)
        if self.k.heads == "transpose":
            concat = heads.transpose(1, 2).reshape(B, Lq, h * d_v)  # (B, Lq, h d_v)
        else:
            concat = heads.reshape(B, Lq, h * d_v)  # (B, Lq, h d_v), positions mixed
        return concat @ self.p[f"{prefix}.o.weight"].T

    def ffn(self, prefix: str, x: Tensor) -> Tensor:
        """§3.3, Eq. (2) with ``activation``; "relu-after-w2" is no activation inside and a ReLU after W2."""
        after_w2 = self.k.activation == "relu-after-w2"
        return oracles.feed_forward(x, self.p[f"{prefix}.w1.weight"], self.p[f"{prefix}.w1.bias"],
                                    self.p[f"{prefix}.w2.weight"], self.p[f"{prefix}.w2.bias"],
                                    activation="identity" if after_w2 else self.k.activation, after_w2=after_w2)

    def sublayer(self, x: Tensor, norm: str, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """§3.1 residual and norm around fn (post-norm or pre-norm; the residual once or twice)."""
        residual = 2 * x if self.k.residual == "twice" else x
        if self.k.norm_place == "pre":
            return residual + fn(self.norm(x, norm))
        out = fn(x)
        return self.norm(residual + out, norm)

    def embed(self, tokens: Tensor, table: str, stack: str) -> Tensor:
        """§3.4, §3.5: scaled embeddings plus the positional table (per ``pe``; the substituted one if any)."""
        d, L = self.cfg.d_model, tokens.size(1)
        scale = {"sqrt(d_model)": math.sqrt(d), "1": 1.0, "1/sqrt(d_model)": 1 / math.sqrt(d)}[self.k.embed_scale]
        x = self.p[f"{table}.weight"][tokens] * scale  # (B, L, d_model)
        times = {"once": 1, "absent": 0, "twice": 2, "encoder-only": int(stack == "encoder"),
                 "decoder-only": int(stack == "decoder")}[self.k.pe]
        if times:
            pe = (self.parts.pe[:L].to(torch.float64) if self.parts.pe is not None
                  else oracles.pe_table(L, d, form=self.k.pe_form))  # (L, d_model)
            x = x + times * pe
        return self.norm(x, None) if self.k.embed_norm == "yes" else x

    def encoder(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """(final encoder output, first layer's output), each (B, S, d_model)."""
        mask = (src != self.cfg.pad_id)[:, None, None, :]  # (B, 1, 1, S)
        x = self.embed(src, "src_embed", "encoder")
        outputs = []
        for i in range(self.cfg.n_layers):
            pre = f"encoder.{i}"

            def self_attention(t: Tensor, pre: str = pre) -> Tensor:
                return self.attention(f"{pre}.self_attn", t, t, mask)

            x = self.sublayer(x, f"{pre}.norm1", self_attention)
            x = self.ffn_sublayer(x, pre, "norm1" if self.k.enc_ffn_norm == "self-attention's" else "norm2")
            outputs.append(x)
        if self.k.final_norm == "yes":
            x = self.norm(x, None)
        return x, outputs[0]

    def ffn_sublayer(self, x: Tensor, pre: str, norm: str) -> Tensor:
        if self.k.ffn_residual == "sublayer-output" and self.k.norm_place == "post":
            out = self.ffn(f"{pre}.ffn", x)
            return self.norm(out + out, f"{pre}.{norm}")
        return self.sublayer(x, f"{pre}.{norm}", lambda t: self.ffn(f"{pre}.ffn", t))

    def forward(self, src: Tensor, tgt: Tensor) -> tuple[Tensor, Tensor]:
        """(log-probabilities (B, T, V), final encoder output (B, S, d_model))."""
        if self.parts.memory is not None:
            final = first = self.parts.memory.to(torch.float64)
        else:
            final, first = self.encoder(src)
        memory = final if self.k.cross_memory == "final" else first
        T = tgt.size(1)
        ones = torch.ones(T, T, dtype=torch.bool)
        causal = ones.tril() if self.k.causal == "inclusive" else ones if self.k.causal == "none" else ones.tril(-1)
        self_fill = -1e9 if self.k.causal == "strict, finite fill" else None
        tgt_mask = causal[None, None] & (tgt != self.cfg.pad_id)[:, None, None, :]  # (B, 1, T, T)
        src_mask = (src != self.cfg.pad_id)[:, None, None, :] if self.k.cross_mask == "yes" else None
        y = self.embed(tgt, "tgt_embed", "decoder")
        for i in range(self.cfg.n_layers):
            pre = f"decoder.{i}"
            layer_in = y

            def self_attention(t: Tensor, pre: str = pre) -> Tensor:
                return self.attention(f"{pre}.self_attn", t, t, tgt_mask, self_fill)

            def cross(t: Tensor, pre: str = pre, layer_in: Tensor = layer_in) -> Tensor:
                query = layer_in if self.k.cross_query == "layer-input" else t
                return self.attention(f"{pre}.cross_attn", query, memory, src_mask)

            y = self.sublayer(y, f"{pre}.norm1", self_attention)
            norm2 = f"{pre}.norm1" if self.k.cross_norm == "self-attention's" else f"{pre}.norm2"
            y = self.sublayer(y, norm2, cross)
            y = self.ffn_sublayer(y, pre, "norm2" if self.k.dec_ffn_norm == "cross-attention's" else "norm3")
        if self.k.final_norm == "yes":
            y = self.norm(y, None)
        logits = y @ self.p["generator.weight"].T  # (B, T, V)
        if self.k.logit_scale != "1":
            logits = logits / math.sqrt(self.cfg.d_model)
        if self.k.output_softmax == "yes":
            logits = torch.softmax(logits, dim=-1)
        return torch.log_softmax(logits, dim=-1), final


def run_variant(knobs: Knobs, state: Mapping[str, Tensor], config: ModelConfig, src: Tensor,
                tgt: Tensor, parts: Parts | None = None) -> tuple[Tensor, Tensor]:
    """(log-probabilities [B, T, V], final encoder output [B, S, d_model]) of the variant, float64, with the
    implementation's own ``parts`` substituted where given."""
    with torch.no_grad():
        return _Run(knobs, state, config, parts).forward(src, tgt)


# --------------------------------------------------------------------------------------------------
# Diagnosis: which variant reproduces the implementation
# --------------------------------------------------------------------------------------------------
# The diagnosis reports only what it has shown (see ``diagnose``):
# A single departure is listed beside an unexplained implementation only when on its own it removes most of the
# difference: it brings the mean |diff| down by more than half. One that removes less is noise a measurement cannot
# tell from a departure the implementation has (a bias, a scale, another norm each move the output somewhat).
IMPROVEMENT = 0.5
MAX_VARIANTS = 600  # variants one diagnosis may run, its substitutions included: a float64 forward each on the
# witness batch, measured 0.07 s at base and 0.17 s at big (a whole budget: 40 s at base, within its check's 120 s)


@dataclass
class Diagnosis:
    """What the variant search has shown about an implementation on one input.

    ``exact``: a variant reproduces the implementation within the model tolerance (log-probabilities, and the
    encoder output when the adapter has ``encode``), and every one of its departures earns its place: with any
    one of them put back to the paper's value, the variant no longer reproduces it. Only then are ``knobs``
    (that variant) reported. Otherwise the implementation is unexplained: ``knobs`` is the paper's model,
    ``distance`` how far it is still off (mean |difference|, ``detail`` the comparison) and ``helped`` the single
    departures that each removed most of that difference on their own (more than ``IMPROVEMENT`` of the mean
    |diff|), the one removing the most first (measurements, not attributions). ``tried`` counts the variants run;
    ``weights`` names the canonical weights the search ran on; ``substituted`` the implementation's own parts the
    variants used, in the order the diagnosis took them (each earning its place as the departures do); ``searched``
    every part the search tried substituting.
    """

    knobs: Knobs
    exact: bool
    distance: float
    detail: str
    tried: int
    weights: str = "visible weights"
    substituted: tuple[str, ...] = ()
    baseline: float = float("nan")
    helped: tuple[str, ...] = ()
    searched: tuple[str, ...] = ()
    bounded: bool = False

    @property
    def matches_paper(self) -> bool:
        return self.exact and not self.knobs.departures()

    def departures_for(self, clause_id: str) -> dict[str, str]:
        """The departures of the explaining variant that belong to ``clause_id`` (knob -> value); none when the
        implementation is unexplained."""
        if not self.exact:
            return {}
        return {n: v for n, v in self.knobs.departures().items() if KNOBS[n].clause == clause_id}


# Departures that come together in real code, tried as one move.
_PAIRED_MOVES: tuple[dict[str, str], ...] = (
    {"norm_place": "pre", "final_norm": "yes"},
)


# Knobs a substituted part makes moot: the table's form once its own table is used; what only the encoder
# computes once its own encoder output is read.
_MOOT = {"pe": ("pe_form",), "memory": ("enc_ffn_norm", "cross_memory")}


def _moves(current: Knobs, parts: Parts) -> list[Knobs]:
    moot = {n for part, names in _MOOT.items() if getattr(parts, part) is not None for n in names}
    out = []
    for name, knob in KNOBS.items():
        if name in moot:
            continue
        for value in knob.values:
            if value != getattr(current, name):
                out.append(dataclasses.replace(current, **{name: value}))
    for pair in _PAIRED_MOVES:
        out.append(dataclasses.replace(current, **pair))
    return out


def _gap(got: Tensor, expected: Tensor, real: Tensor) -> tuple[float, bool, str]:
    """(mean |diff| over comparable entries, within tolerance, description); ``real`` broadcasts over got."""
    real = real & torch.isfinite(got)
    if not bool(real.any()):
        return float("inf"), False, "no finite output at a real position"
    a, e = torch.where(real, got, 0.0), torch.where(real, expected, 0.0)
    a, e = a.nan_to_num(0.0), e.nan_to_num(1e6, posinf=1e6, neginf=-1e6)
    cmp = compare(a, e, dtype=torch.float32, scope="model")
    return float((a - e).abs().sum() / real.expand_as(a).sum()), cmp.ok, cmp.describe()


class _BudgetSpent(Exception):
    """The search has run ``MAX_VARIANTS`` variants."""


def _prune(best: Knobs, measure: Callable[[Knobs], tuple[float, bool, str]]) -> Knobs:
    """Put back to the paper's value, one at a time, every departure the exact variant ``best`` still matches
    without: what is left are departures each of which the match needs."""
    changed = True
    while changed:
        changed = False
        for name in best.departures():
            lighter = dataclasses.replace(best, **{name: PAPER[name]})
            if measure(lighter)[1]:
                best, changed = lighter, True
                break
    return best


def _helpers(measure: Callable[[Knobs], tuple[float, bool, str]], parts: Parts, baseline: float) -> tuple[str, ...]:
    """The single departures from the paper's model that each remove most of its difference from the implementation
    on their own (more than ``IMPROVEMENT`` of the mean |diff| ``baseline``), the one removing the most first."""
    found = []
    for knobs in _moves(Knobs(), parts):
        d = measure(knobs)[0]
        if d < baseline * (1 - IMPROVEMENT):
            found.append((d, knobs.describe()))
    return tuple(f"{what} (removes {1 - d / baseline:.0%}: mean |diff| {d:.3g} instead of {baseline:.3g})"
                 for d, what in sorted(found)[:4])


def diagnose(observe: Callable[[Tensor, Tensor], tuple[Tensor, Tensor | None]], state: Mapping[str, Tensor],
             config: ModelConfig, src: Tensor, tgt: Tensor, *, parts: Parts | None = None,
             start: Knobs | None = None, max_departures: int = 8, max_variants: int = MAX_VARIANTS,
             helpers: bool = True) -> Diagnosis:
    """Search the variants for the one that reproduces ``observe(src, tgt)`` -> (log-probs, encoder output or None).

    Greedy: start from ``start`` (default the paper's model); at each step try every single departure (and the
    paired ones) from the current variant and keep the closest, until one agrees within tolerance or none
    brings it closer by 2%. A variant found is then pruned (``_prune``): a departure it reproduces the
    implementation without is dropped, so every departure reported is one the match needs. When none agrees,
    the result is unexplained and names no departure, only those that helped on their own (``_helpers``).
    ``parts`` are the implementation's own parts to substitute (its encoder output, when substituted, is not
    compared again). At most ``max_variants`` variants run (``Diagnosis.bounded`` says the budget ran out), plus,
    when ``helpers`` and unexplained, one per single departure.
    """
    parts = parts or Parts()
    state = float64_state(state)
    got_lp, got_enc = observe(src, tgt)
    if parts.memory is not None:
        got_enc = None
    real_t = (tgt != config.pad_id)[..., None]  # (B, T, 1)
    real_s = (src != config.pad_id)[..., None]  # (B, S, 1)
    seen: dict[tuple[bool, Knobs], tuple[float, bool, str]] = {}
    limit = [max_variants]

    def run(knobs: Knobs, encoder_only: bool) -> tuple[float, bool, str]:
        if (encoder_only, knobs) in seen:
            return seen[encoder_only, knobs]
        if len(seen) >= limit[0]:
            raise _BudgetSpent
        lp, enc = run_variant(knobs, state, config, src, tgt, parts)
        if encoder_only:
            assert got_enc is not None
            result = _gap(got_enc, enc, real_s)
        else:
            d_lp, ok_lp, desc = _gap(got_lp, lp, real_t)
            result = (d_lp, ok_lp, desc)
            if got_enc is not None:
                d_enc, ok_enc, desc_enc = _gap(got_enc, enc, real_s)
                result = (d_lp + d_enc, ok_lp and ok_enc, desc if not ok_lp else desc_enc)
        seen[encoder_only, knobs] = result
        return result

    def score(knobs: Knobs) -> tuple[float, bool, str]:
        return run(knobs, False)

    def climb(start: Knobs, measure: Callable[[Knobs], tuple[float, bool, str]]) -> Knobs:
        best = start
        best_d, best_ok, _ = measure(best)
        for _ in range(max_departures):
            if best_ok:
                break
            scored = [(measure(k), k) for k in _moves(best, parts)]
            exact = [(s, k) for s, k in scored if s[1]]
            (d, ok, _), k = min(exact or scored, key=lambda sk: sk[0][0])
            if not ok and d >= best_d * 0.98:
                break
            best, best_d, best_ok = k, d, ok
        return best

    baseline, base_ok, base_desc = score(Knobs())
    best, bounded = start or Knobs(), False
    try:
        if got_enc is not None:  # the encoder alone first: fewer departures at a time, each one clearer
            best = climb(best, lambda k: run(k, True))
        best = climb(best, score)
        if score(best)[1]:
            best = _prune(best, score)
    except _BudgetSpent:
        bounded = True
    d, ok, desc = score(best) if (False, best) in seen else (baseline, base_ok, base_desc)
    diag = Diagnosis(best, ok, d, desc, len(seen), substituted=tuple(parts.describe()), baseline=baseline,
                     bounded=bounded)
    if not ok:
        if helpers:
            limit[0] = len(seen) + len(_moves(Knobs(), parts))  # the single departures are always measured
            diag.helped = _helpers(score, parts, baseline)
        diag.knobs, diag.distance, diag.detail, diag.tried = Knobs(), baseline, base_desc, len(seen)
    return diag
