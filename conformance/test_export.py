"""export.onnx: the model exports with dynamic shapes and onnxruntime reproduces it on other shapes."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from aiayn_conformance.implementations import Implementation
from aiayn_conformance.spec.config import ModelConfig
from aiayn_conformance.spec.schema import parameter_count

from .helpers import shapes
from .helpers.harness import build_model, seeded, violation
from .helpers.inputs import shape_need

MISSING = [m for m in ("onnx", "onnxruntime", "onnxscript") if importlib.util.find_spec(m) is None]


# Exporting traces every layer and writes every weight: at the base model's sizes it takes longer than the rest of
# the audit, and tracing time grows with the layers traced. Above this many parameters the export runs on the
# audit's structure (h, its norm epsilon, tying and padding id) at a small width and vocabulary, with at most two
# layers per stack (a first and a last layer, which share their code with the layers between), which exercise the
# same code paths, unless the model refuses them.
EXPORT_AT_FULL_SIZE = 5_000_000


def structural_twin(config: ModelConfig) -> ModelConfig:
    """The audit's structure at a small size: d_k = 8, d_ff = 2 d_model, vocabularies of 64, N at most 2."""
    d_model = 8 * config.n_heads
    return config.replace(d_model=d_model, d_ff=2 * d_model, src_vocab=64, tgt_vocab=64,
                          n_layers=min(config.n_layers, 2))


def export_subject(impl: Implementation, config: ModelConfig) -> tuple[Any, ModelConfig, str]:
    """(the model to export, its configuration, how the messages name it)."""
    if parameter_count(config) > EXPORT_AT_FULL_SIZE:
        small = structural_twin(config)
        try:
            with seeded(0):
                built = impl.build(small)
            if isinstance(built, torch.nn.Module):
                return (built.eval(), small, f"the audit's structure at d_model {small.d_model}, d_ff {small.d_ff}, "
                        f"N {small.n_layers}, vocabularies of {small.tgt_vocab}")
        except Exception:  # built at the audit's sizes instead
            pass
    # On the CPU whatever --device says: the graph is the same on every device, and onnxruntime's outputs are
    # compared with the model's own on the CPU.
    return build_model(impl, config, place=False), config, "the audit configuration"


@pytest.mark.clause("export.onnx")
@pytest.mark.skipif(bool(MISSING), reason=f"the onnx extra is not installed (missing: {', '.join(MISSING)}); "
                                          "pip install 'aiayn-conformance[onnx]'")
def test_exports_and_onnxruntime_agrees(impl: Implementation, tmp_path: Path, config: ModelConfig) -> None:
    from aiayn_conformance.export import ExportError, export_onnx, verify

    contract = shapes.current()
    if contract is not None and not contract.complete:  # a finding of model.shape, not of the export
        pytest.skip(shape_need("the export is dynamic in the batch size and every length up to max_len"))
    model, cfg, at = export_subject(impl, config)
    path = tmp_path / f"{impl.name}.onnx"
    try:
        export_onnx(model, path, cfg)
        result = verify(path, model, cfg)
    except ExportError as exc:
        violation(measured=str(exc), expected="torch.onnx.export(dynamo=True) with dynamic batch and "
                  "lengths succeeds, onnx.checker accepts it and onnxruntime runs it",
                  call=f"export_onnx({impl.name}, {at}), verify on 4 other shapes",
                  hint="data-dependent Python control flow, tensors created without the input's device, or "
                       "operators without an ONNX export")
    if not result.ok:
        violation(measured=result.describe(), expected="onnxruntime equals PyTorch within 1e-4 at real "
                  "positions on shapes other than the export example", call=f"verify({impl.name})",
                  hint="a shape specialized at export time (size-1 example dimensions), or a fully masked row "
                       "that becomes NaN in onnxruntime")
