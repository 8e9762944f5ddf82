"""The model configuration of "Attention Is All You Need" and its Table 3 presets.

`ModelConfig` defaults are the paper's base model (Table 3, first row): N = 6,
d_model = 512, d_ff = 2048, h = 8, P_drop = 0.1, a shared source/target
vocabulary of about 37000 tokens (section 5.1) and three-way weight tying
(section 3.4). The layer-norm epsilon 1e-6 is tensor2tensor's (the paper is
silent).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

__all__ = ["ModelConfig", "PRESETS", "BASE", "BIG", "TINY", "preset"]


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of the encoder-decoder Transformer (section 3, Table 3).

    Symbols: ``d_model`` (section 3.1), ``n_heads`` = h, ``d_k`` and ``d_v``
    (section 3.2.2), ``d_ff`` (section 3.3), ``n_layers`` = N for both stacks
    (section 3.1), ``dropout`` = P_drop (section 5.4).
    ``max_len`` is the longest source or target sequence the model must accept.
    ``pad_id`` marks right-padding in both the source and the target.

    ``d_k`` (queries and keys) and ``d_v`` (values) are per head. Left at 0 they
    are the paper's d_model / h (then d_model must be divisible by h) and stay
    so in ``replace``: a copy with another d_model or h derives them again.
    Given, they are Table 3's row (B) (d_k 16 or 32 at h 8): W^Q and W^K map
    d_model to h d_k, W^V maps d_model to h d_v, and W^O maps h d_v back.
    """

    src_vocab: int = 37000
    tgt_vocab: int = 37000
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_layers: int = 6
    dropout: float = 0.1
    max_len: int = 512
    pad_id: int = 0
    share_embeddings: bool = True
    norm_eps: float = 1e-6
    d_k: int = 0
    d_v: int = 0
    # the head dimensions left at 0 (derived from d_model / h): replace() derives them again
    derived_heads: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"ModelConfig.{name} must be an int, got {value!r}")
            if value <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {value}")
        for name in ("d_k", "d_v"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, or 0 for d_model / h; got {value!r}")
        derived = tuple(name for name in ("d_k", "d_v") if getattr(self, name) == 0)
        if derived and self.d_model % self.n_heads != 0:
            raise ValueError(
                f"ModelConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}) "
                f"for {' and '.join(derived)} = d_model / h (or give {' and '.join(derived)})"
            )
        for name in derived:
            object.__setattr__(self, name, self.d_model // self.n_heads)
        object.__setattr__(self, "derived_heads", derived)
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise ValueError(f"ModelConfig.dropout must be a float in [0, 1), got {self.dropout!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ModelConfig.dropout must be in [0, 1), got {self.dropout}")
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int):
            raise ValueError(f"ModelConfig.pad_id must be an int, got {self.pad_id!r}")
        if not 0 <= self.pad_id < min(self.src_vocab, self.tgt_vocab):
            raise ValueError(
                f"ModelConfig.pad_id must be a token id of both vocabularies "
                f"(0 <= pad_id < {min(self.src_vocab, self.tgt_vocab)}), got {self.pad_id}"
            )
        if not isinstance(self.share_embeddings, bool):
            raise ValueError(f"ModelConfig.share_embeddings must be a bool, got {self.share_embeddings!r}")
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(
                "ModelConfig.share_embeddings=True needs src_vocab == tgt_vocab "
                f"(got {self.src_vocab} and {self.tgt_vocab}); section 3.4 shares one matrix"
            )
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) or self.norm_eps <= 0:
            raise ValueError(f"ModelConfig.norm_eps must be a positive float, got {self.norm_eps!r}")

    @property
    def paper_heads(self) -> bool:
        """Whether d_k = d_v = d_model / h, as everywhere in the paper but Table 3's row (B)."""
        return self.d_k == self.d_v and self.d_k * self.n_heads == self.d_model

    def replace(self, **changes) -> ModelConfig:
        """A copy with some fields changed (validated again); d_k and d_v left derived stay derived."""
        derived: dict[str, object] = {name: 0 for name in self.derived_heads if name not in changes}
        return dataclasses.replace(self, **{**derived, **changes})


BASE = ModelConfig()
"""Table 3, "base": 6 layers, d_model 512, d_ff 2048, h 8, P_drop 0.1 (Table 3: 65M parameters; 63.0M with
this vocabulary of 37000, the paper's being "about 37000" and its totals rounded)."""

BIG = ModelConfig(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)
"""Table 3, "big": d_model 1024, d_ff 4096, h 16, P_drop 0.3 (Table 3: 213M parameters; 214.2M here)."""

TINY = ModelConfig(
    src_vocab=37, tgt_vocab=37, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.1, max_len=24
)
"""A small model with the base model's shape for fast tests: h > 1, N = 2."""

PRESETS: dict[str, ModelConfig] = {"base": BASE, "big": BIG, "tiny": TINY}


def preset(name: str) -> ModelConfig:
    """The named preset; ValueError naming the accepted names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; accepted: {', '.join(PRESETS)}") from None

