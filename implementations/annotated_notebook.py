"""Built-in plugin ``annotated-notebook``: a notebook following the Annotated Transformer (seed 002).

Reproduced from ``/work/shared/seeds/002_7a81b28cd4c1b308.txt`` ("the document", a Jupyter notebook that
follows github.com/harvardnlp/annotated-transformer; "Lnnn" are its line numbers), in our own words, keeping
its class, function and attribute names:

- ``LayerNorm`` (L122-L136): per-feature ``gamma`` (ones) and ``beta`` (zeros); ``x.std(dim=-1)`` is torch's
  default, the unbiased (n - 1) estimate (L134), and eps is added to the standard deviation, outside any square
  root: ``gamma * (x - mean) / (std + eps) + beta`` (L136). eps is the constructor default 1e-6 (L127):
  ``Sublayer`` builds ``LayerNorm(size)`` without it (L148), so ``config.norm_eps`` is never used.
- ``Sublayer`` (L144-L154): the live line is PRE-norm, ``x + dropout(sublayer(norm(x)))`` (L154); the paper's
  post-norm ``layernorm(x + dropout(sublayer(x)))`` is only a comment (L152).
- ``Encoder`` / ``Decoder`` (L80-L90, L182-L192): ``clone``-d layers applied in sequence, and nothing else:
  no LayerNorm at the top of either stack, so with pre-norm sub-layers the un-normalized residual stream reaches
  the cross-attention and the generator.
- ``EncoderLayer`` (L160-L175): self-attention sub-layer, then feed-forward sub-layer, each in its own
  ``Sublayer`` (``clone(Sublayer(size, dropout), 2)``, L169). ``DecoderLayer`` (L197-L223): masked
  self-attention, encoder-decoder attention, feed-forward, three ``Sublayer`` s (L217).
- ``forward_mask`` (L228-L246): ``triu(ones((1, size, size)), diagonal=1) == 0``, True on and below the
  diagonal (True = may attend, the polarity of ``mask == 0`` at L300), built with ``torch.ones`` and no device
  argument, i.e. on the CPU, at every call.
- ``attention`` (L296-L306): ``Q K^T / sqrt(d_k)`` with d_k the per-head size (L297-L298); scores where
  ``mask == 0`` are filled with ``1e-9`` (L300), a tiny POSITIVE number, not -1e9: a masked score becomes about
  0 instead of a large negative number, so masked keys keep a softmax weight comparable to the admissible ones
  (future target tokens and padded keys are attended); softmax over the keys (L301), then dropout on the
  attention weights (L302-L303).
- ``MultiHeadAttention`` (L330-L381): four ``nn.Linear(d_model, d_model)`` cloned (L348), with nn.Linear's
  default biases (the paper's projections have none); heads split by ``view(B, -1, h, d_k).transpose(1, 2)``
  (L363) and merged by ``transpose(1, 2).contiguous().view(B, -1, h * d_k)`` (L371-L375), then the last linear
  (L381). Attention dropout at the module's ``dropout`` (L340, L350).
- ``Generator`` (L55-L68): ``nn.Linear(model_dims, vocab_size)`` with a bias (L64), then ``nn.LogSoftmax(-1)``
  (L65): the model returns log-probabilities.
- ``EncoderDecoder`` (L32-L53): holds ``encoder``, ``decoder``, ``generator``, ``src_embeddings`` and
  ``tgt_embeddings``; its forward returns the decoder output, the generator is applied after it (as in the
  Annotated Transformer).

Repairs (the smallest change that lets the cell run):

- L77: ``numbers`` is never imported (L2-L6); it is imported here.
- L88, L190: ``encoder_stack`` / ``decoder_stack`` are read as globals; read as ``self.encoder_stack`` /
  ``self.decoder_stack``.
- L136: ``eps`` is an undefined global; read as ``self.eps`` (the 1e-6 of L127-L129).
- L154: ``self.norm`` does not exist; the module's norm is ``self.layernorm`` (L148).
- L175: ``self.sublyers`` typo; read as ``self.sublayers``.
- L68: ``self.layer`` does not exist; the linear is ``self.linear`` (L64).
- L306 / L368: ``attention`` returns one tensor but ``MultiHeadAttention`` unpacks two (``x, self.attn = ...``),
  which iterates over the batch axis (it raises unless B == 2, and then mixes samples); here ``x`` takes the
  single result and ``self.attn`` stays None (L349).
- L355: ``mask.unsqueeze(1)`` discards its result, so the [B, 1, S] / [B, T, T] masks meet the
  [B, h, Lq, Lk] scores without a head axis: broadcasting aligns the batch axis of the mask with the HEAD axis
  of the scores, which raises for every batch size other than 1 and h, and for B == h silently gives head j of
  every sample the mask of sample j. Repaired as the comment intends (``mask = mask.unsqueeze(1)``); without it
  the adapter could not run the suite's batches (B = 3 with h = 4).

Completions (cells left as ``...`` or never shown; they follow the paper, §3):

- L46-L53 (``forward``/``encode``/``decode`` are ``...``): ``forward(src, tgt, src_mask, tgt_mask)`` =
  ``decode(encode(src, src_mask), src_mask, tgt, tgt_mask)``; ``encode`` runs the encoder on
  ``src_embeddings(src)``; ``decode`` runs the decoder on ``tgt_embeddings(tgt)`` and the memory.
- L87-L90, L189-L192, L172-L175, L219-L223 (the layers' ``forward(x)`` have no masks and call the attentions
  with ``...``): ``Encoder.forward(x, mask)``, ``Decoder.forward(x, memory, src_mask, tgt_mask)``; the encoder
  self-attention is ``attention(x, x, x, mask)``, the decoder's ``masked_attention(x, x, x, tgt_mask)`` then
  ``attention(x, memory, memory, src_mask)`` (queries from the previous sub-layer, keys and values from the
  final encoder output, §3.2.3); the sub-layers receive callables (L174 and L220-L222 pass the *result* of a
  call).
- Not in the document: the feed-forward network (§3.3, ``w_2(relu(w_1(x)))`` with biases, no inner dropout);
  the embeddings (§3.4, ``nn.Embedding`` times sqrt(d_model)); the positional encoding (§3.5, the sinusoid
  table computed in float64 and kept as a float32 buffer [1, max_len, d_model], added to the scaled embeddings,
  then dropout, §5.4); the model assembly (N = ``n_layers`` deep copies, attention dropout at
  ``config.dropout``, ``nn.init.xavier_uniform_`` on every matrix as the Annotated Transformer's ``make_model``;
  with ``share_embeddings`` the source embedding, target embedding and ``generator.linear.weight`` are one
  matrix, §3.4; the generator keeps the document's bias).
- Masks, as the Annotated Transformer builds them (not shown in the document): ``src_mask`` =
  ``(src != pad).unsqueeze(-2)`` [B, 1, S]; ``tgt_mask`` = ``(tgt != pad).unsqueeze(-2) & forward_mask(T)``
  [B, T, T]. ``forward_mask`` still builds its mask on the CPU (L244-L246); the completion moves it to the
  input's device (the Annotated Transformer's ``type_as``), so the model runs on accelerators.

Canonical schema mapping (``load_reference_state``): ``src_embed``/``tgt_embed`` -> the ``lut`` of each
``Embeddings``; attention ``q, k, v, o`` -> ``linears[0..3].weight`` (their biases 0); ``normK`` -> the
``layernorm`` (gamma, beta) of the K-th ``Sublayer`` of its layer, which with pre-norm normalizes that
sub-layer's INPUT; ``ffn.w1/w2`` -> ``feed_forward.w_1/w_2``; ``generator`` -> ``generator.linear.weight``
(its bias 0).
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Mapping
from functools import partial

import torch
from torch import Tensor, nn

from spec.config import ModelConfig
from spec.schema import copy_canonical

from .hookspecs import hookimpl
from .registry import Implementation

__all__ = ["EncoderDecoder", "AnnotatedNotebookTransformer", "build", "DEVIATIONS"]


def clone(module_to_clone: nn.Module, num_of_clones: int) -> nn.ModuleList:
    """N independent deep copies (doc L76-L78; ``numbers`` imported, repair of L77)."""
    assert isinstance(num_of_clones, numbers.Integral)
    return nn.ModuleList(copy.deepcopy(module_to_clone) for _ in range(num_of_clones))


# -- LayerNorm and Sublayer (doc L122-L154) -------------------------------------------------------------------------
class LayerNorm(nn.Module):
    """gamma * (x - mean) / (std + eps) + beta with the UNBIASED std and eps outside the square root (doc L136)."""

    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(features))
        self.beta = nn.Parameter(torch.zeros(features))

    def forward(self, x: Tensor) -> Tensor:
        std = x.std(dim=-1, keepdim=True)  # unbiased, n - 1 (doc L134)
        mean = x.mean(dim=-1, keepdim=True)
        return self.gamma * (x - mean) / (std + self.eps) + self.beta  # self.eps: repair of doc L136


class Sublayer(nn.Module):
    """Pre-norm residual: x + dropout(sublayer(layernorm(x))) (doc L154; the post-norm form is a comment, L152)."""

    def __init__(self, size: int, dropout: float):
        super().__init__()
        self.layernorm = LayerNorm(size)  # eps left at 1e-6 (doc L148)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer_protagonist) -> Tensor:
        return x + self.dropout(sublayer_protagonist(self.layernorm(x)))  # self.layernorm: repair of doc L154


# -- attention (doc L296-L381) ----------------------------------------------------------------------------------------
def attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None,
              dropout: nn.Module | None = None) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V with masked scores set to +1e-9 (doc L300), dropout on the weights."""
    d_k = query.shape[-1]
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (B, h, Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, 1e-9)  # 1e-9, not -1e9: masked keys keep their weight (doc L300)
    weights = scores.softmax(dim=-1)  # over the keys (doc L301)
    if dropout is not None:
        weights = dropout(weights)  # doc L302-L303
    return weights @ value  # (B, h, Lq, d_k); one tensor (doc L306)


class MultiHeadAttention(nn.Module):
    """h heads over four cloned nn.Linear(d_model, d_model), biases included (doc L348)."""

    def __init__(self, h: int, d_model: int, dropout: float = 0.1):
        super().__init__()
        assert d_model % h == 0
        self.d_k = d_model // h
        self.h = h
        self.linears = clone(nn.Linear(d_model, d_model), 4)  # q, k, v, output
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> Tensor:
        if mask is not None:
            mask = mask.unsqueeze(1)  # head axis; the document discards this result (repair of doc L355)
        num_batches = query.shape[0]
        query, key, value = (
            lin(x).view(num_batches, -1, self.h, self.d_k).transpose(1, 2)  # (B, h, L, d_k), doc L362-L365
            for lin, x in zip(self.linears, (query, key, value))
        )
        x = attention(query, key, value, mask, self.dropout)  # one result, self.attn stays None (repair of L368)
        x = x.transpose(1, 2).contiguous().view(num_batches, -1, self.h * self.d_k)  # doc L371-L375
        return self.linears[-1](x)  # (B, Lq, d_model)


class PositionwiseFeedForward(nn.Module):
    """§3.3, Eq. (2): w_2(relu(w_1(x))) (not in the document; completed from the paper)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(torch.relu(self.w_1(x)))


# -- layers and stacks (doc L80-L223) ---------------------------------------------------------------------------------
class EncoderLayer(nn.Module):
    """Self-attention sub-layer, then the feed-forward sub-layer (doc L160-L175; forward completed with a mask)."""

    def __init__(self, size: int, multihead_self_attention: nn.Module, feed_forward: nn.Module, dropout: float):
        super().__init__()
        self.attention = multihead_self_attention
        self.feed_forward = feed_forward
        self.sublayers = clone(Sublayer(size, dropout), 2)
        self.size = size

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.sublayers[0](x, lambda x: self.attention(x, x, x, mask))  # completion of doc L174
        return self.sublayers[1](x, self.feed_forward)  # self.sublayers: repair of doc L175


class Encoder(nn.Module):
    """N layers in sequence and nothing after them: no final norm (doc L80-L90)."""

    def __init__(self, encoder_layer: nn.Module, N: int):
        super().__init__()
        self.encoder_stack = clone(encoder_layer, N)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        for encoder in self.encoder_stack:  # self.: repair of doc L88
            x = encoder(x, mask)
        return x


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (doc L197-L223; forward completed)."""

    def __init__(self, size: int, masked_multi_head_attention: nn.Module, multi_head_attention: nn.Module,
                 feed_forward: nn.Module, dropout: float):
        super().__init__()
        self.masked_attention = masked_multi_head_attention
        self.attention = multi_head_attention
        self.feed_forward = feed_forward
        self.sublayers = clone(Sublayer(size, dropout), 3)

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        x = self.sublayers[0](x, lambda x: self.masked_attention(x, x, x, tgt_mask))  # doc L220
        x = self.sublayers[1](x, lambda x: self.attention(x, memory, memory, src_mask))  # doc L221
        return self.sublayers[2](x, self.feed_forward)  # doc L222


class Decoder(nn.Module):
    """N layers in sequence and nothing after them: no final norm (doc L182-L192)."""

    def __init__(self, decoder_layer: nn.Module, N: int):
        super().__init__()
        self.decoder_stack = clone(decoder_layer, N)

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        for decoder in self.decoder_stack:  # self.: repair of doc L190
            x = decoder(x, memory, src_mask, tgt_mask)
        return x


def forward_mask(size: int) -> Tensor:
    """(1, size, size) bool, True on and below the diagonal; built on the CPU (no device, doc L244-L246)."""
    above = torch.triu(torch.ones((1, size, size)), diagonal=1).type(torch.uint8)
    return above == 0


# -- embeddings, positions, generator (completions, and doc L55-L68) ---------------------------------------------------
class Embeddings(nn.Module):
    """§3.4: lut(x) * sqrt(d_model) (not in the document)."""

    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.d_model = d_model

    def forward(self, x: Tensor) -> Tensor:
        return self.lut(x) * math.sqrt(self.d_model)


class PositionalEncoding(nn.Module):
    """§3.5 sinusoids (float64, cast) in a buffer [1, max_len, d_model], added, then dropout (not in the document)."""

    def __init__(self, d_model: int, dropout: float, max_len: int):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.register_buffer("pe", sinusoids(max_len, d_model).unsqueeze(0), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(x + self.pe[:, :x.size(1)].to(x.dtype))


def sinusoids(length: int, d_model: int, device: torch.device | str | None = None) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...): (length, d_model) float32."""
    pos = torch.arange(length, dtype=torch.float64, device=device).unsqueeze(1)  # (L, 1)
    div = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)
    table = torch.zeros(length, d_model, dtype=torch.float64, device=device)
    table[:, 0::2] = torch.sin(pos / div)
    table[:, 1::2] = torch.cos(pos / div)[:, : d_model // 2]
    return table.float()


class Generator(nn.Module):
    """nn.Linear WITH a bias (doc L64), then LogSoftmax (doc L65): log-probabilities."""

    def __init__(self, model_dims: int, vocab_size: int):
        super().__init__()
        self.linear = nn.Linear(model_dims, vocab_size)
        self.softmax = nn.LogSoftmax(dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        return self.softmax(self.linear(x))  # self.linear: repair of doc L68


class EncoderDecoder(nn.Module):
    """The document's container (doc L32-L53); forward/encode/decode completed (they are ``...``)."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module, src_embeddings: nn.Module, tgt_embeddings: nn.Module,
                 generator: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.generator = generator
        self.src_embeddings = src_embeddings
        self.tgt_embeddings = tgt_embeddings

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)  # decoder output (B, T, d_model)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return self.encoder(self.src_embeddings(src), src_mask)

    def decode(self, memory: Tensor, src_mask: Tensor, tgt: Tensor, tgt_mask: Tensor) -> Tensor:
        return self.decoder(self.tgt_embeddings(tgt), memory, src_mask, tgt_mask)


def make_model(cfg: ModelConfig) -> EncoderDecoder:
    """The assembly the document never shows (completion, Annotated Transformer style)."""
    c = copy.deepcopy
    attn = MultiHeadAttention(cfg.n_heads, cfg.d_model, dropout=cfg.dropout)
    ff = PositionwiseFeedForward(cfg.d_model, cfg.d_ff)
    position = PositionalEncoding(cfg.d_model, cfg.dropout, cfg.max_len)
    model = EncoderDecoder(
        Encoder(EncoderLayer(cfg.d_model, c(attn), c(ff), cfg.dropout), cfg.n_layers),
        Decoder(DecoderLayer(cfg.d_model, c(attn), c(attn), c(ff), cfg.dropout), cfg.n_layers),
        nn.Sequential(Embeddings(cfg.d_model, cfg.src_vocab), c(position)),
        nn.Sequential(Embeddings(cfg.d_model, cfg.tgt_vocab), c(position)),
        Generator(cfg.d_model, cfg.tgt_vocab),
    )
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    if cfg.share_embeddings:  # §3.4: one matrix, three uses (the generator's bias stays)
        shared = model.src_embeddings[0].lut.weight
        model.tgt_embeddings[0].lut.weight = shared
        model.generator.linear.weight = shared
    return model


# -- adapter -----------------------------------------------------------------------------------------------------------
class AnnotatedNotebookTransformer(nn.Module):
    """The adapter: masks as the Annotated Transformer builds them, then generator(model(...)): log-probs."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = make_model(config)

    def _src_mask(self, src: Tensor) -> Tensor:
        return (src != self.config.pad_id).unsqueeze(-2)  # (B, 1, S), True = may attend

    def _tgt_mask(self, tgt: Tensor) -> Tensor:
        pad = (tgt != self.config.pad_id).unsqueeze(-2)  # (B, 1, T)
        return pad & forward_mask(tgt.size(-1)).to(tgt.device)  # (B, T, T); built on the CPU, then moved

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) right-padded ids to log-probabilities (B, T, tgt_vocab)."""
        out = self.model(src, tgt, self._src_mask(src), self._tgt_mask(tgt))  # (B, T, d_model)
        return self.model.generator(out)

    def encode(self, src: Tensor) -> Tensor:
        """The last encoder layer's output (no final norm), what cross-attention reads: (B, S, d_model)."""
        return self.model.encode(src, self._src_mask(src))

    def positional_encoding(self, length: int) -> Tensor:
        """The table added to the scaled embeddings: (length, d_model)."""
        pe = self.model.src_embeddings[1].pe[0]  # (max_len, d_model)
        if length <= pe.size(0):
            return pe[:length]
        return sinusoids(length, self.config.d_model, device=pe.device)

    @torch.no_grad()
    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical-schema state dict; the attention and generator biases (absent in the paper) get 0."""
        put = partial(copy_canonical, state)  # put(param, *canonical names)

        def put_attention(mha: MultiHeadAttention, prefix: str) -> None:
            for lin, ours in zip(mha.linears, ("q", "k", "v", "o")):
                put(lin.weight, f"{prefix}.{ours}.weight")
                lin.bias.zero_()

        def put_norm(sub: Sublayer, prefix: str) -> None:
            put(sub.layernorm.gamma, f"{prefix}.weight")
            put(sub.layernorm.beta, f"{prefix}.bias")

        def put_ffn(ff: PositionwiseFeedForward, prefix: str) -> None:
            for lin, ours in ((ff.w_1, "w1"), (ff.w_2, "w2")):
                put(lin.weight, f"{prefix}.{ours}.weight")
                put(lin.bias, f"{prefix}.{ours}.bias")

        m = self.model
        put(m.src_embeddings[0].lut.weight, "src_embed.weight")
        put(m.tgt_embeddings[0].lut.weight, "tgt_embed.weight")
        put(m.generator.linear.weight, "generator.weight")
        m.generator.linear.bias.zero_()
        for i, layer in enumerate(m.encoder.encoder_stack):
            p = f"encoder.{i}"
            put_attention(layer.attention, f"{p}.self_attn")
            put_ffn(layer.feed_forward, f"{p}.ffn")
            for k in range(2):
                put_norm(layer.sublayers[k], f"{p}.norm{k + 1}")
        for i, layer in enumerate(m.decoder.decoder_stack):
            p = f"decoder.{i}"
            put_attention(layer.masked_attention, f"{p}.self_attn")
            put_attention(layer.attention, f"{p}.cross_attn")
            put_ffn(layer.feed_forward, f"{p}.ffn")
            for k in range(3):
                put_norm(layer.sublayers[k], f"{p}.norm{k + 1}")


def build(config: ModelConfig) -> AnnotatedNotebookTransformer:
    return AnnotatedNotebookTransformer(config)


DEVIATIONS: dict[str, str] = {
    "train.learns": (
        "the +1e-9 mask fill declared under mask.causal lets the decoder read the next target token while it is "
        "trained teacher-forced (it then predicts 100% of the target tokens), which greedy decoding does not have: "
        "10% of the held-out copies and 3% of the reversals come out right"
    ),
    "norm.post-norm": (
        "Sublayer returns x + dropout(sublayer(norm(x))) (doc L154): pre-norm; the paper's "
        "layernorm(x + dropout(sublayer(x))) is only a comment (doc L152)"
    ),
    "norm.layer-norm": (
        "LayerNorm divides by x.std() + eps (doc L134, L136): the unbiased (n - 1) standard deviation with eps "
        "outside the square root, instead of sqrt(biased var + eps); eps is also fixed at 1e-6 (doc L127, L148)"
    ),
    "mask.causal": (
        "attention fills masked scores with +1e-9 (doc L300), not -inf or -1e9: a future key's score becomes about "
        "0 and keeps a softmax weight, so position i sees target tokens after i"
    ),
    "mask.source-padding": (
        "the +1e-9 fill (doc L300) leaves padded source keys a score of about 0, so they keep their softmax weight "
        "in encoder self-attention and in cross-attention: padding content and length move the outputs"
    ),
    "mask.target-padding": (
        "the +1e-9 fill (doc L300) also opens the decoder self-attention to the appended padded target keys"
    ),
    "model.reference-equivalence": (
        "with the canonical weights loaded (biases 0) it computes a different function: pre-norm sub-layers without "
        "final norms (doc L154, L80-L90, L182-L192), the unbiased std + eps LayerNorm (doc L136) and the +1e-9 "
        "mask fill (doc L300)"
    ),
    "config.parameters": (
        "the four cloned nn.Linear(d_model, d_model) of every attention keep their default biases (doc L348, "
        "4 x d_model per attention) and the generator's nn.Linear has a [tgt_vocab] bias (doc L64)"
    ),
    "embedding.shared-weights": (
        "the generator is nn.Linear(model_dims, vocab_size) with a bias (doc L64): with share_embeddings the "
        "matrix is tied but the pre-softmax projection still carries a [tgt_vocab] bias"
    ),
}


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="annotated-notebook",
        build=build,
        summary="A notebook after the Annotated Transformer: pre-norm Sublayer without final norms, LayerNorm with "
                "unbiased std + eps, masked scores filled with +1e-9, biased projections and generator, log-softmax",
        source="a notebook following https://github.com/harvardnlp/annotated-transformer",
        output="log_probs",
        deviations=DEVIATIONS,
    ))
