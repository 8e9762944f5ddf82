"""Built-in plugin ``building-blocks``: MaryFllh/attention_is_all_you_need, the model its README walks through.

Upstream: https://github.com/MaryFllh/attention_is_all_you_need at commit 888864dcc666 (``file:line``
below are at that commit). The repository spreads the model over ``embeddings/``, ``sublayers/``,
``layers/`` and ``transformer.py``, and its README (``README.md`` at commit ca63e2d14d0e) prints each file in
turn; this plugin reproduces that code in one file, in our own words, keeping its class and attribute names.

- ``Embedder`` (embeddings/embedder.py:5-22): ``nn.Embedding(vocab, d_model)`` times ``d_model ** 0.5``
  (:21), §3.4.
- ``PositionalEncoder`` (embeddings/postional_encoder.py:5-26): the §3.5 table, sines on even and cosines on
  odd columns (:20-22), made in ``__init__`` with ``torch.zeros`` and kept as a plain tensor attribute
  ``self.positional_encodings`` (:18), not a registered buffer: ``module.to(...)`` and ``.double()`` leave it
  on the CPU in float32. ``forward(x)`` takes the token ids [B, L] and returns the first L rows (:24-26).
- ``ScaledDotProductAttention`` (sublayers/scaled_dot_product_attention.py:5-25): scores
  ``einsum("bqhd,bkhd->bhqk")`` (:16) divided by ``sqrt(d_model)`` (:17), not sqrt(d_k): the module is built
  with ``d_model`` (sublayers/multihead_attention.py:24). Masked scores (``mask == 0``) are filled with
  ``1e-20``, a tiny positive number, not -inf (:20); softmax over the keys (:22). The output is
  ``einsum("bhqk, bvhd->bqhd", softmax, v)`` (:23): the value operand is labelled ``v``, not ``k``, so einsum
  sums the weights over ``k`` (each row sums to 1) and the values over ``v`` separately. Every query of a
  head therefore receives the plain sum of ALL value vectors, whatever the scores, the scale or the mask:
  attention ignores its queries and keys, and no mask (padding or causal) has any effect (§3.2.1).
- ``MultiheadAttention`` (sublayers/multihead_attention.py:6-68): ``w_q``, ``w_k``, ``w_v``, ``w_o`` are
  ``nn.Linear`` with their default biases (:20-22, :25); ``split`` reshapes [B, L, d_model] to
  [B, L, h, d_model / h] (:27-41) and ``concat`` reshapes back (:43-55); the einsums work in that layout, so
  no transpose is needed (§3.2.2).
- ``PointWiseFeedForward`` (sublayers/point_wise_feed_forward.py:4-30): Linear, ReLU, Linear (:23-27), no
  inner dropout (§3.3).
- ``EncoderLayer`` (layers/encoder.py:11-33): ``attention_layer_norm(x + dropout(attn(x)))`` (:27-30), then
  ``ff_layer_norm(pwff + dropout(pwff))`` with ``pwff`` the FFN output (:31-32): the FFN sub-layer's
  residual adds the FFN output to (a dropped-out copy of) itself instead of the sub-layer input (§3.1).
- ``Encoder`` (layers/encoder.py:36-64): its own ``Embedder`` and ``PositionalEncoder`` (:48-49), N
  deep-copied layers (:50-57), ``dropout(embedding(x) + positional_encoding(x))`` (:61); no final norm.
- ``DecoderLayer`` (layers/decoder.py:12-50): builds three norms (:21, :23, :25) but normalizes the
  encoder-decoder sub-layer with ``attention_layer_norm`` again (:41-43), so ``enc_dec_att_layer_norm`` is
  never called and the self-attention and cross-attention sub-layers share one norm. Cross-attention takes
  its queries from ``x``, the decoder layer's input (:38), not from the self-attention sub-layer's output,
  and gets no mask: no source padding mask, and the decoder is never given one (:85; transformer.py:57).
  The FFN residual is lost as in the encoder (:46-49).
- ``Decoder`` (layers/decoder.py:53-88): its own ``Embedder`` and ``PositionalEncoder`` (:69-70), so the
  source and target embeddings are two matrices; ``self.linear = nn.Linear(d_model, trg_vocab_size)`` with a
  bias (:80) and a softmax at the end (:86-87): the model returns probabilities (``output="probs"``).
- ``Transformer`` (transformer.py:8-58): ``make_src_mask`` = (src != pad)[B, 1, 1, S] (:44-45);
  ``make_trg_mask`` = ``torch.tril(torch.ones(T, T))`` expanded to [B, 1, T, T] (:47-51): float32, made on
  the CPU whatever the input's device, and without target padding. Layer norms are ``nn.LayerNorm(d_model)``
  with PyTorch's default eps 1e-5 (layers/encoder.py:21, :23; layers/decoder.py:21, :23, :25), so
  ``config.norm_eps`` is not used.

Where the README departs from the files: it prints the multi-head attention file under the name
``sublayers/scaled_dot_product_attention.py``; its copy of ``sublayers/scaled_dot_product_attention.py``
imports ``PositionalEncoder`` without using it; and ``embeddings/embedder.py`` at this commit opens with a
stray ``from turtle import forward`` that the README does not show. None of these changes what the model
computes, and none matters in one file. No repair was needed.

Completions and adaptations (where the code is silent or its interface differs from our config):

- ``PointWiseFeedForward`` takes the inner size ``d_ff`` directly instead of ``forward_expansion`` with inner
  size ``d_model * forward_expansion`` (sublayers/point_wise_feed_forward.py:13, :24-26): the same layers
  when d_ff is a multiple of d_model, and it also accepts configurations where it is not.
- ``Transformer`` is built from ``ModelConfig``: ``src_pad_idx = trg_pad_idx = config.pad_id``
  (transformer.py:12-13), ``max_seq_len = config.max_len`` (:16, default 100 there), ``heads_num``,
  ``layers_num``, ``dropout`` from the config.
- Initialization: the code shows none; PyTorch's defaults (``nn.Linear``, ``nn.Embedding``).
- ``encode(src)`` runs the encoder with its source mask (transformer.py:54, :56).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import CanonicalKey, Target, load_canonical

from ..declarations import Implementation
from ..hookspecs import hookimpl

__all__ = ["Transformer", "build", "DEVIATIONS"]


# -- embeddings/ ----------------------------------------------------------------------------------------------------
class Embedder(nn.Module):
    """Token embeddings multiplied by sqrt(d_model) (embeddings/embedder.py:21)."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.d_model = d_model

    def forward(self, x: Tensor) -> Tensor:
        return self.embedding(x) * (self.d_model ** 0.5)  # (B, L, d_model)


class PositionalEncoder(nn.Module):
    """§3.5 sinusoids, kept as a plain CPU float32 attribute, not a buffer (embeddings/postional_encoder.py:18)."""

    def __init__(self, max_seq_len: int, d_model: int):
        super().__init__()
        table = torch.zeros(max_seq_len, d_model)  # (max_len, d_model)
        positions = torch.arange(max_seq_len).unsqueeze(1)  # (max_len, 1)
        division_term = 10000 ** (torch.arange(0, d_model, 2) / d_model)  # (d_model/2,)
        table[:, 0::2] = torch.sin(positions / division_term)
        table[:, 1::2] = torch.cos(positions / division_term)
        self.positional_encodings = table  # plain attribute: module.to(...) does not move it

    def forward(self, x: Tensor) -> Tensor:
        """Token ids (B, L) -> the first L rows of the table, (L, d_model)."""
        return self.positional_encodings[:x.size(1), :]


# -- sublayers/ -----------------------------------------------------------------------------------------------------
class ScaledDotProductAttention(nn.Module):
    """Scores / sqrt(d_model), masked with 1e-20, softmax over keys; then the weights are summed out."""

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """q (B, Lq, h, d_h), k and v (B, Lk, h, d_h) -> (B, Lq, h, d_h)."""
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / (self.d_model ** 0.5)  # sqrt(d_model), not sqrt(d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, 1e-20)  # a tiny positive fill, not -inf
        weights = torch.softmax(scores, dim=-1)  # over the keys
        # The value operand carries its own letter "v", so "k" and "v" are summed independently:
        # (sum_k weights = 1) * (sum over all value positions), the same for every query.
        return torch.einsum("bhqk,bvhd->bqhd", weights, v)


class MultiheadAttention(nn.Module):
    """h heads in the (B, L, h, d_h) layout; w_q, w_k, w_v, w_o with nn.Linear's default biases."""

    def __init__(self, d_model: int, heads_num: int):
        super().__init__()
        self.d_model = d_model
        self.heads_num = heads_num
        self.d_heads = d_model // heads_num
        if self.d_heads * heads_num != d_model:
            raise ValueError("Embedding size must be divisible by number of heads")
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.attention = ScaledDotProductAttention(d_model)  # built with d_model, not d_heads
        self.w_o = nn.Linear(heads_num * self.d_heads, d_model)

    def split(self, tensor: Tensor) -> Tensor:
        """(B, L, d_model) -> (B, L, h, d_model / h)."""
        batch_size, length, dim = tensor.size()
        return tensor.reshape(batch_size, length, self.heads_num, dim // self.heads_num)

    def concat(self, tensor: Tensor) -> Tensor:
        """(B, L, h, d_h) -> (B, L, h * d_h)."""
        batch_size, length, heads, dim = tensor.size()
        return tensor.reshape(batch_size, length, heads * dim)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        q, k, v = self.split(self.w_q(q)), self.split(self.w_k(k)), self.split(self.w_v(v))
        return self.w_o(self.concat(self.attention(q, k, v, mask)))  # (B, Lq, d_model)


class PointWiseFeedForward(nn.Module):
    """Linear, ReLU, Linear; inner size d_ff (upstream: d_model * forward_expansion)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.d_model = d_model
        self.point_wise_ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))

    def forward(self, x: Tensor) -> Tensor:
        return self.point_wise_ff(x)


# -- layers/ --------------------------------------------------------------------------------------------------------
class EncoderLayer(nn.Module):
    """Post-norm self-attention; the FFN sub-layer normalizes pwff + dropout(pwff), losing its residual."""

    def __init__(self, d_model: int, heads_num: int, d_ff: int, dropout: float):
        super().__init__()
        self.multihead_attention = MultiheadAttention(d_model, heads_num)
        self.attention_layer_norm = nn.LayerNorm(d_model)  # default eps 1e-5
        self.point_wise_feed_forward = PointWiseFeedForward(d_model, d_ff)
        self.ff_layer_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        attended = self.attention_layer_norm(x + self.dropout(self.multihead_attention(x, x, x, mask=mask)))
        pwff = self.point_wise_feed_forward(attended)
        return self.ff_layer_norm(pwff + self.dropout(pwff))  # the sub-layer input is not added


class Encoder(nn.Module):
    """Its own Embedder and PositionalEncoder, then N encoder layers; no final norm."""

    def __init__(self, src_vocab_size: int, d_model: int, max_seq_len: int, heads_num: int, d_ff: int,
                 dropout: float, layers_num: int):
        super().__init__()
        self.embedding = Embedder(src_vocab_size, d_model)
        self.positional_encoding = PositionalEncoder(max_seq_len, d_model)
        self.encoder_layers = nn.ModuleList(
            copy.deepcopy(EncoderLayer(d_model, heads_num, d_ff, dropout)) for _ in range(layers_num))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        out = self.dropout(self.embedding(x) + self.positional_encoding(x))
        for encoder_layer in self.encoder_layers:
            out = encoder_layer(out, mask)
        return out


class DecoderLayer(nn.Module):
    """Self-attention, cross-attention (queries from the layer input, no mask, the self-attention's norm reused)
    and the FFN sub-layer without its residual."""

    def __init__(self, d_model: int, heads_num: int, d_ff: int, dropout: float):
        super().__init__()
        self.multihead_attention = MultiheadAttention(d_model, heads_num)
        self.attention_layer_norm = nn.LayerNorm(d_model)
        self.encoder_decoder_attention = MultiheadAttention(d_model, heads_num)
        self.enc_dec_att_layer_norm = nn.LayerNorm(d_model)  # built, never called
        self.point_wise_feed_forward = PointWiseFeedForward(d_model, d_ff)
        self.ff_layer_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, enc_out: Tensor, x: Tensor, mask: Tensor) -> Tensor:
        self_attention_norm = self.attention_layer_norm(
            x + self.dropout(self.multihead_attention(x, x, x, mask=mask)))
        enc_dec_attention = self.encoder_decoder_attention(x, enc_out, enc_out)  # queries = x, no mask
        enc_dec_att_norm = self.attention_layer_norm(  # the self-attention's norm again
            self_attention_norm + self.dropout(enc_dec_attention))
        pwff = self.point_wise_feed_forward(enc_dec_att_norm)
        return self.ff_layer_norm(pwff + self.dropout(pwff))  # residual lost


class Decoder(nn.Module):
    """Its own Embedder and PositionalEncoder, N decoder layers, a biased Linear and a softmax."""

    def __init__(self, trg_vocab_size: int, d_model: int, max_seq_len: int, heads_num: int, d_ff: int,
                 dropout: float, layers_num: int):
        super().__init__()
        self.embedding = Embedder(trg_vocab_size, d_model)
        self.positional_encoding = PositionalEncoder(max_seq_len, d_model)
        self.decoder = nn.ModuleList(
            copy.deepcopy(DecoderLayer(d_model, heads_num, d_ff, dropout)) for _ in range(layers_num))
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(d_model, trg_vocab_size)  # with a bias

    def forward(self, enc_out: Tensor, x: Tensor, mask: Tensor) -> Tensor:
        out = self.dropout(self.embedding(x) + self.positional_encoding(x))
        for decoder_layer in self.decoder:
            out = decoder_layer(enc_out, out, mask)
        return torch.softmax(self.linear(out), dim=-1)  # probabilities


# -- transformer.py ---------------------------------------------------------------------------------------------------
class Transformer(nn.Module):
    """The repository's Transformer built from a ModelConfig; returns probabilities (B, T, tgt_vocab)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        self.src_pad_idx = cfg.pad_id
        self.trg_pad_idx = cfg.pad_id
        self.encoder = Encoder(cfg.src_vocab, cfg.d_model, cfg.max_len, cfg.n_heads, cfg.d_ff, cfg.dropout,
                               cfg.n_layers)
        self.decoder = Decoder(cfg.tgt_vocab, cfg.d_model, cfg.max_len, cfg.n_heads, cfg.d_ff, cfg.dropout,
                               cfg.n_layers)

    def make_src_mask(self, src: Tensor) -> Tensor:
        """(B, 1, 1, S) boolean, True at real source keys."""
        return (src != self.src_pad_idx).unsqueeze(1).unsqueeze(2)

    def make_trg_mask(self, trg: Tensor) -> Tensor:
        """(B, 1, T, T) float32 lower triangle, built on the CPU and without target padding."""
        batch_size, trg_len = trg.size()
        return torch.tril(torch.ones(trg_len, trg_len)).expand(batch_size, 1, trg_len, trg_len)

    def forward(self, src: Tensor, trg: Tensor) -> Tensor:
        src_mask = self.make_src_mask(src)
        trg_mask = self.make_trg_mask(trg)
        encoder_out = self.encoder(src, src_mask)  # (B, S, d_model)
        return self.decoder(encoder_out, trg, trg_mask)  # (B, T, tgt_vocab), probabilities

    # -- adapter contract ----------------------------------------------------------------------------------------
    def encode(self, src: Tensor) -> Tensor:
        """The last encoder layer's output (what cross-attention reads): (B, S, d_model)."""
        return self.encoder(src, self.make_src_mask(src))

    def positional_encoding(self, length: int) -> Tensor:
        """The table the encoder adds (the decoder holds an identical one): (length, d_model), length <= max_len."""
        table = self.encoder.positional_encoding.positional_encodings
        if length > table.size(0):
            raise ValueError(f"the table was built for max_seq_len={table.size(0)} positions; {length} requested")
        return table[:length]

    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical-schema state dict; attention and generator biases get 0. Decoder ``norm1`` goes to
        ``attention_layer_norm``, which also serves the cross-attention sub-layer, and ``norm2`` to
        ``enc_dec_att_layer_norm``, which is built but never used; the embeddings are never tied, so with
        ``share_embeddings`` the one canonical matrix is copied into all three."""
        get = self.get_parameter
        mapping: dict[CanonicalKey, Target] = {"src_embed.weight": get("encoder.embedding.embedding.weight"),
                                               "tgt_embed.weight": get("decoder.embedding.embedding.weight"),
                                               "generator.weight": get("decoder.linear.weight")}
        zero = [get("decoder.linear.bias")]
        stacks = (("encoder", "encoder.encoder_layers", {"self_attn": "multihead_attention"},
                   {"norm1": "attention_layer_norm", "norm2": "ff_layer_norm"}),
                  ("decoder", "decoder.decoder", {"self_attn": "multihead_attention",
                                                  "cross_attn": "encoder_decoder_attention"},
                   {"norm1": "attention_layer_norm", "norm2": "enc_dec_att_layer_norm", "norm3": "ff_layer_norm"}))
        for stack, layers, attentions, norms in stacks:
            for i in range(self.config.n_layers):
                ours, theirs = f"{stack}.{i}", f"{layers}.{i}"
                for att, mha in attentions.items():
                    mapping.update({f"{ours}.{att}.{x}.weight": get(f"{theirs}.{mha}.w_{x}.weight") for x in "qkvo"})
                    zero += [get(f"{theirs}.{mha}.w_{x}.bias") for x in "qkvo"]
                for p in ("weight", "bias"):
                    mapping[f"{ours}.ffn.w1.{p}"] = get(f"{theirs}.point_wise_feed_forward.point_wise_ff.0.{p}")
                    mapping[f"{ours}.ffn.w2.{p}"] = get(f"{theirs}.point_wise_feed_forward.point_wise_ff.2.{p}")
                    mapping.update({f"{ours}.{norm}.{p}": get(f"{theirs}.{own}.{p}") for norm, own in norms.items()})
        load_canonical(state, mapping, zero=zero)


def build(config: ModelConfig) -> Transformer:
    return Transformer(config)


DEVIATIONS: dict[str, str] = {
    "train.learns": (
        "attention returns the sum of every value vector (the einsum declared under attention.softmax-over-keys), "
        "so no source token can be singled out and the decoder sums future positions too: trained with the "
        "paper's recipe from the reference's initial state, greedy decoding reproduces 1.5% of the held-out copies "
        "and 0.5% of the reversals after 150 updates"
    ),
    "attention.scale": (
        "the scores are divided by sqrt(d_model), not sqrt(d_k) (sublayers/scaled_dot_product_attention.py:17; the "
        "module is built with d_model, sublayers/multihead_attention.py:24): an extra factor 1/sqrt(h). The "
        "scores never reach the output (the einsum under attention.softmax-over-keys), so only the own-weights "
        "trace, which reads the scores where the softmax takes them, sees it"
    ),
    "attention.softmax-over-keys": (
        "the weighted sum is einsum('bhqk, bvhd->bqhd', softmax, v) (sublayers/scaled_dot_product_attention.py:23): "
        "the value operand has its own letter v, so the key axis of the weights and the position axis of the "
        "values are summed separately; each query's weights sum to 1 and every query receives the plain sum of "
        "ALL value vectors of its head, whatever the scores"
    ),
    "mask.causal": (
        "the causal mask (transformer.py:47-51) only touches the scores, which the summed-out weights of the "
        "attention output discard: decoder self-attention returns the sum of the values of every target "
        "position, future ones included"
    ),
    "mask.source-padding": (
        "the source mask (transformer.py:44-45, applied at sublayers/scaled_dot_product_attention.py:20) only "
        "touches the scores, which the attention output discards, so encoder self-attention sums the values of "
        "padded positions too; cross-attention gets no mask at all (layers/decoder.py:38; the decoder is never "
        "given the source mask: layers/decoder.py:85, transformer.py:57)"
    ),
    "mask.target-padding": (
        "decoder self-attention sums the values of every target position, padded ones included, so appending "
        "target padding changes the outputs at real positions (the target mask of transformer.py:49 has no "
        "padding term either, and would be discarded anyway)"
    ),
    "norm.post-norm": (
        "the feed-forward sub-layer computes ff_layer_norm(pwff + dropout(pwff)) with pwff the FFN output "
        "(layers/encoder.py:32, layers/decoder.py:49): the residual adds the FFN output to itself, the sub-layer "
        "input is lost"
    ),
    "dropout.residual": (
        "the FFN sub-layer's dropped output is added to an undropped copy of the same output (pwff + "
        "dropout(pwff), layers/encoder.py:32, layers/decoder.py:49), so no feature of that sub-layer's output is "
        "zeroed in training. The suite's embedding-sum probe also fails, but only because of the lost FFN "
        "residual: with the decoder sub-layers zeroed each layer outputs LN(0 + 0) and the embedding sum never "
        "reaches the output; the code does drop the embedding sums (layers/encoder.py:61, layers/decoder.py:83)"
    ),
    "layers.independent": (
        "the decoder layer builds enc_dec_att_layer_norm (layers/decoder.py:23) but normalizes the "
        "cross-attention sub-layer with attention_layer_norm again (layers/decoder.py:41): one norm serves two "
        "sub-layers and canonical norm2 changes nothing; W_q and W_k of every attention are dead too, since the "
        "attention output discards the scores"
    ),
    "train.gradients": (
        "enc_dec_att_layer_norm (layers/decoder.py:23) is never called (layers/decoder.py:41 reuses "
        "attention_layer_norm), so its weight and bias get no gradient"
    ),
    "embedding.shared-weights": (
        "never tied: the encoder and the decoder each build their own Embedder (layers/encoder.py:48, "
        "layers/decoder.py:69) and the decoder its own nn.Linear(d_model, trg_vocab_size) with a bias "
        "(layers/decoder.py:80), so share_embeddings=True still gives three matrices and a pre-softmax bias"
    ),
    "config.parameters": (
        "beyond the schema: biases on w_q, w_k, w_v, w_o (sublayers/multihead_attention.py:20-25, 4 x d_model per "
        "attention), the untied source/target embeddings and output matrix (layers/encoder.py:48, "
        "layers/decoder.py:69, :80: +2 x vocab x d_model when share_embeddings) and the output bias "
        "(layers/decoder.py:80); the base preset has 101M parameters, not 65M"
    ),
    "device.portable": (
        "PositionalEncoder keeps its table as a plain CPU tensor attribute (embeddings/postional_encoder.py:18), "
        "not a buffer, so module.to(...) leaves it behind; make_trg_mask builds torch.tril(torch.ones(T, T)) on "
        "the CPU whatever the input's device (transformer.py:49)"
    ),
    "model.reference-equivalence": (
        "with the canonical weights loaded the function differs from the paper's: attention returns the sum of "
        "all values (sublayers/scaled_dot_product_attention.py:23), the FFN residual is lost "
        "(layers/encoder.py:32, layers/decoder.py:49) and the cross-attention sub-layer uses the self-attention's "
        "norm (layers/decoder.py:41)"
    ),
}


NOTES = (
    "The worst of the five transcriptions: its attention output `einsum(\"bhqk, bvhd->bqhd\", ...)` gives the value "
    "operand its own letter, so every query receives the sum of all value vectors and no score, scale or mask "
    "reaches the output. The output-based probes therefore cannot observe `attention.scale` or the cross-attention "
    "source (they skip, saying the scores never reach the output); the own-weights trace reads the scores where the "
    "softmax takes them and finds the sqrt(d_model) scale. Every mask clause fails for the summing alone. "
    "The FFN residual is lost (`pwff + dropout(pwff)`), the cross-attention sub-layer reuses the self-attention "
    "norm, the positional table and the causal mask stay on the CPU."
)


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="building-blocks",
        build=build,
        summary="MaryFllh README code: attention that sums all values (einsum 'bhqk,bvhd'), sqrt(d_model) scale, "
                "1e-20 mask fill, FFN residual lost, shared decoder norm, biased projections, softmax output",
        source="https://github.com/MaryFllh/attention_is_all_you_need/tree/888864dcc666c1d328e27ada277d36e87571e153",
        output="probs",
        deviations=DEVIATIONS,
        notes=NOTES,
    ))
