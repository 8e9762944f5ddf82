"""The configurations the suite builds: the audit's (``CONFIG``) and the few others some checks need.

Kept apart from ``inputs`` (which depends on the shape contract) so that ``harness.build_model`` can tell a
configuration the implementation refuses from the audit's own without an import cycle.
"""

from __future__ import annotations

import dataclasses

from aiayn_conformance.spec.config import TINY, ModelConfig

__all__ = ["CONFIG", "OTHER_CONFIGS", "config_change", "audit_at", "others_for"]

# The audit configuration: by default the tiny preset (h > 1, N = 2, d_model 32, max_len 24); ``--config``
# replaces its values in place (``audit_at``) before any check is collected, so that every module holding it,
# default arguments included, audits at the user's sizes. A copy, so the preset itself never changes.
CONFIG: ModelConfig = dataclasses.replace(TINY)


def others_for(config: ModelConfig) -> dict[str, ModelConfig]:
    """The other configurations some checks build, derived from the audit configuration ``config``
    (config.parameters checks that each can be built; a check whose configuration the implementation refuses
    is skipped as blocked by config.parameters). At the tiny preset: vocabularies 41 and 43, the preset itself
    (shared), one head, d_model 48, max_len 64."""
    unit = 2 * config.n_heads  # d_model stays divisible by h and even (the sinusoid pairs)
    wider = -(-config.d_model * 3 // 2 // unit) * unit
    return {
        "separate-vocabularies": config.replace(src_vocab=config.src_vocab + 4, tgt_vocab=config.tgt_vocab + 6,
                                                share_embeddings=False),
        # §3.4's three-way tying: the audit configuration itself unless it has separate vocabularies
        "shared-vocabulary": config.replace(tgt_vocab=config.src_vocab, share_embeddings=True),
        "one-head": config.replace(n_heads=1),
        "wider": config.replace(d_model=max(wider, config.d_model + unit), max_len=max(64, config.max_len)),
        # decoding (§6.1) runs up to the longest witness source + 50 positions: the tiny preset's 24 is too short
        "longer": config.replace(max_len=max(64, config.max_len)),
    }


OTHER_CONFIGS: dict[str, ModelConfig] = others_for(CONFIG)


def _assign(target: ModelConfig, source: ModelConfig) -> None:
    for f in dataclasses.fields(ModelConfig):
        object.__setattr__(target, f.name, getattr(source, f.name))


def audit_at(config: ModelConfig) -> ModelConfig:
    """Make ``config`` the audit configuration, in place (``CONFIG`` and each of ``OTHER_CONFIGS`` keep their
    identity, so modules that imported them, and default arguments bound to them, see the new sizes);
    returns the previous audit configuration (a copy), to restore it with ``audit_at`` again."""
    previous = dataclasses.replace(CONFIG)
    _assign(CONFIG, config)
    for name, other in others_for(config).items():
        _assign(OTHER_CONFIGS[name], other)
    return previous


def config_change(config: ModelConfig) -> str:
    """How ``config`` differs from the audit configuration ("src_vocab=41, tgt_vocab=43"), dropout aside."""
    changed = [(f.name, getattr(config, f.name)) for f in dataclasses.fields(config)
               if f.name != "dropout" and getattr(config, f.name) != getattr(CONFIG, f.name)]
    return ", ".join(f"{name}={value}" for name, value in changed)
