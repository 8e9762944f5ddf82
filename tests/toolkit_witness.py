"""What the toolkit tests (tests/test_toolkit_*.py) share: the configurations a transplant is proven on, a padded
witness batch fitted to each configuration's padding id, and the comparison with the reference twin."""

from __future__ import annotations

import torch

from aiayn_conformance.conformance.helpers.transplant import reference_twin, visible_state
from aiayn_conformance.spec.config import TINY, ModelConfig
from aiayn_conformance.spec.tolerance import compare

CONFIGS = {
    "tied": TINY.replace(dropout=0.0),
    "untied": TINY.replace(dropout=0.0, share_embeddings=False, src_vocab=41, tgt_vocab=43),
    "pad-3": TINY.replace(dropout=0.0, pad_id=3, n_heads=2, n_layers=3),
}
SRC = torch.tensor([[5, 6, 7, 8, 9, 0, 0], [9, 10, 11, 12, 13, 14, 15], [4, 0, 0, 0, 0, 0, 0]])
TGT = torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8], [7, 8, 0, 0, 0]])


def batch(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """SRC and TGT with padding at ``cfg.pad_id`` (a token equal to it moved to 16)."""
    def remap(x: torch.Tensor) -> torch.Tensor:
        x = torch.where(x == cfg.pad_id, torch.full_like(x, 16), x)
        return torch.where(x == 0, torch.full_like(x, cfg.pad_id), x)
    return remap(SRC), remap(TGT)


def agree(a: torch.nn.Module, b: torch.nn.Module, cfg: ModelConfig) -> bool:
    """Same outputs at real target positions and same encoder output at real source positions."""
    src, tgt = batch(cfg)
    with torch.no_grad():
        real, keep = tgt != cfg.pad_id, src != cfg.pad_id
        out = compare(a(src, tgt)[real].double(), b(src, tgt)[real].double(), dtype=torch.float32, scope="model")
        enc = compare(a.encode(src)[keep].double(), b.encode(src)[keep].double(), dtype=torch.float32, scope="model")
    return out.ok and enc.ok


def loaded(build, cfg: ModelConfig, seed: int = 5):
    """(``build(cfg)`` in eval mode holding the visible weights, the reference twin holding them)."""
    state = visible_state(cfg, seed=seed)
    model = build(cfg).eval()
    model.load_reference_state(state)
    return model, reference_twin(cfg, state)
