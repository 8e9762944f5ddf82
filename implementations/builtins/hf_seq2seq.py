"""The machinery the Hugging Face encoder-decoder plugins (``hf-marian``, ``hf-fsmt``, ``hf-bart``) share.

The three classes of transformers are ports of one design (fairseq's post-norm Transformer): the same calling
convention, the same names inside each layer, the same decoding code. What they share lives here, once; each
plugin module keeps what is its own (its config class and arguments, how its positional table is read, the
parameters its mapping adds, and its declarations):

- ``HFSeq2SeqAdapter``: the adapter skeleton, with the library's own decoding (``HFDecoding``). A subclass
  gives ``_build_model(config)`` (the model, from its config class; nothing is downloaded) and, where it differs
  from the defaults, ``GENERATOR``, ``_first_position_row()``, ``_extra_state()`` and ``_after_load()``.
- the calling convention: ``input_ids = src`` with ``attention_mask = (src != pad)``, ``decoder_input_ids =
  tgt`` (already shifted right, so no ``labels``) with ``decoder_attention_mask = (tgt != pad)``, returning
  ``.logits``; the encoder alone for ``encode``.
- ``paper_config``: the config arguments the three classes name alike, set toward the paper.
- ``layer_mapping``: the canonical schema's layers onto ``model.{encoder,decoder}.layers.i`` (``q_proj``,
  ``k_proj``, ``v_proj``, ``out_proj`` with their biases listed for 0; ``fc1``, ``fc2``;
  ``self_attn_layer_norm``, ``encoder_attn_layer_norm``, ``final_layer_norm``).
- ``transformers_unavailable``: why the plugins cannot run here ("" when they can), asked without importing
  transformers.

This module is not a plugin: it registers nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import CanonicalKey, Target, load_canonical

from ..availability import unavailable_reason
from .hf_decoding import HFDecoding

__all__ = ["HFSeq2SeqAdapter", "paper_config", "layer_mapping", "quiet_offline", "transformers_unavailable"]


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")  # the canonical q, k, v, o in that order
# (stack, {canonical attention: the library's}, the library's norms in the canonical order norm1, norm2, ...)
STACKS: tuple[tuple[str, dict[str, str], tuple[str, ...]], ...] = (
    ("encoder", {"self_attn": "self_attn"}, ("self_attn_layer_norm", "final_layer_norm")),
    ("decoder", {"self_attn": "self_attn", "cross_attn": "encoder_attn"},
     ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")),
)


def transformers_unavailable() -> str:
    """"" when a supported transformers release is installed; otherwise one line saying why not and how to
    install it (asked at registration, without importing transformers)."""
    return unavailable_reason("transformers", "transformers", at_least="5.0", below="6")


def quiet_offline() -> None:
    """Nothing is ever downloaded: the model is built from its config class."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def paper_config(cfg: ModelConfig) -> dict[str, Any]:
    """The config arguments Marian, FSMT and BART name alike: the sizes of ``cfg``, ReLU, the sqrt(d_model)
    embedding scale, ``P_drop`` on the embeddings and sub-layer outputs and no other dropout (the paper has
    none), no layer drop, the pad id as padding and as the decoder's start symbol, and no forced end symbol."""
    return dict(
        d_model=cfg.d_model, encoder_layers=cfg.n_layers, decoder_layers=cfg.n_layers,
        encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, max_position_embeddings=cfg.max_len,
        activation_function="relu", scale_embedding=True, dropout=cfg.dropout, attention_dropout=0.0,
        activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
        pad_token_id=cfg.pad_id, decoder_start_token_id=cfg.pad_id, eos_token_id=None, forced_eos_token_id=None,
    )


def layer_mapping(get: Callable[[str], Tensor], n_layers: int) -> tuple[dict[CanonicalKey, Target], list[Tensor]]:
    """(canonical layer name -> parameter, the projection biases the paper lacks) for both stacks' layers."""
    mapping: dict[CanonicalKey, Target] = {}
    zero: list[Tensor] = []
    for stack, attentions, norms in STACKS:
        for i in range(n_layers):
            ours, theirs = f"{stack}.{i}", f"model.{stack}.layers.{i}"
            for att, mine in attentions.items():
                for x, proj in zip("qkvo", PROJECTIONS):
                    mapping[f"{ours}.{att}.{x}.weight"] = get(f"{theirs}.{mine}.{proj}.weight")
                    zero.append(get(f"{theirs}.{mine}.{proj}.bias"))
            for p in ("weight", "bias"):
                mapping[f"{ours}.ffn.w1.{p}"] = get(f"{theirs}.fc1.{p}")
                mapping[f"{ours}.ffn.w2.{p}"] = get(f"{theirs}.fc2.{p}")
                for k, norm in enumerate(norms, start=1):
                    mapping[f"{ours}.norm{k}.{p}"] = get(f"{theirs}.{norm}.{p}")
    return mapping, zero


class HFSeq2SeqAdapter(HFDecoding, nn.Module):
    """A transformers encoder-decoder behind the adapter contract; returns logits (B, T, tgt_vocab)."""

    GENERATOR = "lm_head.weight"  # the output projection's parameter (the canonical generator.weight)

    def __init__(self, config: ModelConfig):
        super().__init__()
        quiet_offline()
        self.config = config
        self.model = self._build_model(config)

    # -- what a subclass gives --------------------------------------------------------------------------
    def _build_model(self, config: ModelConfig) -> Any:
        """The library's model for ``config`` (random weights, from its config class)."""
        raise NotImplementedError

    def _first_position_row(self) -> int:
        """The row of the positional table that position 0 reads."""
        return 0

    def _extra_state(self) -> tuple[list[Tensor], list[Tensor]]:
        """(parameters beyond the schema set to 0, gains set to 1), besides the projection biases."""
        return [], []

    def _after_load(self) -> None:
        """What loading a canonical state does after ``load_canonical`` (nothing by default)."""

    # -- the adapter contract ------------------------------------------------------------------------------
    def _keep(self, tokens: Tensor) -> Tensor:
        return (tokens != self.config.pad_id).long()  # (B, L), 1 = a real token (the library's polarity too)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) right-padded ids -> logits (B, T, tgt_vocab): the documented call."""
        out = self.model(input_ids=src, attention_mask=self._keep(src), decoder_input_ids=tgt,
                         decoder_attention_mask=self._keep(tgt))
        return out.logits

    def encode(self, src: Tensor) -> Tensor:
        """The last encoder layer's output (B, S, d_model)."""
        return self.model.get_encoder()(input_ids=src, attention_mask=self._keep(src)).last_hidden_state

    def positional_encoding(self, length: int) -> Tensor:
        """What both stacks add at positions 0..length-1: rows first..first+length-1 of the encoder's table,
        where ``first`` is the row position 0 reads: (length, d_model)."""
        table = self.model.model.encoder.embed_positions.weight
        first = self._first_position_row()
        if first + length > table.size(0):
            raise ValueError(f"the table holds {table.size(0) - first} positions; {length} requested")
        return table[first:first + length].detach()

    def load_reference_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a canonical-schema state dict; what the schema lacks gets the values nearest the paper."""
        get = self.model.get_parameter
        mapping: dict[CanonicalKey, Target] = {"src_embed.weight": get("model.encoder.embed_tokens.weight"),
                                               "tgt_embed.weight": get("model.decoder.embed_tokens.weight"),
                                               "generator.weight": get(self.GENERATOR)}
        layers, biases = layer_mapping(get, self.config.n_layers)
        zero, one = self._extra_state()
        load_canonical(state, {**mapping, **layers}, zero=[*zero, *biases], one=one)
        self._after_load()
