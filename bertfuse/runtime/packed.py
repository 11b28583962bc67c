"""Serving a packed model (`bertfuse convert --packed`): the encoder runs on the real tokens of
a request only, with fixed shapes per bucket so every bucket replays its own CUDA graph.

    request [b, s] + mask ─► bucket [B, S] (b ≤ B, s ≤ S) ─► token bucket T ≥ real tokens
        ─► host packs token_index / token_offset / cumulative lengths (filler sequences pad the
           token count up to T) ─► one host->device copy ─► replay the (B, S, T) graph
        ─► sequence_output[:b, :s], pooled_output[:b]

A [B, S] bucket has `token_steps` token buckets (T in equal steps up to B x S), so a request
pays for at most one step of filler tokens. Filler tokens sit in rows past the request's
batch, each row a short sequence of its own: PackedAttention and RestorePadding see only
well-formed sequences, and nothing in the outputs is left uninitialised. Outputs at padded
positions are zero (RestorePadding), unlike the padded model; compare valid positions only.
PackedAttention and RestorePadding have CUDA kernels only, so this runs on the GPU.

The device-packed form (`--packed --ops bertfuse`, passes/device_packing.py) packs on the
device: the host stages the padded ids, segments and mask (the same one copy) and packs
nothing; each (B, S, T) bucket binds a `token_bucket` device buffer of T int32, allocated once,
whose shape alone tells PackTokens the token count (T in equal steps up to B x S, no filler rows).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import onnx

from bertfuse.errors import BertfuseError
from bertfuse.ops.packing_layout import (PACKED_INPUTS, PackedShape, capture_mask,
                                     choose_device_shape, choose_shape, device_shapes,
                                     pack_into, packed_shapes)
from bertfuse.runtime.device import GATE, SessionMaker, ThreadClaim, fetch, replay, staging, \
    upload
from bertfuse.runtime.options import SessionOptions, session_options
from bertfuse.runtime.pinned import new_stream
from bertfuse.runtime.progress import check_progress, steps
from bertfuse.runtime.request_checks import (ClosedError, RequestError, bucket_list,
                                             check_request, check_sizes, check_warmup,
                                             model_facts, select_outputs, servable_model,
                                             smallest)
from bertfuse.optional import optional

_capture_mask = capture_mask  # its old name here
_ALIGN = 16  # int32 elements: every input starts 64-byte aligned in the shared buffer
TOKEN_BUCKET = "token_bucket"  # the device-packed form's input: only its length T is read


@dataclass
class _PackedBucket:
    shape: PackedShape
    binding: Any
    run_options: Any  # replays this bucket's CUDA graph
    device: Any  # one int32 buffer holding every input
    host: np.ndarray  # its host staging copy
    views: dict[str, np.ndarray]  # per input, a view into `host`
    outputs: dict[str, Any]
    token_bucket: Any = None  # device-packed form: T int32 on the device, bound once


class PackedSession:
    """`PackedSession(packed_model, max_batch, max_seq).run(input_ids, input_mask, segment_ids)`."""

    def __init__(self, model: str | onnx.ModelProto, options: SessionOptions | None = None,
                 **overrides: Any) -> None:
        """The options a padded Session takes; the packed path reads the sizes, buckets,
        token_steps, cuda_graph, provider_options, validate, pinned and own_stream."""
        ort = optional("onnxruntime", why="ONNX Runtime (cpu or gpu extra)")

        self._ort = ort
        self._closed = False
        opts = session_options(options, overrides)
        proto = servable_model(model)
        self.facts = model_facts(proto)
        self.device_packed = is_device_packed(self.facts.inputs)
        if not self.device_packed and not set(PACKED_INPUTS) <= set(self.facts.inputs):
            raise BertfuseError("not a packed model: convert it with --packed")
        if opts.device != "cuda":
            raise BertfuseError("packed models run on CUDA only (ORT has no CPU kernels for "
                                "PackedAttention/RestorePadding)")
        # Requests carry a mask like the padded model's; the packed model has none.
        self._request_facts = dataclasses.replace(
            self.facts, inputs=["input_ids", "input_mask"]
            + (["segment_ids"] if "segment_ids" in self.facts.inputs else []))
        max_batch, max_seq = check_sizes(self.facts, opts.max_batch, opts.max_seq,
                                         opts.batch_buckets, opts.seq_buckets)
        self.max_batch, self.max_seq, self.validate = max_batch, max_seq, opts.validate
        self.batch_buckets = bucket_list(opts.batch_buckets, max_batch)
        self.seq_buckets = bucket_list(opts.seq_buckets, max_seq)
        self.token_steps = opts.token_steps
        self.pinned = opts.pinned
        self.stream = new_stream() if opts.own_stream and opts.pinned else None
        self._data = proto.SerializeToString() if proto is model else os.fspath(model)
        self._maker = SessionMaker(ort, "cuda", opts.cuda_graph, self.stream,
                                   opts.provider_options)
        self.session = self._maker.open(self._data)
        self._lock = threading.Lock()
        self._claim = ThreadClaim()  # the thread its CUDA graphs belong to
        self._buckets: dict[PackedShape, _PackedBucket] = {}
        self._shapes: dict[tuple[int, int], list[PackedShape]] = {}

    @property
    def cuda_graph(self) -> bool:
        return self._maker.cuda_graph

    @property
    def fallback_reason(self) -> str:
        return self._maker.fallback_reason

    # -- buckets ----------------------------------------------------------------------------

    def shapes_for(self, batch: int, seq: int) -> list[PackedShape]:
        b, s = smallest(self.batch_buckets, batch), smallest(self.seq_buckets, seq)
        if (b, s) not in self._shapes:
            shapes = device_shapes if self.device_packed else packed_shapes
            self._shapes[(b, s)] = shapes(b, s, self.token_steps)
        return self._shapes[(b, s)]

    def shape_for(self, batch: int, seq: int, tokens: int) -> PackedShape:
        """The token bucket a request of `tokens` kept tokens in [batch, seq] lands in."""
        shapes = self.shapes_for(batch, seq)
        if self.device_packed:
            return choose_device_shape(shapes, tokens)
        return choose_shape(shapes, batch, tokens)

    def warmup(self, buckets: Sequence[tuple[int, int]] | None = None,
               progress: Any = None) -> None:
        """Captures every token bucket of the given [batch, seq] buckets (default: all).
        `progress`: see runtime/progress.py (one step per [batch, seq] bucket)."""
        check_progress(progress)
        shapes = None if buckets is None else check_warmup(buckets, self.max_batch, self.max_seq)
        with self._lock:
            self._require_open()
            self._claim.claim(self)
            every = [(b, s) for b in self.batch_buckets for s in self.seq_buckets]
            keys = every if shapes is None else shapes
            with steps(progress, len(keys), "capturing packed buckets") as step:
                for b, s in keys:
                    for shape in self.shapes_for(b, s):
                        self._bucket(shape)
                    step((b, s))

    def _require_open(self) -> None:
        if self._closed:
            raise ClosedError("this PackedSession is closed")

    def close(self) -> None:
        """Releases the ORT session and every token bucket's buffers (device and
        page-locked host); later calls raise ClosedError. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            held = [self._buckets, self.session]
            self._buckets, self._shapes, self.session = {}, {}, None
        with GATE.capturing():  # frees device memory: never during another's capture
            held[0].clear()
            del held[:]  # as Session.close: the gate is taken after the lock is let go

    def __enter__(self) -> "PackedSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _layout(self, shape: PackedShape) -> dict[str, tuple[int, tuple[int, ...]]]:
        return input_layout(self.facts.inputs, shape)

    def _bucket(self, shape: PackedShape) -> _PackedBucket:
        if shape in self._buckets:
            return self._buckets[shape]
        with GATE.capturing():
            bucket = self._new_bucket(shape)
        self._buckets[shape] = bucket
        return bucket

    def _new_bucket(self, shape: PackedShape) -> _PackedBucket:
        ort = self._ort
        layout = self._layout(shape)
        total = max(at + int(np.prod(dims)) for at, dims in layout.values())
        host = staging((-(-total // _ALIGN) * _ALIGN,), self.pinned)
        views = {n: host[at:at + int(np.prod(d))].reshape(d) for n, (at, d) in layout.items()}
        self._stage(views, {"input_ids": np.zeros((shape.batch, shape.seq), np.int32),
                            "input_mask": capture_mask(shape)}, shape)
        device = ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)
        binding = self.session.io_binding()
        for name, (at, dims) in layout.items():
            binding.bind_input(name, "cuda", 0, np.int32, list(dims), device.data_ptr() + at * 4)
        token_bucket = None
        if self.device_packed:
            token_bucket = ort.OrtValue.ortvalue_from_numpy(
                np.zeros(shape.tokens, np.int32), "cuda", 0)
            binding.bind_ortvalue_input(TOKEN_BUCKET, token_bucket)
        # Output shapes from one uncaptured run (gpu_graph_id -1), then fixed buffers.
        for name in self.facts.outputs:
            binding.bind_output(name, "cuda")
        self.session.run_with_iobinding(binding, self._maker.run_options(-1))
        out_shapes = [v.shape() for v in binding.get_outputs()]
        binding.clear_binding_outputs()
        outputs = {}
        for name, dims in zip(self.facts.outputs, out_shapes):
            outputs[name] = ort.OrtValue.ortvalue_from_shape_and_type(dims, np.float32, "cuda", 0)
            binding.bind_ortvalue_output(name, outputs[name])
        graph_id = len(self._buckets)
        bucket = _PackedBucket(shape, binding, self._maker.run_options(graph_id), device, host,
                               views, outputs, token_bucket)
        try:
            for _ in range(2):  # the first runs of a graph id capture it
                self.session.run_with_iobinding(binding, bucket.run_options)
        except Exception as exc:
            if not self.cuda_graph:
                raise
            self._maker.graph_off(exc)  # capture impossible: plain IO binding from here on
            self.session = self._maker.open(self._data)
            self._buckets.clear()
            return self._new_bucket(shape)
        return bucket

    def replay_call(self, mask: np.ndarray) -> Callable[[], None]:
        """ORT's run alone (the graph replay) of the warm token bucket that a request with
        this mask lands in: benchmarks time it apart from packing the request."""
        batch, seq = mask.shape
        shape = self.shape_for(batch, seq, int(np.count_nonzero(mask)))
        bucket = self._buckets[shape]
        return lambda: replay(self.session, bucket.binding, bucket.run_options)

    # -- requests ---------------------------------------------------------------------------

    @staticmethod
    def _stage(views: dict[str, np.ndarray], arrays: dict[str, np.ndarray],
               shape: PackedShape) -> None:
        b, s = arrays["input_ids"].shape
        for name in ("input_ids", "segment_ids"):
            if name in views:
                views[name].fill(0)
                if name in arrays:
                    views[name][:b, :s] = arrays[name]
        if "input_mask" in views:  # device-packed: PackTokens packs the mask on the device
            views["input_mask"].fill(0)
            views["input_mask"][:b, :s] = arrays["input_mask"]
            return
        pack_into(arrays["input_mask"], shape, out=views)

    def run(self, input_ids: Any, input_mask: Any, segment_ids: Any = None,
            to_host: bool = True, outputs: Sequence[str] | None = None) -> dict[str, Any]:
        """Runs one request; returns {output name: array} sliced to [batch(, seq)], for the
        `outputs` named (default all).

        With to_host=False the outputs stay on the device as the bucket's OrtValues (rows
        past the batch are filler), valid until the next call."""
        self._require_open()
        names = select_outputs(self.facts.outputs, outputs)
        given = {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}
        arrays = check_request(given, self._request_facts, self.max_batch, self.max_seq,
                               self.validate)
        mask = arrays.get("input_mask")
        if not isinstance(mask, np.ndarray) or not isinstance(arrays["input_ids"], np.ndarray):
            raise RequestError("the packed path takes host (NumPy) arrays with an input_mask")
        # An all-masked row came back unmasked (unmask_empty_rows): packed, it keeps a token.
        return self.run_checked(arrays, to_host, names)

    def run_checked(self, arrays: dict[str, np.ndarray], to_host: bool = True,
                    outputs: Sequence[str] | None = None,
                    tokens: int | None = None) -> dict[str, Any]:
        """run() for arrays already checked (check_request with value ranges, every row
        keeping a token) and output names already selected: Session routes requests here,
        with the mask's kept-token count when it has it."""
        names = list(self.facts.outputs) if outputs is None else outputs
        mask = arrays["input_mask"]
        batch, seq = mask.shape
        if tokens is None:
            tokens = int(np.count_nonzero(mask))
        with self._lock, GATE.running():
            self._require_open()
            self._claim.claim(self)
            shape = self.shape_for(batch, seq, tokens)
            bucket = self._bucket(shape)
            self._stage(bucket.views, arrays, shape)
            upload(bucket.device, bucket.host, self.stream)
            replay(self.session, bucket.binding, bucket.run_options)
            if not to_host:
                return {"batch": batch, "seq": seq, "shape": shape,
                        **{n: bucket.outputs[n] for n in names}}
            return {n: fetch(bucket.outputs[n], batch, seq, len(bucket.outputs[n].shape()) == 3)
                    for n in names}


def is_device_packed(inputs: Sequence[str]) -> bool:
    """Whether a packed model's inputs are the device-packed form's (a token_bucket input)."""
    return TOKEN_BUCKET in inputs


def input_layout(inputs: Sequence[str], shape: PackedShape
                 ) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Offset (in int32 elements) and shape of every model input in a bucket's shared buffer:
    one host->device copy per request. The device-packed form's token_bucket is not in it."""
    padded = (shape.batch, shape.seq)
    sizes = {"input_ids": padded, "segment_ids": padded, "input_mask": padded,
             "token_index": (shape.tokens,), "token_offset": (shape.rows, shape.seq),
             "cumulative_sequence_length": (shape.rows + 1,)}
    layout, at = {}, 0
    for name in inputs:
        if name == TOKEN_BUCKET:  # its own device buffer (_new_bucket): never copied
            continue
        layout[name] = (at, sizes[name])
        at += -(-int(np.prod(sizes[name])) // _ALIGN) * _ALIGN
    return layout
