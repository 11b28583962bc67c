"""Serving a packed model (`bertfuse convert --packed`): per request, the host packs the real
tokens of every row (padding anywhere) and the encoder runs on those tokens only.

Shapes change with every request's token count, so there is no CUDA graph here; inputs go
in with IO binding and ORT's arena serves the outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from bertfuse.errors import BertfuseError
from bertfuse.passes.packing import PACKED_INPUTS, pack_request
from bertfuse.runtime.session import RequestError, _check_range, model_facts


class PackedSession:
    def __init__(self, model: str | onnx.ModelProto, device: str = "cuda",
                 provider_options: dict | None = None) -> None:
        import onnxruntime as ort

        proto = onnx.load(model, load_external_data=False) if isinstance(model, str) else model
        self.facts = model_facts(proto)
        if not set(PACKED_INPUTS) <= set(self.facts.inputs):
            raise BertfuseError("not a packed model: convert it with --packed")
        if device != "cuda":
            raise BertfuseError("packed models run on CUDA only (ORT has no CPU kernels for "
                                "PackedAttention/RestorePadding)")
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        data = model if isinstance(model, str) else model.SerializeToString()
        self.session = ort.InferenceSession(
            data, opts, providers=[("CUDAExecutionProvider", provider_options or {})])

    def run(self, input_ids: Any, input_mask: Any, segment_ids: Any = None,
            to_host: bool = True) -> dict[str, Any]:
        ids = np.asarray(input_ids)
        mask = np.asarray(input_mask)
        if ids.ndim != 2 or mask.shape != ids.shape or ids.dtype.kind not in "iu":
            raise RequestError("input_ids and input_mask must be integer [batch, seq] arrays")
        _check_range(ids, "input_ids", self.facts.vocab_size)
        _check_range(mask, "input_mask", 2)
        if not (mask != 0).any(axis=1).all():
            raise RequestError("every row needs at least one token (a row of mask zeros)")
        feeds = {"input_ids": ids.astype(np.int32, copy=False), **pack_request(mask)}
        if "segment_ids" in self.facts.inputs:
            segs = np.zeros_like(ids, np.int32) if segment_ids is None else \
                np.asarray(segment_ids).astype(np.int32, copy=False)
            _check_range(segs, "segment_ids", self.facts.type_vocab_size)
            feeds["segment_ids"] = segs
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name in self.facts.outputs:
            binding.bind_output(name, "cuda")
        self.session.run_with_iobinding(binding)
        values = binding.get_outputs()
        if not to_host:
            return dict(zip(self.facts.outputs, values))
        return {n: v.numpy() for n, v in zip(self.facts.outputs, values)}
