"""The paper's decoding settings as data (§6.1 translation, §6.3 parsing).

§6.1: "We used beam search with a beam size of 4 and length penalty α = 0.6
[GNMT] ... We set the maximum output length during inference to input length +
50, but terminate early when possible." §6.3 (constituency parsing): beam size
21, α = 0.3, maximum output length input length + 300.

The length penalty is GNMT's, lp(Y) = ((5 + |Y|) / 6)^α, dividing the summed
log-probabilities of a hypothesis (``reference.decoding`` implements it and
says what |Y| counts).

Token ids. ``ModelConfig`` knows only ``pad_id``; the paper names no start or
end symbol ids (tensor2tensor uses pad 0, EOS 1 and a zero vector as the
decoder's first input). This project's decoders start from an explicit start
symbol, so a ``DecodeConfig`` carries both ids: ``bos_id`` (the first decoder
input, never part of the output) and ``eos_id`` (ends a hypothesis, and is part
of it). Defaults: pad 0 (``ModelConfig``), bos 1, eos 2. ``bos_id`` may equal
``eos_id`` (fairseq starts decoding from its end symbol); neither may be the
padding id, which decoders never generate (see ``reference.decoding``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .config import ModelConfig

__all__ = ["DecodeConfig", "TRANSLATION", "PARSING", "DECODE_PRESETS", "decode_preset"]


def _int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"DecodeConfig.{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"DecodeConfig.{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class DecodeConfig:
    """How to decode (§6.1); the defaults are the paper's translation setting.

    ``beam_size``     hypotheses kept alive per source (1 means greedy search)
    ``alpha``         α of the GNMT length penalty ((5 + |Y|) / 6)^α; 0 disables it
    ``extra_length``  the maximum output length is each source's real (non-pad) length plus this
    ``bos_id``        the decoder's first input token (not part of the output)
    ``eos_id``        the end-of-sequence token (the last token of a finished output)
    """

    beam_size: int = 4
    alpha: float = 0.6
    extra_length: int = 50
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        _int("beam_size", self.beam_size, 1)
        _int("extra_length", self.extra_length, 0)
        _int("bos_id", self.bos_id, 0)
        _int("eos_id", self.eos_id, 0)
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or self.alpha < 0:
            raise ValueError(f"DecodeConfig.alpha must be a float >= 0, got {self.alpha!r}")

    def check_for(self, model: ModelConfig) -> DecodeConfig:
        """Raise a one-line ValueError unless the ids fit ``model``'s target vocabulary and padding."""
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            if value >= model.tgt_vocab:
                raise ValueError(f"DecodeConfig.{name}={value} is not a target token id (tgt_vocab={model.tgt_vocab})")
            if value == model.pad_id:
                raise ValueError(f"DecodeConfig.{name}={value} is the padding id; padding is never decoded "
                                 "(choose another id)")
        return self

    def replace(self, **changes) -> DecodeConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


TRANSLATION = DecodeConfig()
"""§6.1, translation: beam 4, α = 0.6, maximum output length = input length + 50."""

PARSING = DecodeConfig(beam_size=21, alpha=0.3, extra_length=300)
"""§6.3, English constituency parsing: beam 21, α = 0.3, maximum output length = input length + 300."""

DECODE_PRESETS: dict[str, DecodeConfig] = {"translation": TRANSLATION, "parsing": PARSING}


def decode_preset(name: str) -> DecodeConfig:
    """The named decoding preset; ValueError naming the accepted names otherwise."""
    try:
        return DECODE_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown decoding preset {name!r}; accepted: {', '.join(DECODE_PRESETS)}") from None
