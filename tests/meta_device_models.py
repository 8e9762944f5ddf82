"""Models that cannot run on the meta device, for ``device.portable``'s meta-device check.

A plugin for the suite's own tests (``--plugin tests/meta_device_models.py``): each model computes the reference's
function on the CPU, so only its forward on the meta device tells it apart. Two put a tensor on a device fixed in
advance (the clause's finding: that forward breaks on any other device than the CPU); one calls ``.item()``, a
data-dependent step the meta device cannot run and no portability bug (the check skips, naming it).
``tests/test_meta_device.py`` runs the check over them; ``META_MODELS`` says what each must get.
Registered without declarations, so that the finding shows as a failure with its message.
"""

from __future__ import annotations

from torch import Tensor

from aiayn_conformance.implementations import Implementation, hookimpl
from aiayn_conformance.reference.model import Transformer, causal_mask, padding_mask


class MaskOnConstructorDevice(Transformer):
    """The causal mask made with device=self.device, the device of the parameters at construction."""

    def __init__(self, config):
        super().__init__(config)
        self.device = next(self.parameters()).device

    def decode(self, memory: Tensor, src_mask: Tensor, tgt: Tensor) -> Tensor:
        tgt_mask = causal_mask(tgt.size(1), self.device) & padding_mask(tgt, self.config.pad_id)  # BUG
        y = self.embed(tgt, self.tgt_embed)
        for layer in self.decoder:
            y = layer(y, memory, src_mask, tgt_mask)
        return y


class SourceMaskToCpu(Transformer):
    """The source mask moved with .cpu() (code written for a CPU-only pipeline)."""

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return super().encode(src, None if src_mask is None else src_mask.cpu())  # BUG: a fixed device


class DataDependentLength(Transformer):
    """Reads the longest real target length with .item() (a Python int: data the meta device does not have)."""

    def decode(self, memory: Tensor, src_mask: Tensor, tgt: Tensor) -> Tensor:
        longest = int((tgt != self.config.pad_id).sum(dim=1).max().item())  # data-dependent, not a device bug
        return super().decode(memory, src_mask, tgt) if longest >= 0 else memory


# name -> (build, outcome of the meta-device check, words its message must hold)
META_MODELS = {
    "mask-on-constructor-device": (MaskOnConstructorDevice, "failed",
                                   ["torch.ones(..., device=device(type='cpu'))", "put a tensor on cpu",
                                    "not on the expected device"]),
    "source-mask-cpu": (SourceMaskToCpu, "failed", ["tensor.cpu() on a meta tensor", "put a tensor on cpu",
                                                    "Cannot copy out of meta tensor"]),
    "data-dependent-item": (DataDependentLength, "skipped", ["Tensor.item() cannot be called on meta tensors",
                                                             "in decode", "other than a tensor's device"]),
}


@hookimpl
def register_implementations(register):
    for name, (build, _, _) in META_MODELS.items():
        register(Implementation(name=f"meta-{name}", build=build, output="logits", summary=build.__doc__ or name,
                                source="tests/meta_device_models.py"))
