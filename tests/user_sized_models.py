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
    register(Implementation(name="toy-toolkit", build=_refuse, output="logits", read_checkpoint=read_toy_checkpoint,
                            summary="a toolkit read from its own checkpoints", source="tests/user_sized_models.py"))


# A toolkit that saves its own checkpoints: {"format": "toy-toolkit", "sizes": {...}, "model": state_dict}. Its
# registration reads them (read_checkpoint); the registration's own build refuses to build, so a check that runs
# at all ran on the model the checkpoint's build made.
TOY_FORMAT = "toy-toolkit"


def _refuse(config: ModelConfig) -> Transformer:
    raise RuntimeError("toy-toolkit builds only from its checkpoint (--weights)")


def read_toy_checkpoint(path: str):
    import torch

    from aiayn_conformance.implementations import Checkpoint

    saved = torch.load(path, map_location="cpu", weights_only=True)
    found = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
    if found != TOY_FORMAT:
        raise ValueError(f"not a toy-toolkit checkpoint (its 'format' is {found!r}); accepted: a file saved by "
                         "toy-toolkit's trainer, format 'toy-toolkit'")
    return Checkpoint(config=ModelConfig(**saved["sizes"]), state=saved["model"], build=Transformer,
                      describes=f"toy-toolkit checkpoint, step {saved['step']}")

