"""Built-in plugin ``torch-nn``: PyTorch's own ``torch.nn.Transformer``, used as its documentation shows.

``nn.Transformer`` (post-norm, ReLU, ``batch_first=True``, ``layer_norm_eps=config.norm_eps``) wrapped in what
the paper adds around the stacks: token embeddings multiplied by sqrt(d_model) (§3.4), the §3.5 sinusoids as a
buffer, dropout on their sum (§5.4) and a bias-free generator tied to the embeddings (§3.4). Its boolean masks
are True where attention is NOT allowed, the opposite of this project's. What the module adds to the paper is
declared in ``DEVIATIONS``; ``NOTES`` says why the adapter decodes only by recomputing the prefix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from aiayn_conformance.reference.decoding import PrefixDecoding
from aiayn_conformance.reference.model import sinusoid_table
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import CanonicalKey, Target, load_canonical

from ..declarations import Implementation
from ..hookspecs import hookimpl

__all__ = ["TorchNNTransformer", "build", "DEVIATIONS"]


class TorchNNTransformer(PrefixDecoding, nn.Module):
    """Embeddings, positions, ``nn.Transformer`` and a tied generator; returns logits (B, T, tgt_vocab)."""

    pe: Tensor  # (max_len, d_model), a non-persistent buffer

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        self.src_embed = nn.Embedding(cfg.src_vocab, cfg.d_model)
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab, cfg.d_model)
        # The encoder nn.Transformer would build, but with enable_nested_tensor=False: its nested-tensor fast
        # path (eval, no grad, key-padding mask) crashes under CPU autocast ("expected scalar type Float but
        # found BFloat16": its guard torch.is_autocast_enabled() sees only CUDA autocast) and zeroes padded
        # encoder positions. The per-layer eval fast path (torch._transformer_encoder_layer_fwd) stays on.
        encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout,
                                       layer_norm_eps=cfg.norm_eps, batch_first=True),
            cfg.n_layers, norm=nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps), enable_nested_tensor=False,
        )
        self.transformer = nn.Transformer(
            d_model=cfg.d_model, nhead=cfg.n_heads, num_encoder_layers=cfg.n_layers,
            num_decoder_layers=cfg.n_layers, dim_feedforward=cfg.d_ff, dropout=cfg.dropout,
            custom_encoder=encoder, layer_norm_eps=cfg.norm_eps, batch_first=True,
        )
        self.generator = nn.Linear(cfg.d_model, cfg.tgt_vocab, bias=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.register_buffer("pe", sinusoid_table(cfg.max_len, cfg.d_model), persistent=False)  # (max_len, d_model)
        nn.init.normal_(self.src_embed.weight, mean=0.0, std=cfg.d_model ** -0.5)
        nn.init.normal_(self.tgt_embed.weight, mean=0.0, std=cfg.d_model ** -0.5)
        if cfg.share_embeddings:  # §3.4: one matrix, three uses
            self.tgt_embed.weight = self.src_embed.weight
            self.generator.weight = self.src_embed.weight

    # -- §3.5 -----------------------------------------------------------------
    def positional_encoding(self, length: int) -> Tensor:
        """The table added to the scaled embeddings: (length, d_model)."""
        if length <= self.pe.size(0):
            return self.pe[:length]
        return sinusoid_table(length, self.config.d_model, device=self.pe.device)

    def _embed(self, tokens: Tensor, embedding: nn.Embedding) -> Tensor:
        """§3.4, §3.5, §5.4: Dropout(sqrt(d_model) * E[tokens] + PE). (B, L, d_model)."""
        x = embedding(tokens) * math.sqrt(self.config.d_model)  # (B, L, d_model)
        return self.dropout(x + self.positional_encoding(tokens.size(1)).to(x.dtype))

    # -- the model --------------------------------------------------------------
    def encode(self, src: Tensor) -> Tensor:
        """``nn.Transformer.encoder`` output (B, S, d_model), after its final ``encoder.norm``."""
        src_pad = src == self.config.pad_id  # (B, S), True = ignore
        return self.transformer.encoder(self._embed(src, self.src_embed), src_key_padding_mask=src_pad)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) right-padded token ids to logits (B, T, tgt_vocab)."""
        pad = self.config.pad_id
        src_pad = src == pad  # (B, S), True = ignore
        tgt_pad = tgt == pad  # (B, T), True = ignore
        T = tgt.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).triu(1)  # (T, T), True above the diagonal
        y = self.transformer(
            self._embed(src, self.src_embed), self._embed(tgt, self.tgt_embed),
            tgt_mask=causal, src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad, tgt_is_causal=True,
        )  # (B, T, d_model)
        return self.generator(y)  # (B, T, tgt_vocab)

    # -- adapter contract ----------------------------------------------------------
    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical-schema state dict; biases the paper lacks get 0, the final norms gain 1 and bias 0.

        ``in_proj_weight`` is cat(q, k, v) along the output rows, ``out_proj.weight`` is o, ``linear1`` and
        ``linear2`` are the FFN's w1 and w2."""
        get = self.get_parameter
        mapping: dict[CanonicalKey, Target] = {name: get(name) for name in ("src_embed.weight", "tgt_embed.weight",
                                                                             "generator.weight")}
        zero, one = [], []
        stacks = (("encoder", {"self_attn": "self_attn"}, ("norm1", "norm2")),
                  ("decoder", {"self_attn": "self_attn", "cross_attn": "multihead_attn"}, ("norm1", "norm2", "norm3")))
        for stack, attentions, norms in stacks:
            one.append(get(f"transformer.{stack}.norm.weight"))  # the extra final norm, as near to absent as it gets
            zero.append(get(f"transformer.{stack}.norm.bias"))
            for i in range(self.config.n_layers):
                ours, theirs = f"{stack}.{i}", f"transformer.{stack}.layers.{i}"
                for att, mha in attentions.items():
                    mapping[tuple(f"{ours}.{att}.{x}.weight" for x in "qkv")] = get(f"{theirs}.{mha}.in_proj_weight")
                    mapping[f"{ours}.{att}.o.weight"] = get(f"{theirs}.{mha}.out_proj.weight")
                    zero += [get(f"{theirs}.{mha}.in_proj_bias"), get(f"{theirs}.{mha}.out_proj.bias")]
                for p in ("weight", "bias"):
                    mapping[f"{ours}.ffn.w1.{p}"] = get(f"{theirs}.linear1.{p}")
                    mapping[f"{ours}.ffn.w2.{p}"] = get(f"{theirs}.linear2.{p}")
                    mapping.update({f"{ours}.{norm}.{p}": get(f"{theirs}.{norm}.{p}") for norm in norms})
        load_canonical(state, mapping, zero=zero, one=one)


def build(config: ModelConfig) -> TorchNNTransformer:
    return TorchNNTransformer(config)


DEVIATIONS: dict[str, str] = {
    "dropout.extra-sites": (
        "nn.Transformer passes its one dropout rate to every MultiheadAttention (dropout=..., applied to the "
        "softmax weights) and uses it between linear1 and linear2 (TransformerEncoderLayer/DecoderLayer._ff_block: "
        "linear2(dropout(activation(linear1(x))))), so in training the attention weights and the FFN's hidden units "
        "are dropped at P_drop too (§5.4 names no such site for the base model; tensor2tensor v1 had it at 0, v2 on "
        "at 0.1: common practice, not the paper's base model)"
    ),
    "norm.no-extra-norm": (
        "nn.Transformer always adds a final LayerNorm to each stack (encoder.norm, decoder.norm), even post-norm, "
        "so the last layer's output is normalized twice (pytorch/pytorch #24930, #50086)"
    ),
    "model.reference-equivalence": (
        "the extra final LayerNorm of each stack re-normalizes the last layer's output: even with gain 1 and "
        "bias 0 loaded it discards the last norm's gain and bias, so the function differs from the paper's"
    ),
    "mask.finite": (
        "in eval mode without autograd, nn.TransformerEncoderLayer's fast path (torch._transformer_encoder_layer_fwd) "
        "returns NaN for a fully padded source sequence, and cross-attention carries the NaN to every target "
        "position of that sample (training mode and the autograd path give finite values)"
    ),
    "config.parameters": (
        "beyond the paper's parameters: biases on every attention projection (in_proj_bias, out_proj.bias: "
        "4 x d_model per attention) and the two final LayerNorms (2 x 2 x d_model)"
    ),
}


NOTES = (
    "Not deviations: the layer-norm epsilon (set from the config); the Q/K/V/output projection biases, which "
    "`load_reference_state` sets to 0. The encoder is built with `enable_nested_tensor=False`: with nested tensors "
    "(the default) eval-mode inference without autograd crashes under CPU autocast (\"expected scalar type Float "
    "but found BFloat16\", the guard `torch.is_autocast_enabled()` sees only CUDA autocast) and zeroes padded "
    "encoder positions.\n\n"
    "Decoding: the step-level interface only (`begin_decoding`, `decode_step`, `reorder_state` from "
    "`reference.decoding.PrefixDecoding`), each step recomputing the whole prefix with `forward`; PyTorch documents "
    "no decoder for `nn.Transformer`, so the adapter offers no `generate` and the search clauses (`decode.greedy`, "
    "`decode.beam`, `decode.max-length`) skip."
)


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="torch-nn",
        build=build,
        summary="torch.nn.Transformer (post-norm, batch_first) with scaled embeddings, sinusoids and a tied generator",
        source="https://pytorch.org/docs/stable/generated/torch.nn.Transformer.html (the installed torch)",
        output="logits",
        deviations=DEVIATIONS,
        notes=NOTES,
    ))
