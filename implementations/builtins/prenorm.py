"""Built-in plugin ``prenorm``: the paper's Transformer with pre-norm residuals, the most common modern deviation.

Every sub-layer computes ``x + Dropout(Sublayer(LayerNorm(x)))`` instead of
§3.1's ``LayerNorm(x + Dropout(Sublayer(x)))``, and each stack ends with a
final LayerNorm (without it the residual stream would reach the generator
and the cross-attention unnormalized). This is tensor2tensor's
``transformer_base`` from v2 on (``layer_preprocess_sequence="n"``,
``layer_postprocess_sequence="da"``), the Annotated Transformer's choice, and
``nn.Transformer(norm_first=True)``'s. Everything else is the paper's:
bias-free multi-head attention with 1/sqrt(d_k) (§3.2), -inf masks where a
query with no admissible key attends to nothing, Eq. (2) FFN, tied embeddings
scaled by sqrt(d_model) (§3.4), interleaved sinusoids (§3.5) and §5.4's
dropout sites.

Decoding: the step-level interface only (``begin_decoding``, ``decode_step``,
``reorder_state`` from ``reference.decoding.PrefixDecoding``), each step
recomputing the whole prefix with ``forward``: a layout variant, not a library with
a decoder of its own, so the adapter offers no search (no ``generate``) and invents no cache.

``load_reference_state`` puts each canonical ``normK`` on the input of the
K-th sub-layer of its layer (the same position in the sub-layer order) and
gives the final stack norms gain 1 and bias 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from aiayn_conformance.reference.decoding import PrefixDecoding
from aiayn_conformance.reference.model import causal_mask, padding_mask, sinusoid_table
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import load_canonical, parameter_schema

from ..declarations import Implementation
from ..hookspecs import hookimpl

__all__ = ["PreNormTransformer", "build", "DEVIATIONS"]


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """§3.2.1, Eq. (1): softmax(Q K^T / sqrt(d_k)) V over the keys the mask (True = may attend) allows.

    q (B, h, Lq, d_k), k and v (B, h, Lk, d_k); a query with no allowed key returns zeros.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, Lq, Lk)
    any_allowed = mask.any(dim=-1, keepdim=True)  # (B, 1, Lq|1, 1)
    weights = torch.softmax(scores.masked_fill(~(mask | ~any_allowed), float("-inf")), dim=-1)
    return weights.masked_fill(~any_allowed, 0.0) @ v  # (B, h, Lq, d_k)


class MultiHeadAttention(nn.Module):
    """§3.2.2: h heads of size d_k, bias-free projections q, k, v, o (head j on rows j*d_k..(j+1)*d_k)."""

    def __init__(self, d_model: int, h: int):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.v = nn.Linear(d_model, d_model, bias=False)
        self.o = nn.Linear(d_model, d_model, bias=False)

    def forward(self, query: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        B, Lq, Lk = query.size(0), query.size(1), memory.size(1)
        q = self.q(query).view(B, Lq, self.h, self.d_k).transpose(1, 2)  # (B, h, Lq, d_k)
        k = self.k(memory).view(B, Lk, self.h, self.d_k).transpose(1, 2)  # (B, h, Lk, d_k)
        v = self.v(memory).view(B, Lk, self.h, self.d_k).transpose(1, 2)  # (B, h, Lk, d_k)
        heads = attention(q, k, v, mask)  # (B, h, Lq, d_k)
        return self.o(heads.transpose(1, 2).reshape(B, Lq, self.h * self.d_k))  # (B, Lq, d_model)


class FeedForward(nn.Module):
    """§3.3, Eq. (2): max(0, x W1 + b1) W2 + b2."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(torch.relu(self.w1(x)))


class EncoderLayer(nn.Module):
    """Pre-norm encoder layer: x + Dropout(SelfAttn(LN1(x))), then x + Dropout(FFN(LN2(x)))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        h = self.norm1(x)
        x = x + self.dropout(self.self_attn(h, h, src_mask))  # (B, S, d_model)
        return x + self.dropout(self.ffn(self.norm2(x)))  # (B, S, d_model)


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: masked self-attention, encoder-decoder attention, FFN, each x + Dropout(F(LN(x)))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff)
        self.norm3 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, y: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        h = self.norm1(y)
        y = y + self.dropout(self.self_attn(h, h, tgt_mask))  # (B, T, d_model)
        y = y + self.dropout(self.cross_attn(self.norm2(y), memory, src_mask))  # (B, T, d_model)
        return y + self.dropout(self.ffn(self.norm3(y)))  # (B, T, d_model)


class PreNormTransformer(PrefixDecoding, nn.Module):
    """§3 with pre-norm residuals and a final LayerNorm per stack; returns logits (B, T, tgt_vocab)."""

    pe: Tensor  # (max_len, d_model), a non-persistent buffer

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        self.src_embed = nn.Embedding(cfg.src_vocab, cfg.d_model)
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab, cfg.d_model)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.encoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.decoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.generator = nn.Linear(cfg.d_model, cfg.tgt_vocab, bias=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.register_buffer("pe", sinusoid_table(cfg.max_len, cfg.d_model), persistent=False)  # (max_len, d_model)
        for name, p in self.named_parameters():  # the reference's initialization
            if name.endswith("embed.weight"):
                nn.init.normal_(p, mean=0.0, std=cfg.d_model ** -0.5)
            elif p.dim() == 2:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        if cfg.share_embeddings:  # §3.4: one matrix, three uses
            self.tgt_embed.weight = self.src_embed.weight
            self.generator.weight = self.src_embed.weight

    def positional_encoding(self, length: int) -> Tensor:
        """§3.5: the table added to the scaled embeddings, (length, d_model)."""
        if length <= self.pe.size(0):
            return self.pe[:length]
        return sinusoid_table(length, self.config.d_model, device=self.pe.device)

    def _embed(self, tokens: Tensor, embedding: nn.Embedding) -> Tensor:
        """§3.4, §3.5, §5.4: Dropout(sqrt(d_model) * E[tokens] + PE). (B, L, d_model)."""
        x = embedding(tokens) * math.sqrt(self.config.d_model)  # (B, L, d_model)
        return self.dropout(x + self.positional_encoding(tokens.size(1)).to(x.dtype))

    def _encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        x = self._embed(src, self.src_embed)  # (B, S, d_model)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.encoder_norm(x)

    def encode(self, src: Tensor) -> Tensor:
        """The encoder output that cross-attention reads (after the final encoder norm): (B, S, d_model)."""
        return self._encode(src, padding_mask(src, self.config.pad_id))

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) right-padded token ids to logits (B, T, tgt_vocab)."""
        src_mask = padding_mask(src, self.config.pad_id)  # (B, 1, 1, S), True = may attend
        tgt_mask = causal_mask(tgt.size(1), tgt.device) & padding_mask(tgt, self.config.pad_id)  # (B, 1, T, T)
        memory = self._encode(src, src_mask)  # (B, S, d_model)
        y = self._embed(tgt, self.tgt_embed)  # (B, T, d_model)
        for layer in self.decoder:
            y = layer(y, memory, src_mask, tgt_mask)
        return self.generator(self.decoder_norm(y))  # (B, T, tgt_vocab)

    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical-schema state dict: every canonical name is this model's own (``normK`` now
        normalizes the K-th sub-layer's input); the final norms get gain 1 and bias 0."""
        load_canonical(state, {name: self.get_parameter(name) for name in parameter_schema(self.config)},
                       zero=[self.encoder_norm.bias, self.decoder_norm.bias],
                       one=[self.encoder_norm.weight, self.decoder_norm.weight])


def build(config: ModelConfig) -> PreNormTransformer:
    return PreNormTransformer(config)


DEVIATIONS: dict[str, str] = {
    "norm.post-norm": (
        "each sub-layer computes x + Dropout(Sublayer(LayerNorm(x))) (pre-norm) instead of "
        "LayerNorm(x + Dropout(Sublayer(x)))"
    ),
    "norm.no-extra-norm": "each stack ends with a final LayerNorm (encoder_norm, decoder_norm), which pre-norm needs",
    "config.parameters": "the two final LayerNorms add 2 x 2 x d_model parameters the paper does not have",
    "model.reference-equivalence": (
        "with the canonical weights loaded the norms sit before the sub-layers and the residual stream is never "
        "normalized between layers, so the function differs from the paper's"
    ),
}


NOTES = (
    "The layout of tensor2tensor's `transformer_base` from v2 on, of the Annotated Transformer and of "
    "`nn.Transformer(norm_first=True)`: each sub-layer normalizes its input, and each stack ends with a LayerNorm "
    "that brings the residual stream back to unit scale. Everything else is the paper's.\n\n"
    "Decoding: as `torch-nn`, the step-level interface by recomputing the prefix, and no `generate`."
)


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="prenorm",
        build=build,
        summary="The paper's model with pre-norm residuals x + Dropout(F(LN(x))) and a final LayerNorm per stack",
        source="aiayn-conformance implementations/builtins/prenorm.py (tensor2tensor transformer_base v2+ layout)",
        output="logits",
        deviations=DEVIATIONS,
        notes=NOTES,
    ))
