"""Built-in plugin ``sections-notebook``: a notebook transcribing hkproj/pytorch-transformer (seed document 001).

Reproduced from ``/work/shared/seeds/001_4fb16b8f804a365a.txt`` ("the document"; "Lnnn" are its line
numbers), in our own words, keeping its class and attribute names. The document stops inside the
multi-head attention's ``forward`` (after L147); everything after that point is ours, from the paper.

What the document shows, reproduced as it computes:

- ``InputEmbeddings`` (L13-L23): ``nn.Embedding(vocab_size, d_model)`` multiplied by sqrt(d_model) (L23).
- ``PositionalEncoding`` (L31-L62): a (1, seq_len, d_model) table built once (L43-L54), sines on the even
  and cosines on the odd columns (L50-L51), registered as a (persistent) buffer (L57); ``forward`` adds the
  first L rows and applies dropout (L61-L62). Its frequencies are
  ``div_term = exp(arange(0, d_model, 2) * (log(10000) / d_model))`` (L47): the exponent is positive, so
  column pair 2i holds sin/cos(pos * 10000^(2i/d_model)), not pos / 10000^(2i/d_model) as the formula the
  notebook itself prints at L64-L66 says. The table covers ``seq_len`` = ``config.max_len`` positions only.
- ``LayerNormalization`` (L73-L83): ``alpha * (x - mean) / (std + eps) + bias`` over the last axis, with
  ``x.std`` (the unbiased estimate, L82), eps added to the std outside any square root (L83), and a single
  scalar ``alpha`` and a single scalar ``bias`` shared by all features (L78-L79). Default eps 1e-6 (L74).
- ``FeedForwardBlock`` (L94-L105): Linear_1, ReLU, dropout, Linear_2 (a dropout between the two linears,
  L101, L105).
- ``MultiHeadAttentionBlock`` (L116-L147): ``w_q``, ``w_k``, ``w_v``, ``w_o`` are ``nn.Linear`` with their
  default biases (L125-L129); heads split by ``view(B, L, h, d_k).transpose(1, 2)`` (L143-L147). A dropout
  module is built (L130) but the document never reaches a line that uses it.

Repairs (the smallest change that lets the cell run):

- L21: ``nn.embedding`` -> ``nn.Embedding`` (no such attribute).
- L40: ``self.dropout = dropout`` stores the float, and L62 calls it; stored as ``nn.Dropout(dropout)``.
- L54: ``pe.unsqueece(0)`` -> ``pe.unsqueeze(0)``.
- L100, L102 vs L105: the layers are created as ``Linear_1``/``Linear_2`` and called as ``linear_1``/``linear_2``
  (AttributeError); one spelling is used for both.
- L129: ``nn.Linear(d_modelm d_model)`` -> ``nn.Linear(d_model, d_model)`` (syntax error).
- L131-L132: ``def attention(query)`` has no colon and no body (syntax error); completed below.
- L143: ``self.h, self,d_k`` -> ``self.h, self.d_k`` (``d_k`` is not defined).
- L146: ``key = query.view(key.shape[0], key.shape[1], self.h, self.d_k)`` -> ``key.view(...)``. As written it
  views the already transposed query heads (B, h, Lq, d_k): ``view`` raises "view size is not compatible with
  input tensor's size and stride" for every self-attention with h > 1 and more than one position, and
  "shape ... is invalid" for every cross-attention with S != T. It runs only when h = 1 or the sequence has
  one position, and there it takes W_q q as the keys (``w_k`` unused). No runnable variant keeps that
  behaviour (any "keys from the queries" form fails in cross-attention whenever S != T), so the only repair
  that lets the model run is the one the ``key.shape`` arguments point to.
- L147: ``view.shape[1]`` -> ``value.shape[1]`` (``view`` is not defined).

Completions (not in the document; they follow the paper):

- The rest of ``MultiHeadAttentionBlock.forward`` and ``attention`` (after L147): §3.2.1 Eq. (1),
  softmax(Q K^T / sqrt(d_k)) V over the keys, masked scores set to -inf (§3.2.3); a query with no admissible
  key (a fully padded source) attends to nothing (zeros), as in the reference (the paper is silent). No
  dropout on the attention weights (the paper has none; L130's module stays unused). Heads concatenated per
  position and projected by ``w_o`` (§3.2.2).
- ``ResidualConnection``: post-norm ``LayerNormalization(x + Dropout(sublayer(x)))`` (§3.1, §5.4), one
  document ``LayerNormalization`` per sub-layer, constructed with ``config.norm_eps``.
- ``EncoderBlock`` (self-attention, FFN) and ``DecoderBlock`` (masked self-attention, encoder-decoder
  attention with queries from the decoder and keys/values from the final encoder output, FFN) (§3.1, §3.2.3).
- ``Encoder`` / ``Decoder``: N blocks with their own parameters, no final norm (§3.1).
- ``ProjectionLayer``: a bias-free ``nn.Linear(d_model, tgt_vocab)`` returning logits (§3.4; the softmax
  belongs to the loss). With ``config.share_embeddings`` the source embedding, target embedding and projection
  are one matrix (§3.4).
- Masks (the document builds none): boolean, True = may attend, built on the input's device: the source
  key-padding mask (B, 1, 1, S) for encoder self-attention and cross-attention, and causal AND target
  key-padding (B, 1, T, T) for decoder self-attention (§3.2.3).
- One ``PositionalEncoding`` per stack (seq_len = ``config.max_len``, dropout = ``config.dropout``).
- Initialization (the paper is silent): the reference's, N(0, d_model^-0.5) embeddings, Xavier-uniform
  matrices, zero biases.

Canonical schema mapping (``load_reference_state``): ``src_embed``/``tgt_embed`` -> ``*.embedding``,
``generator`` -> ``projection.proj``; attention ``q, k, v, o`` -> ``w_q, w_k, w_v, w_o`` (biases 0);
``ffn.w1/w2`` -> ``Linear_1/Linear_2``. A norm's per-feature gain and bias cannot be held by the scalar
``alpha`` and ``bias``: each gets the mean of its vector (exact when the vector is constant).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial

import torch
from torch import Tensor, nn

from spec.config import ModelConfig
from spec.schema import CanonicalKey, Target, load_canonical

from .declarations import Implementation
from .hookspecs import hookimpl

__all__ = ["SectionsNotebookTransformer", "build", "DEVIATIONS"]


# -- what the document shows (L13-L147), repaired ------------------------------------------------------------
class InputEmbeddings(nn.Module):
    """L13-L23: token embeddings times sqrt(d_model)."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.d_model, self.vocab_size = d_model, vocab_size
        self.embedding = nn.Embedding(vocab_size, d_model)  # L21 repaired: nn.embedding

    def forward(self, x: Tensor) -> Tensor:
        return self.embedding(x) * math.sqrt(self.d_model)  # (B, L, d_model)


class PositionalEncoding(nn.Module):
    """L31-L62: a (1, seq_len, d_model) sinusoid buffer with exp(+...) frequencies, added then dropped out."""

    pe: Tensor  # (1, seq_len, d_model), a buffer

    def __init__(self, d_model: int, seq_len: int, dropout: float):
        super().__init__()
        self.d_model, self.seq_len = d_model, seq_len
        self.dropout = nn.Dropout(dropout)  # L40 repaired: the float itself was stored and called (L62)
        pos = torch.arange(seq_len, dtype=torch.float).unsqueeze(1)  # (seq_len, 1)
        freq = torch.exp(torch.arange(0, d_model, 2).float() * (math.log(10000.0) / d_model))  # L47: exp(+)
        table = torch.zeros(seq_len, d_model)
        table[:, 0::2] = torch.sin(pos * freq)
        table[:, 1::2] = torch.cos(pos * freq)
        self.register_buffer("pe", table.unsqueeze(0))  # (1, seq_len, d_model); L54 repaired: unsqueece

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(x + self.pe[:, : x.size(1), :].requires_grad_(False))


class LayerNormalization(nn.Module):
    """L73-L83: alpha * (x - mean) / (unbiased std + eps) + bias, alpha and bias scalars."""

    def __init__(self, eps: float = 10**-6):
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)
        return self.alpha * centred / (x.std(dim=-1, keepdim=True) + self.eps) + self.bias


class FeedForwardBlock(nn.Module):
    """L94-L105: Linear_2(Dropout(ReLU(Linear_1(x))))."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.Linear_1 = nn.Linear(d_model, d_ff)  # L100/L105 repaired: one spelling
        self.dropout = nn.Dropout(dropout)
        self.Linear_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.Linear_2(self.dropout(torch.relu(self.Linear_1(x))))


class MultiHeadAttentionBlock(nn.Module):
    """L116-L147 (biased projections, view + transpose head split), completed from §3.2 after L147."""

    def __init__(self, d_model: int, h: int, dropout: float):
        super().__init__()
        assert d_model % h == 0, "d_model is not divisible by h"
        self.d_model, self.h, self.d_k = d_model, h, d_model // h
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)  # L129 repaired: d_modelm
        self.dropout = nn.Dropout(dropout)  # L130: built, never reached by the document (unused here)

    @staticmethod
    def attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> Tensor:
        """Completion (§3.2.1, §3.2.3): masked scaled dot-product attention; True in ``mask`` = may attend."""
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (B, h, Lq, Lk)
        if mask is None:
            return torch.softmax(scores, dim=-1) @ value
        has_key = mask.any(dim=-1, keepdim=True)
        weights = torch.softmax(scores.masked_fill(~(mask | ~has_key), float("-inf")), dim=-1)
        return weights.masked_fill(~has_key, 0.0) @ value  # (B, h, Lq, d_k)

    def _heads(self, x: Tensor) -> Tensor:
        return x.view(x.size(0), x.size(1), self.h, self.d_k).transpose(1, 2)  # (B, h, L, d_k)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        # L143, L146, L147 repaired: self,d_k / query.view for the keys / view.shape (see the module docstring)
        query, key, value = self._heads(self.w_q(q)), self._heads(self.w_k(k)), self._heads(self.w_v(v))
        heads = self.attention(query, key, value, mask)  # completion from here on
        B, _, Lq, _ = heads.shape
        return self.w_o(heads.transpose(1, 2).reshape(B, Lq, self.d_model))  # (B, Lq, d_model)


# -- completions from the paper -------------------------------------------------------------------------------
class ResidualConnection(nn.Module):
    """§3.1, §5.4: LayerNormalization(x + Dropout(sublayer(x))), post-norm, with the document's norm."""

    def __init__(self, dropout: float, eps: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.norm = LayerNormalization(eps)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attention_block = MultiHeadAttentionBlock(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.feed_forward_block = FeedForwardBlock(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.residual_connections = nn.ModuleList(ResidualConnection(cfg.dropout, cfg.norm_eps) for _ in range(2))

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.residual_connections[0](x, lambda t: self.self_attention_block(t, t, t, src_mask))
        return self.residual_connections[1](x, self.feed_forward_block)


class DecoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attention_block = MultiHeadAttentionBlock(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.cross_attention_block = MultiHeadAttentionBlock(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.feed_forward_block = FeedForwardBlock(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.residual_connections = nn.ModuleList(ResidualConnection(cfg.dropout, cfg.norm_eps) for _ in range(3))

    def forward(self, y: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        y = self.residual_connections[0](y, lambda t: self.self_attention_block(t, t, t, tgt_mask))
        y = self.residual_connections[1](y, lambda t: self.cross_attention_block(t, memory, memory, src_mask))
        return self.residual_connections[2](y, self.feed_forward_block)


class ProjectionLayer(nn.Module):
    """§3.4: the pre-softmax linear map, bias-free; returns logits."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)  # (B, T, vocab)


def _fill_mean(param: Tensor, value: Tensor) -> None:
    """Store a per-feature canonical vector in a scalar parameter: its mean, the nearest a scalar gets."""
    param.fill_(value.mean().item())


class SectionsNotebookTransformer(nn.Module):
    """The document's blocks assembled as §3 describes; forward returns logits (B, T, tgt_vocab)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        self.src_embed = InputEmbeddings(cfg.d_model, cfg.src_vocab)
        self.tgt_embed = InputEmbeddings(cfg.d_model, cfg.tgt_vocab)
        self.src_pos = PositionalEncoding(cfg.d_model, cfg.max_len, cfg.dropout)
        self.tgt_pos = PositionalEncoding(cfg.d_model, cfg.max_len, cfg.dropout)
        self.encoder = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.n_layers))
        self.decoder = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_layers))
        self.projection = ProjectionLayer(cfg.d_model, cfg.tgt_vocab)
        for name, p in self.named_parameters():  # the reference's initialization (the paper is silent)
            if name.endswith("embedding.weight"):
                nn.init.normal_(p, mean=0.0, std=cfg.d_model ** -0.5)
            elif p.dim() == 2:
                nn.init.xavier_uniform_(p)
            elif name.endswith(".bias") and "residual_connections" not in name:
                nn.init.zeros_(p)
        if cfg.share_embeddings:  # §3.4: one matrix, three uses
            self.tgt_embed.embedding.weight = self.src_embed.embedding.weight
            self.projection.proj.weight = self.src_embed.embedding.weight

    # -- masks (completion: True = may attend, on the input's device) ---------------------------------------------
    def _src_mask(self, src: Tensor) -> Tensor:
        return (src != self.config.pad_id)[:, None, None, :]  # (B, 1, 1, S)

    def _tgt_mask(self, tgt: Tensor) -> Tensor:
        T = tgt.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).tril()  # (T, T)
        return causal[None, None] & (tgt != self.config.pad_id)[:, None, None, :]  # (B, 1, T, T)

    # -- the model ----------------------------------------------------------------------------------------------
    def positional_encoding(self, length: int) -> Tensor:
        """The table the document adds (L61): (length, d_model); it holds max_len rows only."""
        if length > self.src_pos.pe.size(1):
            raise ValueError(f"the document's table has {self.src_pos.pe.size(1)} positions (seq_len), asked {length}")
        return self.src_pos.pe[0, :length]

    def _encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        x = self.src_pos(self.src_embed(src))  # (B, S, d_model)
        for block in self.encoder:
            x = block(x, src_mask)
        return x

    def encode(self, src: Tensor) -> Tensor:
        """The final encoder block's output (B, S, d_model)."""
        return self._encode(src, self._src_mask(src))

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) right-padded token ids to logits (B, T, tgt_vocab)."""
        src_mask = self._src_mask(src)
        memory = self._encode(src, src_mask)
        tgt_mask = self._tgt_mask(tgt)
        y = self.tgt_pos(self.tgt_embed(tgt))  # (B, T, d_model)
        for block in self.decoder:
            y = block(y, memory, src_mask, tgt_mask)
        return self.projection(y)

    # -- adapter contract ------------------------------------------------------------------------------------------
    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical-schema state dict; attention biases 0, each norm's gain and bias as their means
        (a scalar gain and bias are the best this layer norm can hold)."""
        get = self.get_parameter
        mapping: dict[CanonicalKey, Target] = {"src_embed.weight": get("src_embed.embedding.weight"),
                                               "tgt_embed.weight": get("tgt_embed.embedding.weight"),
                                               "generator.weight": get("projection.proj.weight")}
        zero = []
        stacks = (("encoder", {"self_attn": "self_attention_block"}, 2),
                  ("decoder", {"self_attn": "self_attention_block", "cross_attn": "cross_attention_block"}, 3))
        for stack, attentions, n_norms in stacks:
            for i in range(self.config.n_layers):
                p = f"{stack}.{i}"
                for att, block in attentions.items():
                    mapping.update({f"{p}.{att}.{x}.weight": get(f"{p}.{block}.w_{x}.weight") for x in "qkvo"})
                    zero += [get(f"{p}.{block}.w_{x}.bias") for x in "qkvo"]
                for k in (1, 2):
                    mapping[f"{p}.ffn.w{k}.weight"] = get(f"{p}.feed_forward_block.Linear_{k}.weight")
                    mapping[f"{p}.ffn.w{k}.bias"] = get(f"{p}.feed_forward_block.Linear_{k}.bias")
                for k in range(n_norms):
                    norm = f"{p}.residual_connections.{k}.norm"
                    mapping[f"{p}.norm{k + 1}.weight"] = partial(_fill_mean, get(f"{norm}.alpha"))
                    mapping[f"{p}.norm{k + 1}.bias"] = partial(_fill_mean, get(f"{norm}.bias"))
        load_canonical(state, mapping, zero=zero)


def build(config: ModelConfig) -> SectionsNotebookTransformer:
    return SectionsNotebookTransformer(config)


DEVIATIONS: dict[str, str] = {
    "norm.layer-norm": (
        "LayerNormalization computes alpha * (x - mean) / (x.std() + eps) + bias: the unbiased std (doc L82), eps "
        "added outside the square root (doc L83), and one scalar alpha and bias for all features (doc L78-L79)"
    ),
    "position.formula": (
        "div_term = exp(arange(0, d_model, 2) * (log(10000) / d_model)) has a positive exponent (doc L47), so the "
        "table holds sin/cos(pos * 10000^(2i/d_model)) instead of pos / 10000^(2i/d_model)"
    ),
    "config.parameters": (
        "biases on the four attention projections (nn.Linear defaults, doc L125-L129: 4 x d_model per attention) "
        "and scalar norm gains and biases (doc L78-L79: 2 scalars per norm instead of 2 x d_model)"
    ),
    "model.reference-equivalence": (
        "with the canonical weights loaded the function differs: unbiased std with eps outside the sqrt "
        "(doc L82-L83), exp(+) positional frequencies (doc L47), and per-feature norm gains and biases that the "
        "scalar alpha and bias (doc L78-L79) cannot hold (each loads its vector's mean)"
    ),
}


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="sections-notebook",
        build=build,
        summary="hkproj/pytorch-transformer as a notebook transcribes it (scalar unbiased-std LayerNorm, exp(+) "
                "sinusoid frequencies), completed from the paper",
        source="https://github.com/hkproj/pytorch-transformer (model.py), as transcribed in the notebook",
        output="logits",
        deviations=DEVIATIONS,
    ))
