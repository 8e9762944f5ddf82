"""Tables: the words in parameter paths that tell embeddings, attention projections, feed-forward networks and norms
apart, and :func:`tokens`, which splits a path into its words. A naming convention the scaffold misses is an entry
here."""

from __future__ import annotations

import re


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
# and out_proj, so it says only "a projection" (as an output word it made q_proj, k_proj and v_proj ambiguous).
PROJ = {"q": {"q", "qs", "query", "queries", "wq", "wqs"}, "k": {"k", "ks", "key", "keys", "wk", "wks"},
        "v": {"v", "vs", "value", "values", "wv", "wvs"},
        "o": {"o", "out", "output", "fc", "concat", "wo", "dense", "outproj", "final"}}
FUSED = ("in_proj", "qkv", "c_attn", "to_qkv", "query_key_value")
"""Words of a [3 d_model, d_model] weight stacked q|k|v: torch.nn's in_proj_weight, qkv / to_qkv, GPT-2's c_attn."""
POSITION = {"pos", "position", "positions", "positional", "wpe", "pe"}  # a learned positional table
GAIN = {"weight", "gamma", "a_2", "alpha", "g", "scale", "w", "gain"}
SHIFT = {"bias", "beta", "b_2", "b", "shift"}
