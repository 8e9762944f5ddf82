"""Built-in plugin ``jadore801120``: jadore801120/attention-is-all-you-need-pytorch, as a code review quotes it.

Upstream: https://github.com/jadore801120/attention-is-all-you-need-pytorch, package ``transformer/``. The
review this plugin reproduces quotes four of its files, class by class, in the version on the repository's
master branch (the one with ``scale_emb``): ``Modules.py``, ``SubLayers.py``, ``Layers.py`` and ``Models.py``.
``SubLayers.py:N`` and ``Layers.py:N`` below are lines at commits fec78a687210 and 1005ce78ccd6, identical to
what the review quotes; the classes of ``Modules.py`` and ``Models.py`` are named instead (their quoted
version could not be pinned to a commit). Reproduced in our own words, keeping the class and attribute names:

- ``ScaledDotProductAttention`` (Modules.py): the queries are divided by ``temperature`` = sqrt(d_k)
  (SubLayers.py:24) before the product with the keys; scores where ``mask == 0`` are filled with the finite
  constant -1e9, so a query with no admissible key (a fully padded source) attends uniformly to the padded
  keys; softmax over the keys, then dropout on the attention weights. The dropout rate is the constructor's
  default ``attn_dropout=0.1``: ``MultiHeadAttention`` builds it without passing ``dropout``
  (SubLayers.py:24), so the weights are dropped at 0.1 in training whatever the configured rate, even 0.
- ``MultiHeadAttention`` (SubLayers.py:9-59): bias-free ``w_qs``, ``w_ks``, ``w_vs``, ``fc`` (:19-22); heads
  split by ``view`` + ``transpose(1, 2)`` (:39-44), the mask unsqueezed on the head axis (:46-47), merged back
  by ``transpose`` + ``view`` (:53). The residual and the layer norm live inside the module, post-norm:
  ``layer_norm(dropout(fc(heads)) + q)`` with ``q`` the query input (:35, :54-57); its LayerNorm is
  ``nn.LayerNorm(d_model, eps=1e-6)`` (:27), eps fixed, not the configured one.
- ``PositionwiseFeedForward`` (SubLayers.py:62-82): ``w_2(relu(w_1(x)))`` with biases, dropout after ``w_2``
  only, then ``layer_norm(x + residual)`` (post-norm, :74-80), ``nn.LayerNorm(d_in, eps=1e-6)`` (:69).
- ``EncoderLayer`` / ``DecoderLayer`` (Layers.py:10-42): self-attention then FFN; the decoder's
  cross-attention takes its queries from the self-attention sub-layer's output and keys/values from
  ``enc_output`` (:39-40) with the source mask (``Decoder.forward`` passes ``dec_enc_attn_mask=src_mask``).
- ``PositionalEncoding`` (Models.py): the §3.5 table computed with numpy in float64
  (``pos / 10000^(2 (j // 2) / d)``, sin on even, cos on odd columns), converted to float32 with a leading
  batch axis [1, n_position, d] and registered as a (persistent) buffer ``pos_table``;
  ``forward(x) = x + pos_table[:, :L]``. It holds ``n_position`` rows only (default 200).
- ``Encoder`` / ``Decoder`` (Models.py): ``nn.Embedding(vocab, d_word_vec, padding_idx=pad_idx)``; the
  embeddings are multiplied by sqrt(d_model) only when ``scale_emb`` is set, and ``scale_emb`` defaults to
  False in both constructors: a user gets unscaled embeddings; then ``layer_norm(dropout(E[x] + PE))``: an
  extra ``nn.LayerNorm(d_model, eps=1e-6)`` on the input of each stack; then the layers. Neither stack has a
  norm at its top. Both return one-element tuples.

Completions (the review shows no ``Transformer`` class and no mask helpers; they follow the paper):

- ``Transformer``: builds the encoder and the decoder with ``d_word_vec = d_model``, ``d_inner = d_ff``,
  ``d_k`` and ``d_v`` from the configuration (d_model / n_heads unless given), ``n_position = max_len`` and
  ``pad_idx = pad_id``; ``scale_emb`` is left
  at its default (False). The pre-softmax projection is a bias-free ``nn.Linear(d_model, tgt_vocab)``
  returning logits, with no logit scaling (§3.4; the upstream ``Transformer``'s ``x_logit_scale`` and
  ``scale_emb_or_prj`` are not in the review). With ``share_embeddings`` the source embedding, target
  embedding and projection are one matrix (§3.4).
- Masks, in the polarity of ``mask == 0`` (non-zero = may attend), built on the input's device: ``src_mask``
  = (src != pad) [B, 1, S] over the keys, for encoder self-attention and cross-attention; ``trg_mask`` =
  (tgt != pad) [B, 1, T] AND the lower triangle (diagonal included) [1, T, T], giving [B, T, T], as the
  upstream ``get_pad_mask`` and ``get_subsequent_mask``. ``MultiHeadAttention`` adds the head axis.
- Initialization: the review shows none; PyTorch's defaults (``nn.Linear``, ``nn.Embedding`` with its
  padding row zeroed).

Repairs: none; every class shown runs as written (``numpy`` is imported when the table is built).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import CanonicalKey, Target, load_canonical

from ..declarations import Implementation
from ..hookspecs import hookimpl

__all__ = ["Transformer", "build", "DEVIATIONS"]


# -- Modules.py ------------------------------------------------------------------------------------------------------
class ScaledDotProductAttention(nn.Module):
    """softmax((q / temperature) k^T) v, masked scores (mask == 0) set to -1e9, dropout on the weights."""

    def __init__(self, temperature: float, attn_dropout: float = 0.1):
        super().__init__()
        self.temperature = temperature
        self.dropout = nn.Dropout(attn_dropout)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        scores = (q / self.temperature) @ k.transpose(2, 3)  # (B, h, Lq, Lk): q scaled first
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)  # finite fill
        weights = self.dropout(F.softmax(scores, dim=-1))  # over the keys, then attention dropout
        return weights @ v, weights  # (B, h, Lq, d_v), (B, h, Lq, Lk)


# -- SubLayers.py ----------------------------------------------------------------------------------------------------
class MultiHeadAttention(nn.Module):
    """Bias-free projections, h heads, and the sub-layer's own dropout + residual + post-norm."""

    def __init__(self, n_head: int, d_model: int, d_k: int, d_v: int, dropout: float = 0.1):
        super().__init__()
        self.n_head, self.d_k, self.d_v = n_head, d_k, d_v
        self.w_qs = nn.Linear(d_model, n_head * d_k, bias=False)
        self.w_ks = nn.Linear(d_model, n_head * d_k, bias=False)
        self.w_vs = nn.Linear(d_model, n_head * d_v, bias=False)
        self.fc = nn.Linear(n_head * d_v, d_model, bias=False)
        self.attention = ScaledDotProductAttention(temperature=d_k ** 0.5)  # attn_dropout left at 0.1 (SubLayers.py:24)
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)  # eps fixed

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        B, Lq, Lk, Lv = q.size(0), q.size(1), k.size(1), v.size(1)
        residual = q  # the query input
        q = self.w_qs(q).view(B, Lq, self.n_head, self.d_k).transpose(1, 2)  # (B, h, Lq, d_k)
        k = self.w_ks(k).view(B, Lk, self.n_head, self.d_k).transpose(1, 2)  # (B, h, Lk, d_k)
        v = self.w_vs(v).view(B, Lv, self.n_head, self.d_v).transpose(1, 2)  # (B, h, Lv, d_v)
        if mask is not None:
            mask = mask.unsqueeze(1)  # head axis
        heads, attn = self.attention(q, k, v, mask=mask)  # (B, h, Lq, d_v)
        out = heads.transpose(1, 2).contiguous().view(B, Lq, -1)  # (B, Lq, h * d_v)
        out = self.dropout(self.fc(out)) + residual
        return self.layer_norm(out), attn  # post-norm


class PositionwiseFeedForward(nn.Module):
    """layer_norm(dropout(w_2(relu(w_1(x)))) + x)."""

    def __init__(self, d_in: int, d_hid: int, dropout: float = 0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_in, d_hid)
        self.w_2 = nn.Linear(d_hid, d_in)
        self.layer_norm = nn.LayerNorm(d_in, eps=1e-6)  # eps fixed
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        residual = x
        x = self.dropout(self.w_2(F.relu(self.w_1(x))))  # no dropout between the linears
        return self.layer_norm(x + residual)


# -- Layers.py -------------------------------------------------------------------------------------------------------
class EncoderLayer(nn.Module):
    """Self-attention sub-layer, then the FFN sub-layer (each carries its own residual and norm)."""

    def __init__(self, d_model: int, d_inner: int, n_head: int, d_k: int, d_v: int, dropout: float = 0.1):
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner, dropout=dropout)

    def forward(self, enc_input: Tensor, slf_attn_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        enc_output, enc_slf_attn = self.slf_attn(enc_input, enc_input, enc_input, mask=slf_attn_mask)
        return self.pos_ffn(enc_output), enc_slf_attn


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention (queries from the previous sub-layer), FFN."""

    def __init__(self, d_model: int, d_inner: int, n_head: int, d_k: int, d_v: int, dropout: float = 0.1):
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.enc_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner, dropout=dropout)

    def forward(self, dec_input: Tensor, enc_output: Tensor, slf_attn_mask: Tensor | None = None,
                dec_enc_attn_mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        dec_output, dec_slf_attn = self.slf_attn(dec_input, dec_input, dec_input, mask=slf_attn_mask)
        dec_output, dec_enc_attn = self.enc_attn(dec_output, enc_output, enc_output, mask=dec_enc_attn_mask)
        return self.pos_ffn(dec_output), dec_slf_attn, dec_enc_attn


# -- Models.py -------------------------------------------------------------------------------------------------------
class PositionalEncoding(nn.Module):
    """The sinusoid table, built with numpy in float64, stored as a float32 buffer [1, n_position, d]."""

    pos_table: Tensor  # (1, n_position, d_hid), a buffer

    def __init__(self, d_hid: int, n_position: int = 200):
        super().__init__()
        self.register_buffer("pos_table", self._get_sinusoid_encoding_table(n_position, d_hid))

    @staticmethod
    def _get_sinusoid_encoding_table(n_position: int, d_hid: int) -> Tensor:
        import numpy as np  # the table is a numpy computation upstream

        hid = np.arange(d_hid)
        inv = np.power(10000, 2 * (hid // 2) / d_hid)  # (d_hid,): 2 * (hid_j // 2) / d_hid
        table = np.arange(n_position, dtype=np.float64)[:, None] / inv[None, :]  # (n_position, d_hid), float64
        table[:, 0::2] = np.sin(table[:, 0::2])  # dim 2i
        table[:, 1::2] = np.cos(table[:, 1::2])  # dim 2i+1
        return torch.tensor(table, dtype=torch.float32).unsqueeze(0)  # (1, n_position, d_hid)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.pos_table[:, :x.size(1)].clone().detach()


class Encoder(nn.Module):
    """Embedding (scaled only with scale_emb), + PE, dropout, an extra LayerNorm, then the layers."""

    def __init__(self, n_src_vocab: int, d_word_vec: int, n_layers: int, n_head: int, d_k: int, d_v: int,
                 d_model: int, d_inner: int, pad_idx: int, dropout: float = 0.1, n_position: int = 200,
                 scale_emb: bool = False):
        super().__init__()
        self.src_word_emb = nn.Embedding(n_src_vocab, d_word_vec, padding_idx=pad_idx)
        self.position_enc = PositionalEncoding(d_word_vec, n_position=n_position)
        self.dropout = nn.Dropout(p=dropout)
        self.layer_stack = nn.ModuleList(
            EncoderLayer(d_model, d_inner, n_head, d_k, d_v, dropout=dropout) for _ in range(n_layers))
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)
        self.scale_emb = scale_emb
        self.d_model = d_model

    def forward(self, src_seq: Tensor, src_mask: Tensor) -> tuple[Tensor]:
        enc_output = self.src_word_emb(src_seq)  # (B, S, d_model)
        if self.scale_emb:  # False by default
            enc_output = enc_output * self.d_model ** 0.5
        enc_output = self.layer_norm(self.dropout(self.position_enc(enc_output)))
        for enc_layer in self.layer_stack:
            enc_output, _ = enc_layer(enc_output, slf_attn_mask=src_mask)
        return (enc_output,)


class Decoder(nn.Module):
    """As the encoder, with decoder layers reading ``enc_output``."""

    def __init__(self, n_trg_vocab: int, d_word_vec: int, n_layers: int, n_head: int, d_k: int, d_v: int,
                 d_model: int, d_inner: int, pad_idx: int, n_position: int = 200, dropout: float = 0.1,
                 scale_emb: bool = False):
        super().__init__()
        self.trg_word_emb = nn.Embedding(n_trg_vocab, d_word_vec, padding_idx=pad_idx)
        self.position_enc = PositionalEncoding(d_word_vec, n_position=n_position)
        self.dropout = nn.Dropout(p=dropout)
        self.layer_stack = nn.ModuleList(
            DecoderLayer(d_model, d_inner, n_head, d_k, d_v, dropout=dropout) for _ in range(n_layers))
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)
        self.scale_emb = scale_emb
        self.d_model = d_model

    def forward(self, trg_seq: Tensor, trg_mask: Tensor, enc_output: Tensor, src_mask: Tensor) -> tuple[Tensor]:
        dec_output = self.trg_word_emb(trg_seq)  # (B, T, d_model)
        if self.scale_emb:  # False by default
            dec_output = dec_output * self.d_model ** 0.5
        dec_output = self.layer_norm(self.dropout(self.position_enc(dec_output)))
        for dec_layer in self.layer_stack:
            dec_output, _, _ = dec_layer(dec_output, enc_output, slf_attn_mask=trg_mask, dec_enc_attn_mask=src_mask)
        return (dec_output,)


# -- the whole model (completed: the review omits it) ---------------------------------------------------------------
def get_pad_mask(seq: Tensor, pad_idx: int) -> Tensor:
    """(B, 1, L): True at real (non-pad) keys; the polarity of ``mask == 0`` (non-zero = may attend)."""
    return (seq != pad_idx).unsqueeze(-2)


def get_subsequent_mask(seq: Tensor) -> Tensor:
    """(1, L, L): True on and below the diagonal, on the input's device."""
    L = seq.size(1)
    return torch.tril(torch.ones(1, L, L, dtype=torch.bool, device=seq.device))


class Transformer(nn.Module):
    """Encoder, decoder, masks and a bias-free, optionally tied projection; returns logits (B, T, tgt_vocab)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        self.src_pad_idx = self.trg_pad_idx = cfg.pad_id
        d_k, d_v = cfg.d_k, cfg.d_v  # Models.py's d_k=64, d_v=64 arguments (train.py's -d_k, -d_v)
        # scale_emb is not passed: its default, False.
        self.encoder = Encoder(
            n_src_vocab=cfg.src_vocab, d_word_vec=cfg.d_model, n_layers=cfg.n_layers, n_head=cfg.n_heads,
            d_k=d_k, d_v=d_v, d_model=cfg.d_model, d_inner=cfg.d_ff, pad_idx=cfg.pad_id, dropout=cfg.dropout,
            n_position=cfg.max_len)
        self.decoder = Decoder(
            n_trg_vocab=cfg.tgt_vocab, d_word_vec=cfg.d_model, n_layers=cfg.n_layers, n_head=cfg.n_heads,
            d_k=d_k, d_v=d_v, d_model=cfg.d_model, d_inner=cfg.d_ff, pad_idx=cfg.pad_id, dropout=cfg.dropout,
            n_position=cfg.max_len)
        self.trg_word_prj = nn.Linear(cfg.d_model, cfg.tgt_vocab, bias=False)  # §3.4, no logit scaling
        if cfg.share_embeddings:  # §3.4: one matrix, three uses
            self.trg_word_prj.weight = self.decoder.trg_word_emb.weight
            self.encoder.src_word_emb.weight = self.decoder.trg_word_emb.weight

    def _masks(self, src: Tensor, tgt: Tensor) -> tuple[Tensor, Tensor]:
        src_mask = get_pad_mask(src, self.src_pad_idx)  # (B, 1, S)
        trg_mask = get_pad_mask(tgt, self.trg_pad_idx) & get_subsequent_mask(tgt)  # (B, T, T)
        return src_mask, trg_mask

    def encode(self, src: Tensor) -> Tensor:
        """The last encoder layer's output (what cross-attention reads): (B, S, d_model)."""
        return self.encoder(src, get_pad_mask(src, self.src_pad_idx))[0]

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) right-padded token ids to logits (B, T, tgt_vocab)."""
        src_mask, trg_mask = self._masks(src, tgt)
        enc_output, *_ = self.encoder(src, src_mask)  # (B, S, d_model)
        dec_output, *_ = self.decoder(tgt, trg_mask, enc_output, src_mask)  # (B, T, d_model)
        return self.trg_word_prj(dec_output)  # (B, T, tgt_vocab)

    # -- adapter contract ----------------------------------------------------------------------------------------
    def positional_encoding(self, length: int) -> Tensor:
        """The table the encoder adds (the decoder holds an identical one): (length, d_model), length <= max_len."""
        table = self.encoder.position_enc.pos_table[0]  # (n_position, d_model)
        if length > table.size(0):
            raise ValueError(f"the table was built for n_position={table.size(0)} positions; {length} requested")
        return table[:length]

    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical-schema state dict; each sub-layer's norm lives in its attention or FFN module, and
        the extra embedding norms get gain 1 and bias 0."""
        get = self.get_parameter
        mapping: dict[CanonicalKey, Target] = {"src_embed.weight": get("encoder.src_word_emb.weight"),
                                               "tgt_embed.weight": get("decoder.trg_word_emb.weight"),
                                               "generator.weight": get("trg_word_prj.weight")}
        stacks = (("encoder", {"self_attn": ("slf_attn", "norm1")}, "norm2"),
                  ("decoder", {"self_attn": ("slf_attn", "norm1"), "cross_attn": ("enc_attn", "norm2")}, "norm3"))
        for stack, attentions, ffn_norm in stacks:
            for i in range(self.config.n_layers):
                ours, theirs = f"{stack}.{i}", f"{stack}.layer_stack.{i}"
                for att, (mha, norm) in attentions.items():
                    mapping.update({f"{ours}.{att}.{x}.weight": get(f"{theirs}.{mha}.{own}.weight")
                                    for x, own in zip("qkvo", ("w_qs", "w_ks", "w_vs", "fc"))})
                    mapping.update({f"{ours}.{norm}.{p}": get(f"{theirs}.{mha}.layer_norm.{p}")
                                    for p in ("weight", "bias")})
                for p in ("weight", "bias"):
                    mapping[f"{ours}.ffn.w1.{p}"] = get(f"{theirs}.pos_ffn.w_1.{p}")
                    mapping[f"{ours}.ffn.w2.{p}"] = get(f"{theirs}.pos_ffn.w_2.{p}")
                    mapping[f"{ours}.{ffn_norm}.{p}"] = get(f"{theirs}.pos_ffn.layer_norm.{p}")
        load_canonical(state, mapping, zero=[get("encoder.layer_norm.bias"), get("decoder.layer_norm.bias")],
                       one=[get("encoder.layer_norm.weight"), get("decoder.layer_norm.weight")])


def build(config: ModelConfig) -> Transformer:
    return Transformer(config)


DEVIATIONS: dict[str, str] = {
    "dropout.extra-sites": (
        "ScaledDotProductAttention drops the softmax weights at its default attn_dropout = 0.1 whatever the "
        "configuration (Modules.py; never passed at SubLayers.py:24) (§5.4 names no such site for the base model; "
        "tensor2tensor v1 had it at 0, v2 on at 0.1: common practice, not the paper's base model)"
    ),
    "norm.no-extra-norm": (
        "Encoder and Decoder normalize the sum of embedding and positional encoding before the first layer: "
        "layer_norm(dropout(E[x] + PE)) (Models.py, Encoder.forward and Decoder.forward), a LayerNorm the paper "
        "does not have"
    ),
    "embedding.scale": (
        "the embeddings are multiplied by sqrt(d_model) only when scale_emb is set, and scale_emb defaults to "
        "False in the Encoder and Decoder constructors (Models.py): by default E[x] + PE, unscaled"
    ),
    "model.reference-equivalence": (
        "with the canonical weights loaded (extra norms at gain 1, bias 0) the unscaled embeddings (scale_emb=False) "
        "and the LayerNorm after embedding + PE change the encoder and decoder inputs"
    ),
    "config.parameters": (
        "the two LayerNorms after embedding + PE (Encoder.layer_norm, Decoder.layer_norm in Models.py) add "
        "2 x 2 x d_model parameters beyond the schema"
    ),
    "dropout.residual": (
        "ScaledDotProductAttention's dropout on the attention weights keeps its default rate 0.1 (Modules.py): "
        "MultiHeadAttention constructs it without passing the configured dropout (SubLayers.py:24), so P_drop = 0 "
        "still drops attention weights in training"
    ),
    "model.eval-determinism": (
        "with dropout 0 train mode still differs from eval mode: the attention-weight dropout is fixed at 0.1 "
        "(the attn_dropout default, never passed at SubLayers.py:24) whatever the configuration"
    ),
}


NOTES = (
    "As a code review quotes its Modules, SubLayers, Layers and Models. Close to the paper in its layers, but by "
    "default the embeddings are not scaled by sqrt(d_model) (`scale_emb=False`), a LayerNorm the paper lacks sits "
    "after embedding + PE, and the attention-weight dropout ignores the configured rate (fixed 0.1), so "
    "`dropout=0` still differs between train and eval. "
    "Not a deviation: from its own initialisation (the tied pre-softmax projection keeps nn.Embedding's N(0, 1) "
    "init with no logit scale, so the tiny model's first logits have a standard deviation of about 8.5 and its "
    "loss starts near 22) greedy decoding reproduced 5% of the copies after train.learns' 150 updates; started, as "
    "train.learns now starts a model that loads canonical weights, from the reference's initial state, it learns "
    "both tasks: an initialisation artifact."
)


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="jadore801120",
        build=build,
        summary="jadore801120/attention-is-all-you-need-pytorch as reviewed: post-norm inside the sub-layers, "
                "LayerNorm after embedding+PE, unscaled embeddings (scale_emb=False), -1e9 mask fill, "
                "attention dropout fixed at 0.1",
        source="https://github.com/jadore801120/attention-is-all-you-need-pytorch (transformer/, master branch, "
               "as a code review quotes it)",
        output="logits",
        free_head_dims=True,  # Transformer(d_k=..., d_v=...)
        deviations=DEVIATIONS,
        notes=NOTES,
    ))
