"""A model written at its user's own sizes: a plugin for tests/test_audit_config.py
(``--plugin tests/user_sized_models.py``).

``user-sized`` is the reference model at ``USER_SIZES`` (vocabulary 40, d_model 64), built only at those sizes,
as a model written for one checkpoint is: at the suite's own sizes nothing can be checked (its build refuses
vocabulary 37 and d_model 32); audited with ``--config`` at its sizes, it conforms at them (the other sizes some
checks build are refused, blocked by config.parameters).
"""

from __future__ import annotations

from collections.abc import Callable

from aiayn_conformance.implementations import Implementation, hookimpl
from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.spec.config import ModelConfig

USER_SIZES = ModelConfig(src_vocab=40, tgt_vocab=40, d_model=64, n_heads=4, d_ff=96, n_layers=2, max_len=32)
USER_CONFIG = "src_vocab=40,d_model=64,h=4,d_ff=96,N=2,max_len=32"  # --config for USER_SIZES


def build_user_sized(config: ModelConfig) -> Transformer:
    if config.replace(dropout=USER_SIZES.dropout) != USER_SIZES:
        raise ValueError(f"this model is built at {USER_SIZES}, not {config}")
    return Transformer(config)


@hookimpl
def register_implementations(register: Callable[[Implementation], None]) -> None:
    register(Implementation(name="user-sized", build=build_user_sized, output="logits",
                            summary="the reference at fixed sizes (vocabulary 40, d_model 64)",
                            source="tests/user_sized_models.py"))
