"""Model repositories for other servers: triton (Triton Inference Server's onnxruntime
backend: config.pbtxt + a copy of the model)."""
