"""The reference Transformer: the paper, to the letter. See ``reference/model.py``."""

from .model import (
    DecoderLayer,
    EncoderLayer,
    LayerNorm,
    MultiHeadAttention,
    PositionwiseFeedForward,
    Transformer,
    build,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
    sinusoid_table,
)

__all__ = [
    "DecoderLayer", "EncoderLayer", "LayerNorm", "MultiHeadAttention", "PositionwiseFeedForward",
    "Transformer", "build", "causal_mask", "padding_mask", "scaled_dot_product_attention",
    "sinusoid_table",
]
