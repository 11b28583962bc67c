"""bertfuse: TensorFlow BERT -> fused ONNX (ONNX Runtime contrib ops) for fast GPU serving.

Importing the package never imports TensorFlow: the converter loads it lazily, so passes,
runtime and benchmarks run on hosts that have only onnx + onnxruntime.
"""

__version__ = "0.1.0"
