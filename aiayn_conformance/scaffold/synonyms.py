"""Tables: constructor argument names as real code spells them (tutorials, torch.nn, Hugging Face, fairseq,
OpenNMT-py, JoeyNMT), and the ``ModelConfig`` field each means. :data:`SURE` names mean one field wherever they are
seen; :data:`ASSUMED` names could mean more than one, so the line passing them is marked ``# CHECK:`` with what was
assumed; :data:`GUESSES` are token ids ``ModelConfig`` lacks. :func:`meaning` reads them."""

from __future__ import annotations

CONFIG_PARAMETERS = ("config", "cfg", "model_config", "model_cfg", "hparams", "args", "model_args", "opt", "opts",
                     "model_opt", "options")
"""Names of a required constructor parameter that takes a whole configuration object."""

SURE: dict[str, tuple[str, ...]] = {
    "config.src_vocab": ("src_vocab", "src_vocab_size", "n_src_vocab", "enc_voc_size", "enc_vocab_size",
                         "source_vocab_size", "input_vocab_size", "src_vocab_len", "num_src_tokens", "src_ntoken",
                         "src_n_vocab", "n_src_words", "src_vocab_dim", "input_vocab", "src_vocabs"),
    "config.tgt_vocab": ("tgt_vocab", "trg_vocab", "tgt_vocab_size", "trg_vocab_size", "n_trg_vocab", "n_tgt_vocab",
                         "dec_voc_size", "dec_vocab_size", "target_vocab_size", "output_vocab_size", "tgt_vocab_len",
                         "trg_vocab_len", "num_tgt_tokens", "tgt_ntoken", "n_tgt_words", "decoder_vocab_size",
                         "output_vocab", "tgt_vocabs", "trg_vocabs"),
    "config.d_model": ("d_model", "hidden_size", "d_word_vec", "embed_dim", "emb_dim", "model_dim", "n_embd",
                       "d_embed", "embedding_dim", "embed_size", "emb_size", "d_emb", "embedding_size",
                       "encoder_embed_dim", "decoder_embed_dim", "dim_model", "n_embed", "word_vec_size",
                       "src_word_vec_size", "tgt_word_vec_size", "enc_hid_size", "dec_hid_size", "rnn_size",
                       "model_dimension"),
    "config.n_heads": ("n_heads", "nhead", "n_head", "num_heads", "heads", "num_attention_heads", "attn_heads",
                       "n_attn_heads", "encoder_attention_heads", "decoder_attention_heads", "num_head", "nheads",
                       "head_num", "num_attn_heads", "number_of_heads"),
    "config.d_ff": ("d_ff", "dim_feedforward", "ffn_hidden", "d_inner", "ff_dim", "ffn_dim", "d_ffn", "pf_dim",
                    "feed_forward_dim", "d_inner_hid", "ff_hidden", "ffn_hidden_size", "intermediate_size",
                    "encoder_ffn_dim", "decoder_ffn_dim", "encoder_ffn_embed_dim", "decoder_ffn_embed_dim",
                    "d_feedforward", "ff_size", "ffn_size", "dim_ff", "forward_expansion_dim", "hidden_ff",
                    "transformer_ff"),
    "config.n_layers": ("n_layers", "num_layers", "N", "n_layer", "num_encoder_layers", "num_decoder_layers",
                        "n_enc_layers", "n_dec_layers", "enc_layers", "dec_layers", "encoder_layers", "decoder_layers",
                        "num_hidden_layers", "n_blocks", "num_blocks", "nlayers", "num_decoder_blocks",
                        "num_encoder_blocks", "n_encoder_layers", "n_decoder_layers", "number_of_layers"),
    "config.dropout": ("dropout", "drop_prob", "p_drop", "dropout_rate", "dropout_p", "drop_rate", "dropout_prob",
                       "hidden_dropout_prob", "resid_pdrop", "residual_dropout", "dropout_ratio",
                       "dropout_probability"),
    "config.max_len": ("max_len", "max_seq_len", "n_position", "max_length", "max_position_embeddings", "seq_len",
                       "max_seq_length", "src_seq_len", "tgt_seq_len", "context_length", "max_positions",
                       "max_source_positions", "max_target_positions",
                       "n_positions", "max_sequence_length", "max_src_len", "max_tgt_len", "max_trg_len",
                       "maxlen", "block_size", "n_ctx", "src_max_len", "tgt_max_len", "trg_max_len"),
    "config.pad_id": ("pad_id", "pad_idx", "src_pad_idx", "trg_pad_idx", "tgt_pad_idx", "padding_idx",
                      "pad_token_id", "src_pad_id", "tgt_pad_id", "trg_pad_id", "pad_index", "pad_token",
                      "src_pad", "trg_pad", "tgt_pad", "padding_index", "pad", "PAD_IDX", "word_padding_idx"),
    "config.norm_eps": ("norm_eps", "eps", "layer_norm_eps", "ln_eps", "layer_norm_epsilon", "norm_epsilon"),
    "config.d_k": ("d_k", "dim_head", "head_dim", "d_head", "d_kv", "head_size", "dim_k", "d_key"),
    "config.share_embeddings": ("share_embeddings", "tie_embeddings", "emb_src_trg_weight_sharing",
                                "trg_emb_prj_weight_sharing", "tie_word_embeddings", "shared_embeddings",
                                "weight_sharing", "share_emb", "share_encoder_decoder_embeddings",
                                "share_all_embeddings", "tie_weights", "share_decoder_input_output_embed",
                                "share_decoder_embeddings", "tied_embeddings", "tied_softmax"),
    '"cpu"': ("device",),
}

VOCAB = "read as the target vocabulary (one size for source and target? with two, pass the source's too)"
ASSUMED: dict[str, tuple[str, str]] = {
    # vocabulary sizes: one name for two vocabularies, or a dimension named like a size
    "vocab_size": ("config.tgt_vocab", VOCAB),
    "vocab": ("config.tgt_vocab", VOCAB),
    "n_vocab": ("config.tgt_vocab", VOCAB),
    "ntoken": ("config.tgt_vocab", VOCAB),
    "ntokens": ("config.tgt_vocab", VOCAB),
    "num_tokens": ("config.tgt_vocab", VOCAB),
    "word_vocab_size": ("config.tgt_vocab", VOCAB),
    "input_dim": ("config.src_vocab", "read as the source vocabulary (the tutorials' encoder input_dim); if it "
                                      "is a width, use config.d_model"),
    "output_dim": ("config.tgt_vocab", "read as the target vocabulary (the tutorials' decoder output_dim); if it "
                                       "is a width, use config.d_model"),
    # d_model: a "hidden" size is the model width in the tutorials, the FFN's inner width elsewhere
    "hid_dim": ("config.d_model", "read as d_model (the tutorials' hid_dim is the model width); if it is the "
                                  "feed-forward network's inner width, use config.d_ff"),
    "hidden": ("config.d_model", "read as d_model; if it is the feed-forward network's inner width, use "
                                 "config.d_ff"),
    "dim": ("config.d_model", "read as d_model; if it is another width (d_ff, d_k), change it"),
    "d": ("config.d_model", "read as d_model; if it is another width (d_ff, d_k), change it"),
    "size": ("config.d_model", "read as d_model (the Annotated Transformer's layer size)"),
    "hidden_dim": ("config.d_ff", "read as the feed-forward network's inner width; if it is the model width, use "
                                  "config.d_model"),
    "inner_dim": ("config.d_ff", "read as the feed-forward network's inner width; if it is the model width, use "
                                 "config.d_model"),
    # heads, layers
    "h": ("config.n_heads", "read as the number of heads (the paper's h)"),
    "layers": ("config.n_layers", "read as the number of layers in each stack"),
    "depth": ("config.n_layers", "read as the number of layers in each stack"),
    # dropout
    "p": ("config.dropout", "read as the residual dropout rate P_drop"),
    "drop": ("config.dropout", "read as the residual dropout rate P_drop"),
    # the value dimension
    "d_v": ("config.d_k", "read as d_v = d_k = d_model / h"),
}
"""Names that could mean more than one field: (the field passed, the CHECK note saying what was assumed)."""

GUESSES: dict[str, tuple[str, str]] = {
    name: ("1", "not in ModelConfig: a token id other than pad_id (used by generation, not by forward)")
    for name in ("trg_sos_idx", "sos_idx", "bos_idx", "bos_id", "sos_id", "trg_bos_idx", "tgt_sos_idx",
                 "start_token", "start_symbol", "bos_token_id", "decoder_start_token_id", "sos_token", "bos_token")
} | {
    name: ("2", "not in ModelConfig: an end-of-sequence token id other than pad_id (used by generation)")
    for name in ("eos_idx", "eos_id", "trg_eos_idx", "eos_token_id", "end_symbol", "eos_token", "forced_eos_token_id")
}
"""Names whose meaning is not in ModelConfig: a value that lets the model build, always marked for the user."""

PAPER: dict[str, tuple[str, str]] = {
    "encoder_type": ('"transformer"', "the paper's encoder (OpenNMT-py's option)"),
    "decoder_type": ('"transformer"', "the paper's decoder (OpenNMT-py's option)"),
    "type": ('"transformer"', "read as the architecture of the stack it is in (JoeyNMT's encoder/decoder type)"),
    "position_encoding": ("True", "the sinusoid of section 3.5 added to the embeddings"),
    "attention_dropout": ("0.0", "section 5.4 drops out sub-layer outputs and embedding sums, not attention weights"),
    "add_ffnbias": ("True", "Eq. (2) has biases b1 and b2"),
    "layer_norm": ('"post"', "post-norm, LayerNorm(x + Sublayer(x)) of section 3.1 (JoeyNMT's layer_norm)"),
    "scale": ("True", "read as the embeddings' scale by sqrt(d_model) of section 3.4 (JoeyNMT's embeddings.scale); if "
                      "it scales something else, remove it"),
}
"""Architecture options of toolkits, not ModelConfig fields, and the value that is the paper's: passed where the
option is read and its default is another, always marked with what it was read as."""


def meaning(name: str) -> tuple[str, str] | None:
    """(the ``ModelConfig`` expression, the CHECK note or "") for a constructor parameter's name; None when no
    table names it. Lookup is exact first, then case-insensitive (``PAD_IDX``, ``Dropout``)."""
    for key in (name, name.lower()):
        for expr, names in SURE.items():
            if key in names:
                return expr, ""
        if key in ASSUMED:
            expr, why = ASSUMED[key]
            return expr, f"{name} {why}"
        if key in GUESSES:
            return GUESSES[key]
    return None

SPECIALS: dict[str, str] = {
    "unk_token": '"<unk>"', "pad_token": '"<pad>"', "bos_token": '"<s>"', "eos_token": '"</s>"', "sep_token": "None",
    "mask_token": "None", "lang_tags": "[]", "sep_id": "None",
}
"""What a vocabulary class reads of its special tokens (JoeyNMT's ``special_symbols``); their ids are tried."""
SPECIAL_IDS = ("unk_id", "pad_id", "bos_id", "eos_id")

VOCABULARIES: dict[tuple[str, str], tuple[str, str, str]] = {
    ("onmt", "vocabs"): ("onmt.inputters.inputter", "dict_to_vocabs",
                         '{"src": tokens(config.src_vocab, ["<blank>", "<unk>", "<s>", "</s>"], config.pad_id), '
                         '"tgt": tokens(config.tgt_vocab, ["<blank>", "<unk>", "<s>", "</s>"], config.pad_id), '
                         '"data_task": "seq2seq"}'),
}
"""(top package, parameter) -> (module, function, its argument): toolkits' own vocabulary builders, for a builder
taking vocabularies with no annotation to say which class (OpenNMT-py's ``vocabs``: pyonmttok vocabularies, its
pad token ``<blank>`` at config.pad_id)."""
