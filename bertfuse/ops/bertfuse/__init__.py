"""Contracts and NumPy references of bertfuse's own ops (domain ai.bertfuse, CUDA EP only,
implemented in kernels/): BertAttention, the Dense* GEMM-with-epilogue family and its FP8
forms, the device-packed PackTokens / PackedBertAttention / UnpackTokens, BertPooler and
BertEmbedLayerNorm."""
