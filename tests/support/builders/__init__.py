"""Model builders for the tests: tiny ONNX graphs in tf2onnx's shapes (onnx_graphs) and tiny
TF BERTs in every source form bertfuse reads (tf_models; TensorFlow loads on first use)."""
