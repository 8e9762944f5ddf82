"""Built-in plugin ``x-transformers``: lucidrains' ``x_transformers.XTransformer`` (encoder-decoder).

Source: the installed ``x-transformers``; the reasons cite ``x_transformers/x_transformers.py:N`` in the release
``WRITTEN_FOR`` (docs/plugins.md, "The version tie").

Configuration (keyword arguments of ``XTransformer``, random weights): ``dim = d_model``,
``enc_/dec_num_tokens`` = the vocabularies, ``enc_/dec_depth = N``, ``enc_/dec_heads = h``,
``enc_/dec_attn_dim_head = d_k`` (its default is 64 whatever h), ``enc_/dec_attn_project_out=True`` (with
h = 1 x-transformers drops W^O unless told, ``x_transformers/x_transformers.py:2237``),
``enc_/dec_ff_mult = d_ff / d_model``,
``enc_/dec_max_seq_len = max_len``, and toward the paper: ``enc_/dec_pre_norm=False`` (post-norm; the default
is pre-norm), ``enc_/dec_ff_custom_activation=nn.ReLU()`` (the default is GELU),
``enc_/dec_scaled_sinu_pos_emb=True`` (sinusoids; the default is a learned table),
``tie_token_emb = share_embeddings`` (one matrix for both embeddings), ``enc_/dec_emb_dropout``,
``enc_/dec_attn_sublayer_dropout`` and ``enc_/dec_ff_sublayer_dropout = P_drop`` (the paper's dropout sites;
attention-weight and inner FFN dropout stay 0). Projections are bias-free and the FFN biased, as in the paper.

What it cannot be told is declared in ``DEVIATIONS``.

The calling convention, hidden in the adapter: ``XTransformer.forward`` returns the autoregressive wrapper's
loss on ``tgt`` shifted by one, not logits; the adapter calls what it calls, the encoder
``model.encoder(src, mask=src != pad, return_embeddings=True)`` (mask True = may attend, as in this project)
and the decoder network ``model.decoder.net(tgt, context=..., context_mask=src != pad)``, on the already
shifted ``tgt``, which returns the logits.

Canonical schema (``load_reference_state``): ``src_embed``/``tgt_embed``/``generator`` ->
``encoder.token_emb.emb``/``decoder.net.token_emb.emb``/``decoder.net.to_logits`` (the first two one tensor
when tied); the layers are ``attn_layers.layers.J`` with J = 2i, 2i+1 (encoder: self-attention, FFN) and
3i, 3i+1, 3i+2 (decoder: self-attention, cross-attention, FFN); attention ``q, k, v, o`` ->
``to_q, to_k, to_v, to_out``; ``ffn.w1`` -> ``ff.0.0``, ``ffn.w2`` -> ``ff.2``; ``normK.weight`` -> the
block's post-norm ``layers.J.0.2.gamma``, stored as gain - 1 (x-transformers multiplies by ``gamma + 1``,
``norm_add_unit_offset`` being on by default). The canonical norm biases have nowhere to go and are dropped
(declared). The sinusoids' learned scale is set to its initial 1/sqrt(d_model), which keeps the paper's
ratio of token to position (sqrt(d_model) E + PE, divided by sqrt(d_model)).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import CanonicalKey, Target, load_canonical

from ..availability import INSTALL, unavailable_reason
from ..declarations import Implementation
from ..hookspecs import hookimpl

__all__ = ["XTransformerAdapter", "build", "DEVIATIONS", "WRITTEN_FOR", "CITED"]

WRITTEN_FOR = "x-transformers 2.31.10"
X = "x_transformers/x_transformers.py"
A = "x_transformers/autoregressive_wrapper.py"

# Every file:line the reasons cite, with a fragment of that line (tests/test_library_plugins.py reads them).
CITED: dict[str, str] = {
    f"{X}:406": "return l2norm(token_emb) if self.l2norm_embed else token_emb",
    f"{X}:448": "self.scale = nn.Parameter(torch.ones(1) * dim ** -0.5)",
    f"{X}:451": "freq_seq = arange(half_dim).float() / half_dim",
    f"{X}:465": "pos = arange(seq_len, device = device) + offset",
    f"{X}:470": "emb = einsum('i, j -> i j', pos, self.inv_freq)",
    f"{X}:471": "emb = cat((emb.sin(), emb.cos()), dim = -1)",
    f"{X}:472": "return emb * self.scale",
    f"{X}:2237": "need_project_out = default(project_out, heads > 1 or dim != dim_out or on_attn)",
    f"{X}:1029": "self.ln = nn.LayerNorm(dim, elementwise_affine = False)",
    f"{X}:1030": "self.gamma = nn.Parameter(torch.ones(dim))",
    f"{X}:4162": "self.to_logits = LinearNoBias(dim, logits_dim) if not exists(to_logits) else to_logits",
    f"{X}:4295": "x = token_embeds + pos_emb",
    f"{X}:4735": "dec_transformer_kwargs = pick_and_pop(['num_tokens', 'max_seq_len'], dec_kwargs)",
    f"{X}:4754": "self.decoder.token_emb = self.encoder.token_emb",
    f"{X}:3501": "context = context[:, :0]",
    f"{A}:57": "if inter.layer_type == 'a':",
    f"{A}:217": "assert not exists(eos_token), 'eos token not supported yet'",
    f"{A}:396": "max_seq_len, greedy = self.max_seq_len, temperature == 0.",
    f"{A}:459": "for _ in range(seq_len):",
}


def _drop(value: Tensor) -> None:
    """The target of a canonical tensor the model has no parameter for (a layer-norm bias): not stored."""


def _gain(norm: nn.Module):
    """The target of a canonical layer-norm gain: x-transformers stores ``gamma`` = gain - 1 and multiplies by
    ``gamma + 1`` (``unit_offset``, on by default through ``norm_add_unit_offset``)."""
    offset = float(getattr(norm, "unit_offset", False))

    gamma = norm.get_parameter("gamma")

    def store(gain: Tensor) -> None:
        gamma.copy_(gain - offset)

    return store


class XTransformerAdapter(nn.Module):
    """``XTransformer`` behind the adapter contract; returns logits (B, T, tgt_vocab)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        from x_transformers import XTransformer

        self.config = cfg = config
        mult = cfg.d_ff / cfg.d_model
        if int(cfg.d_model * mult) != cfg.d_ff:
            raise ValueError(f"x-transformers cannot build d_ff={cfg.d_ff}: its inner size is "
                             f"int(d_model * ff_mult), which gives {int(cfg.d_model * mult)} here")
        stack = dict(depth=cfg.n_layers, heads=cfg.n_heads, attn_dim_head=cfg.d_k, attn_value_dim_head=cfg.d_v,
                     ff_mult=mult,
                     max_seq_len=cfg.max_len, pre_norm=False, ff_custom_activation=nn.ReLU(),
                     scaled_sinu_pos_emb=True, emb_dropout=cfg.dropout, attn_sublayer_dropout=cfg.dropout,
                     ff_sublayer_dropout=cfg.dropout, attn_dropout=0.0, ff_dropout=0.0, attn_project_out=True)
        self.model = XTransformer(
            dim=cfg.d_model, tie_token_emb=cfg.share_embeddings, pad_value=cfg.pad_id,
            enc_num_tokens=cfg.src_vocab, dec_num_tokens=cfg.tgt_vocab,
            **{f"enc_{k}": v for k, v in stack.items()}, **{f"dec_{k}": v for k, v in stack.items()},
        )

    # -- the adapter contract ------------------------------------------------------------------------------
    def encode(self, src: Tensor) -> Tensor:
        """The last encoder layer's output (B, S, d_model)."""
        return self.model.encoder(src, mask=src != self.config.pad_id, return_embeddings=True)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) right-padded ids -> logits (B, T, tgt_vocab)."""
        keep = src != self.config.pad_id  # (B, S), True = may attend (x-transformers' polarity too)
        memory = self.model.encoder(src, mask=keep, return_embeddings=True)  # (B, S, d_model)
        return self.model.decoder.net(tgt, context=memory, context_mask=keep)  # (B, T, tgt_vocab)

    def positional_encoding(self, length: int) -> Tensor:
        """What the encoder adds to its (unscaled) token embeddings: scale * [sin | cos], (length, d_model)."""
        pos_emb = self.model.encoder.pos_emb
        probe = torch.zeros(1, length, dtype=torch.long, device=pos_emb.inv_freq.device)
        return pos_emb(probe).detach()

    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical-schema state dict; the layer-norm biases are dropped (x-transformers has none)."""
        get, d = self.model.get_parameter, self.config.d_model
        mapping: dict[CanonicalKey, Target] = {"src_embed.weight": get("encoder.token_emb.emb.weight"),
                                               "tgt_embed.weight": get("decoder.net.token_emb.emb.weight"),
                                               "generator.weight": get("decoder.net.to_logits.weight")}
        stacks = (("encoder", "encoder.attn_layers.layers", ("self_attn", "ffn")),
                  ("decoder", "decoder.net.attn_layers.layers", ("self_attn", "cross_attn", "ffn")))
        for stack, layers, blocks in stacks:
            for i in range(self.config.n_layers):
                ours = f"{stack}.{i}"
                for k, block in enumerate(blocks):
                    theirs = f"{layers}.{len(blocks) * i + k}"
                    if block == "ffn":
                        for p in ("weight", "bias"):
                            mapping[f"{ours}.ffn.w1.{p}"] = get(f"{theirs}.1.ff.0.0.{p}")
                            mapping[f"{ours}.ffn.w2.{p}"] = get(f"{theirs}.1.ff.2.{p}")
                    else:
                        for x, proj in zip("qkvo", ("to_q", "to_k", "to_v", "to_out")):
                            mapping[f"{ours}.{block}.{x}.weight"] = get(f"{theirs}.1.{proj}.weight")
                    mapping[f"{ours}.norm{k + 1}.weight"] = _gain(self.model.get_submodule(f"{theirs}.0.2"))
                    mapping[f"{ours}.norm{k + 1}.bias"] = _drop  # no bias in x-transformers' LayerNorm
        load_canonical(state, mapping)
        with torch.no_grad():
            for wrapper in (self.model.encoder, self.model.decoder.net):
                wrapper.pos_emb.scale.fill_(1 / math.sqrt(d))  # its initial value: the paper's ratio, / sqrt(d)


def build(config: ModelConfig) -> XTransformerAdapter:
    return XTransformerAdapter(config)


DEVIATIONS: dict[str, str] = {
    "norm.layer-norm": (
        f"x-transformers' LayerNorm is nn.LayerNorm(dim, elementwise_affine=False) times a per-feature gain, with no "
        f"bias ({X}:1029-1030): §3.1's per-feature bias cannot be held, so load_reference_state drops the canonical "
        "norm biases"
    ),
    "embedding.scale": (
        f"the token embeddings are not multiplied by sqrt(d_model) ({X}:406, :4295); the sinusoids are "
        f"multiplied by a learned scalar initialized to 1/sqrt(d_model) ({X}:448) instead, so the stacks' input is "
        "the paper's divided by sqrt(d_model)"
    ),
    "position.formula": (
        f"the sinusoids are laid out as [sin | cos] halves ({X}:471), not interleaved, and multiplied by the "
        f"learned scalar ({X}:448); the frequencies are the paper's, 10000^(-2i/d_model) ({X}:451)"
    ),
    "embedding.shared-weights": (
        f"XTransformer ties only the two token embeddings (tie_token_emb, {X}:4754); the decoder's output "
        f"projection is its own matrix (to_logits, {X}:4162) because XTransformer passes only num_tokens and "
        f"max_seq_len (and the positional options) to the decoder's TransformerWrapper ({X}:4735), so its "
        "tie_embedding cannot be set"
    ),
    "model.reference-equivalence": (
        f"with the same weights the outputs differ: the layer-norm biases are dropped ({X}:1030), the input is "
        f"scaled by 1/sqrt(d_model) ({X}:406, :448) and the sinusoids are laid out in halves ({X}:471)"
    ),
    "export.onnx": (
        f"torch.onnx.export(dynamo=True) gives a graph onnx.checker rejects (elem type float64 vs float32): "
        f"ScaledSinusoidalEmbedding multiplies int64 positions by float32 frequencies in an einsum ({X}:465, :470), "
        f"which eager PyTorch promotes to float32 but the exporter to float64, then multiplies by the float32 scale "
        f"({X}:472); with the positions cast to float the exporter fixes the batch and lengths to the example's"
    ),
    "config.parameters": (
        f"against the schema: no layer-norm biases (-d_model per norm, {X}:1030), an untied output matrix "
        f"(+vocab x d_model, {X}:4162) and the two learned sinusoid scales (+2, {X}:448)"
    ),
}


# Nothing the suite does not see: the bias-free norm is named under norm.layer-norm, whose probes take a missing
# bias into account.
UNSEEN: dict[str, str] = {}

NOTES = (
    "Not deviations: the bias-free attention projections and the biased FFN are the paper's; post-norm, the ReLU "
    "and the sinusoids are configured (`pre_norm=False`, `ff_custom_activation=nn.ReLU()`, "
    "`scaled_sinu_pos_emb=True`; the library's defaults are pre-norm, GELU and a learned table), as are d_k "
    "(`attn_dim_head`, default 64), the dropout sites (`emb_dropout`, `attn_sublayer_dropout`, "
    "`ff_sublayer_dropout`) and W^O with one head (`attn_project_out=True`; without it x-transformers drops W^O "
    f"when h = 1, {X}:2237). Its layer norm has a gain, no bias and PyTorch's eps 1e-5 whatever the config (not "
    "config.norm_eps: `norm.epsilon`, undeclared because the suite does not observe it yet); the "
    "gain is stored minus 1 (`norm_add_unit_offset`, on by default), which `load_reference_state` accounts for. "
    "Masked scores are filled with the dtype's most negative value and a fully masked row's output is zeroed. All "
    "of x-transformers' departures here are design choices (it is a library of variants), not bugs; the one limit "
    "of the API is that `XTransformer` cannot tie the output matrix. "
    "No decoding methods, so the `decode.*` checks skip: x-transformers' cached generation is "
    f"`AutoregressiveWrapper.generate` (sampling, or greedy at temperature 0, one length for the whole batch, "
    f"{A}:396, :459) and `beam_search`, which refuses an end symbol ({A}:217); neither is the contract's "
    "`generate` (greedy and beam search stopping at an end symbol). A step-level decoder would have to reorder the "
    f"cross-attention caches that x-transformers' own reordering leaves alone (`modify_cached_kv` touches "
    f"self-attention layers only, {A}:57, while a cached step reads the cross-attention keys from the cache, "
    f"{X}:3501): code of ours over the library's internals, not the library's decoding."
)


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="x-transformers",
        build=build,
        summary="x-transformers XTransformer (post-norm, ReLU, scaled sinusoids configured) with bias-free layer "
                "norms, unscaled embeddings and an untied output matrix; no decoder the contract can drive",
        source="https://github.com/lucidrains/x-transformers/blob/2.31.10/x_transformers/x_transformers.py "
               "(the installed x-transformers)",
        output="logits",
        free_head_dims=True,  # attn_dim_head = d_k, attn_value_dim_head = d_v
        deviations=DEVIATIONS,
        notes=NOTES,
        written_for=WRITTEN_FOR,
        unavailable=unavailable_reason("x_transformers", "x-transformers", at_least="2.31", below="3"), install=INSTALL,
    ))
