"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), to the letter.

This file is the project's oracle. It follows the paper section by section
(arXiv:1706.03762 v7) and departs from it nowhere; where the paper is silent
the choice is named in a comment (and follows tensor2tensor's published
configuration unless stated otherwise).

Shape legend
    B  batch size                  S  source length        T  target length
    L  a generic sequence length   Lq query length         Lk key length
    d_model  model width           h  number of heads      d_k, d_v per head (d_model / h)
    d_ff  inner width of the FFN   V  vocabulary size

Mask polarity
    Every mask in this file is boolean and True means "may attend".
    key-padding mask  (B, 1, 1, Lk)   True at real (non-pad) keys
    causal mask       (1, 1, T, T)    True on and below the diagonal
    Masks broadcast over heads and queries against scores of shape (B, h, Lq, Lk).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.decoding import DecodeConfig
from aiayn_conformance.spec.training import TrainConfig

from .decoding import (
    KVCache,
    LengthPenalty,
    SearchFn,
    beam_search,
    decode_step,
    gnmt_length_penalty,
    greedy_search,
    init_cache,
    reorder,
    search_tokens,
)
from .training import adam, label_smoothed_cross_entropy, lrate_scheduler, teacher_forcing

__all__ = [
    "sinusoid_table",
    "scaled_dot_product_attention",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "LayerNorm",
    "EncoderLayer",
    "DecoderLayer",
    "Transformer",
    "padding_mask",
    "causal_mask",
    "reference_twin",
]

AttentionFn = Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor]
PositionalFn = Callable[[int, int], Tensor]
NormFactory = Callable[[int, float], nn.Module]
FeedForwardFactory = Callable[[int, int], nn.Module]
OptimizerFactory = Callable[[Iterable[nn.Parameter], TrainConfig], torch.optim.Optimizer]
ScheduleFactory = Callable[[torch.optim.Optimizer, int, TrainConfig], Any]  # an object with step()
CriterionFactory = Callable[[int, int, TrainConfig], Callable[[Tensor, Tensor], Tensor]]


# ---------------------------------------------------------------------------
# §3.2.1 Scaled dot-product attention
# ---------------------------------------------------------------------------
def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """§3.2.1, Eq. (1): Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V.

    q (B, h, Lq, d_k), k (B, h, Lk, d_k), v (B, h, Lk, d_v); mask broadcastable
    to (B, h, Lq, Lk), True where attention is allowed. Illegal connections are
    set to -inf before the softmax (§3.2.3). A query with no allowed key (a
    fully padded sequence) attends to nothing and returns zeros: the paper is
    silent there, and -inf over a whole row would give NaN.
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, h, Lq, Lk)
    if mask is None:
        return torch.softmax(scores, dim=-1) @ v  # (B, h, Lq, d_v)
    any_allowed = mask.any(dim=-1, keepdim=True)  # (B|1, h|1, Lq|1, 1)
    scores = scores.masked_fill(~(mask | ~any_allowed), float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # over the keys, (B, h, Lq, Lk)
    weights = weights.masked_fill(~any_allowed, 0.0)
    return weights @ v  # (B, h, Lq, d_v)


# ---------------------------------------------------------------------------
# §3.2.2 Multi-head attention
# ---------------------------------------------------------------------------
class MultiHeadAttention(nn.Module):
    """§3.2.2: MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The h per-head matrices W_i^Q (d_model x d_k) are stored stacked in one
    nn.Linear ``q`` whose output rows i*d_k..(i+1)*d_k belong to head i (same
    for ``k`` and ``v``); ``o`` is W^O. The equations have no bias, so neither
    do these projections.
    """

    def __init__(self, d_model: int, h: int, attention: AttentionFn = scaled_dot_product_attention, *,
                 d_k: int | None = None, d_v: int | None = None):
        super().__init__()
        if d_k is None or d_v is None:
            assert d_model % h == 0, "d_model must be divisible by h for d_k = d_v = d_model / h"
        self.h, self.d_k, self.d_v = h, d_k or d_model // h, d_v or d_model // h
        self.q = nn.Linear(d_model, h * self.d_k, bias=False)  # W_1^Q .. W_h^Q stacked
        self.k = nn.Linear(d_model, h * self.d_k, bias=False)
        self.v = nn.Linear(d_model, h * self.d_v, bias=False)
        self.o = nn.Linear(h * self.d_v, d_model, bias=False)  # W^O
        self.attention = attention

    def split_heads(self, x: Tensor) -> Tensor:
        B, L, hd = x.shape
        return x.view(B, L, self.h, hd // self.h).transpose(1, 2)  # (B, h, L, d_k or d_v)

    def merge_heads(self, heads: Tensor) -> Tensor:
        B, _, L, d_v = heads.shape
        return heads.transpose(1, 2).reshape(B, L, self.h * d_v)  # (B, L, h*d_v): Concat(head_1, ..., head_h)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> Tensor:
        q = self.split_heads(self.q(query))  # (B, h, Lq, d_k)
        k = self.split_heads(self.k(key))  # (B, h, Lk, d_k)
        v = self.split_heads(self.v(value))  # (B, h, Lk, d_v)
        heads = self.attention(q, k, v, mask)  # (B, h, Lq, d_v)
        return self.o(self.merge_heads(heads))  # (B, Lq, d_model)


# ---------------------------------------------------------------------------
# §3.3 Position-wise feed-forward network
# ---------------------------------------------------------------------------
class PositionwiseFeedForward(nn.Module):
    """§3.3, Eq. (2): FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position alike."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(torch.relu(self.w1(x)))  # (B, L, d_model)


# ---------------------------------------------------------------------------
# §3.1 Layer normalization (Ba et al., 2016)
# ---------------------------------------------------------------------------
class LayerNorm(nn.Module):
    """§3.1: LayerNorm over the d_model features of each position.

    y = (x - mean) / sqrt(var + eps) * weight + bias, with the biased variance
    (mean of squared deviations) and a per-feature gain ``weight`` and ``bias``.
    eps is tensor2tensor's 1e-6 by default (the paper is silent).
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(dim=-1, keepdim=True)  # (B, L, 1)
        var = (x - mean).pow(2).mean(dim=-1, keepdim=True)  # (B, L, 1), biased
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


# ---------------------------------------------------------------------------
# §3.1 Encoder and decoder layers, post-norm residuals with §5.4 dropout
# ---------------------------------------------------------------------------
class EncoderLayer(nn.Module):
    """§3.1: two sub-layers, each LayerNorm(x + Dropout(Sublayer(x))) (§5.4)."""

    def __init__(self, cfg: ModelConfig, attention: AttentionFn, norm: NormFactory, ffn: FeedForwardFactory):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, attention, d_k=cfg.d_k, d_v=cfg.d_v)
        self.norm1 = norm(cfg.d_model, cfg.norm_eps)
        self.ffn = ffn(cfg.d_model, cfg.d_ff)
        self.norm2 = norm(cfg.d_model, cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.norm1(x + self.dropout(self.self_attn(x, x, x, src_mask)))  # (B, S, d_model)
        return self.norm2(x + self.dropout(self.ffn(x)))  # (B, S, d_model)


class DecoderLayer(nn.Module):
    """§3.1: masked self-attention, attention over the encoder output, FFN; each post-norm."""

    def __init__(self, cfg: ModelConfig, attention: AttentionFn, norm: NormFactory, ffn: FeedForwardFactory):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, attention, d_k=cfg.d_k, d_v=cfg.d_v)
        self.norm1 = norm(cfg.d_model, cfg.norm_eps)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, attention, d_k=cfg.d_k, d_v=cfg.d_v)
        self.norm2 = norm(cfg.d_model, cfg.norm_eps)
        self.ffn = ffn(cfg.d_model, cfg.d_ff)
        self.norm3 = norm(cfg.d_model, cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, y: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        y = self.norm1(y + self.dropout(self.self_attn(y, y, y, tgt_mask)))  # (B, T, d_model)
        # §3.2.3: queries from the decoder, keys and values from the encoder output.
        y = self.norm2(y + self.dropout(self.cross_attn(y, memory, memory, src_mask)))  # (B, T, d_model)
        return self.norm3(y + self.dropout(self.ffn(y)))  # (B, T, d_model)


# ---------------------------------------------------------------------------
# §3.5 Positional encoding
# ---------------------------------------------------------------------------
def sinusoid_table(length: int, d_model: int, *, dtype: torch.dtype = torch.float32,
                   device: torch.device | str | None = None) -> Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Positions count from 0; sines and cosines interleave. Computed in float64
    and cast, so the table is exact to the target precision. Returns (length, d_model).
    """
    pos = torch.arange(length, dtype=torch.float64, device=device).unsqueeze(1)  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=device)  # (ceil(d_model/2),)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (L, ceil(d_model/2))
    table = torch.zeros(length, d_model, dtype=torch.float64, device=device)  # (L, d_model)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.to(dtype)


# ---------------------------------------------------------------------------
# Masks (§3.2.3); True means "may attend"
# ---------------------------------------------------------------------------
def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Key-padding mask (B, 1, 1, L): True at real tokens, False at padding.

    The paper never mentions padding. Masking padded keys, as tensor2tensor does, makes every output
    independent of it; in the decoder the causal mask already hides right padding from real positions.
    """
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, L)


def causal_mask(length: int, device: torch.device | str | None = None) -> Tensor:
    """§3.2.3: position i may attend to positions up to and including i. (1, 1, L, L)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]  # (1, 1, L, L)


# ---------------------------------------------------------------------------
# §3 The encoder-decoder model, with §3.4 embeddings and softmax
# ---------------------------------------------------------------------------
class Transformer(nn.Module):
    """§3, Figure 1: the encoder-decoder Transformer; returns logits (B, T, V).

    §3.4: learned embeddings multiplied by sqrt(d_model); one matrix shared by
    the source embedding, the target embedding and the pre-softmax projection
    when ``config.share_embeddings`` (no bias on the projection).
    §3.5: the sinusoidal table is added at the bottom of both stacks; it is a
    non-persistent buffer, so it follows ``.to(device)`` and is not saved.
    §5.4: dropout on the sums of embeddings and positions, and on every
    sub-layer output before the residual addition; nowhere else.

    The keyword arguments swap in components (see ``implementations``
    components): an attention kernel, a positional table, a norm factory or
    a feed-forward factory, for ``generate`` a beam search or a length
    penalty, and for the training recipe an optimizer, a learning-rate schedule
    or a criterion factory. Left at None they are this file's own (and
    ``reference/decoding.py``'s: tensor2tensor's beam search, GNMT's penalty;
    ``reference/training.py``'s: Adam, Eq. (3), label smoothing).
    """

    pe: Tensor  # (max_len, d_model), the §3.5 table: a buffer registered in __init__

    def __init__(
        self,
        config: ModelConfig,
        *,
        attention: AttentionFn | None = None,
        positional_encoding: PositionalFn | None = None,
        layer_norm: NormFactory | None = None,
        feed_forward: FeedForwardFactory | None = None,
        search: SearchFn | None = None,
        length_penalty: LengthPenalty | None = None,
        optimizer: OptimizerFactory | None = None,
        lr_schedule: ScheduleFactory | None = None,
        criterion: CriterionFactory | None = None,
    ):
        super().__init__()
        self.config = cfg = config
        self._optimizer: OptimizerFactory = optimizer or adam
        self._lr_schedule: ScheduleFactory = lr_schedule or lrate_scheduler
        self._criterion: CriterionFactory = criterion or label_smoothed_cross_entropy
        self._search: SearchFn = search or beam_search
        self._length_penalty: LengthPenalty = length_penalty or gnmt_length_penalty
        attention = attention or scaled_dot_product_attention
        norm = layer_norm or LayerNorm
        ffn = feed_forward or PositionwiseFeedForward
        self._pe_fn: PositionalFn = positional_encoding or (lambda n, d: sinusoid_table(n, d))

        # The vocabulary tables (most of a base model's parameters) are left undrawn here (skip_init) and drawn
        # once, by reset_parameters, after §3.4's sharing has made them one matrix.
        self.src_embed = nn.utils.skip_init(nn.Embedding, cfg.src_vocab, cfg.d_model)
        self.tgt_embed = nn.utils.skip_init(nn.Embedding, cfg.tgt_vocab, cfg.d_model)
        self.encoder, self.decoder = self._stacks(cfg, attention, norm, ffn)
        self.generator = nn.utils.skip_init(nn.Linear, cfg.d_model, cfg.tgt_vocab, bias=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.register_buffer("pe", self._table(cfg.max_len), persistent=False)  # (max_len, d_model)
        if cfg.share_embeddings:  # §3.4: one matrix for both embeddings and the pre-softmax transformation
            self.tgt_embed.weight = self.src_embed.weight
            self.generator.weight = self.src_embed.weight
        self.reset_parameters()

    @staticmethod
    def _stacks(cfg: ModelConfig, attention: AttentionFn, norm: NormFactory,
                ffn: FeedForwardFactory) -> tuple[nn.ModuleList, nn.ModuleList]:
        """§3.1: the N encoder and N decoder layers, their parameters left undrawn: built on the meta device (no
        values), then given storage on the default device, for reset_parameters to draw each parameter once. Where
        that would lose something, a buffer's value or a parameter a component shares (to_empty gives each module
        its own tensor), they are built where they live instead."""
        def build() -> tuple[nn.ModuleList, nn.ModuleList]:
            return (nn.ModuleList(EncoderLayer(cfg, attention, norm, ffn) for _ in range(cfg.n_layers)),
                    nn.ModuleList(DecoderLayer(cfg, attention, norm, ffn) for _ in range(cfg.n_layers)))
        device = torch.get_default_device()
        with torch.device("meta"):
            encoder, decoder = build()
        stacks = nn.ModuleList([encoder, decoder])
        shared = len(list(stacks.parameters())) != len(list(stacks.named_parameters(remove_duplicate=False)))
        if shared or any(True for _ in stacks.buffers()):
            return build()
        stacks.to_empty(device=device)  # storage in place: encoder and decoder are the modules it holds
        return encoder, decoder

    def _table(self, length: int) -> Tensor:
        table = torch.as_tensor(self._pe_fn(length, self.config.d_model), dtype=torch.float32)
        if table.shape != (length, self.config.d_model):
            raise ValueError(
                f"positional encoding returned shape {tuple(table.shape)}, "
                f"expected ({length}, {self.config.d_model})"
            )
        return table

    def reset_parameters(self) -> None:
        """Initialization (the paper is silent): tensor2tensor's embedding init
        N(0, d_model^-0.5), so scaled embeddings have unit variance; Xavier-uniform
        matrices (PyTorch's nn.Transformer; tensor2tensor used uniform unit scaling);
        zero biases; unit norm gains. A shared matrix (§3.4) is drawn once, as the source embedding."""
        for name, p in self.named_parameters():  # each parameter once, under its first name
            if name.endswith("embed.weight"):
                nn.init.normal_(p, mean=0.0, std=self.config.d_model ** -0.5)
            elif p.dim() == 2:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.ones_(p)

    # -- §3.5 ---------------------------------------------------------------
    def positional_encoding(self, length: int) -> Tensor:
        """The table added to the scaled embeddings: (length, d_model)."""
        if length <= self.pe.size(0):
            return self.pe[:length]
        return self._table(length).to(self.pe.device)  # beyond max_len: §3.5 extrapolates

    def embed(self, tokens: Tensor, embedding: nn.Embedding, start: int = 0) -> Tensor:
        """§3.4 and §3.5: Dropout(sqrt(d_model) * E[tokens] + PE). (B, L, d_model).

        The tokens sit at positions start .. start + L - 1 (incremental decoding
        embeds one token at a time, at the position after the prefix)."""
        x = embedding(tokens) * math.sqrt(self.config.d_model)  # (B, L, d_model)
        pe = self.positional_encoding(start + tokens.size(1))[start:].to(dtype=x.dtype)  # (L, d_model)
        return self.dropout(x + pe)

    # -- §3.1 ---------------------------------------------------------------
    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """The encoder stack: (B, S) token ids to the final encoder output (B, S, d_model)."""
        if src_mask is None:
            src_mask = padding_mask(src, self.config.pad_id)  # (B, 1, 1, S)
        x = self.embed(src, self.src_embed)  # (B, S, d_model)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return x

    def decode(self, memory: Tensor, src_mask: Tensor, tgt: Tensor) -> Tensor:
        """The decoder stack: memory (B, S, d_model) and tgt (B, T) to (B, T, d_model)."""
        T = tgt.size(1)
        tgt_mask = causal_mask(T, tgt.device) & padding_mask(tgt, self.config.pad_id)  # (B, 1, T, T)
        y = self.embed(tgt, self.tgt_embed)  # (B, T, d_model)
        for layer in self.decoder:
            y = layer(y, memory, src_mask, tgt_mask)
        return y

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) token ids, right-padded with pad_id, to logits (B, T, V)."""
        src_mask = padding_mask(src, self.config.pad_id)  # (B, 1, 1, S)
        memory = self.encode(src, src_mask)  # (B, S, d_model)
        return self.generator(self.decode(memory, src_mask, tgt))  # (B, T, V)

    # -- adapter contract ---------------------------------------------------
    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical-schema state dict; this model's keys are the schema's."""
        self.load_state_dict(dict(state), strict=True)

    # -- training (§5), the recipe capabilities of the adapter contract: see reference/training.py --
    def make_optimizer(self, params: Iterable[nn.Parameter], train_config: TrainConfig) -> torch.optim.Optimizer:
        """§5.3: Adam with beta1 0.9, beta2 0.98, eps 1e-9, no weight decay."""
        return self._optimizer(params, train_config)

    def make_scheduler(self, optimizer: torch.optim.Optimizer, train_config: TrainConfig) -> Any:
        """§5.3, Eq. (3) with this model's d_model; ``step()`` once after each update."""
        return self._lr_schedule(optimizer, self.config.d_model, train_config)

    def make_criterion(self, train_config: TrainConfig) -> Callable[[Tensor, Tensor], Tensor]:
        """§5.4: label-smoothed cross entropy on logits, padding targets weighted 0."""
        return self._criterion(self.config.tgt_vocab, self.config.pad_id, train_config)

    def make_batch(self, target: Tensor, bos_id: int) -> tuple[Tensor, Tensor]:
        """§3.1: (BOS + target[:, :-1], target)."""
        return teacher_forcing(target, bos_id)

    # -- decoding (§6.1), adapter contract: see reference/decoding.py -----------
    def begin_decoding(self, src: Tensor) -> KVCache:
        """Encode src (B, S) once; the key/value cache for an empty prefix."""
        return init_cache(self, src)

    def decode_step(self, state: KVCache, tokens: Tensor) -> tuple[Tensor, KVCache]:
        """Feed tokens (N,) at the next position: next-token logits (N, V) and the grown cache."""
        return decode_step(self, state, tokens)

    def reorder_state(self, state: KVCache, indices: Tensor) -> KVCache:
        """Row i of the new cache is row indices[i] of ``state`` (beams)."""
        return reorder(state, indices)

    def generate(self, src: Tensor, *, bos_id: int, eos_id: int, beam_size: int = 4, alpha: float = 0.6,
                 max_len: int | None = None) -> Tensor:
        """§6.1: beam search with GNMT's length penalty (greedy when beam_size is 1), cached.

        Returns (B, L) output tokens without the start symbol, right-padded with
        pad_id; max_len None means each source's real length + 50 (§6.1). A
        ``search`` or ``length_penalty`` given to the constructor runs instead of
        ``reference.decoding.beam_search`` or ``gnmt_length_penalty`` (beam_size > 1).
        """
        DecodeConfig(beam_size=beam_size, alpha=alpha, bos_id=bos_id, eos_id=eos_id)  # one-line errors
        pad_id = self.config.pad_id
        if beam_size == 1:
            return greedy_search(self, src, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, max_len=max_len).tokens
        with torch.no_grad():
            return search_tokens(self._search(self, src, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                                              beam_size=beam_size, alpha=alpha, max_len=max_len,
                                              length_penalty=self._length_penalty))

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, *, bos_id: int, eos_id: int, max_new_tokens: int | None = None) -> Tensor:
        """Greedy decoding (§6.1 without the beam): (B, S) to (B, 1 + n) tokens starting with bos_id.

        Stops when every sequence has emitted eos_id or after max_new_tokens
        (default: each source's real length + 50, §6.1). Finished sequences are
        padded. ``reference.decoding.greedy_search`` with the key/value cache.
        """
        ys = greedy_search(self, src, bos_id=bos_id, eos_id=eos_id, pad_id=self.config.pad_id,
                           max_len=max_new_tokens).tokens  # (B, n)
        return torch.cat([ys.new_full((src.size(0), 1), bos_id), ys], dim=1)  # (B, 1 + n)


def build(config: ModelConfig) -> Transformer:
    """The reference implementation's factory (see implementations/builtins/reference.py)."""
    return Transformer(config)


def reference_twin(config: ModelConfig, state: Mapping[str, Tensor]) -> Transformer:
    """The reference model in eval mode holding ``state``, a canonical state dict (copied into its parameters by
    ``load_state_dict``, not shared): the twin an implementation holding the same state is compared with."""
    with torch.device("meta"):  # no initialization to draw: every parameter is loaded from ``state`` below
        ref = Transformer(config).eval()
    # Storage for each parameter, its values next. The vocabulary tables were made on the CPU (skip_init), so
    # to_empty keeps the tied ones one tensor; made on the meta device, each module would get a copy of its own.
    ref.to_empty(device="cpu")
    ref.pe = ref._table(config.max_len)  # (max_len, d_model): the §3.5 buffer, computed on the meta device above
    ref.load_reference_state(state)
    return ref
