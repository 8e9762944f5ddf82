"""Deterministic witness inputs for the configuration the suite audits with (the ``config`` fixture; hypothesis
draws its inputs in ``strategies.py``).

Witnesses are fitted to the shapes the implementation under test accepts (``shapes``, model.shape): for a
model that accepts every batch size and length they are exactly as written here; for one that rejects some,
:func:`fitted` cuts or pads them to accepted widths and batch sizes, or skips the check naming model.shape.
"""

from __future__ import annotations

import torch

from aiayn_conformance.spec.config import ModelConfig

from . import shapes

# The shapes the witnesses use, which the shape probe tries (with 1 and config.max_len) before any check runs:
# the source and target widths of every witness (with the padding the mask checks append), and their batch
# sizes. The witness batch's own shape is the probe's first call.
WITNESS_SHAPE = (3, 7, 5)  # witness_batch(): (batch, source length, target length)
WITNESS_LENGTHS = (4, 5, 6, 7, 8, 9, 12)
WITNESS_BATCHES = (1, 2, 3)


def random_tokens(config: ModelConfig, lengths: list[int], total: int, *, vocab: int, seed: int) -> torch.Tensor:
    """Right-padded [len(lengths), total] ids; row b has lengths[b] real (non-pad) tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(lengths), total), generator=g)
    ids = torch.where(ids == config.pad_id, (ids + 1) % vocab, ids)
    for b, n in enumerate(lengths):
        ids[b, n:] = config.pad_id
    return ids


BOS_ID, EOS_ID = 1, 2  # the start and end symbols the training and decoding witnesses use (DecodeConfig's defaults)


def ordinary_ids(config: ModelConfig, vocab: int) -> torch.Tensor:
    """The ids of ``vocab`` that are no special symbol: not the start symbol, the end symbol or the pad id."""
    ids = torch.tensor([t for t in range(vocab) if t not in (BOS_ID, EOS_ID, config.pad_id)], dtype=torch.long)
    if ids.numel() == 0:
        raise ValueError(f"a vocabulary of {vocab} holds only special symbols")
    return ids


def ordinary_tokens(config: ModelConfig, lengths: list[int], total: int, *, vocab: int, seed: int,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Right-padded [len(lengths), total] ids; row b has lengths[b] real tokens, all ordinary (no start or end
    symbol and no padding among them, see :func:`ordinary_ids`)."""
    g = torch.Generator().manual_seed(seed) if generator is None else generator
    pool = ordinary_ids(config, vocab)
    ids = pool[torch.randint(0, pool.numel(), (len(lengths), total), generator=g)]
    for b, n in enumerate(lengths):
        ids[b, n:] = config.pad_id
    return ids


def target_tokens(config: ModelConfig, lengths: list[int], total: int, *, vocab: int, seed: int,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Targets as a toolkit's batching makes them: row b holds lengths[b] real tokens, ordinary ones and then the
    end symbol (``EOS_ID``) as its last, then padding; the end symbol nowhere else (a row of length 1 is the end
    symbol alone, an empty sentence)."""
    ids = ordinary_tokens(config, lengths, total, vocab=vocab, seed=seed, generator=generator)
    for b, n in enumerate(lengths):
        if n > 0:
            ids[b, n - 1] = EOS_ID
    return ids


def fitted(src: torch.Tensor, tgt: torch.Tensor, config: ModelConfig, *, src_room: int = 0,
           tgt_room: int = 0, min_batch: int = 1, keep: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """A witness (src, tgt) at shapes the implementation under test accepts: unchanged when it accepts them
    (with room for ``src_room`` / ``tgt_room`` more tokens, for checks that append padding, and at least
    ``min_batch`` rows), else cut or padded to the nearest accepted widths (right-padded rows keep their first
    tokens) and batch size (the rows ``keep`` first, then the first rows); skips the check, as blocked by
    model.shape, when nothing fits. Outside a check of an implementation: unchanged."""
    return shapes.fit_pair(shapes.current(), src, tgt, config.pad_id, src_room=src_room, tgt_room=tgt_room,
                           min_batch=min_batch, keep=keep)


def shape_need(what: str, axis: shapes.Axis | None = None) -> str:
    """The skip reason of a check that needs ``what`` (a shape) the implementation under test rejects:
    "blocked by model.shape: <what>, and the model accepts only target length 5"."""
    contract = shapes.current()
    return contract.need(what, axis) if contract is not None else f"blocked by model.shape: {what}"


def witness_batch(config: ModelConfig, *, seed: int = 0, src_room: int = 0, tgt_room: int = 0,
                  min_batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded batch with src_len != tgt_len: src [3, 7], tgt [3, 5] (fitted, see :func:`fitted`)."""
    src = random_tokens(config, [7, 4, 2], 7, vocab=config.src_vocab, seed=seed)
    tgt = random_tokens(config, [5, 3, 1], 5, vocab=config.tgt_vocab, seed=seed + 1)
    return fitted(src, tgt, config, src_room=src_room, tgt_room=tgt_room, min_batch=min_batch)


def other_token(token: int, vocab: int, pad_id: int, shift: int = 1) -> int:
    """A different non-pad token id."""
    t = token
    for _ in range(vocab):
        t = (t + shift) % vocab
        if t not in (token, pad_id):
            return t
    raise ValueError("vocabulary too small")
