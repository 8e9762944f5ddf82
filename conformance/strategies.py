"""Hypothesis strategies for the suite, and its profiles: every drawn input of a property check comes from here.

Inputs are drawn piece by piece (batch size, lengths, each row's padding, token values, mask bits), each
labelled, so a failure shrinks to the smallest witness and is reported with its parts named.

Profiles (select with ``--hypothesis-profile NAME`` or ``AIAYN_HYPOTHESIS_PROFILE``):
    ci        derandomized, 10 examples per test, no deadline: fast and repeatable (default)
    thorough  100 examples per test, random: for deep audits
    smoke     derandomized, 3 examples, no shrinking: the fixed witnesses do the catching (every
              check has one); used by the project's own tests that run the suite on many models
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from spec.config import ModelConfig

settings.register_profile(
    "ci", max_examples=10, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "smoke", max_examples=3, derandomize=True, deadline=None, print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "thorough", max_examples=100, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("AIAYN_HYPOTHESIS_PROFILE", "ci"))


def lengths(config: ModelConfig, *, min_value: int = 1, max_value: int | None = None) -> st.SearchStrategy[int]:
    """Sequence lengths from min_value to max_value (default max_len), with both edges favoured."""
    top = config.max_len if max_value is None else max_value
    return st.one_of(st.sampled_from(sorted({min_value, top})), st.integers(min_value=min_value, max_value=top))


def real_tokens(config: ModelConfig, vocab: int) -> st.SearchStrategy[int]:
    """Token ids other than the pad id (shrinking towards the smallest)."""
    return st.sampled_from([t for t in range(vocab) if t != config.pad_id])


def token_batch(config: ModelConfig, *, vocab: int, batch: int, length: int, min_real: int = 1,
                padded: bool = True) -> st.SearchStrategy[torch.Tensor]:
    """A right-padded LongTensor [batch, length]: each row has between min_real and length real tokens
    (every token real when not ``padded``)."""

    @st.composite
    def build(draw: st.DrawFn) -> torch.Tensor:
        rows = []
        for b in range(batch):
            real = (draw(st.integers(min_value=min(min_real, length), max_value=length), label=f"real length {b}")
                    if padded else length)
            ids = draw(st.lists(real_tokens(config, vocab), min_size=real, max_size=real), label=f"tokens {b}")
            rows.append(ids + [config.pad_id] * (length - real))
        return torch.tensor(rows, dtype=torch.long)

    return build()


@st.composite
def src_tgt(draw: st.DrawFn, config: ModelConfig, *, min_batch: int = 1, max_batch: int = 4,
            max_len: int | None = None, padded: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(src [B, S], tgt [B, T]): batch size, lengths (1 to ``max_len``, default the config's), right padding
    per row (every row with at least one real token; none when not ``padded``) and token values, all drawn."""
    batch = draw(st.integers(min_value=min_batch, max_value=max_batch), label="batch")
    s_len = draw(lengths(config, max_value=max_len), label="S")
    t_len = draw(lengths(config, max_value=max_len), label="T")
    src = draw(token_batch(config, vocab=config.src_vocab, batch=batch, length=s_len, padded=padded), label="src")
    tgt = draw(token_batch(config, vocab=config.tgt_vocab, batch=batch, length=t_len, padded=padded), label="tgt")
    return src, tgt


def attention_mask(*, batch: int, lq: int, lk: int) -> st.SearchStrategy[torch.Tensor]:
    """A boolean mask [batch, 1, Lq, Lk] (True = may attend), any pattern, rows with no allowed key included."""
    return st.lists(st.booleans(), min_size=batch * lq * lk, max_size=batch * lq * lk).map(
        lambda bits: torch.tensor(bits, dtype=torch.bool).view(batch, 1, lq, lk))
