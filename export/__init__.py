"""Export of a conforming model, with equivalence proven by the runtime it targets.

``export.onnx``       forward(src, tgt) and the full-prefix generation graphs (onnxruntime)
``export.kv_cache``   incremental decoding with a key/value cache as ONNX inputs and outputs,
                      verified by whole greedy and beam searches in onnxruntime
``export.decoders``   the step decoders those verifications and the decoding benchmark run
``export.ctranslate2`` conversion to a CTranslate2 TransformerSpec (needs the ``ctranslate2`` extra)
"""

from .kv_cache import (
    CachedGeneration,
    DecodeCheck,
    OrtCachedDecoder,
    OrtPrefixDecoder,
    export_cached_generation,
    reference_twin,
    verify_cached_generation,
)
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
           "ort_greedy_decode", "resolve_model", "torch_greedy_decode", "verify", "verify_generation",
           "CachedGeneration", "DecodeCheck", "OrtCachedDecoder", "OrtPrefixDecoder", "export_cached_generation",
           "reference_twin", "verify_cached_generation"]
