"""Deterministic witness inputs and the configuration the suite audits with (hypothesis draws its inputs in
``strategies.py``)."""

from __future__ import annotations

import dataclasses

import torch

from spec.config import TINY, ModelConfig

# The default audit configuration: h > 1, N = 2, d_model 32, max_len 24.
CONFIG: ModelConfig = TINY

# The other configurations some checks build (config.parameters checks that each can be built; a check whose
# configuration the implementation refuses is skipped as blocked by config.parameters).
OTHER_CONFIGS: dict[str, ModelConfig] = {
    "separate-vocabularies": CONFIG.replace(src_vocab=41, tgt_vocab=43, share_embeddings=False),
    "one-head": CONFIG.replace(n_heads=1),
    "wider": CONFIG.replace(d_model=48, n_heads=4, max_len=64),
}


def config_change(config: ModelConfig) -> str:
    """How ``config`` differs from the audit configuration ("src_vocab=41, tgt_vocab=43"), dropout aside."""
    changed = [(f.name, getattr(config, f.name)) for f in dataclasses.fields(config)
               if f.name != "dropout" and getattr(config, f.name) != getattr(CONFIG, f.name)]
    return ", ".join(f"{name}={value}" for name, value in changed)


def random_tokens(config: ModelConfig, lengths: list[int], total: int, *, vocab: int, seed: int) -> torch.Tensor:
    """Right-padded [len(lengths), total] ids; row b has lengths[b] real (non-pad) tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(lengths), total), generator=g)
    ids = torch.where(ids == config.pad_id, (ids + 1) % vocab, ids)
    for b, n in enumerate(lengths):
        ids[b, n:] = config.pad_id
    return ids


def witness_batch(config: ModelConfig = CONFIG, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded batch with src_len != tgt_len: src [3, 7], tgt [3, 5]."""
    src = random_tokens(config, [7, 4, 2], 7, vocab=config.src_vocab, seed=seed)
    tgt = random_tokens(config, [5, 3, 1], 5, vocab=config.tgt_vocab, seed=seed + 1)
    return src, tgt


def other_token(token: int, vocab: int, pad_id: int, shift: int = 1) -> int:
    """A different non-pad token id."""
    t = token
    for _ in range(vocab):
        t = (t + shift) % vocab
        if t not in (token, pad_id):
            return t
    raise ValueError("vocabulary too small")
