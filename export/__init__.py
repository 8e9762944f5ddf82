"""Export of a conforming model, with equivalence proven by the runtime it targets.

``export.common``     what the targets share, public: errors, example inputs, the model to export
                      (``resolve_model``, ``reference_for``), the ONNX graph plumbing, ``DecodeCheck``
                      and ``Target``, the entry of ``TARGETS``
``export.onnx``       the target ``onnx``: forward(src, tgt) and the full-prefix generation graphs (onnxruntime)
``export.kv_cache``   its cached form: incremental decoding with a key/value cache as ONNX inputs and outputs,
                      verified by whole greedy and beam searches in onnxruntime
``export.ctranslate2`` the target ``ctranslate2``: a CTranslate2 TransformerSpec (needs the ``ctranslate2`` extra)
``export.decoders``   the step decoders those verifications and the decoding benchmark run

``TARGETS`` maps each target's name to its ``Target``; ``aiayn export --format`` offers exactly these
(docs/export.md, "Adding a target").
"""

from . import ctranslate2, onnx
from .common import NEVER, DecodeCheck, ExportError, Target, reference_for, resolve_model
from .kv_cache import (
    CachedGeneration,
    OrtCachedDecoder,
    OrtPrefixDecoder,
    export_cached_generation,
    verify_cached_generation,
)
from .onnx import (
    OPSET,
    GenerationCheck,
    Verification,
    export_generation,
    export_onnx,
    ort_greedy_decode,
    torch_greedy_decode,
    verify,
    verify_generation,
)

TARGETS: dict[str, Target] = {t.name: t for t in (onnx.TARGET, ctranslate2.TARGET)}
"""The export targets by name, in the order ``aiayn export --help`` lists them (the first is the default)."""

__all__ = ["OPSET", "NEVER", "ExportError", "GenerationCheck", "Verification", "export_generation", "export_onnx",
           "ort_greedy_decode", "resolve_model", "torch_greedy_decode", "verify", "verify_generation",
           "CachedGeneration", "DecodeCheck", "OrtCachedDecoder", "OrtPrefixDecoder", "export_cached_generation",
           "reference_for", "verify_cached_generation", "Target", "TARGETS"]
