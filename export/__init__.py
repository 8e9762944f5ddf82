"""ONNX export of a conforming model, with equivalence proven by onnxruntime (see export/onnx.py)."""

from .onnx import (
    OPSET,
    ExportError,
    GenerationCheck,
    Verification,
    export_generation,
    export_onnx,
    ort_greedy_decode,
    resolve_model,
    torch_greedy_decode,
    verify,
    verify_generation,
)

__all__ = ["OPSET", "ExportError", "GenerationCheck", "Verification", "export_generation", "export_onnx",
           "ort_greedy_decode", "resolve_model", "torch_greedy_decode", "verify", "verify_generation"]
