"""Deliberately broken models: one bug each, each declaring the clauses it must break.

A plugin for the suite's own tests (``--plugin tests/broken_models.py``). Every
model here is the reference Transformer with exactly one bug of a kind real
implementations carry. Each registers as ``broken-<bug>`` and declares as
deviations the clauses that bug breaks. A run of the whole conformance suite
over them exits 0 only if, for every model, each declared clause is observed
failing (declarations are strict per clause) and no other clause fails: the
suite catches each bug by the clause it breaks and accuses none of the rest.

``model.reference-equivalence`` is declared wherever the bug changes the
function the model computes on padded batches with the canonical weights,
since the differential check must see it too. ``train.learns`` (two short
trainings) runs only on ``LEARNS_MODELS``, which alone declare it.

The models here are registered without the reference's decoding methods
(``begin_decoding``, ``decode_step``, ``reorder_state``, ``generate``): those
would run the paper's layers over a key/value cache, not the broken ones, a
second bug unrelated to the one under test. Decoding bugs live in
``tests/broken_decoders.py``. Nor do they expose the reference's training
recipe (``spec.contract.RECIPE_METHODS``): ``train.learns`` trains them with the
reference's recipe read through their declared output kind (so a model whose
output is not what it declares is trained wrongly, as a user's loop would);
recipe bugs live in ``tests/broken_recipes.py``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn_conformance.implementations import Implementation, hookimpl
from aiayn_conformance.reference.model import (
    DecoderLayer,
    EncoderLayer,
    LayerNorm,
    MultiHeadAttention,
    PositionwiseFeedForward,
    Transformer,
    causal_mask,
    padding_mask,
    sinusoid_table,
)
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.contract import RECIPE_METHODS

EQ = "model.reference-equivalence"
LEARNS = "train.learns"
TRAINS = "train.equivalence"

# The models train.learns runs on in tests/test_broken_models.py (two short trainings each cost seconds): the
# bugs it must catch, and bugs it must not accuse. Only these may declare train.learns.
LEARNS_MODELS = ("fill-1e-9", "softmax-over-queries", "heads-no-transpose", "no-positions", "no-causal-mask",
                 "logits-as-probs", "pre-norm", "scale-d-model", "cross-no-source-mask")


# -- attention kernels with one bug --------------------------------------------------------------------------
def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, scale: float | None = None,
            fill: float = float("-inf"), dim: int = -1, guard: bool = True) -> Tensor:
    """Eq. (1) with knobs: the divisor, the masked fill value, the softmax axis, the empty-row guard."""
    scores = q @ k.transpose(-2, -1) / (scale if scale is not None else math.sqrt(q.size(-1)))  # (B, h, Lq, Lk)
    if mask is None:
        return torch.softmax(scores, dim=dim) @ v
    empty = ~mask.any(dim=-1, keepdim=True) if guard else torch.zeros_like(mask[..., :1])
    scores = scores.masked_fill(~(mask | empty), fill)
    weights = torch.softmax(scores, dim=dim).masked_fill(empty, 0.0)  # (B, h, Lq, Lk)
    if dim != -1:  # a column of -inf over the queries is NaN: zero the masked weights, as such code does
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v  # (B, h, Lq, d_v)


def with_attention(**knobs) -> Callable[[ModelConfig], Transformer]:
    def build(cfg: ModelConfig) -> Transformer:
        kw = dict(knobs)
        if kw.pop("scale_by_d_model", False):
            kw["scale"] = math.sqrt(cfg.d_model)
        return Transformer(cfg, attention=partial(_attend, **kw))
    return build


# -- multi-head attention: heads merged with a reshape and no transpose --------------------------------------
class NoTransposeMHA(MultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        q, k, v = (self.split_heads(f(x)) for f, x in ((self.q, query), (self.k, key), (self.v, value)))
        heads = self.attention(q, k, v, mask)  # (B, h, Lq, d_v)
        B, _, Lq, _ = heads.shape
        return self.o(heads.reshape(B, Lq, self.h * self.d_k))  # BUG: (B, h, Lq, d_v) read as (B, Lq, h*d_v)


class OneQuerySliceMHA(MultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        q = self.split_heads(self.q(query))[:, :1].expand(-1, self.h, -1, -1)  # BUG: head 0's queries for every head
        k, v = self.split_heads(self.k(key)), self.split_heads(self.v(value))
        heads = self.attention(q, k, v, mask)  # (B, h, Lq, d_v)
        B, _, Lq, _ = heads.shape
        return self.o(heads.transpose(1, 2).reshape(B, Lq, self.h * self.d_k))


class HalfTheHeadsMHA(MultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        h = max(1, self.h // 2)  # BUG: h / 2 heads of 2 d_k features (the scale kept at 1/sqrt(d_k))
        q, k, v = (f(x).view(*x.shape[:2], h, -1).transpose(1, 2) for f, x in
                   ((self.q, query), (self.k, key), (self.v, value)))  # (B, h/2, L, 2 d_k)
        heads = _attend(q, k, v, mask, scale=math.sqrt(self.d_k))  # (B, h/2, Lq, 2 d_v)
        B, _, Lq, _ = heads.shape
        return self.o(heads.transpose(1, 2).reshape(B, Lq, self.h * self.d_k))


def with_mha(cls: type[MultiHeadAttention]) -> Callable[[ModelConfig], Transformer]:
    def build(cfg: ModelConfig) -> Transformer:
        model = Transformer(cfg)
        for m in model.modules():
            if type(m) is MultiHeadAttention:
                m.__class__ = cls
        return model
    return build


class ValueFromQueryMHA(MultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        q, k = self.split_heads(self.q(query)), self.split_heads(self.k(key))
        v = self.split_heads(self.v(query))  # BUG: the values projected from the query's input, not `value`
        eye = torch.eye(k.size(-2), dtype=k.dtype, device=k.device).expand(*k.shape[:2], -1, -1)
        weights = self.attention(q, k, eye, mask)  # Eq. (1)'s weights, (B, h, Lq, Lk)
        heads = torch.einsum("bhqk,bhqd->bhqd", weights, v)  # each query's weights applied to its own value
        B, _, Lq, _ = heads.shape
        return self.o(heads.transpose(1, 2).reshape(B, Lq, self.h * self.d_k))


def cross_value_from_query(cfg: ModelConfig) -> Transformer:
    model = Transformer(cfg)
    for layer in model.decoder:
        layer.cross_attn.__class__ = ValueFromQueryMHA  # only cross-attention: self-attention's query is its value
    return model


heads_no_transpose = with_mha(NoTransposeMHA)


# -- layer variants -----------------------------------------------------------------------------------------
class PreNormEncoderLayer(EncoderLayer):
    def forward(self, x, src_mask):
        x = x + self.dropout(self.self_attn(*(self.norm1(x),) * 3, src_mask))  # BUG: pre-norm
        return x + self.dropout(self.ffn(self.norm2(x)))


class PreNormDecoderLayer(DecoderLayer):
    def forward(self, y, memory, src_mask, tgt_mask):
        y = y + self.dropout(self.self_attn(*(self.norm1(y),) * 3, tgt_mask))
        y = y + self.dropout(self.cross_attn(self.norm2(y), memory, memory, src_mask))
        return y + self.dropout(self.ffn(self.norm3(y)))


class CrossNoMaskDecoderLayer(DecoderLayer):
    def forward(self, y, memory, src_mask, tgt_mask):
        y = self.norm1(y + self.dropout(self.self_attn(y, y, y, tgt_mask)))
        y = self.norm2(y + self.dropout(self.cross_attn(y, memory, memory, None)))  # BUG: no source mask
        return self.norm3(y + self.dropout(self.ffn(y)))


class NoResidualDropoutEncoderLayer(EncoderLayer):
    def forward(self, x, src_mask):
        x = self.norm1(x + self.self_attn(x, x, x, src_mask))  # BUG: no dropout on the sub-layer output
        return self.norm2(x + self.ffn(x))


class NoResidualDropoutDecoderLayer(DecoderLayer):
    def forward(self, y, memory, src_mask, tgt_mask):
        y = self.norm1(y + self.self_attn(y, y, y, tgt_mask))
        y = self.norm2(y + self.cross_attn(y, memory, memory, src_mask))
        return self.norm3(y + self.ffn(y))


class AttentionUndroppedEncoderLayer(EncoderLayer):
    def forward(self, x, src_mask):
        x = self.norm1(x + self.self_attn(x, x, x, src_mask))  # BUG: the attention output is not dropped
        return self.norm2(x + self.dropout(self.ffn(x)))


class AttentionUndroppedDecoderLayer(DecoderLayer):
    def forward(self, y, memory, src_mask, tgt_mask):
        y = self.norm1(y + self.self_attn(y, y, y, tgt_mask))  # BUG: neither attention output is dropped
        y = self.norm2(y + self.cross_attn(y, memory, memory, src_mask))
        return self.norm3(y + self.dropout(self.ffn(y)))


class CrossUndroppedDecoderLayer(DecoderLayer):
    def forward(self, y, memory, src_mask, tgt_mask):
        y = self.norm1(y + self.dropout(self.self_attn(y, y, y, tgt_mask)))
        y = self.norm2(y + self.cross_attn(y, memory, memory, src_mask))  # BUG: the cross-attention output kept
        return self.norm3(y + self.dropout(self.ffn(y)))


def first_layer_dropout_only(cfg: ModelConfig) -> Transformer:
    """Dropout on the sub-layer outputs of each stack's first layer only (a dropout module built for layer 0
    alone, the later layers built without it)."""
    model = Transformer(cfg)
    for stack, cls in ((model.encoder, NoResidualDropoutEncoderLayer), (model.decoder, NoResidualDropoutDecoderLayer)):
        for layer in list(stack)[1:]:
            layer.__class__ = cls  # BUG: layers 1..N-1 add their sub-layer outputs undropped
    return model


class ResidualTwiceEncoderLayer(EncoderLayer):
    def forward(self, x, src_mask):
        x = self.norm1(x + x + self.dropout(self.self_attn(x, x, x, src_mask)))  # BUG: the residual added twice
        return self.norm2(x + x + self.dropout(self.ffn(x)))


class ResidualTwiceDecoderLayer(DecoderLayer):
    def forward(self, y, memory, src_mask, tgt_mask):
        y = self.norm1(y + y + self.dropout(self.self_attn(y, y, y, tgt_mask)))
        y = self.norm2(y + y + self.dropout(self.cross_attn(y, memory, memory, src_mask)))
        return self.norm3(y + y + self.dropout(self.ffn(y)))


class DropoutAfterNormEncoderLayer(EncoderLayer):
    def forward(self, x, src_mask):
        x = self.dropout(self.norm1(x + self.self_attn(x, x, x, src_mask)))  # BUG: dropout after the add & norm
        return self.dropout(self.norm2(x + self.ffn(x)))


class DropoutAfterNormDecoderLayer(DecoderLayer):
    def forward(self, y, memory, src_mask, tgt_mask):
        y = self.dropout(self.norm1(y + self.self_attn(y, y, y, tgt_mask)))
        y = self.dropout(self.norm2(y + self.cross_attn(y, memory, memory, src_mask)))
        return self.dropout(self.norm3(y + self.ffn(y)))


class PreNormNoResidualDropoutEncoderLayer(EncoderLayer):
    def forward(self, x, src_mask):
        x = x + self.self_attn(*(self.norm1(x),) * 3, src_mask)  # BUG: pre-norm, and no dropout on the output
        return x + self.ffn(self.norm2(x))


class PreNormNoResidualDropoutDecoderLayer(DecoderLayer):
    def forward(self, y, memory, src_mask, tgt_mask):
        y = y + self.self_attn(*(self.norm1(y),) * 3, tgt_mask)
        y = y + self.cross_attn(self.norm2(y), memory, memory, src_mask)
        return y + self.ffn(self.norm3(y))


class InnerDropoutFeedForward(PositionwiseFeedForward):
    """w2(dropout(relu(w1 x))): nn.TransformerEncoderLayer's and tensor2tensor v2's relu_dropout."""

    def __init__(self, d_model, d_ff, p=0.1):
        super().__init__(d_model, d_ff)
        self.dropout = nn.Dropout(p)

    def forward(self, x):
        return self.w2(self.dropout(torch.relu(self.w1(x))))


class DroppedWeightsAttention(nn.Module):
    """Eq. (1) with dropout on the softmax weights. A module (each MultiHeadAttention holds it as a submodule), so
    that model.train()/eval() reaches the dropout in every copy of the model: a closure over one nn.Dropout would
    keep pointing at the original's after copy.deepcopy, in whatever mode that one was left."""

    def __init__(self, p: float):
        super().__init__()
        self.drop = nn.Dropout(p)

    def forward(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, Lq, Lk)
        if mask is None:
            return self.drop(torch.softmax(scores, dim=-1)) @ v
        empty = ~mask.any(dim=-1, keepdim=True)  # a query with no admissible key attends to nothing
        weights = torch.softmax(scores.masked_fill(~(mask | empty), float("-inf")), dim=-1)
        return self.drop(weights.masked_fill(empty, 0.0)) @ v  # BUG (t2t v2 practice): dropped weights


def with_extra_dropout(*, attention: bool, ffn: bool, layers: tuple[type | None, type | None] = (None, None)):
    """The reference (or its layers ``layers``) with dropout at config.dropout on the attention weights and/or
    inside the FFN, as the Annotated Transformer, nn.Transformer and later tensor2tensor have."""
    def build(cfg: ModelConfig) -> Transformer:
        parts = {}
        if attention:
            parts["attention"] = DroppedWeightsAttention(cfg.dropout)
        if ffn:
            parts["feed_forward"] = partial(InnerDropoutFeedForward, p=cfg.dropout)
        model = Transformer(cfg, **parts)
        enc, dec = layers
        if enc or dec:
            for stack, cls in (("encoder", enc), ("decoder", dec)):
                for layer in getattr(model, stack) if cls else ():
                    layer.__class__ = cls
        return model
    return build


class SharedNormEncoderLayer(EncoderLayer):
    def forward(self, x, src_mask):
        x = self.norm1(x + self.dropout(self.self_attn(x, x, x, src_mask)))
        return self.norm1(x + self.dropout(self.ffn(x)))  # BUG: norm1 reused, norm2 never used


def with_layers(enc: type | None = None, dec: type | None = None) -> Callable[[ModelConfig], Transformer]:
    def build(cfg: ModelConfig) -> Transformer:
        model = Transformer(cfg)
        for layer in model.encoder if enc else ():
            layer.__class__ = enc
        for layer in model.decoder if dec else ():
            layer.__class__ = dec
        return model
    return build


# -- norms and feed-forward ------------------------------------------------------------------------------------
class UnbiasedLayerNorm(LayerNorm):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(x.var(-1, keepdim=True, unbiased=True) + self.eps) * self.weight + self.bias


class EpsOutsideLayerNorm(LayerNorm):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = (x - mean).pow(2).mean(-1, keepdim=True).sqrt()
        return (x - mean) / (std + self.eps) * self.weight + self.bias  # BUG: eps outside the root


class FixedEpsLayerNorm(LayerNorm):
    def __init__(self, d_model, eps=1e-6):
        super().__init__(d_model, eps=1e-5)  # BUG: nn.LayerNorm's default eps, whatever the configuration says


class GeluFeedForward(PositionwiseFeedForward):
    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))  # BUG: GELU for ReLU


class LeakyReluFeedForward(PositionwiseFeedForward):
    def forward(self, x):
        return self.w2(F.leaky_relu(self.w1(x), 0.01))  # BUG: leaky ReLU (slope 0.01), ReLU on positive inputs


# -- positional tables -------------------------------------------------------------------------------------------
def concat_table(length: int, d_model: int) -> Tensor:
    t = sinusoid_table(length, d_model, dtype=torch.float64)
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1).float()  # BUG: sines then cosines, not interleaved


def from_one_table(length: int, d_model: int) -> Tensor:
    return sinusoid_table(length + 1, d_model)[1:]  # BUG: positions 1..L


def base_1000_table(length: int, d_model: int) -> Tensor:
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    angle = pos / torch.pow(1000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # BUG: base 1000
    return torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(length, d_model).float()


# -- whole-model variants ----------------------------------------------------------------------------------------
class NoEmbeddingScale(Transformer):
    def embed(self, tokens, embedding):
        return self.dropout(embedding(tokens) + self.positional_encoding(tokens.size(1)))  # BUG: no sqrt(d_model)


class NoPositions(Transformer):
    def embed(self, tokens, embedding):
        return self.dropout(embedding(tokens) * math.sqrt(self.config.d_model))  # BUG: the table is never added


class NoCausalMask(Transformer):
    def decode(self, memory, src_mask, tgt):
        y = self.embed(tgt, self.tgt_embed)
        for layer in self.decoder:
            y = layer(y, memory, src_mask, padding_mask(tgt, self.config.pad_id))  # BUG: padding only
        return y


class CausalWithoutDiagonal(Transformer):
    def decode(self, memory, src_mask, tgt):
        T = tgt.size(1)
        strict = torch.ones(T, T, dtype=torch.bool, device=tgt.device).tril(-1)  # BUG: i attends to < i only
        y = self.embed(tgt, self.tgt_embed)
        for layer in self.decoder:
            y = layer(y, memory, src_mask, strict & padding_mask(tgt, self.config.pad_id))
        return y


class CausalMaskFirstLayerOnly(Transformer):
    """The causal mask dropped on one code path (every decoder layer after the first gets the padding mask
    only), with a Hugging Face-style initialisation (every matrix N(0, 0.02^2)): attention is near uniform at
    the model's own scale, so the leak moves its outputs by less than the tolerance there."""

    def reset_parameters(self):
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.ones_(p)

    def decode(self, memory, src_mask, tgt):
        pad = padding_mask(tgt, self.config.pad_id)
        tgt_mask = causal_mask(tgt.size(1), tgt.device) & pad
        y = self.embed(tgt, self.tgt_embed)
        for i, layer in enumerate(self.decoder):
            y = layer(y, memory, src_mask, tgt_mask if i == 0 else pad)  # BUG: the causal part lost after layer 0
        return y


class CpuCausalMask(Transformer):
    def decode(self, memory, src_mask, tgt):
        tgt_mask = causal_mask(tgt.size(1)) & padding_mask(tgt, self.config.pad_id)  # BUG: built on the CPU
        y = self.embed(tgt, self.tgt_embed)
        for layer in self.decoder:
            y = layer(y, memory, src_mask, tgt_mask)
        return y


class ConstructorDevice(Transformer):
    def __init__(self, config):
        super().__init__(config)
        self.device = next(self.parameters()).device  # the device the constructor saw (the CPU)

    def decode(self, memory, src_mask, tgt):
        tgt_mask = causal_mask(tgt.size(1), tgt.device) & padding_mask(tgt, self.config.pad_id)
        tgt_mask = tgt_mask.to(self.device)  # BUG: moved to the device saved at construction, not the input's
        y = self.embed(tgt, self.tgt_embed)
        for layer in self.decoder:
            y = layer(y, memory, src_mask, tgt_mask)
        return y


class PlainAttributeTable(Transformer):
    def __init__(self, config):
        super().__init__(config)
        del self.pe
        self.pe = sinusoid_table(config.max_len, config.d_model)  # BUG: a plain attribute, not a buffer


class FirstSampleSourceMask(Transformer):
    def forward(self, src, tgt):
        src_mask = padding_mask(src[:1], self.config.pad_id)  # BUG: sample 0's padding used for the whole batch
        return self.generator(self.decode(self.encode(src, src_mask), src_mask, tgt))


class CrossFromFirstLayer(Transformer):
    def forward(self, src, tgt):
        src_mask = padding_mask(src, self.config.pad_id)
        first = self.encoder[0](self.embed(src, self.src_embed), src_mask)  # BUG: memory from encoder layer 1
        return self.generator(self.decode(first, src_mask, tgt))


class ExtraFinalNorms(Transformer):
    def __init__(self, config):
        super().__init__(config)
        self.enc_norm = LayerNorm(config.d_model, config.norm_eps)  # BUG: a norm on top of each post-norm stack
        self.dec_norm = LayerNorm(config.d_model, config.norm_eps)

    def encode(self, src, src_mask=None):
        return self.enc_norm(super().encode(src, src_mask))

    def decode(self, memory, src_mask, tgt):
        return self.dec_norm(super().decode(memory, src_mask, tgt))

    def load_reference_state(self, state):
        self.load_state_dict(dict(state), strict=False)  # the extra norms keep gain 1, bias 0


class DropoutInEval(Transformer):
    def __init__(self, config):
        super().__init__(config)
        for m in list(self.modules()):
            if isinstance(m, nn.Dropout):
                m.forward = partial(F.dropout, p=config.dropout, training=True)  # BUG: ignores .eval()


class SharedLayers(Transformer):
    def __init__(self, config):
        super().__init__(config)
        self.encoder = nn.ModuleList([self.encoder[0]] * config.n_layers)  # BUG: one layer applied N times

    def load_reference_state(self, state):
        keep = {k: v for k, v in state.items() if not k.startswith("encoder.") or k.startswith("encoder.0.")}
        self.load_state_dict(keep, strict=False)


class Untied(Transformer):
    def __init__(self, config):
        super().__init__(config)
        if config.share_embeddings:  # BUG: three separate matrices whatever the config says
            self.tgt_embed.weight = nn.Parameter(self.src_embed.weight.detach().clone())
            self.generator.weight = nn.Parameter(self.src_embed.weight.detach().clone())


class GeneratorBias(Transformer):
    def __init__(self, config):
        super().__init__(config)
        self.generator_bias = nn.Parameter(torch.randn(config.tgt_vocab))  # BUG: a bias on the tied projection

    def forward(self, src, tgt):
        return super().forward(src, tgt) + self.generator_bias

    def load_reference_state(self, state):
        self.load_state_dict(dict(state), strict=False)
        with torch.no_grad():
            self.generator_bias.zero_()


class ScaledLogits(Transformer):
    def forward(self, src, tgt):
        return super().forward(src, tgt) * self.config.d_model ** -0.5  # BUG: logits rescaled before the softmax


class LogSoftmaxDeclaredLogits(Transformer):
    def forward(self, src, tgt):
        return torch.log_softmax(super().forward(src, tgt), dim=-1)  # BUG: normalized, registered as logits


class LogitsDeclaredProbs(Transformer):
    pass  # BUG: returns logits, registered as probabilities


class SourceVocabularyGenerator(Transformer):
    def __init__(self, config):
        super().__init__(config)
        if not config.share_embeddings:  # BUG: the output projection is sized by the source vocabulary
            self.generator = nn.Linear(config.d_model, config.src_vocab, bias=False)


# -- several deviations at once, as real libraries carry them -----------------------------------------------------
def offset_table(length: int, d_model: int) -> Tensor:
    return sinusoid_table(length + 2, d_model)[2:]  # positions 2..L+1, as tables offset past a padding index are


def biased_attention(model: nn.Module) -> None:
    """Give every attention projection a bias (nn.Linear's default), as most libraries' attention has."""
    for m in list(model.modules()):
        if isinstance(m, MultiHeadAttention):
            d = m.q.in_features
            m.q, m.k, m.v, m.o = (nn.Linear(d, d) for _ in range(4))


class OffsetTableEmbedNormBiases(Transformer):
    """Three deviations at once: a positional table offset by two positions (exposed by positional_encoding),
    a LayerNorm after the embedding sum, and biases on every attention projection (loaded as zeros)."""

    def __init__(self, config):
        super().__init__(config, positional_encoding=offset_table)
        self.src_embed_norm = LayerNorm(config.d_model, config.norm_eps)
        self.tgt_embed_norm = LayerNorm(config.d_model, config.norm_eps)
        biased_attention(self)

    def embed(self, tokens, embedding):
        norm = self.src_embed_norm if embedding is self.src_embed else self.tgt_embed_norm
        x = embedding(tokens) * math.sqrt(self.config.d_model) + self.positional_encoding(tokens.size(1))
        return self.dropout(norm(x))  # BUG: a LayerNorm on the embedding sum

    def load_reference_state(self, state):
        self.load_state_dict(dict(state), strict=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "_attn." in name and name.endswith(".bias"):
                    p.zero_()  # the paper's projections have no bias
                elif "embed_norm" in name:
                    p.fill_(1.0 if name.endswith("weight") else 0.0)


class GainOnlyLayerNorm(nn.Module):
    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # BUG: no bias term

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, None, self.eps)


class GainOnlyNormsAndBiases(Transformer):
    """Layer norms without a bias term, and biases on every attention projection (loaded as zeros)."""

    def __init__(self, config):
        super().__init__(config, layer_norm=GainOnlyLayerNorm)
        biased_attention(self)

    def load_reference_state(self, state):
        keep = {k: v for k, v in state.items() if not (".norm" in k and k.endswith(".bias"))}  # nowhere to go
        self.load_state_dict(keep, strict=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "_attn." in name and name.endswith(".bias"):
                    p.zero_()


class SingleVocabulary(Transformer):
    def __init__(self, config):
        if config.src_vocab != config.tgt_vocab:  # BUG (a limitation): one vocabulary size for both sides
            raise ValueError(f"this model has one shared vocabulary: src_vocab ({config.src_vocab}) must equal "
                             f"tgt_vocab ({config.tgt_vocab})")
        super().__init__(config)


class Float32Norm(LayerNorm):
    def forward(self, x):  # BUG: computed in float32 "for stability" and never cast back to the input's dtype
        return F.layer_norm(x.float(), x.shape[-1:], self.weight.float(), self.bias.float(), self.eps)


class VendorOpFeedForward(PositionwiseFeedForward):
    def forward(self, x):
        h = self.w1(x)
        if torch.onnx.is_in_onnx_export():  # BUG: exported as a vendor's fused op that onnxruntime does not know
            h = torch.onnx.ops.symbolic("vendor.fused::FastRelu", (h,), {}, dtype=h.dtype, shape=h.shape, version=1)
        else:
            h = torch.relu(h)
        return self.w2(h)


class _OwnTables(Transformer):
    """Keeps parameters of its own that the canonical schema does not name (learned positional tables): the adapter
    loads the canonical state and leaves them at their own initialisation, as a user's checkpoint conversion would."""

    def load_reference_state(self, state):
        missing, unexpected = self.load_state_dict(dict(state), strict=False)
        if unexpected or any("pos" not in name for name in missing):
            raise KeyError(f"canonical state does not fit: missing {missing}, unexpected {unexpected}")


def learned_table(config: ModelConfig) -> nn.Parameter:
    """A learned [max_len, d_model] positional table at N(0, 1) (its own seed: it is not in the canonical state)."""
    return nn.Parameter(torch.randn(config.max_len, config.d_model, generator=torch.Generator().manual_seed(5)))


class _StackAware(_OwnTables):
    """Knows which stack it embeds for (the reference's ``embed`` is shared by both)."""

    _decoding = False

    def decode(self, memory, src_mask, tgt):
        self._decoding = True
        try:
            return super().decode(memory, src_mask, tgt)
        finally:
            self._decoding = False


class LearnedPositionsUnscaled(_StackAware):
    """A tutorial's model: a learned positional table in each stack instead of the sinusoids (and no
    positional_encoding to read it back), and embeddings not multiplied by sqrt(d_model). Nothing else departs:
    attention, norms, the FFN and the masks are the paper's."""

    positional_encoding = None  # type: ignore[assignment]  # the table is not exposed

    def __init__(self, config):
        super().__init__(config)
        self.src_pos, self.tgt_pos = learned_table(config), learned_table(config)

    def embed(self, tokens, embedding, start=0):
        table = self.tgt_pos if self._decoding else self.src_pos
        L = tokens.size(1)
        return self.dropout(embedding(tokens) + table[start:start + L])  # BUG: no sqrt(d_model), learned table


class DecoderOwnTable(_StackAware):
    """The paper's model whose decoder adds a learned table of its own to the sinusoids (the encoder's input is the
    paper's): PE is added to both stacks, so "PE added to the encoder input only" would be a wrong diagnosis."""

    def __init__(self, config):
        super().__init__(config)
        self.tgt_pos = learned_table(config)

    def embed(self, tokens, embedding, start=0):
        x = embedding(tokens) * math.sqrt(self.config.d_model) + self.positional_encoding(tokens.size(1))
        if self._decoding:
            x = x + 0.2 * self.tgt_pos[:tokens.size(1)]  # BUG: a second, learned table in the decoder
        return self.dropout(x)


class FixedLengthUnscaled(Transformer):
    """Position ids hard-coded for a 5-token example sentence (every other length raises) and embeddings not scaled;
    the causal mask and everything else is the paper's."""

    def embed(self, tokens, embedding):
        x = embedding(tokens)  # BUG: no sqrt(d_model)
        return self.dropout(x + self.pe[torch.arange(5, device=tokens.device)])  # BUG: length 5 only


# -- backward passes that are not the forward's gradient (train.equivalence) -----------------------------------------
class DetachedStatisticsLayerNorm(LayerNorm):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True).detach()  # BUG: the statistics treated as constants in the backward pass
        std = torch.sqrt((x - mean).pow(2).mean(-1, keepdim=True) + self.eps).detach()
        return (x - mean) / std * self.weight + self.bias


class GradMultiply(torch.autograd.Function):
    """fairseq's GradMultiply: the identity forward, the gradient multiplied by ``scale``."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


class GradScaledSublayerEncoderLayer(EncoderLayer):
    def forward(self, x, src_mask):
        a = GradMultiply.apply(self.self_attn(x, x, x, src_mask), 0.25)  # BUG: the sub-layer's gradient scaled
        x = self.norm1(x + self.dropout(a))
        return self.norm2(x + self.dropout(GradMultiply.apply(self.ffn(x), 0.25)))


class FrozenEmbedding(Transformer):
    def __init__(self, config):
        super().__init__(config)
        # BUG: nn.Embedding.from_pretrained freezes the table by default (freeze=True)
        self.src_embed = nn.Embedding.from_pretrained(self.src_embed.weight.detach().clone())
        self.tgt_embed = nn.Embedding.from_pretrained(self.tgt_embed.weight.detach().clone())
        if config.share_embeddings:
            self.tgt_embed.weight = self.src_embed.weight
            self.generator.weight = self.src_embed.weight


class BufferBiasFeedForward(PositionwiseFeedForward):
    def __init__(self, d_model, d_ff):
        super().__init__(d_model, d_ff)
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.register_buffer("b1", torch.zeros(d_ff))  # BUG: a buffer, not an nn.Parameter: never trained

    def forward(self, x):
        return self.w2(torch.relu(self.w1(x) + self.b1))


class BufferBias(Transformer):
    def __init__(self, config):
        super().__init__(config, feed_forward=BufferBiasFeedForward)

    def load_reference_state(self, state):
        state = dict(state)
        for key in [k for k in state if k.endswith("ffn.w1.bias")]:
            state[key.replace("w1.bias", "b1")] = state.pop(key)
        self.load_state_dict(state, strict=True)


# -- models that cannot hold the canonical weights: judged on their own weights (conformance.helpers.traces) ---------
def no_transplant(build: Callable[[ModelConfig], nn.Module]) -> Callable[[ModelConfig], nn.Module]:
    """``build`` whose model offers no load_reference_state, as an adapter whose model cannot hold the canonical
    weights (or whose author did not write one): every transplant-based check skips."""
    def make(cfg: ModelConfig) -> nn.Module:
        model = build(cfg)
        model.load_reference_state = None
        return model
    return make


class SharedHeadsMHA(MultiHeadAttention):
    """One [d_k, d_k] projection for Q (and one for K, one for V) that every head applies to its own d_k slice of
    the input: no per-head W_i^Q exists, so no adapter can load the canonical [d_model, d_model] matrices."""

    def __init__(self, d_model, h, attention):
        super().__init__(d_model, h, attention)
        self.q, self.k, self.v = (nn.Linear(self.d_k, self.d_k, bias=False) for _ in range(3))

    def forward(self, query, key, value, mask=None):
        q, k, v = (f(x.view(*x.shape[:2], self.h, self.d_k)).transpose(1, 2)
                   for f, x in ((self.q, query), (self.k, key), (self.v, value)))  # (B, h, L, d_k)
        heads = self.attention(q, k, v, mask)  # (B, h, Lq, d_v)
        B, _, Lq, _ = heads.shape
        return self.o(heads.transpose(1, 2).reshape(B, Lq, self.h * self.d_k))


class HiddenTable(Transformer):
    """The table added but not exposed (no positional_encoding to read it back), as most models keep it."""

    positional_encoding = None  # type: ignore[assignment]

    def embed(self, tokens, embedding, start=0):
        x = embedding(tokens) * math.sqrt(self.config.d_model)
        return self.dropout(x + self.pe[start:start + tokens.size(1)].to(dtype=x.dtype))


class TableAddedTwice(HiddenTable):
    """A positional module that returns x + PE, and a caller that adds PE to that again."""

    def embed(self, tokens, embedding, start=0):
        x = embedding(tokens) * math.sqrt(self.config.d_model)
        pe = self.pe[start:start + tokens.size(1)].to(dtype=x.dtype)
        x = x + pe
        return self.dropout(x + pe)  # BUG: the table added a second time


def shared_heads_scale_d_model(cfg: ModelConfig) -> Transformer:
    model = Transformer(cfg, attention=partial(_attend, scale=math.sqrt(cfg.d_model)))  # BUG: sqrt(d_model)
    for layer in [*model.encoder, *model.decoder]:
        for name in ("self_attn", "cross_attn"):
            if hasattr(layer, name):
                setattr(layer, name, SharedHeadsMHA(cfg.d_model, cfg.n_heads, getattr(layer, name).attention))
    return model


def with_parts(cls=Transformer, **parts) -> Callable[[ModelConfig], Transformer]:
    return lambda cfg: cls(cfg, **parts)


# name -> (build, output, bug, {clause: why})
BROKEN: dict[str, tuple[Callable[[ModelConfig], nn.Module], str, str, dict[str, str]]] = {
    "fill-1e-9": (with_attention(fill=1e-9), "logits", "masked scores filled with 1e-9 instead of -inf", {
        "mask.causal": "future keys keep a score of 1e-9, so they get weight",
        "mask.source-padding": "padded keys keep weight",
        "mask.target-padding": "appended padding gets weight in decoder self-attention",
        EQ: "every masked score leaks", LEARNS: "trained teacher-forced, it reads the future it lacks when decoding"}),
    "fill-1e4": (with_attention(fill=-1e4), "logits", "masked scores filled with -1e4 instead of -inf", {
        "mask.causal": "with scores of order 1e5, a query whose admissible scores are all below -1e4 attends to "
                       "the future",
        "mask.source-padding": "the same queries attend to padded source keys",
        "mask.target-padding": "and to appended target padding"}),
    "scale-d-model": (with_attention(scale_by_d_model=True), "logits", "scores divided by sqrt(d_model)", {
        "attention.scale": "divides by sqrt(d_model) = sqrt(h) * sqrt(d_k)", EQ: "softer attention"}),
    "softmax-over-queries": (with_attention(dim=-2), "logits", "softmax along the query axis", {
        "attention.softmax-over-keys": "normalizes over queries",
        "mask.causal": "a later query changes the normalizer of earlier ones",
        "mask.source-padding": "padded keys still carry weight",
        "mask.target-padding": "appended queries change the normalizer",
        EQ: "different weights", LEARNS: "later queries leak into earlier ones while training"}),
    "nan-empty-rows": (with_attention(guard=False), "logits", "-inf fill with no guard for fully masked rows", {
        "mask.finite": "a fully padded sequence gives softmax over all -inf: NaN"}),
    "heads-no-transpose": (heads_no_transpose, "logits", "heads merged by reshape without transpose", {
        "attention.heads": "the concat mixes positions and heads",
        "mask.causal": "position i reads heads of later positions",
        "mask.source-padding": "padded positions leak through the mixed layout",
        "mask.target-padding": "appended positions leak",
        EQ: "different function", LEARNS: "positions mixed across heads: the future leaks while training"}),
    "pre-norm": (with_layers(PreNormEncoderLayer, PreNormDecoderLayer), "logits", "pre-norm residuals", {
        "norm.post-norm": "LayerNorm before the sub-layer", EQ: "different function"}),
    "cross-no-source-mask": (with_layers(dec=CrossNoMaskDecoderLayer), "logits",
                             "cross-attention without the source padding mask", {
        "mask.source-padding": "decoder attends to padded encoder positions", EQ: "padded memory read"}),
    "no-residual-dropout": (with_layers(NoResidualDropoutEncoderLayer, NoResidualDropoutDecoderLayer), "logits",
                            "no dropout on sub-layer outputs", {
        "dropout.residual": "train mode only drops the embeddings"}),
    "attention-output-undropped": (with_layers(AttentionUndroppedEncoderLayer, AttentionUndroppedDecoderLayer),
                                   "logits", "no dropout on the attention sub-layers' outputs (the FFN's dropped)", {
        "dropout.residual": "train mode keeps every feature of each self- and cross-attention output"}),
    "cross-output-undropped": (with_layers(dec=CrossUndroppedDecoderLayer), "logits",
                               "no dropout on the decoder cross-attention's output (every other sub-layer's dropped)", {
        "dropout.residual": "train mode keeps every feature of each cross-attention output"}),
    "first-layer-dropout-only": (first_layer_dropout_only, "logits",
                                 "sub-layer outputs dropped in each stack's first layer only", {
        "dropout.residual": "train mode keeps every feature of the sub-layer outputs of layers 1..N-1"}),
    "residual-twice": (with_layers(ResidualTwiceEncoderLayer, ResidualTwiceDecoderLayer), "logits",
                       "the residual added twice: LayerNorm(x + x + Sublayer(x))", {
        "norm.post-norm": "LayerNorm(2x + Sublayer(x))", EQ: "different function"}),
    "dropout-after-norm": (with_layers(DropoutAfterNormEncoderLayer, DropoutAfterNormDecoderLayer), "logits",
                           "dropout after the add & norm: Dropout(LayerNorm(x + Sublayer(x)))", {
        "dropout.residual": "in train mode the layer outputs are no longer normalized"}),
    "pre-norm-no-residual-dropout": (with_layers(PreNormNoResidualDropoutEncoderLayer,
                                                 PreNormNoResidualDropoutDecoderLayer), "logits",
                                     "pre-norm residuals without dropout on the sub-layer outputs", {
        "norm.post-norm": "LayerNorm before the sub-layer", EQ: "different function",
        "dropout.residual": "train mode drops nothing but the embedding sums (judged whatever the norm placement)"}),
    "attention-weight-dropout": (with_extra_dropout(attention=True, ffn=False), "logits",
                                 "dropout on the attention weights", {
        "dropout.extra-sites": "the softmax weights are dropped in training"}),
    "attention-dropout-hard-coded": (lambda cfg: Transformer(cfg, attention=DroppedWeightsAttention(0.1)), "logits",
                                     "dropout on the attention weights at a rate of 0.1 written into the code", {
        "dropout.extra-sites": "the softmax weights are dropped in training",
        "model.eval-determinism": "train mode at dropout 0 still drops the attention weights",
        "dropout.residual": "the configuration's rate of 0 leaves randomness in train mode"}),
    "ffn-inner-dropout": (with_extra_dropout(attention=False, ffn=True), "logits", "dropout between W1 and W2", {
        "dropout.extra-sites": "the FFN's hidden units are dropped in training"}),
    "pre-norm-extra-dropout": (with_extra_dropout(attention=True, ffn=True,
                                                  layers=(PreNormEncoderLayer, PreNormDecoderLayer)), "logits",
                               "pre-norm residuals, with dropout on the attention weights and inside the FFN", {
        "norm.post-norm": "LayerNorm before the sub-layer", EQ: "different function",
        "dropout.extra-sites": "extra dropout sites, found whatever the norm placement"}),
    "shared-norm": (with_layers(enc=SharedNormEncoderLayer), "logits", "one LayerNorm reused for both sub-layers", {
        "layers.independent": "two sub-layers share one LayerNorm", EQ: "norm2's gain and bias are never applied",
        "train.gradients": "norm2 is never used: its parameters get no gradient"}),
    "unbiased-layer-norm": (with_parts(layer_norm=UnbiasedLayerNorm), "logits", "unbiased variance in LayerNorm", {
        "norm.layer-norm": "divides by d_model - 1", EQ: "outputs scaled by sqrt((d-1)/d)"}),
    "eps-outside-sqrt": (with_parts(layer_norm=EpsOutsideLayerNorm), "logits", "LayerNorm eps added to the std", {
        "norm.epsilon": "eps outside the square root"}),
    "eps-1e-5": (with_parts(layer_norm=FixedEpsLayerNorm), "logits", "LayerNorm eps 1e-5 where the config says 1e-6", {
        "norm.epsilon": "eps = 1e-5 inside the square root"}),
    "gelu": (with_parts(feed_forward=GeluFeedForward), "logits", "GELU in the FFN", {
        "ffn.formula": "GELU instead of ReLU", EQ: "different nonlinearity"}),
    "leaky-relu": (with_parts(feed_forward=LeakyReluFeedForward), "logits", "leaky ReLU (slope 0.01) in the FFN", {
        "ffn.formula": "negative pre-activations give 0.01 x, not max(0, x)", EQ: "different nonlinearity"}),
    "concat-pe": (with_parts(positional_encoding=concat_table), "logits", "sin and cos halves concatenated", {
        "position.formula": "sines then cosines", EQ: "different table"}),
    "pe-from-one": (with_parts(positional_encoding=from_one_table), "logits", "positions counted from 1", {
        "position.formula": "shifted by one", EQ: "different table"}),
    "pe-base-1000": (with_parts(positional_encoding=base_1000_table), "logits", "base 1000 instead of 10000", {
        "position.formula": "wrong base", EQ: "different table"}),
    "no-positions": (with_parts(NoPositions), "logits", "the positional table is never added", {
        "position.added": "embeddings only", EQ: "no order information",
        LEARNS: "without positions neither the order to copy nor to reverse can be found"}),
    "no-embedding-scale": (with_parts(NoEmbeddingScale), "logits", "embeddings not multiplied by sqrt(d_model)", {
        "embedding.scale": "unscaled", EQ: "different input scale"}),
    "no-causal-mask": (with_parts(NoCausalMask), "logits", "decoder self-attention without the causal mask", {
        "mask.causal": "sees the future", EQ: "different function",
        LEARNS: "it learns to read the next target token, which greedy decoding does not have"}),
    "causal-without-diagonal": (with_parts(CausalWithoutDiagonal), "logits", "causal mask excludes position i", {
        "mask.causal": "position i cannot see token i", EQ: "different function"}),
    "causal-first-layer-only": (with_parts(CausalMaskFirstLayerOnly), "logits",
                                "causal mask dropped after the first decoder layer, std-0.02 initialisation", {
        "mask.causal": "decoder layers after the first see the future (invisible at the model's own scale, "
                       "visible on sharp transplanted weights)",
        EQ: "different function"}),
    "cpu-causal-mask": (with_parts(CpuCausalMask), "logits", "causal mask built on the CPU", {
        "device.portable": "torch.ones(T, T) without the input's device"}),
    "constructor-device": (with_parts(ConstructorDevice), "logits", "forward moves the target mask to the device "
                           "its constructor saw (.to(self.device))", {
        "device.portable": "on any other device than the CPU the mask is copied back to the CPU"}),
    "plain-attribute-table": (with_parts(PlainAttributeTable), "logits", "positional table as a plain attribute", {
        "device.portable": "self.pe does not follow .to(device)"}),
    "first-sample-source-mask": (with_parts(FirstSampleSourceMask), "logits", "one source mask for the batch", {
        "model.batch-independence": "a sample's output depends on sample 0", EQ: "padding read"}),
    "cross-value-from-query": (cross_value_from_query, "logits",
                               "cross-attention values projected from the decoder's stream, not the encoder output", {
        "attention.cross-source": "each query's value is its own input: the encoder output moves the weights only",
        EQ: "different function"}),
    "cross-from-first-layer": (with_parts(CrossFromFirstLayer), "logits", "memory taken from encoder layer 1", {
        "attention.cross-source": "cross-attention reads the first layer", EQ: "different memory",
        "train.gradients": "the last encoder layer is computed by nobody: its parameters get no gradient"}),
    "extra-final-norm": (with_parts(ExtraFinalNorms), "logits", "a LayerNorm on top of each post-norm stack", {
        "norm.no-extra-norm": "two norms in a row", "config.parameters": "2 x 2 x d_model extra parameters",
        EQ: "the last norm's gain and bias are re-normalized away"}),
    "dropout-in-eval": (with_parts(DropoutInEval), "logits", "dropout stays active in eval mode", {
        "model.eval-determinism": "two eval calls differ",
        "export.onnx": "the exported graph keeps the random dropout, so onnxruntime cannot reproduce an output"}),
    "shared-layers": (with_parts(SharedLayers), "logits", "one encoder layer applied N times", {
        "layers.independent": "layer 1 and layer 2 are the same parameters",
        "config.parameters": "(N-1) encoder layers of parameters missing", EQ: "different function"}),
    "untied": (with_parts(Untied), "logits", "embeddings not shared although configured", {
        "embedding.shared-weights": "three matrices", "config.parameters": "two extra vocab x d_model matrices",
        TRAINS: "loaded with one tensor the three copies agree, then each trains apart on its own gradient"}),
    "generator-bias": (with_parts(GeneratorBias), "logits", "a bias on the pre-softmax projection", {
        "embedding.shared-weights": "the projection has a bias", "config.parameters": "tgt_vocab extra parameters"}),
    "scaled-logits": (with_parts(ScaledLogits), "logits", "logits multiplied by d_model^-0.5 before the softmax", {
        "embedding.shared-weights": "the pre-softmax transformation is d_model^-0.5 times the shared matrix",
        EQ: "a flatter distribution"}),
    "log-softmax-as-logits": (with_parts(LogSoftmaxDeclaredLogits), "logits", "normalized output declared logits", {
        "model.output-normalization": "already a log-softmax"}),
    "logits-as-probs": (with_parts(LogitsDeclaredProbs), "probs", "logits declared as probabilities", {
        "model.output-normalization": "do not sum to 1", EQ: "compared as probabilities",
        LEARNS: "the criterion takes the log of its logits as if they were probabilities"}),
    "offset-table-embed-norm-biases": (with_parts(OffsetTableEmbedNormBiases), "logits",
                                       "a table offset by 2 positions, a LayerNorm on the embedding sum and "
                                       "attention biases", {
        "position.formula": "the table starts at position 2",
        "norm.no-extra-norm": "a LayerNorm after embedding + PE (named after substituting its own table)",
        "config.parameters": "4 x d_model of biases per attention and 2 x 2 x d_model for the embedding norms",
        EQ: "different table and an extra norm"}),
    "gain-only-norms": (with_parts(GainOnlyNormsAndBiases), "logits",
                        "layer norms without a bias term, and attention biases", {
        "norm.layer-norm": "the norms add no bias (not an extra norm)",
        "config.parameters": "no norm biases (-d_model per norm), 4 x d_model of biases per attention",
        EQ: "the canonical norm biases cannot be loaded"}),
    "learned-positions-unscaled": (with_parts(LearnedPositionsUnscaled), "logits",
                                   "a learned positional table (not exposed) and unscaled embeddings", {
        "config.parameters": "two max_len x d_model tables beyond the schema",
        "embedding.scale": "the traced stack inputs are 1 x E + P (own weights: no transplant needed)",
        "position.formula": "the traced per-position term is the learned table, no sinusoid",
        EQ: "another table and another input scale"}),
    "decoder-own-table": (with_parts(DecoderOwnTable), "logits", "the decoder adds a learned table of its own", {
        "config.parameters": "a max_len x d_model table beyond the schema", EQ: "another decoder input",
        "position.added": "the traced decoder input is sqrt(d_model) E + PE + 0.2 T: a second per-position term"}),
    "fixed-length-unscaled": (with_parts(FixedLengthUnscaled), "logits",
                              "position ids for length 5 only, and unscaled embeddings", {
        "model.shape": "every length but 5 raises", "embedding.scale": "unscaled", EQ: "another input scale"}),
    "single-vocabulary": (with_parts(SingleVocabulary), "logits", "refuses src_vocab != tgt_vocab", {
        "config.parameters": "cannot be built with two vocabularies of different sizes"}),
    "float32-norm": (with_parts(layer_norm=Float32Norm), "logits", "layer norm output left in float32", {
        "device.portable": "after model.double() the next Linear gets a float32 input and raises"}),
    "vendor-onnx-op": (with_parts(feed_forward=VendorOpFeedForward), "logits",
                       "the FFN exported as a custom-domain op onnxruntime rejects", {
        "export.onnx": "onnxruntime refuses to load the exported graph (vendor.fused:FastRelu is no registered op)"}),
    "norm-statistics-detached": (with_parts(layer_norm=DetachedStatisticsLayerNorm), "logits",
                                 "layer norm mean and std detached: the forward exact, the backward not", {
        TRAINS: "the gradient ignores how the mean and the deviation depend on the input"}),
    "grad-scaled-sublayers": (with_layers(enc=GradScaledSublayerEncoderLayer), "logits",
                              "the gradient of each encoder sub-layer's output multiplied by 0.25 (GradMultiply)", {
        TRAINS: "the encoder's sub-layers get a quarter of their gradient beside the residual path's"}),
    "frozen-embedding": (with_parts(FrozenEmbedding), "logits",
                         "nn.Embedding.from_pretrained(...) keeps its default freeze=True", {
        TRAINS: "the shared embedding and output matrix never update"}),
    "buffer-ffn-bias": (with_parts(BufferBias), "logits", "the FFN's first bias a buffer, not a parameter", {
        TRAINS: "b1 never updates", "config.parameters": "d_ff parameters per FFN missing"}),
    "source-vocab-generator": (with_parts(SourceVocabularyGenerator), "logits",
                               "output projection sized by the source vocabulary", {
        "model.shape": "with separate vocabularies of 41 and 43 tokens the scores are [B, T, 41]",
        "embedding.shared-weights": "with share_embeddings=False there are two source-sized matrices and no "
                                    "separate target projection"}),
    # Models that cannot hold the canonical weights (no load_reference_state): the transplant-based checks skip,
    # and the own-weights trace (conformance.helpers.traces) judges attention.scale, the masks and embedding.scale.
    "no-transplant": (no_transplant(Transformer), "logits", "none: the paper's model without load_reference_state",
                      {}),
    "shared-heads-scale-d-model": (no_transplant(shared_heads_scale_d_model), "logits",
                                   "one [d_k, d_k] projection shared by every head, scores divided by sqrt(d_model)", {
        "attention.scale": "the traced scores are (q k^T) / sqrt(d_model) (no transplant needed to see it)",
        "attention.heads": "the traced queries, keys and values come from d_k-feature slices of each token, all "
                           "projected by one [d_k, d_k] weight",
        "config.parameters": "3 [d_k, d_k] matrices per attention where the schema has [d_model, d_model]"}),
    "no-transplant-fill-1e-9": (no_transplant(with_attention(fill=1e-9)), "logits",
                                "masked scores filled with 1e-9, no load_reference_state", {
        "mask.causal": "future keys get weight", "mask.source-padding": "padded source keys get weight",
        "mask.target-padding": "padded target keys get weight"}),
    "no-transplant-fill-1e4": (no_transplant(with_attention(fill=-1e4)), "logits",
                               "masked scores filled with -1e4, no load_reference_state", {
        "mask.causal": "at scores of order 1e5 (query projections sharpened) queries attend to the future",
        "mask.source-padding": "and to padded source keys", "mask.target-padding": "and to padded target keys"}),
    "no-transplant-causal-without-diagonal": (no_transplant(with_parts(CausalWithoutDiagonal)), "logits",
                                              "causal mask off by one (excludes position i), no load_reference_state", {
        "mask.causal": "every real query gives its own position a weight of 0"}),
    "no-transplant-concat-pe": (no_transplant(with_parts(HiddenTable, positional_encoding=concat_table)), "logits",
                                "sin and cos halves concatenated, the table not exposed, no load_reference_state", {
        "position.formula": "the traced per-position term is the concatenated table"}),
    "no-transplant-table-added-twice": (no_transplant(with_parts(TableAddedTwice)), "logits",
                                        "the positional table added twice, no load_reference_state", {
        "position.added": "the traced stack input is sqrt(d_model) x E + 2 PE"}),
    "no-transplant-heads-no-transpose": (no_transplant(heads_no_transpose), "logits",
                                         "heads merged by reshape without transpose, no load_reference_state", {
        "attention.heads": "the traced input of W^O holds other positions' head outputs",
        "mask.causal": "position i reads head outputs of later positions (caught without the transplant)",
        "mask.source-padding": "padded positions leak through the mixed layout",
        "mask.target-padding": "appended positions leak"}),
    "no-transplant-one-query-slice": (no_transplant(with_mha(OneQuerySliceMHA)), "logits",
                                      "every head reads head 0's queries, no load_reference_state", {
        "attention.heads": "the traced queries of each position hold the same d_k features h times"}),
    "no-transplant-half-the-heads": (no_transplant(with_mha(HalfTheHeadsMHA)), "logits",
                                     "h / 2 heads of 2 d_k features, no load_reference_state", {
        "attention.heads": "the traced attentions have h / 2 matrices of 2 d_k features per sequence"}),
    "no-transplant-no-embedding-scale": (no_transplant(with_parts(NoEmbeddingScale)), "logits",
                                         "embeddings not multiplied by sqrt(d_model), no load_reference_state", {
        "embedding.scale": "the traced stack input is 1 x E + PE"}),
}


def forward_only(build: Callable[[ModelConfig], nn.Module]) -> Callable[[ModelConfig], nn.Module]:
    """``build`` whose model hides the decoding methods and the training recipe it inherits from the reference
    (see the module docstring)."""
    def make(cfg: ModelConfig) -> nn.Module:
        model = build(cfg)
        for method in ("begin_decoding", "decode_step", "reorder_state", "generate", *RECIPE_METHODS):
            setattr(model, method, None)
        return model
    return make


@hookimpl
def register_implementations(register):
    # AIAYN_BROKEN_UNDECLARED=1 registers them without their declarations (the negative control).
    declare = os.environ.get("AIAYN_BROKEN_UNDECLARED") != "1"
    for name, (build, output, bug, clauses) in BROKEN.items():
        register(Implementation(name=f"broken-{name}", build=forward_only(build), output=output, summary=f"BUG: {bug}",
                                source="tests/broken_models.py", deviations=clauses if declare else {}))
