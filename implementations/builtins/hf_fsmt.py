"""Built-in plugin ``hf-fsmt``: Hugging Face transformers' ``FSMTForConditionalGeneration`` (the port of
fairseq's WMT19 Transformer, the ``facebook/wmt19-*`` models).

Source: the installed ``transformers``; the reasons cite ``transformers/models/fsmt/modeling_fsmt.py:N`` in the
release ``WRITTEN_FOR`` (docs/plugins.md, "The version tie").

Configuration (``FSMTConfig``, random weights, nothing downloaded): ``langs=["src", "tgt"]``,
``src_vocab_size``/``tgt_vocab_size``, ``d_model``, ``encoder_layers = decoder_layers = N``, ``h`` heads,
``d_ff``, ``max_position_embeddings = max_len``, ``activation_function="relu"`` and ``scale_embedding=True``
(its defaults already), ``dropout = P_drop``, ``attention_dropout = activation_dropout = 0``,
``tie_word_embeddings = share_embeddings`` (one matrix for both embeddings and the output projection; the
default is untied), ``pad_token_id = pad_id``. Post-norm is FSMT's only layout; attention is its own eager code.

What the class cannot be told is declared in ``DEVIATIONS``.

The calling convention, hidden in the adapter: the model is called the way its users train it and the way they
generate. ``forward`` is the teacher-forced call of the training path,
``model(input_ids=src, attention_mask=(src != pad), decoder_input_ids=tgt, decoder_attention_mask=(tgt != pad),
use_cache=False)`` (``tgt`` already shifted right), returning ``.logits``: passing ``labels=`` turns the cache off
the same way, and only then does the model build its causal and target-padding masks. Decoding goes through the
cache, as ``generate`` does (``hf_decoding``). The same call with the default ``use_cache=True`` builds neither
mask, a bug recorded in the notes.

Canonical schema (``load_reference_state``): ``src_embed``/``tgt_embed``/``generator`` ->
``model.encoder.embed_tokens``/``model.decoder.embed_tokens``/``model.decoder.output_projection`` (one tensor
when tied); attention ``q, k, v, o`` -> ``q_proj, k_proj, v_proj, out_proj`` (biases set to 0); ``ffn.w1/w2``
-> ``fc1/fc2``; the norms as in Marian (``self_attn_layer_norm``, ``encoder_attn_layer_norm``,
``final_layer_norm``). The positional tables keep the library's values.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from aiayn_conformance.spec.config import ModelConfig

from ..availability import INSTALL
from ..declarations import Implementation
from ..hookspecs import hookimpl
from .hf_decoding import BEAM, DECODING_NOTE, HF_CITED, MAX_LENGTH
from .hf_seq2seq import HFSeq2SeqAdapter, paper_config, transformers_unavailable

__all__ = ["FSMTAdapter", "build", "DEVIATIONS", "WRITTEN_FOR", "CITED"]

WRITTEN_FOR = "transformers 5.24.0"
F = "transformers/models/fsmt/modeling_fsmt.py"

# Every file:line the reasons cite, with a fragment of that line (tests/test_library_plugins.py reads them).
CITED: dict[str, str] = {
    f"{F}:853": "use_cache = use_cache if use_cache is not None else self.config.use_cache",
    f"{F}:857": "if not use_cache and input_ids is not None:",
    f"{F}:866": "decoder_padding_mask, causal_mask = None, None",
    f"{F}:1056": "We don't want to save the weight of this embedding since it's not trained",
    f"{F}:1064": "super().__init__(num_positions, embedding_dim, padding_idx)",
    f"{F}:1083": "emb = math.log(10000) / (half_dim - 1)",
    f"{F}:1086": "emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)",
    f"{F}:1099": "Position numbers begin at padding_idx+1.",
    f"{F}:1106": "return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + padding_idx",
    f"{F}:671": "bias=True,",
    f"{F}:685": "self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)",
    f"{F}:688": "self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)",
    f"{F}:208": "causal_mask = torch.triu(",
    f"{F}:209": "fill_with_neg_inf(torch.zeros(tgt_len, tgt_len, dtype=causal_mask_dtype",
    f"{F}:792": "return t.float().fill_(torch.finfo(t.dtype).min).type_as(t)",
    f"{F}:1001": "if labels is not None:",
    f"{F}:1002": "use_cache = False",
    f"{F}:279": "self.self_attn_layer_norm = LayerNorm(self.embed_dim)",
    f"{F}:458": "self.final_layer_norm = LayerNorm(self.embed_dim)",
    **HF_CITED,
}


class FSMTAdapter(HFSeq2SeqAdapter):
    """``FSMTForConditionalGeneration`` behind the adapter contract; returns logits (B, T, tgt_vocab)."""

    GENERATOR = "model.decoder.output_projection.weight"

    def _build_model(self, config: ModelConfig) -> Any:
        from transformers import FSMTConfig, FSMTForConditionalGeneration

        return FSMTForConditionalGeneration(FSMTConfig(
            langs=["src", "tgt"], src_vocab_size=config.src_vocab, tgt_vocab_size=config.tgt_vocab,
            tie_word_embeddings=config.share_embeddings, bos_token_id=None, **paper_config(config),
        ))

    def _first_position_row(self) -> int:
        return self.config.pad_id + 1  # fairseq numbers positions from pad_id + 1

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) right-padded ids -> logits (B, T, tgt_vocab): the teacher-forced call of the
        training path (``labels=`` turns the cache off, so the model builds its causal and padding masks)."""
        out = self.model(input_ids=src, attention_mask=self._keep(src), decoder_input_ids=tgt,
                         decoder_attention_mask=self._keep(tgt), use_cache=False)
        return out.logits


def build(config: ModelConfig) -> FSMTAdapter:
    return FSMTAdapter(config)


DEVIATIONS: dict[str, str] = {
    "norm.epsilon": (
        f"every layer norm is `torch.nn.LayerNorm(d_model)` ({F}:279, :458) with PyTorch's default eps 1e-5, and the "
        "config class has no layer-norm epsilon to set: the suite fits eps = 1e-5 inside the square root at the last "
        "decoder norm, where "
        "config.norm_eps is 1e-6 (a should clause: outputs move by about eps / (2 var), below the model tolerance at "
        "ordinary scales)"
    ),
    "position.formula": (
        f"fairseq's table, not §3.5's: sines in the first half of the features and cosines in the second "
        f"({F}:1086), frequencies 10000^(-i/(d_model/2 - 1)) instead of 10000^(-2i/d_model) ({F}:1083), and "
        f"positions numbered from pad_id + 1 ({F}:1099, :1106), so position 0 gets fairseq's row for pad_id + 1"
    ),
    "model.reference-equivalence": (
        f"with the same weights the outputs differ: the fairseq positional table ({F}:1083-1086, :1106) is added "
        "instead of §3.5's (the weights are loaded faithfully; the library's table is fixed)"
    ),
    "config.parameters": (
        f"beyond the schema: biases on q_proj, k_proj, v_proj and out_proj ({F}:671, :685-688; 4 x d_model per "
        f"attention) and the two positional tables, which are trainable nn.Embedding weights ({F}:1064), though "
        f"the class says they are not trained ({F}:1056): an optimizer over model.parameters() updates them"
    ),
    "device.portable": (
        f"a bug: after model.double() the training-path forward raises \"value cannot be converted to type float "
        f"without overflow\": the causal mask ({F}:208-209) is filled by fill_with_neg_inf, which casts to float32 "
        f"and fills it with float64's minimum ({F}:792)"
    ),
    "decode.beam": BEAM,
    "decode.max-length": MAX_LENGTH,
}


# Nothing the suite does not see: the mask.causal witnesses run on transplanted sharp weights, so FSMT's missing
# causal mask is observed under its own clause.
UNSEEN: dict[str, str] = {}


NOTES = (
    "A real bug the suite's calls do not take: `FSMTModel.forward` builds the decoder's causal and padding masks "
    f"only when use_cache is False ({F}:857; otherwise both are None, :866), and use_cache defaults to the "
    f"config's True ({F}:853), so the call model(input_ids, decoder_input_ids=...) without labels lets every target "
    "position attend to later ones and to appended padding. Training with labels= turns the cache off "
    f"({F}:1001-1002) and generation feeds one token at a time, so the adapter calls those paths (with the default "
    "use_cache the suite observed it under mask.causal, mask.target-padding and decode.incremental, and train.learns "
    "fell to 0-2% on reversal). The \"not trained\" sinusoidal tables are trainable parameters "
    "(`config.parameters`). Not deviations: post-norm, ReLU, the sqrt(d_model) embedding "
    "scale (all FSMT's defaults), the tying (configured: `tie_word_embeddings=True`; FSMT's default is two "
    "matrices), the projection biases (set to 0 by `load_reference_state`), and the masked scores filled with "
    f"the dtype's minimum instead of -inf (finite; a fully padded source then attends uniformly to padding). The "
    f"layer norms are `torch.nn.LayerNorm(d_model)` with PyTorch's eps 1e-5 whatever the config ({F}:279, :458), "
    "not config.norm_eps (declared under `norm.epsilon`)."
    + " " + DECODING_NOTE
)


@hookimpl
def register_implementations(register):
    register(Implementation(
        name="hf-fsmt",
        build=build,
        summary="transformers FSMTForConditionalGeneration (fairseq WMT19; post-norm, ReLU, tied) with fairseq's "
                "positional table, biased projections and a causal mask that float64 cannot build; generate's "
                "|Y|^alpha beams and one length limit per batch",
        source="https://github.com/huggingface/transformers/blob/v5.24.0/"
               "src/transformers/models/fsmt/modeling_fsmt.py (the installed transformers)",
        output="logits",
        deviations=DEVIATIONS,
        notes=NOTES,
        written_for=WRITTEN_FOR,
        unavailable=transformers_unavailable(), install=INSTALL,
    ))
