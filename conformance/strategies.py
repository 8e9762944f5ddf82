"""Hypothesis strategies for the suite, and its profiles.

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


def lengths(config: ModelConfig, *, min_value: int = 1) -> st.SearchStrategy[int]:
    """Sequence lengths from min_value to max_len, with the edges 1 and max_len favoured."""
    return st.one_of(st.sampled_from(sorted({min_value, config.max_len})),
                     st.integers(min_value=min_value, max_value=config.max_len))


def token_batch(config: ModelConfig, *, vocab: int, batch: int, length: int, min_real: int = 1):
    """A right-padded LongTensor [batch, length]: each row has between min_real and length real tokens."""

    @st.composite
    def build(draw):
        rows = []
        for b in range(batch):
            real = draw(st.integers(min_value=min(min_real, length), max_value=length), label=f"real length {b}")
            ids = draw(st.lists(st.integers(min_value=0, max_value=vocab - 1).filter(lambda t: t != config.pad_id),
                                min_size=real, max_size=real), label=f"tokens {b}")
            rows.append(ids + [config.pad_id] * (length - real))
        return torch.tensor(rows, dtype=torch.long)

    return build()


@st.composite
def src_tgt(draw, config: ModelConfig, *, max_batch: int = 4):
    """(src [B, S], tgt [B, T]) right-padded, every row with at least one real token."""
    batch = draw(st.integers(min_value=1, max_value=max_batch), label="batch")
    s_len = draw(lengths(config), label="S")
    t_len = draw(lengths(config), label="T")
    src = draw(token_batch(config, vocab=config.src_vocab, batch=batch, length=s_len), label="src")
    tgt = draw(token_batch(config, vocab=config.tgt_vocab, batch=batch, length=t_len), label="tgt")
    return src, tgt
