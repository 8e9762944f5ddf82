"""Built-in plugin ``annotated-notebook``: a study notebook written after the Annotated Transformer.

Upstream: https://github.com/harvardnlp/annotated-transformer, ``the_annotated_transformer.py`` at commit
0a91a254735c (a jupytext export of the notebook; its classes and functions are named below, since its line
numbers move with every export). The notebook this plugin reproduces follows that file's structure and the
paper's text, renames several parts, leaves cells as ``...``, never shows the embeddings, the positional
encoding, the feed-forward network or the model assembly, and departs from the file in ways that change what
it computes; each departure is named below. The plugin reproduces the notebook, in our own words, keeping its
class, function and attribute names:

- ``LayerNorm`` (upstream ``LayerNorm``, with ``a_2``/``b_2`` named ``gamma``/``beta``): per-feature
  ``gamma`` (ones) and ``beta`` (zeros); ``x.std(dim=-1)`` is torch's default, the unbiased (n - 1) estimate,
  and eps is added to the standard deviation, outside any square root:
  ``gamma * (x - mean) / (std + eps) + beta``, as upstream. eps is the constructor default 1e-6: ``Sublayer``
  builds ``LayerNorm(size)`` without it, so ``config.norm_eps`` is never used.
- ``Sublayer`` (upstream ``SublayerConnection``): the live line is PRE-norm,
  ``x + dropout(sublayer(norm(x)))``, as upstream; the paper's post-norm
  ``layernorm(x + dropout(sublayer(x)))`` is only a comment.
- ``Encoder`` / ``Decoder``: ``clone``-d layers applied in sequence, and nothing else. Here the notebook
  departs from the file, whose ``Encoder`` and ``Decoder`` end with a ``LayerNorm``: without it, with
  pre-norm sub-layers, the un-normalized residual stream reaches the cross-attention and the generator.
- ``EncoderLayer``: self-attention sub-layer, then feed-forward sub-layer, each in its own ``Sublayer``
  (``clone(Sublayer(size, dropout), 2)``). ``DecoderLayer``: masked self-attention, encoder-decoder attention,
  feed-forward, three ``Sublayer`` s.
- ``forward_mask`` (upstream ``subsequent_mask``): ``triu(ones((1, size, size)), diagonal=1) == 0``, True on
  and below the diagonal (True = may attend, the polarity ``attention`` reads with ``mask == 0``), built with
  ``torch.ones`` and no device argument, i.e. on the CPU, at every call.
- ``attention``: ``Q K^T / sqrt(d_k)`` with d_k the per-head size; scores where ``mask == 0`` are filled with
  ``1e-9``, a tiny POSITIVE number, where the file has -1e9: a masked score becomes about 0 instead of a large
  negative number, so masked keys keep a softmax weight comparable to the admissible ones (future target
  tokens and padded keys are attended); softmax over the keys, then dropout on the attention weights.
- ``MultiHeadAttention`` (upstream ``MultiHeadedAttention``): four ``nn.Linear(d_model, d_model)`` cloned,
  with nn.Linear's default biases (the paper's projections have none); heads split by
  ``view(B, -1, h, d_k).transpose(1, 2)`` and merged by ``transpose(1, 2).contiguous().view(B, -1, h * d_k)``,
  then the last linear. Attention dropout at the module's ``dropout``.
- ``Generator``: ``nn.Linear(model_dims, vocab_size)`` with a bias, then ``nn.LogSoftmax(-1)``: the model
  returns log-probabilities, as upstream.
- ``EncoderDecoder``: holds ``encoder``, ``decoder``, ``generator``, ``src_embeddings`` and
  ``tgt_embeddings``; its forward returns the decoder output, the generator is applied after it (as upstream).

Repairs of the notebook (the smallest change that lets each cell run; the file has none of these defects):

- ``clone`` asserts ``isinstance(n, numbers.Integral)`` but ``numbers`` is never imported; it is imported here.
- ``Encoder.forward`` / ``Decoder.forward`` read ``encoder_stack`` / ``decoder_stack`` as globals; read as
  ``self.encoder_stack`` / ``self.decoder_stack``.
- ``LayerNorm.forward`` reads ``eps`` as an undefined global; read as ``self.eps`` (1e-6).
- ``Sublayer.forward`` calls ``self.norm``, which does not exist; the module's norm is ``self.layernorm``.
- ``EncoderLayer.forward`` reads ``self.sublyers``; read as ``self.sublayers``.
- ``Generator.forward`` calls ``self.layer``, which does not exist; the linear is ``self.linear``.
- ``attention`` returns one tensor but ``MultiHeadAttention`` unpacks two (``x, self.attn = ...``), which
  iterates over the batch axis (it raises unless B == 2, and then mixes samples); here ``x`` takes the single
  result and ``self.attn`` stays None.
- ``MultiHeadAttention.forward`` calls ``mask.unsqueeze(1)`` and discards the result (the file assigns it), so
  the [B, 1, S] / [B, T, T] masks meet the [B, h, Lq, Lk] scores without a head axis: broadcasting aligns the
  batch axis of the mask with the HEAD axis of the scores, which raises for every batch size other than 1 and
  h, and for B == h silently gives head j of every sample the mask of sample j. Repaired as the comment
  intends (``mask = mask.unsqueeze(1)``); without it the adapter could not run the suite's batches (B = 3
  with h = 4).

Completions (cells left as ``...`` or never shown; they follow the paper, §3, and the file where it agrees):

- ``EncoderDecoder.forward``/``encode``/``decode`` are ``...``: ``forward(src, tgt, src_mask, tgt_mask)`` =
  ``decode(encode(src, src_mask), src_mask, tgt, tgt_mask)``; ``encode`` runs the encoder on
  ``src_embeddings(src)``; ``decode`` runs the decoder on ``tgt_embeddings(tgt)`` and the memory (as upstream).
- The layers' and stacks' ``forward(x)`` take no masks and call the attentions with ``...``:
  ``Encoder.forward(x, mask)``, ``Decoder.forward(x, memory, src_mask, tgt_mask)``; the encoder self-attention
  is ``attention(x, x, x, mask)``, the decoder's ``masked_attention(x, x, x, tgt_mask)`` then
  ``attention(x, memory, memory, src_mask)`` (queries from the previous sub-layer, keys and values from the
  final encoder output, §3.2.3); the sub-layers receive callables (the notebook passes the *result* of a call).
- Not in the notebook: the feed-forward network (§3.3, ``w_2(relu(w_1(x)))`` with biases and no inner dropout,
  where the file's ``PositionwiseFeedForward`` drops between the two linears); the embeddings (§3.4,
  ``nn.Embedding`` times sqrt(d_model)); the positional encoding (§3.5, the sinusoid table computed in float64
  and kept as a float32 buffer [1, max_len, d_model], added to the scaled embeddings, then dropout, §5.4); the
  model assembly (N = ``n_layers`` deep copies, attention dropout at ``config.dropout``,
  ``nn.init.xavier_uniform_`` on every matrix as the file's ``make_model``; with ``share_embeddings`` the
  source embedding, target embedding and ``generator.linear.weight`` are one matrix, §3.4; the generator keeps
  its bias).
- Masks, as the file's ``Batch`` builds them (the notebook shows none): ``src_mask`` =
  ``(src != pad).unsqueeze(-2)`` [B, 1, S]; ``tgt_mask`` = ``(tgt != pad).unsqueeze(-2) & forward_mask(T)``
  [B, T, T]. ``forward_mask`` still builds its mask on the CPU; the completion moves it to the input's device
  (the file's ``type_as``), so the model runs on accelerators.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import CanonicalKey, Target, load_canonical

from ..declarations import Implementation
from ..hookspecs import hookimpl

__all__ = ["EncoderDecoder", "AnnotatedNotebookTransformer", "build", "DEVIATIONS"]


def clone(module_to_clone: nn.Module, num_of_clones: int) -> nn.ModuleList:
    """N independent deep copies (``numbers`` imported here: the notebook never imports it)."""
    assert isinstance(num_of_clones, numbers.Integral)
    return nn.ModuleList(copy.deepcopy(module_to_clone) for _ in range(num_of_clones))


# -- LayerNorm and Sublayer ------------------------------------------------------------------------------------------
class LayerNorm(nn.Module):
    """gamma * (x - mean) / (std + eps) + beta with the UNBIASED std and eps outside the square root."""

    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(features))
        self.beta = nn.Parameter(torch.zeros(features))

    def forward(self, x: Tensor) -> Tensor:
        std = x.std(dim=-1, keepdim=True)  # unbiased, n - 1
        mean = x.mean(dim=-1, keepdim=True)
        return self.gamma * (x - mean) / (std + self.eps) + self.beta  # self.eps: a global eps there


class Sublayer(nn.Module):
    """Pre-norm residual: x + dropout(sublayer(layernorm(x))) (the post-norm form is a comment in the notebook)."""

    def __init__(self, size: int, dropout: float):
        super().__init__()
        self.layernorm = LayerNorm(size)  # eps left at 1e-6
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer_protagonist) -> Tensor:
        return x + self.dropout(sublayer_protagonist(self.layernorm(x)))  # self.layernorm: the notebook calls self.norm


# -- attention -------------------------------------------------------------------------------------------------------
def attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None,
              dropout: nn.Module | None = None) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V with masked scores set to +1e-9, dropout on the weights."""
    d_k = query.shape[-1]
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (B, h, Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, 1e-9)  # 1e-9, not -1e9: masked keys keep their weight
    weights = scores.softmax(dim=-1)  # over the keys
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value  # (B, h, Lq, d_k); one tensor


class MultiHeadAttention(nn.Module):
    """h heads over four cloned nn.Linear(d_model, d_model), biases included."""

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
            mask = mask.unsqueeze(1)  # head axis; the notebook discards this result
        num_batches = query.shape[0]
        query, key, value = (
            lin(x).view(num_batches, -1, self.h, self.d_k).transpose(1, 2)  # (B, h, L, d_k)
            for lin, x in zip(self.linears, (query, key, value))
        )
        x = attention(query, key, value, mask, self.dropout)  # one result, self.attn stays None (repaired)
        x = x.transpose(1, 2).contiguous().view(num_batches, -1, self.h * self.d_k)
        return self.linears[-1](x)  # (B, Lq, d_model)


class PositionwiseFeedForward(nn.Module):
    """§3.3, Eq. (2): w_2(relu(w_1(x))) (not in the notebook; completed from the paper)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(torch.relu(self.w_1(x)))


# -- layers and stacks -----------------------------------------------------------------------------------------------
class EncoderLayer(nn.Module):
    """Self-attention sub-layer, then the feed-forward sub-layer (forward completed with a mask)."""

    def __init__(self, size: int, multihead_self_attention: nn.Module, feed_forward: nn.Module, dropout: float):
        super().__init__()
        self.attention = multihead_self_attention
        self.feed_forward = feed_forward
        self.sublayers = clone(Sublayer(size, dropout), 2)
        self.size = size

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.sublayers[0](x, lambda x: self.attention(x, x, x, mask))  # completed: the notebook passes a result
        return self.sublayers[1](x, self.feed_forward)  # self.sublayers: the notebook reads self.sublyers


class Encoder(nn.Module):
    """N layers in sequence and nothing after them: no final norm."""

    def __init__(self, encoder_layer: nn.Module, N: int):
        super().__init__()
        self.encoder_stack = clone(encoder_layer, N)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        for encoder in self.encoder_stack:  # self.: the notebook reads a global
            x = encoder(x, mask)
        return x


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (forward completed)."""

    def __init__(self, size: int, masked_multi_head_attention: nn.Module, multi_head_attention: nn.Module,
                 feed_forward: nn.Module, dropout: float):
        super().__init__()
        self.masked_attention = masked_multi_head_attention
        self.attention = multi_head_attention
        self.feed_forward = feed_forward
        self.sublayers = clone(Sublayer(size, dropout), 3)

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        x = self.sublayers[0](x, lambda x: self.masked_attention(x, x, x, tgt_mask))
        x = self.sublayers[1](x, lambda x: self.attention(x, memory, memory, src_mask))
        return self.sublayers[2](x, self.feed_forward)


class Decoder(nn.Module):
    """N layers in sequence and nothing after them: no final norm (the file ends the stack with a LayerNorm)."""

    def __init__(self, decoder_layer: nn.Module, N: int):
        super().__init__()
        self.decoder_stack = clone(decoder_layer, N)

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        for decoder in self.decoder_stack:  # self.: the notebook reads a global
            x = decoder(x, memory, src_mask, tgt_mask)
        return x


def forward_mask(size: int) -> Tensor:
    """(1, size, size) bool, True on and below the diagonal; built on the CPU (no device)."""
    above = torch.triu(torch.ones((1, size, size)), diagonal=1).type(torch.uint8)
    return above == 0


# -- embeddings, positions (completions), generator -------------------------------------------------------------------
class Embeddings(nn.Module):
    """§3.4: lut(x) * sqrt(d_model) (not in the notebook)."""

    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.d_model = d_model

    def forward(self, x: Tensor) -> Tensor:
        return self.lut(x) * math.sqrt(self.d_model)


class PositionalEncoding(nn.Module):
    """§3.5 sinusoids (float64, cast) in a buffer [1, max_len, d_model], added, then dropout (not in the notebook)."""

    pe: Tensor  # (1, max_len, d_model), a non-persistent buffer

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
    """nn.Linear WITH a bias, then LogSoftmax: log-probabilities."""

    def __init__(self, model_dims: int, vocab_size: int):
        super().__init__()
        self.linear = nn.Linear(model_dims, vocab_size)
        self.softmax = nn.LogSoftmax(dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        return self.softmax(self.linear(x))  # self.linear: the notebook calls self.layer


class EncoderDecoder(nn.Module):
    """The notebook's container; forward/encode/decode completed (they are ``...``)."""

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
    """The assembly the notebook never shows (completion, as the file's ``make_model``)."""
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
        shared = model.get_parameter("src_embeddings.0.lut.weight")
        model.get_submodule("tgt_embeddings.0.lut").weight = shared
        model.get_submodule("generator.linear").weight = shared
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
        pe = self.model.get_buffer("src_embeddings.1.pe")[0]  # (max_len, d_model)
        if length <= pe.size(0):
            return pe[:length]
        return sinusoids(length, self.config.d_model, device=pe.device)

    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical-schema state dict; the attention and generator biases (absent in the paper) get 0.

        ``normK`` goes to the ``layernorm`` of the K-th ``Sublayer``, which with pre-norm normalizes that
        sub-layer's input."""
        get = self.get_parameter
        mapping: dict[CanonicalKey, Target] = {"src_embed.weight": get("model.src_embeddings.0.lut.weight"),
                                               "tgt_embed.weight": get("model.tgt_embeddings.0.lut.weight"),
                                               "generator.weight": get("model.generator.linear.weight")}
        zero = [get("model.generator.linear.bias")]
        stacks = (("encoder", "model.encoder.encoder_stack", {"self_attn": "attention"}, 2),
                  ("decoder", "model.decoder.decoder_stack", {"self_attn": "masked_attention",
                                                              "cross_attn": "attention"}, 3))
        for stack, layers, attentions, n_norms in stacks:
            for i in range(self.config.n_layers):
                ours, theirs = f"{stack}.{i}", f"{layers}.{i}"
                for att, mha in attentions.items():  # linears 0..3 are q, k, v, o
                    mapping.update({f"{ours}.{att}.{x}.weight": get(f"{theirs}.{mha}.linears.{j}.weight")
                                    for j, x in enumerate("qkvo")})
                    zero += [get(f"{theirs}.{mha}.linears.{j}.bias") for j in range(4)]
                for k in (1, 2):
                    mapping[f"{ours}.ffn.w{k}.weight"] = get(f"{theirs}.feed_forward.w_{k}.weight")
                    mapping[f"{ours}.ffn.w{k}.bias"] = get(f"{theirs}.feed_forward.w_{k}.bias")
                for k in range(n_norms):
                    mapping[f"{ours}.norm{k + 1}.weight"] = get(f"{theirs}.sublayers.{k}.layernorm.gamma")
                    mapping[f"{ours}.norm{k + 1}.bias"] = get(f"{theirs}.sublayers.{k}.layernorm.beta")
        load_canonical(state, mapping, zero=zero)


def build(config: ModelConfig) -> AnnotatedNotebookTransformer:
    return AnnotatedNotebookTransformer(config)


DEVIATIONS: dict[str, str] = {
    "dropout.extra-sites": (
        "attention() drops the softmax weights (dropout(p_attn), as the Annotated Transformer does) at the "
        "configured rate (§5.4 names no such site for the base model; tensor2tensor v1 had it at 0, v2 on at 0.1: "
        "common practice, not the paper's base model); its feed-forward network, completed from the paper, has no "
        "inner dropout"
    ),
    "train.learns": (
        "the +1e-9 mask fill declared under mask.causal lets the decoder read the next target token while it is "
        "trained teacher-forced (it then predicts 100% of the target tokens), which greedy decoding does not have: "
        "from the reference's initial state, 6% of the held-out copies and 0.5% of the reversals come out right"
    ),
    "norm.post-norm": (
        "Sublayer returns x + dropout(sublayer(norm(x))) (as the file's SublayerConnection): pre-norm; the paper's "
        "layernorm(x + dropout(sublayer(x))) is only a comment in the notebook"
    ),
    "norm.layer-norm": (
        "LayerNorm divides by x.std() + eps (as the file's LayerNorm): the unbiased (n - 1) standard deviation with "
        "eps outside the square root, instead of sqrt(biased var + eps); eps is also fixed at 1e-6 (Sublayer "
        "builds LayerNorm(size) without it)"
    ),
    "mask.causal": (
        "attention fills masked scores with +1e-9 (the file has -1e9), not -inf or -1e9: a future key's score "
        "becomes about 0 and keeps a softmax weight, so position i sees target tokens after i"
    ),
    "mask.source-padding": (
        "the +1e-9 fill leaves padded source keys a score of about 0, so they keep their softmax weight in encoder "
        "self-attention and in cross-attention: padding content and length move the outputs"
    ),
    "mask.target-padding": (
        "the +1e-9 fill also opens the decoder self-attention to the appended padded target keys"
    ),
    "model.reference-equivalence": (
        "with the canonical weights loaded (biases 0) it computes a different function: pre-norm sub-layers without "
        "final norms (the notebook drops the file's final LayerNorm of each stack), the unbiased std + eps "
        "LayerNorm and the +1e-9 mask fill"
    ),
    "config.parameters": (
        "the four cloned nn.Linear(d_model, d_model) of every attention keep their default biases (4 x d_model per "
        "attention) and the generator's nn.Linear has a [tgt_vocab] bias"
    ),
    "embedding.shared-weights": (
        "the generator is nn.Linear(model_dims, vocab_size) with a bias: with share_embeddings the matrix is tied "
        "but the pre-softmax projection still carries a [tgt_vocab] bias"
    ),
}


NOTES = (
    "A study notebook following the Annotated Transformer (EncoderDecoder, Generator, Sublayer, forward_mask), "
    "with typos and cells left as `...`. Pre-norm sold as the paper (the post-norm line is a comment), with no "
    "final norm; masks filled with +1e-9 instead of a large negative number, so future and padded keys are "
    "attended; the Annotated Transformer's `std + eps` layer norm; a generator bias; log-probabilities out."
)


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="annotated-notebook",
        build=build,
        summary="A notebook after the Annotated Transformer: pre-norm Sublayer without final norms, LayerNorm with "
                "unbiased std + eps, masked scores filled with +1e-9, biased projections and generator, log-softmax",
        source="a notebook following https://github.com/harvardnlp/annotated-transformer/blob/"
               "0a91a254735c07532e23733dce8a693e504f3a08/the_annotated_transformer.py",
        output="log_probs",
        deviations=DEVIATIONS,
        notes=NOTES,
    ))
