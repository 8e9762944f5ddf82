"""Built-in plugin ``hf-bart``: Hugging Face transformers' ``BartForConditionalGeneration``.

Source: the installed ``transformers``; the reasons cite ``transformers/models/bart/modeling_bart.py:N`` in the
release ``WRITTEN_FOR`` (docs/plugins.md, "The version tie").

Configuration (``BartConfig``, random weights, nothing downloaded): ``vocab_size``, ``d_model``,
``encoder_layers = decoder_layers = N``, ``h`` heads, ``d_ff``, ``max_position_embeddings = max_len``, and
toward the paper: ``activation_function="relu"`` (default GELU), ``scale_embedding=True`` (default False),
``dropout = P_drop``, ``attention_dropout = activation_dropout = 0``, ``tie_word_embeddings =
share_embeddings``, ``pad_token_id = pad_id``. Post-norm is BART's only layout; the attention kernel is the
library's default (``sdpa``).

What the class cannot be told is declared in ``DEVIATIONS``. One ``vocab_size`` serves both stacks, so a
configuration with ``src_vocab != tgt_vocab`` cannot be built (``build`` says so in one line).

The calling convention, hidden in the adapter: ``input_ids = src``, ``attention_mask = (src != pad)``,
``decoder_input_ids = tgt`` (already shifted right: BART would otherwise shift ``input_ids`` itself),
``decoder_attention_mask = (tgt != pad)``; ``forward`` returns ``.logits`` (with ``final_logits_bias``).

Canonical schema (``load_reference_state``): as ``hf-marian`` (``model.encoder.embed_tokens``,
``model.decoder.embed_tokens``, ``lm_head``; ``q_proj/k_proj/v_proj/out_proj`` with biases set to 0;
``fc1/fc2``; ``self_attn_layer_norm``, ``encoder_attn_layer_norm``, ``final_layer_norm``). The parameters the
schema lacks get the values nearest the paper: the extra ``layernorm_embedding`` gain 1 and bias 0, the
``final_logits_bias`` 0, ``model.shared`` (a separate, unused matrix when untied) the source embedding, and
the learned positional tables the paper's §3.5 sinusoids (rows 2.. of each, BART's offset), so that with the
same weights BART differs from the paper by what it cannot drop: the embedding norms.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from aiayn_conformance.reference.model import sinusoid_table
from aiayn_conformance.spec.config import ModelConfig

from ..availability import INSTALL
from ..declarations import Implementation
from ..hookspecs import hookimpl
from .hf_decoding import BEAM, DECODING_NOTE, HF_CITED, MAX_LENGTH
from .hf_seq2seq import HFSeq2SeqAdapter, paper_config, transformers_unavailable

__all__ = ["BartAdapter", "build", "DEVIATIONS", "WRITTEN_FOR", "CITED"]

WRITTEN_FOR = "transformers 5.24.0"
B = "transformers/models/bart/modeling_bart.py"
C = "transformers/models/bart/configuration_bart.py"

# Every file:line the reasons cite, with a fragment of that line (tests/test_library_plugins.py reads them).
CITED: dict[str, str] = {
    f"{B}:83": "self.offset = 2",
    f"{B}:97": "return super().forward(position_ids + self.offset)",
    f"{B}:151": "bias: bool = True,",
    f"{B}:179": "self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)",
    f"{B}:182": "self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)",
    f"{B}:272": "self.self_attn_layer_norm = nn.LayerNorm(self.embed_dim)",
    f"{B}:498": "self.layernorm_embedding = nn.LayerNorm(embed_dim)",
    f"{B}:524": "hidden_states = self.layernorm_embedding(hidden_states)",
    f"{B}:585": "self.layernorm_embedding = nn.LayerNorm(config.d_model)",
    f"{B}:649": "hidden_states = self.layernorm_embedding(hidden_states)",
    f"{B}:688": "self.shared = BartScaledWordEmbedding(vocab_size, config.d_model, padding_idx,",
    f"{B}:809": "self.final_logits_bias = nn.Buffer(torch.zeros((1, self.model.shared.num_embeddings)))",
    f"{C}:48": "vocab_size: int = 50265",
    **HF_CITED,
}


class BartAdapter(HFSeq2SeqAdapter):
    """``BartForConditionalGeneration`` behind the adapter contract; returns logits (B, T, tgt_vocab), incl.
    ``final_logits_bias``."""

    OFFSET = 2  # BartLearnedPositionalEmbedding reads row position + 2

    def __init__(self, config: ModelConfig):
        if config.src_vocab != config.tgt_vocab:
            raise ValueError(f"hf-bart cannot build src_vocab={config.src_vocab} != tgt_vocab={config.tgt_vocab}: "
                             f"BartConfig has one vocab_size for both stacks ({C}:48)")
        super().__init__(config)

    def _build_model(self, config: ModelConfig) -> Any:
        from transformers import BartConfig, BartForConditionalGeneration

        return BartForConditionalGeneration(BartConfig(
            vocab_size=config.tgt_vocab, tie_word_embeddings=config.share_embeddings, bos_token_id=None,
            **paper_config(config),
        ))

    def _first_position_row(self) -> int:
        return self.OFFSET

    def _extra_state(self) -> tuple[list[Tensor], list[Tensor]]:
        """The final-logits bias 0; each stack's embedding LayerNorm gain 1, bias 0."""
        model = self.model.model
        stacks = (model.encoder, model.decoder)
        zero = [self.model.get_buffer("final_logits_bias"), *(s.layernorm_embedding.bias for s in stacks)]
        return zero, [s.layernorm_embedding.weight for s in stacks]

    def _after_load(self) -> None:
        """``model.shared`` (untied: a matrix no stack reads) gets the source embedding, and the learned
        positional tables the paper's sinusoids (rows 2.., BART's offset)."""
        model = self.model.model
        with torch.no_grad():
            if model.shared.weight is not model.encoder.embed_tokens.weight:  # untied: a matrix no stack reads
                model.shared.weight.copy_(model.encoder.embed_tokens.weight)
            for stack in (model.encoder, model.decoder):
                table = stack.embed_positions.weight  # (max_len + 2, d_model); rows 0 and 1 are never read
                table[self.OFFSET:].copy_(sinusoid_table(table.size(0) - self.OFFSET, self.config.d_model))


def build(config: ModelConfig) -> BartAdapter:
    return BartAdapter(config)


DEVIATIONS: dict[str, str] = {
    "norm.epsilon": (
        f"every layer norm is `nn.LayerNorm(d_model)` ({B}:272) with PyTorch's default eps 1e-5, and the config class "
        "has no layer-norm epsilon to set: the suite fits eps = 1e-5 inside the square root at the last decoder norm, "
        "where "
        "config.norm_eps is 1e-6 (a should clause: outputs move by about eps / (2 var), below the model tolerance at "
        "ordinary scales)"
    ),
    "norm.no-extra-norm": (
        f"a LayerNorm right after embedding + position in both stacks (layernorm_embedding, {B}:498, :524 and "
        f":585, :649); BartConfig has no option to drop it"
    ),
    "model.reference-equivalence": (
        f"with the same weights (and the paper's sinusoids in the learned tables) the outputs differ: the "
        f"embedding LayerNorms ({B}:524, :649) re-normalize the encoder's and the decoder's inputs, even at gain 1 "
        "and bias 0"
    ),
    "position.formula": (
        f"learned positional embeddings (BartLearnedPositionalEmbedding, read at position + 2, {B}:83, :97), "
        "randomly initialized, not §3.5's sinusoids; BART has no sinusoidal option (load_reference_state writes "
        "the paper's table into them)"
    ),
    "config.parameters": (
        f"beyond the schema: biases on q_proj, k_proj, v_proj and out_proj ({B}:151, :179-182; 4 x d_model per "
        f"attention), the learned positional tables (2 x (max_len + 2) x d_model, {B}:83) and the two embedding "
        f"LayerNorms (2 x 2 x d_model, {B}:498, :585); one vocab_size for both stacks ({C}:48), so src_vocab != "
        "tgt_vocab cannot be built"
    ),
    "decode.beam": BEAM,
    "decode.max-length": MAX_LENGTH,
}


NOTES = (
    "Not deviations: post-norm (BART's only layout), the ReLU and sqrt(d_model) (configured: "
    "`activation_function='relu'`, `scale_embedding=True`; BART's defaults are GELU and no scale), the tying "
    f"(`tie_word_embeddings`), the projection biases and `final_logits_bias` ({B}:809; set to 0 by "
    "`load_reference_state`). "
    f"The layer norms are `nn.LayerNorm(d_model)` with PyTorch's eps 1e-5 whatever the config ({B}:272), "
    "not config.norm_eps (declared under `norm.epsilon`). BART's "
    "choices are design choices of a denoising pre-training model, not bugs; with `tie_word_embeddings=False` "
    f"BART also keeps `model.shared` ({B}:688), a fourth [vocab, d_model] matrix that no stack reads."
    + " " + DECODING_NOTE
)


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="hf-bart",
        build=build,
        summary="transformers BartForConditionalGeneration (post-norm, ReLU, sqrt(d_model), tied) with embedding "
                "LayerNorms, learned positions, biased projections and one vocabulary; generate's |Y|^alpha beams and "
                "one length limit per batch",
        source="https://github.com/huggingface/transformers/blob/v5.24.0/"
               "src/transformers/models/bart/modeling_bart.py (the installed transformers)",
        output="logits",
        deviations=DEVIATIONS,
        notes=NOTES,
        written_for=WRITTEN_FOR,
        unavailable=transformers_unavailable(), install=INSTALL,
    ))
