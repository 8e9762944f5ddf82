"""Built-in plugin ``building-blocks``: MaryFllh/attention_is_all_you_need as its README shows it (seed document 000).

Reproduced from ``/work/shared/seeds/000_30444cb105c0e0ea.txt`` ("the document"; "Lnnn" are its line
numbers), in our own words, keeping its class and attribute names. The document spreads the model over
embeddings/, sublayers/, layers/ and transformer.py; here it is one file.

- ``Embedder`` (L30-L47): ``nn.Embedding(vocab, d_model)`` times ``d_model ** 0.5`` (L46).
- ``PositionalEncoder`` (L60-L81): the §3.5 table (sines on even, cosines on odd columns, L73-L77) made in
  ``__init__`` with ``torch.zeros`` and kept as a plain tensor attribute ``self.positional_encodings`` (L73),
  not a registered buffer: ``module.to(...)`` and ``.double()`` leave it on the CPU in float32.
  ``forward(x)`` takes the token ids [B, L] and returns the first L rows (L79-L81).
- ``ScaledDotProductAttention`` (L123-L143): scores ``einsum("bqhd,bkhd->bhqk")`` (L134) divided by
  ``sqrt(d_model)``, not sqrt(d_k) (L129-L131, L135; built with ``d_model`` at L177); masked scores
  (``mask == 0``) filled with ``1e-20``, a tiny positive number, not -inf (L138); softmax over the keys (L140).
  The output is ``einsum("bhqk, bvhd->bqhd", softmax, v)`` (L141): the value operand is labelled ``v``, not
  ``k``, so einsum sums the weights over ``k`` (each row sums to 1) and the values over ``v`` separately.
  Every query of a head therefore receives the plain sum of ALL value vectors, whatever the scores, the
  scale or the mask: attention ignores its queries and keys, and no mask (padding or causal) has any effect.
- ``MultiheadAttention`` (L159-L221): ``w_q``, ``w_k``, ``w_v``, ``w_o`` are ``nn.Linear`` with their default
  biases (L173-L178); ``split`` reshapes [B, L, d_model] to [B, L, h, d_model / h] (L191-L194) and ``concat``
  reshapes back (L207-L208); the einsums work in that layout, so no transpose is needed.
- ``PointWiseFeedForward`` (L236-L262): Linear, ReLU, Linear (L255-L259), no inner dropout.
- ``EncoderLayer`` (L283-L305): ``attention_layer_norm(x + dropout(attn(x)))`` (L299-L302), then
  ``ff_layer_norm(pwff + dropout(pwff))`` with ``pwff`` the FFN output (L303-L304): the FFN sub-layer's
  residual adds the FFN output to (a dropped-out copy of) itself instead of the sub-layer input.
- ``Encoder`` (L311-L339): its own ``Embedder`` and ``PositionalEncoder`` (L323-L324), N deep-copied layers
  (L325-L332), ``dropout(embedding(x) + positional_encoding(x))`` (L336); no final norm.
- ``DecoderLayer`` (L358-L396): builds three norms (L367, L369, L371) but the encoder-decoder sub-layer is
  normalized by ``attention_layer_norm`` again (L387), so ``enc_dec_att_layer_norm`` (L369) is never called
  and the self-attention and cross-attention sub-layers share one norm. Cross-attention takes its queries
  from ``x``, the decoder layer's input (L384), not from the self-attention sub-layer's output, and gets no
  mask (L384: no source padding mask; the decoder is never given one, L428, L498). The FFN residual is lost
  as in the encoder (L392-L395).
- ``Decoder`` (L399-L434): its own ``Embedder`` and ``PositionalEncoder`` (L415-L416), so the source and
  target embeddings are two matrices; ``self.linear = nn.Linear(d_model, trg_vocab_size)`` with a bias (L426)
  and a softmax at the end (L432-L433): the model returns probabilities (``output="probs"``).
- ``Transformer`` (L449-L499): ``make_src_mask`` = (src != pad)[B, 1, 1, S] (L485-L486); ``make_trg_mask`` =
  ``torch.tril(torch.ones(T, T))`` expanded to [B, 1, T, T] (L488-L492): float32, made on the CPU whatever
  the input's device, and without target padding. Layer norms are ``nn.LayerNorm(d_model)`` with PyTorch's
  default eps 1e-5 (L293, L295, L367, L369, L371), so ``config.norm_eps`` is not used.

Repairs: none were needed. (The README labels the multi-head attention file
``sublayers/scaled_dot_product_attention.py`` (L152) while it is imported as ``sublayers.multihead_attention``
(L277, L352); ``sublayers/scaled_dot_product_attention.py`` imports ``PositionalEncoder`` without using it
(L118); both are moot in one file.)

Completions and adaptations (where the document is silent or its interface differs from our config):

- ``PointWiseFeedForward`` takes the inner size ``d_ff`` directly instead of ``forward_expansion`` with inner
  size ``d_model * forward_expansion`` (L245, L256-L258): the same layers when d_ff is a multiple of d_model,
  and it also accepts configurations where it is not.
- ``Transformer`` is built from ``ModelConfig``: ``src_pad_idx = trg_pad_idx = config.pad_id`` (L453-L454),
  ``max_seq_len = config.max_len`` (L457, default 100 there), ``heads_num``, ``layers_num``, ``dropout`` from
  the config.
- Initialization: the document shows none; PyTorch's defaults (``nn.Linear``, ``nn.Embedding``).
- ``encode(src)`` runs the document's encoder with its source mask (L495, L497).

Canonical schema mapping (``load_reference_state``): ``src_embed`` -> ``encoder.embedding.embedding``,
``tgt_embed`` -> ``decoder.embedding.embedding``, ``generator`` -> ``decoder.linear`` (its bias set to 0);
attention ``q, k, v, o`` -> ``w_q, w_k, w_v, w_o`` (biases set to 0); ``ffn.w1/w2`` -> ``point_wise_ff[0]/[2]``;
encoder ``norm1/norm2`` -> ``attention_layer_norm/ff_layer_norm``; decoder ``norm1`` -> ``attention_layer_norm``
(which also serves the cross-attention sub-layer), ``norm2`` -> ``enc_dec_att_layer_norm`` (loaded, never
used), ``norm3`` -> ``ff_layer_norm``. The embeddings are never tied, so with ``share_embeddings`` the same
canonical matrix is copied into all three.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from functools import partial

import torch
from torch import Tensor, nn

from spec.config import ModelConfig
from spec.schema import copy_canonical

from .hookspecs import hookimpl
from .registry import Implementation

__all__ = ["Transformer", "build", "DEVIATIONS"]


# -- embeddings/ (doc L24-L82) ----------------------------------------------------------------------------------------
class Embedder(nn.Module):
    """Token embeddings multiplied by sqrt(d_model) (doc L46)."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.d_model = d_model

    def forward(self, x: Tensor) -> Tensor:
        return self.embedding(x) * (self.d_model ** 0.5)  # (B, L, d_model)


class PositionalEncoder(nn.Module):
    """§3.5 sinusoids, kept as a plain CPU float32 attribute (doc L73: not a buffer)."""

    def __init__(self, max_seq_len: int, d_model: int):
        super().__init__()
        table = torch.zeros(max_seq_len, d_model)  # (max_len, d_model), doc L73
        positions = torch.arange(max_seq_len).unsqueeze(1)  # (max_len, 1), doc L74
        division_term = 10000 ** (torch.arange(0, d_model, 2) / d_model)  # (d_model/2,), doc L75
        table[:, 0::2] = torch.sin(positions / division_term)  # doc L76
        table[:, 1::2] = torch.cos(positions / division_term)  # doc L77
        self.positional_encodings = table  # plain attribute: module.to(...) does not move it

    def forward(self, x: Tensor) -> Tensor:
        """Token ids (B, L) -> the first L rows of the table, (L, d_model) (doc L79-L81)."""
        return self.positional_encodings[:x.size(1), :]


# -- sublayers/ (doc L115-L263) ------------------------------------------------------------------------------------
class ScaledDotProductAttention(nn.Module):
    """Scores / sqrt(d_model), masked with 1e-20, softmax over keys; then the weights are summed out (doc L141)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """q (B, Lq, h, d_h), k and v (B, Lk, h, d_h) -> (B, Lq, h, d_h)."""
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / (self.d_model ** 0.5)  # sqrt(d_model), doc L134-L135
        if mask is not None:
            scores = scores.masked_fill(mask == 0, 1e-20)  # a tiny positive fill, not -inf (doc L138)
        weights = torch.softmax(scores, dim=-1)  # over the keys (doc L140)
        # doc L141: the value operand carries its own letter "v", so "k" and "v" are summed independently:
        # (sum_k weights = 1) * (sum over all value positions), the same for every query.
        return torch.einsum("bhqk,bvhd->bqhd", weights, v)


class MultiheadAttention(nn.Module):
    """h heads in the (B, L, h, d_h) layout; w_q, w_k, w_v, w_o with nn.Linear's default biases (doc L173-L178)."""

    def __init__(self, d_model: int, heads_num: int):
        super().__init__()
        self.d_model = d_model
        self.heads_num = heads_num
        self.d_heads = d_model // heads_num
        if self.d_heads * heads_num != d_model:  # doc L169-L171
            raise ValueError("Embedding size must be divisible by number of heads")
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.attention = ScaledDotProductAttention(d_model)  # built with d_model, not d_heads (doc L177)
        self.w_o = nn.Linear(heads_num * self.d_heads, d_model)

    def split(self, tensor: Tensor) -> Tensor:
        """(B, L, d_model) -> (B, L, h, d_model / h) (doc L191-L194)."""
        batch_size, length, dim = tensor.size()
        return tensor.reshape(batch_size, length, self.heads_num, dim // self.heads_num)

    def concat(self, tensor: Tensor) -> Tensor:
        """(B, L, h, d_h) -> (B, L, h * d_h) (doc L207-L208)."""
        batch_size, length, heads, dim = tensor.size()
        return tensor.reshape(batch_size, length, heads * dim)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        q, k, v = self.split(self.w_q(q)), self.split(self.w_k(k)), self.split(self.w_v(v))
        return self.w_o(self.concat(self.attention(q, k, v, mask)))  # (B, Lq, d_model)


class PointWiseFeedForward(nn.Module):
    """Linear, ReLU, Linear (doc L255-L259); inner size d_ff (the document's d_model * forward_expansion)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.d_model = d_model
        self.point_wise_ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))

    def forward(self, x: Tensor) -> Tensor:
        return self.point_wise_ff(x)


# -- layers/ (doc L270-L435) ---------------------------------------------------------------------------------------
class EncoderLayer(nn.Module):
    """Post-norm self-attention; the FFN sub-layer normalizes pwff + dropout(pwff), losing its residual (doc L304)."""

    def __init__(self, d_model: int, heads_num: int, d_ff: int, dropout: float):
        super().__init__()
        self.multihead_attention = MultiheadAttention(d_model, heads_num)
        self.attention_layer_norm = nn.LayerNorm(d_model)  # default eps 1e-5 (doc L293)
        self.point_wise_feed_forward = PointWiseFeedForward(d_model, d_ff)
        self.ff_layer_norm = nn.LayerNorm(d_model)  # doc L295
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        attended = self.attention_layer_norm(x + self.dropout(self.multihead_attention(x, x, x, mask=mask)))
        pwff = self.point_wise_feed_forward(attended)
        return self.ff_layer_norm(pwff + self.dropout(pwff))  # the sub-layer input is not added (doc L304)


class Encoder(nn.Module):
    """Its own Embedder and PositionalEncoder, then N encoder layers; no final norm (doc L311-L339)."""

    def __init__(self, src_vocab_size: int, d_model: int, max_seq_len: int, heads_num: int, d_ff: int,
                 dropout: float, layers_num: int):
        super().__init__()
        self.embedding = Embedder(src_vocab_size, d_model)
        self.positional_encoding = PositionalEncoder(max_seq_len, d_model)
        self.encoder_layers = nn.ModuleList(
            copy.deepcopy(EncoderLayer(d_model, heads_num, d_ff, dropout)) for _ in range(layers_num))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        out = self.dropout(self.embedding(x) + self.positional_encoding(x))  # doc L336
        for encoder_layer in self.encoder_layers:
            out = encoder_layer(out, mask)
        return out


class DecoderLayer(nn.Module):
    """Self-attention, cross-attention (queries from the layer input, no mask, the self-attention's norm reused)
    and the FFN sub-layer without its residual (doc L374-L396)."""

    def __init__(self, d_model: int, heads_num: int, d_ff: int, dropout: float):
        super().__init__()
        self.multihead_attention = MultiheadAttention(d_model, heads_num)
        self.attention_layer_norm = nn.LayerNorm(d_model)  # doc L367
        self.encoder_decoder_attention = MultiheadAttention(d_model, heads_num)
        self.enc_dec_att_layer_norm = nn.LayerNorm(d_model)  # doc L369: built, never called
        self.point_wise_feed_forward = PointWiseFeedForward(d_model, d_ff)
        self.ff_layer_norm = nn.LayerNorm(d_model)  # doc L371
        self.dropout = nn.Dropout(dropout)

    def forward(self, enc_out: Tensor, x: Tensor, mask: Tensor) -> Tensor:
        self_attention_norm = self.attention_layer_norm(
            x + self.dropout(self.multihead_attention(x, x, x, mask=mask)))  # doc L376-L381
        enc_dec_attention = self.encoder_decoder_attention(x, enc_out, enc_out)  # queries = x, no mask (doc L384)
        enc_dec_att_norm = self.attention_layer_norm(  # the self-attention's norm again (doc L387)
            self_attention_norm + self.dropout(enc_dec_attention))
        pwff = self.point_wise_feed_forward(enc_dec_att_norm)
        return self.ff_layer_norm(pwff + self.dropout(pwff))  # residual lost (doc L395)


class Decoder(nn.Module):
    """Its own Embedder and PositionalEncoder, N decoder layers, a biased Linear and a softmax (doc L399-L434)."""

    def __init__(self, trg_vocab_size: int, d_model: int, max_seq_len: int, heads_num: int, d_ff: int,
                 dropout: float, layers_num: int):
        super().__init__()
        self.embedding = Embedder(trg_vocab_size, d_model)
        self.positional_encoding = PositionalEncoder(max_seq_len, d_model)
        self.decoder = nn.ModuleList(
            copy.deepcopy(DecoderLayer(d_model, heads_num, d_ff, dropout)) for _ in range(layers_num))
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(d_model, trg_vocab_size)  # with a bias (doc L426)

    def forward(self, enc_out: Tensor, x: Tensor, mask: Tensor) -> Tensor:
        out = self.dropout(self.embedding(x) + self.positional_encoding(x))  # doc L429
        for decoder_layer in self.decoder:
            out = decoder_layer(enc_out, out, mask)
        return torch.softmax(self.linear(out), dim=-1)  # probabilities (doc L432-L433)


# -- transformer.py (doc L440-L500) ------------------------------------------------------------------------------------
class Transformer(nn.Module):
    """The document's Transformer built from a ModelConfig; returns probabilities (B, T, tgt_vocab)."""

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
        """(B, 1, 1, S) boolean, True at real source keys (doc L485-L486)."""
        return (src != self.src_pad_idx).unsqueeze(1).unsqueeze(2)

    def make_trg_mask(self, trg: Tensor) -> Tensor:
        """(B, 1, T, T) float32 lower triangle, built on the CPU and without target padding (doc L488-L492)."""
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

    @torch.no_grad()
    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical-schema state dict; attention and generator biases get 0."""
        put = partial(copy_canonical, state)  # put(param, *canonical names)

        def put_attention(mha: MultiheadAttention, prefix: str) -> None:
            for ours, theirs in (("q", mha.w_q), ("k", mha.w_k), ("v", mha.w_v), ("o", mha.w_o)):
                put(theirs.weight, f"{prefix}.{ours}.weight")
                theirs.bias.zero_()

        def put_ffn(ffn: PointWiseFeedForward, prefix: str) -> None:
            for ours, theirs in (("w1", ffn.point_wise_ff[0]), ("w2", ffn.point_wise_ff[2])):
                put(theirs.weight, f"{prefix}.{ours}.weight")
                put(theirs.bias, f"{prefix}.{ours}.bias")

        def put_norm(norm: nn.LayerNorm, prefix: str) -> None:
            put(norm.weight, f"{prefix}.weight")
            put(norm.bias, f"{prefix}.bias")

        put(self.encoder.embedding.embedding.weight, "src_embed.weight")
        put(self.decoder.embedding.embedding.weight, "tgt_embed.weight")
        put(self.decoder.linear.weight, "generator.weight")
        self.decoder.linear.bias.zero_()
        for i, layer in enumerate(self.encoder.encoder_layers):
            p = f"encoder.{i}"
            put_attention(layer.multihead_attention, f"{p}.self_attn")
            put_norm(layer.attention_layer_norm, f"{p}.norm1")
            put_ffn(layer.point_wise_feed_forward, f"{p}.ffn")
            put_norm(layer.ff_layer_norm, f"{p}.norm2")
        for i, layer in enumerate(self.decoder.decoder):
            p = f"decoder.{i}"
            put_attention(layer.multihead_attention, f"{p}.self_attn")
            put_norm(layer.attention_layer_norm, f"{p}.norm1")
            put_attention(layer.encoder_decoder_attention, f"{p}.cross_attn")
            put_norm(layer.enc_dec_att_layer_norm, f"{p}.norm2")  # loaded, never used (doc L387)
            put_ffn(layer.point_wise_feed_forward, f"{p}.ffn")
            put_norm(layer.ff_layer_norm, f"{p}.norm3")


def build(config: ModelConfig) -> Transformer:
    return Transformer(config)


DEVIATIONS: dict[str, str] = {
    "train.learns": (
        "attention returns the sum of every value vector (the einsum declared under attention.softmax-over-keys), "
        "so no source token can be singled out and the decoder sums future positions too: trained with the "
        "paper's recipe, the loss falls only to about 1.5 in 150 updates and greedy decoding reproduces none of "
        "the held-out copies or reversals"
    ),
    "attention.softmax-over-keys": (
        "the weighted sum is einsum('bhqk, bvhd->bqhd', softmax, v) (doc L141): the value operand has its own "
        "letter v, so the key axis of the weights and the position axis of the values are summed separately; "
        "each query's weights sum to 1 and every query receives the plain sum of ALL value vectors of its head, "
        "whatever the scores"
    ),
    "mask.causal": (
        "the causal mask (doc L488-L492) only touches the scores, which the summed-out weights of doc L141 discard: "
        "decoder self-attention returns the sum of the values of every target position, future ones included"
    ),
    "mask.source-padding": (
        "the source mask (doc L486, L138) only touches the scores, which doc L141 discards, so encoder "
        "self-attention sums the values of padded positions too; cross-attention gets no mask at all (doc L384, "
        "the decoder is never given src_mask: L428, L498)"
    ),
    "mask.target-padding": (
        "decoder self-attention sums the values of every target position (doc L141), padded ones included, so "
        "appending target padding changes the outputs at real positions (the target mask of doc L490 has no "
        "padding term either, and would be discarded anyway)"
    ),
    "norm.post-norm": (
        "the feed-forward sub-layer computes ff_layer_norm(pwff + dropout(pwff)) with pwff the FFN output (doc "
        "L304 encoder, L395 decoder): the residual adds the FFN output to itself, the sub-layer input is lost"
    ),
    "dropout.residual": (
        "the FFN sub-layer's dropped output is added to an undropped copy of the same output (pwff + "
        "dropout(pwff), doc L304, L395), so no feature of that sub-layer's output is zeroed in training. The "
        "suite's embedding-sum probe also fails, but only because of the lost FFN residual: with the decoder "
        "sub-layers zeroed each layer outputs LN(0 + 0) and the embedding sum never reaches the output; the "
        "document does drop the embedding sums (doc L336, L429)"
    ),
    "layers.independent": (
        "the decoder layer builds enc_dec_att_layer_norm (doc L369) but normalizes the cross-attention sub-layer "
        "with attention_layer_norm again (doc L387): one norm serves two sub-layers and canonical norm2 changes "
        "nothing; W_q and W_k of every attention are dead too, since doc L141 discards the scores"
    ),
    "train.gradients": (
        "enc_dec_att_layer_norm (doc L369) is never called (doc L387 reuses attention_layer_norm), so its weight "
        "and bias get no gradient"
    ),
    "embedding.shared-weights": (
        "never tied: the encoder and the decoder each build their own Embedder (doc L323, L415) and the decoder "
        "its own nn.Linear(d_model, trg_vocab_size) with a bias (doc L426), so share_embeddings=True still gives "
        "three matrices and a pre-softmax bias"
    ),
    "config.parameters": (
        "beyond the schema: biases on w_q, w_k, w_v, w_o (doc L173-L178, 4 x d_model per attention), the untied "
        "source/target embeddings and output matrix (doc L323, L415, L426: +2 x vocab x d_model when "
        "share_embeddings) and the output bias (doc L426); the base preset has 101M parameters, not 65M"
    ),
    "device.portable": (
        "PositionalEncoder keeps its table as a plain CPU tensor attribute (doc L73), not a buffer, so "
        "module.to(...) leaves it behind; make_trg_mask builds torch.tril(torch.ones(T, T)) on the CPU whatever "
        "the input's device (doc L490)"
    ),
    "model.reference-equivalence": (
        "with the canonical weights loaded the function differs from the paper's: attention returns the sum of "
        "all values (doc L141), the FFN residual is lost (doc L304, L395) and the cross-attention sub-layer uses "
        "the self-attention's norm (doc L387)"
    ),
}


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="building-blocks",
        build=build,
        summary="MaryFllh README code: attention that sums all values (einsum 'bhqk,bvhd'), sqrt(d_model) scale, "
                "1e-20 mask fill, FFN residual lost, shared decoder norm, biased projections, softmax output",
        source="https://github.com/MaryFllh/attention_is_all_you_need",
        output="probs",
        deviations=DEVIATIONS,
    ))
