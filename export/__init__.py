"""ONNX export of a conforming model, with equivalence proven by onnxruntime."""
