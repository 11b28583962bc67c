"""Contracts and NumPy references of the ONNX Runtime contrib ops (domain com.microsoft)
the fusion passes emit: Attention, SkipLayerNormalization, EmbedLayerNormalization, the GELU
family, LayerNormalization, PackedAttention and RestorePadding (README: ../README.md)."""
