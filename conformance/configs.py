"""The configurations the suite builds: the audit's (``CONFIG``) and the few others some checks need.

Kept apart from ``inputs`` (which depends on the shape contract) so that ``harness.build_model`` can tell a
configuration the implementation refuses from the audit's own without an import cycle.
"""

from __future__ import annotations

import dataclasses

from aiayn_conformance.spec.config import TINY, ModelConfig

__all__ = ["CONFIG", "OTHER_CONFIGS", "config_change"]

# The default audit configuration: h > 1, N = 2, d_model 32, max_len 24.
CONFIG: ModelConfig = TINY

# The other configurations some checks build (config.parameters checks that each can be built; a check whose
# configuration the implementation refuses is skipped as blocked by config.parameters).
OTHER_CONFIGS: dict[str, ModelConfig] = {
    "separate-vocabularies": CONFIG.replace(src_vocab=41, tgt_vocab=43, share_embeddings=False),
    "one-head": CONFIG.replace(n_heads=1),
    "wider": CONFIG.replace(d_model=48, n_heads=4, max_len=64),
    # decoding (§6.1) runs up to the longest witness source + 50 positions: the tiny preset's 24 is too short
    "longer": CONFIG.replace(max_len=64),
}


def config_change(config: ModelConfig) -> str:
    """How ``config`` differs from the audit configuration ("src_vocab=41, tgt_vocab=43"), dropout aside."""
    changed = [(f.name, getattr(config, f.name)) for f in dataclasses.fields(config)
               if f.name != "dropout" and getattr(config, f.name) != getattr(CONFIG, f.name)]
    return ", ".join(f"{name}={value}" for name, value in changed)
