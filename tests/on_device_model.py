"""The reference behind ``OnDevice`` (what ``--device cuda`` wraps every model in), here on the CPU: a plugin for
tests/test_devices.py (``--plugin tests/on_device_model.py``). Its checks must judge exactly as the reference's."""

from __future__ import annotations

from collections.abc import Callable

import torch

from aiayn_conformance.conformance.helpers.devices import OnDevice
from aiayn_conformance.implementations import Implementation, hookimpl
from aiayn_conformance.reference.model import Transformer
from aiayn_conformance.spec.config import ModelConfig


def build(config: ModelConfig) -> OnDevice:
    return OnDevice(Transformer(config), torch.device("cpu"))


@hookimpl
def register_implementations(register: Callable[[Implementation], None]) -> None:
    register(Implementation(name="reference-on-device", build=build, output="logits",
                            summary="the reference behind OnDevice, on the CPU", source="tests/on_device_model.py"))
