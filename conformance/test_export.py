"""export.onnx: the model exports with dynamic shapes and onnxruntime reproduces it on other shapes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from aiayn_conformance.implementations import Implementation
from aiayn_conformance.spec.config import ModelConfig

from .helpers import shapes
from .helpers.harness import build_model, violation
from .helpers.inputs import shape_need

MISSING = [m for m in ("onnx", "onnxruntime", "onnxscript") if importlib.util.find_spec(m) is None]


@pytest.mark.clause("export.onnx")
@pytest.mark.skipif(bool(MISSING), reason=f"the onnx extra is not installed (missing: {', '.join(MISSING)}); "
                                          "pip install 'aiayn-conformance[onnx]'")
def test_exports_and_onnxruntime_agrees(impl: Implementation, tmp_path: Path, config: ModelConfig) -> None:
    from aiayn_conformance.export import ExportError, export_onnx, verify

    contract = shapes.current()
    if contract is not None and not contract.complete:  # a finding of model.shape, not of the export
        pytest.skip(shape_need("the export is dynamic in the batch size and every length up to max_len"))
    model = build_model(impl, config)
    path = tmp_path / f"{impl.name}.onnx"
    try:
        export_onnx(model, path, config)
        result = verify(path, model, config)
    except ExportError as exc:
        violation(measured=str(exc), expected="torch.onnx.export(dynamo=True) with dynamic batch and "
                  "lengths succeeds, onnx.checker accepts it and onnxruntime runs it",
                  call=f"export_onnx({impl.name}, tiny config), verify on 4 other shapes",
                  hint="data-dependent Python control flow, tensors created without the input's device, or "
                       "operators without an ONNX export")
    if not result.ok:
        violation(measured=result.describe(), expected="onnxruntime equals PyTorch within 1e-4 at real "
                  "positions on shapes other than the export example", call=f"verify({impl.name})",
                  hint="a shape specialized at export time (size-1 example dimensions), or a fully masked row "
                       "that becomes NaN in onnxruntime")
