"""The naming conventions the scaffold reads: constructor parameter names and the ``ModelConfig`` field each
means, and the words in parameter paths that tell embeddings, attention projections, feed-forward networks and
norms apart.

Tables only, no logic: a new convention (a library's naming, say) is a new entry or a new table here, and the
probe (probe.py) and the proposal (proposal.py, layer.py) read it from here.
"""

from __future__ import annotations

import re

# -- constructor parameters ---------------------------------------------------------------------------------------
CONFIG_PARAMETERS = ("config", "cfg", "model_config", "hparams")
"""Names of a required constructor parameter that takes the whole ``ModelConfig``."""

# Constructor parameter names and the ModelConfig expression each takes (the generated code's spelling).
ALIASES: dict[str, tuple[str, ...]] = {
    "config.src_vocab": ("src_vocab", "src_vocab_size", "n_src_vocab", "enc_voc_size", "enc_vocab_size",
                         "source_vocab_size", "input_vocab_size", "src_vocab_len", "num_src_tokens"),
    "config.tgt_vocab": ("tgt_vocab", "trg_vocab", "tgt_vocab_size", "trg_vocab_size", "n_trg_vocab", "n_tgt_vocab",
                         "dec_voc_size", "dec_vocab_size", "target_vocab_size", "output_vocab_size", "tgt_vocab_len",
                         "vocab_size", "vocab", "n_vocab", "ntoken", "num_tokens"),
    "config.d_model": ("d_model", "dim", "hidden_size", "d_word_vec", "embed_dim", "emb_dim", "model_dim", "n_embd",
                       "d_embed", "embedding_dim"),
    "config.n_heads": ("n_heads", "nhead", "n_head", "num_heads", "heads", "h", "num_attention_heads"),
    "config.d_ff": ("d_ff", "dim_feedforward", "ffn_hidden", "d_inner", "ff_dim", "ffn_dim", "d_hidden", "d_ffn",
                    "feed_forward_dim", "pf_dim", "hidden_dim", "inner_dim"),
    "config.n_layers": ("n_layers", "num_layers", "N", "n_layer", "layers", "depth", "num_encoder_layers",
                        "num_decoder_layers", "n_enc_layers", "n_dec_layers", "enc_layers", "dec_layers"),
    "config.dropout": ("dropout", "drop_prob", "p_drop", "dropout_rate", "dropout_p", "drop_rate"),
    "config.max_len": ("max_len", "max_seq_len", "n_position", "max_length", "max_position_embeddings", "seq_len",
                       "max_seq_length", "src_seq_len", "tgt_seq_len", "context_length"),
    "config.pad_id": ("pad_id", "pad_idx", "src_pad_idx", "trg_pad_idx", "tgt_pad_idx", "padding_idx",
                      "pad_token_id", "src_pad_id", "tgt_pad_id", "trg_pad_id"),
    "config.norm_eps": ("norm_eps", "eps", "layer_norm_eps", "ln_eps"),
    "config.d_k": ("d_k", "d_v", "dim_head", "head_dim", "d_head"),
    "config.share_embeddings": ("share_embeddings", "tie_embeddings", "emb_src_trg_weight_sharing",
                                "trg_emb_prj_weight_sharing", "tie_word_embeddings", "shared_embeddings",
                                "weight_sharing", "share_emb"),
    '"cpu"': ("device",),
}
# Names whose meaning is not in ModelConfig: a value that lets the model build, always marked for the user.
GUESSES: dict[str, tuple[str, str]] = {
    name: ("1", "not in ModelConfig: a token id other than pad_id (used by generation, not by forward)")
    for name in ("trg_sos_idx", "sos_idx", "bos_idx", "bos_id", "sos_id", "trg_bos_idx", "tgt_sos_idx",
                 "start_token", "start_symbol")
}
UNCERTAIN = {"vocab_size", "vocab", "n_vocab", "ntoken", "num_tokens", "hidden_dim", "inner_dim", "layers", "depth",
             "dim", "h", "d_v"}  # names that more than one config field could mean


# -- parameter paths -------------------------------------------------------------------------------------------
def tokens(text: str) -> set[str]:
    """The words of a parameter path or module name: split at dots, underscores, dashes and camelCase humps."""
    return {t for t in re.split(r"[._\-]|(?<=[a-z])(?=[A-Z])", text.lower()) if t}


ENCODER = {"encoder", "enc"}  # a path component naming a stack (followed, further on, by a layer number)
DECODER = {"decoder", "dec"}
EMBEDDING = {"emb", "embed", "embedding", "embeddings", "lut", "tok", "token"}  # never the pre-softmax projection
GENERATOR = {"generator", "proj", "prj", "projection", "head", "logits", "out", "output", "classifier", "linear", "fc",
             "lm", "logit", "vocab"}
SOURCE = {"src", "source", "enc", "encoder", "input", "inp"}
TARGET = {"tgt", "trg", "target", "dec", "decoder"}
SELF = {"self", "slf", "masked", "causal", "selfattn", "self_attn"}
CROSS = {"cross", "enc", "encoder", "src", "context", "memory", "mem", "encdec", "inter", "source"}
ATTENTION = {"attn", "attention", "att", "self", "slf"}  # a norm named for attention, in a layer: the first sub-layer's
FFN = {"ff", "ffn", "feed", "feedforward", "mlp", "pos", "final", "fc", "pwff", "positionwise"}
# The projection each word names. "proj" names none of them: Hugging Face and fairseq write q_proj, k_proj, v_proj
# and out_proj, so it says only "a projection" (issue 24: with "proj" among the output words q_proj, k_proj and v_proj
# were ambiguous and the registration-order fallback mapped q <- k_proj, k <- v_proj, v <- q_proj).
PROJ = {"q": {"q", "qs", "query", "queries", "wq", "wqs"}, "k": {"k", "ks", "key", "keys", "wk", "wks"},
        "v": {"v", "vs", "value", "values", "wv", "wvs"},
        "o": {"o", "out", "output", "fc", "concat", "wo", "dense", "outproj"}}
FUSED = ("in_proj", "qkv", "c_attn", "to_qkv", "query_key_value")
"""Words of a [3 d_model, d_model] weight stacked q|k|v: torch.nn's in_proj_weight, qkv / to_qkv, GPT-2's c_attn."""
POSITION = {"pos", "position", "positions", "positional", "wpe", "pe"}  # a learned positional table
GAIN = {"weight", "gamma", "a_2", "alpha", "g", "scale", "w", "gain"}
SHIFT = {"bias", "beta", "b_2", "b", "shift"}
