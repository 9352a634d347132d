"""Random-graph tests: Hypothesis draws small ONNX networks; fused must match onnxruntime and unfused."""
