"""``--device``: the audit's models on an accelerator, behind the adapter contract on the CPU.

Checks build their inputs on the CPU and compare outputs there. ``OnDevice`` holds the model on the device and
moves what crosses the contract: tensor arguments go to the device, scores, encoder outputs, tables and tokens
come back to the CPU (with their autograd graph, so a loss on them trains the model on the device). Decoding states
stay where the adapter keeps them. The recipe's methods (``spec.contract.RECIPE_METHODS``) cross nothing: their
arguments are the caller's own (parameters to optimize, which a copy to the device would turn into non-leaf
tensors, an optimizer, targets on the CPU) and what they make works where the caller is: a batch made from a CPU
target stays on the CPU, the criterion judges the CPU scores, the optimizer steps the parameters it was given. The
device checks themselves (device.portable, device.parity) and the ONNX export build the plain model
(``harness.build_model(..., place=False)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from aiayn_conformance.spec.contract import RECIPE_METHODS

__all__ = ["DEVICES", "DEVICE_ERRORS", "OnDevice", "device_problem", "is_device_error", "place"]

DEVICES = "cpu, cuda or cuda:N (where torch.cuda.is_available())"


def device_problem(device: str) -> str:
    """Why ``device`` cannot run the audit here ("" when it can), one line naming what is accepted."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        return f"--device {device}: not a device name; accepted: {DEVICES}"
    if dev.type == "cpu":
        return ""
    if dev.type != "cuda":
        return f"--device {device}: the audit runs on cpu or cuda; accepted: {DEVICES}"
    if not torch.cuda.is_available():
        built = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA")
        return f"--device {device}: CUDA is not available here ({built}); accepted: {DEVICES}"
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        return f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here; accepted: {DEVICES}"
    return ""


# What torch says when one operation meets tensors on two devices (CUDA and the CPU, or the meta device), or when a
# forward asks for CUDA where there is none.
DEVICE_ERRORS = ("not on the expected device", "same device", "expected all tensors to be on the same device",
                 "torch not compiled with cuda", "nvidia driver", "no cuda gpus", "expected device",
                 "found at least two devices")


def is_device_error(exc: BaseException) -> bool:
    """Whether ``exc`` is torch refusing to mix devices (a tensor the model left on, or made on, another device)."""
    text = str(exc).lower()
    return any(e in text for e in DEVICE_ERRORS)


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_to(v, device) for v in value)
    if isinstance(value, list):
        return [_to(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _cpu(value: Any) -> Any:
    return _to(value, torch.device("cpu"))


# What crosses the contract for each optional method: (arguments to the device, results back to the CPU).
_RESULTS_BACK = {"encode", "positional_encoding", "generate"}
_STEP = {"begin_decoding", "decode_step", "reorder_state"}


class OnDevice(nn.Module):
    """``model`` on ``device``, called like the adapter on the CPU (see the module docstring)."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        super().__init__()
        self.model = model.to(device)
        self.placed_on = device

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _cpu(self.model(*_to(args, self.placed_on), **_to(kwargs, self.placed_on)))

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # parameters, buffers, the wrapped model
        except AttributeError:
            pass
        attr = getattr(self._modules["model"], name)
        if not callable(attr) or name.startswith("_") or name in RECIPE_METHODS:
            return attr
        return self._crossing(name, attr)

    def _crossing(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        device = self.placed_on

        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*_to(args, device), **_to(kwargs, device))
            if name in _RESULTS_BACK:
                return _cpu(result)
            if name == "decode_step" and isinstance(result, tuple) and len(result) == 2:
                return _cpu(result[0]), result[1]  # the scores back; the state stays on the device
            return result

        return call


def place(model: nn.Module, device: str) -> nn.Module:
    """``model`` itself on the CPU, else wrapped on ``device`` (``OnDevice``)."""
    dev = torch.device(device)
    return model if dev.type == "cpu" else OnDevice(model, dev)
