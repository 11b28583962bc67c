"""The padded session: preallocated IO buffers per shape bucket, IO binding, CUDA graphs.

    request [B, S] ─► validate ─► smallest bucket (b ≥ B, s ≥ S) ─► copy into its input buffers
                      (pad: mask 0) ─► replay the bucket's CUDA graph ─► outputs sliced [:B, :S]

Each bucket (buckets.Bucket) owns device buffers for every input and output, allocated once and
bound once with IO binding; with `cuda_graph=True` each bucket's run is captured as its own CUDA
graph and replayed: by bertfuse itself around ORT's run for a model on its op library
(graphs.py: no ORT Run() call per request), else by ONNX Runtime (`gpu_graph_id`). After
`warmup()` a request allocates no device memory. On the CPU a request runs at its own shape
through one ORT session (no buckets, no mask variants: what is fast there); `pad_to_buckets=True`
runs the bucket machinery on the CPU EP too, so CI exercises it. session.Session adds the packed
model on top.
"""

from __future__ import annotations

import threading
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np
import onnx

from bertfuse.io.inputs import shape_probe
from bertfuse.runtime.buckets import Bucket, BucketSpec
from bertfuse.runtime.device import (GATE, SessionMaker, ThreadClaim, device_memory_used,
                                     probe_output_dims)
from bertfuse.runtime.kernel_choice import choose, file_identity
from bertfuse.runtime.options import SessionOptions, session_options
from bertfuse.runtime.pinned import new_stream
from bertfuse.runtime.progress import check_progress, steps
from bertfuse.runtime.request_checks import (ClosedError, bucket_list, check_canonical,
                                             check_ranges, check_request, check_sizes,
                                             check_warmup, declared_output_dims, model_facts,
                                             select_outputs, servable_model, smallest,
                                             unmask_empty_rows, upper_bound)
from bertfuse.runtime.staging import FastStager
from bertfuse.runtime.variants import VariantPolicy, attention_mask_variant, has_own_attention
from bertfuse.optional import optional

R = TypeVar("R")


class PaddedSession:
    """`PaddedSession(model, SessionOptions(...))` or `PaddedSession(model, max_batch=8, ...)`,
    then `.run(input_ids, input_mask, segment_ids)`."""

    def __init__(self, model: str | onnx.ModelProto, options: SessionOptions | None = None,
                 **overrides: Any) -> None:
        """Arguments are checked before any work: a ConfigError names the first bad one."""
        ort = optional("onnxruntime", why="ONNX Runtime (cpu or gpu extra)")

        self._ort = ort
        self._closed = False
        self.options = opts = session_options(options, overrides)
        proto = servable_model(model)
        self.facts = model_facts(proto)
        check_canonical(self.facts)
        self.max_batch, self.max_seq = check_sizes(self.facts, opts.max_batch, opts.max_seq,
                                                   opts.batch_buckets, opts.seq_buckets)
        # The kernels this machine runs (runtime/kernel_choice.py): lowered here, not at convert.
        proto, self.kernels = choose(proto, opts.kernels, opts.device, self.max_seq,
                                     opts.provider_options, source=file_identity(model))
        self.batch_buckets = bucket_list(opts.batch_buckets, self.max_batch)
        self.seq_buckets = bucket_list(opts.seq_buckets, self.max_seq)
        self.device, self.validate, self.pad = opts.device, opts.validate, opts.pad
        self.pinned = opts.pinned and self.device == "cuda"  # page-locked host staging
        self.right_padded, self.variant_min_seq = opts.right_padded, opts.variant_min_seq
        self.variant_notes: dict[tuple[int, int, str], str] = {}
        self.fp16 = any(i.data_type == onnx.TensorProto.FLOAT16 for i in proto.graph.initializer)
        self.policy = VariantPolicy(opts.right_padded, opts.variant_min_seq, self.fp16,
                                    own_attention=has_own_attention(proto))
        self._lock = threading.Lock()
        self._buckets: dict[tuple[int, int], Bucket] = {}
        self._claim = ThreadClaim()  # the thread its CUDA graphs belong to
        self.stream = new_stream() if self.device == "cuda" and opts.own_stream \
            and self.pinned else None
        self._maker = SessionMaker(ort, self.device, opts.cuda_graph, self.stream,
                                   opts.provider_options, own_graphs=True,
                                   intra_op_threads=opts.intra_op_threads)
        self.graph_notes: dict[tuple[int, int, str], str] = {}  # buckets run uncaptured: why
        self.sessions = {"raw": self._maker.open(proto.SerializeToString())}
        if opts.variants and "input_mask" in self.facts.inputs:
            for mode in self.policy.modes_used(self.seq_buckets):
                variant = attention_mask_variant(proto, mode)
                if variant is not None:
                    self.sessions[mode] = self._maker.open(variant.SerializeToString())
        self.session = self.sessions["raw"]
        self._stager = FastStager.for_model(self.facts) \
            if self.device == "cuda" and self.pad and self._maker.kernels else None
        with GATE.capturing():
            output_dims = declared_output_dims(proto) or probe_output_dims(
                self.session, self.facts, self._maker.run_options(-1))
        # Per input, the first value out of range as uint32 (negatives wrap to >= 2**31).
        upper = np.array([min(upper_bound(self.facts, n) or 2**31, 2**31)
                          for n in self.facts.inputs], np.uint32)
        self._spec = BucketSpec(ort, self.device, self.facts, output_dims, self._maker,
                                self.pinned, self.stream, upper)

    @property
    def cuda_graph(self) -> bool:
        return self._maker.cuda_graph

    @cuda_graph.setter
    def cuda_graph(self, on: bool) -> None:
        self._maker.cuda_graph = on

    @property
    def fallback_reason(self) -> str:
        """Why CUDA graphs are off although asked for ('' when they are on)."""
        return self._maker.fallback_reason

    @property
    def fast_lane(self) -> bool:
        """Whether warm buckets take the native fast lane (staging.py)."""
        return self._stager is not None

    @property
    def buckets(self) -> Mapping[tuple[int, int], Bucket]:
        """The buckets made so far, by [batch, seq] (read-only)."""
        return MappingProxyType(self._buckets)

    def session_for(self, mask: Any, bucket: Bucket, batch: int, seq: int,
                    form: str | None = None) -> str:
        """The session (mask variant) that serves this request in this bucket; `form`: the
        mask's mask_mode when the caller knows it."""
        if len(self.sessions) == 1:
            return "raw"
        kind = self.policy.request_kind(mask, (bucket.batch, bucket.seq), (batch, seq), form)
        mode = self.policy.mode_for(kind, bucket.seq)
        return "raw" if mode not in self.sessions or mode in bucket.disabled else mode

    # -- buckets ----------------------------------------------------------------------------

    def bucket_for(self, batch: int, seq: int) -> tuple[int, int]:
        """The [batch, seq] a request runs at: its bucket, or its own shape unpadded."""
        if not self.pad:
            return batch, seq
        return smallest(self.batch_buckets, batch), smallest(self.seq_buckets, seq)

    def warmup(self, buckets: Sequence[tuple[int, int]] | None = None,
               progress: Any = None) -> list[tuple[int, int]]:
        """Allocates, binds and captures every bucket (or those serving the given [batch,
        seq] request shapes) up front; returns their [batch, seq]. Unpadded (the CPU), runs
        one request of each given shape (default: the largest, [max_batch, max_seq]), which
        grows ORT's memory arena once. `progress`: see runtime/progress.py."""
        check_progress(progress)
        shapes = None if buckets is None else check_warmup(buckets, self.max_batch, self.max_seq)
        with self._lock:
            self._require_open()
            self._claim.claim(self)
            if not self.pad:
                keys = [(self.max_batch, self.max_seq)] if shapes is None else shapes
            elif shapes is None:
                keys = [(b, s) for b in self.batch_buckets for s in self.seq_buckets]
            else:
                keys = [self.bucket_for(b, s) for b, s in shapes]
            keys = list(dict.fromkeys(keys))
            with steps(progress, len(keys), "warming up") as step:
                for key in keys:
                    if self.pad:
                        self.bucket(*key)
                    else:
                        self.session.run(None, shape_probe(self.facts.inputs, *key))
                    step(key)
        return keys

    def bucket(self, batch: int, seq: int) -> Bucket:
        """The bucket [batch, seq] (a bucket size pair), made on first use."""
        key = (batch, seq)
        if key in self._buckets:
            return self._buckets[key]
        with GATE.capturing():
            bucket = self._new_bucket(batch, seq)
        self._buckets[key] = bucket
        return bucket

    def _new_bucket(self, batch: int, seq: int) -> Bucket:
        bucket = Bucket.build(self._spec, self.sessions, batch, seq, len(self._buckets),
                              validate=self.validate, lane=self._stager is not None)
        self.graph_notes.update(bucket.graph_notes)
        self.variant_notes.update(bucket.variant_notes)
        return bucket

    def on_warm_bucket(self, key: tuple[int, int], fn: Callable[..., R | None],
                       *args: Any) -> R | None:
        """fn(bucket, *args) under the session's lock and the capture gate, where the bucket
        [key] is made; None where it is not (making it captures: the checked path does)."""
        with self._lock, GATE.running():
            self._require_open()
            bucket = self._buckets.get(key)
            if bucket is None:
                return None
            self._claim.claim(self)
            return fn(bucket, *args)

    # -- requests ---------------------------------------------------------------------------

    def run(self, input_ids: Any, input_mask: Any = None, segment_ids: Any = None,
            to_host: bool = True, outputs: Sequence[str] | None = None) -> dict[str, Any]:
        """Runs one request; returns {output name: array} sliced to the request's shape.

        Inputs are NumPy arrays (or anything np.asarray takes), or device arrays exposing
        __dlpack__ (CuPy, torch), which are copied device-to-device. `outputs` names the
        outputs to return (default all): a ranker that reads pooled_output alone does not
        pay for copying sequence_output to the host. With to_host=False the outputs stay on
        the device as ORT OrtValues of the bucket's shape (valid until the next call): slice
        them yourself with the returned 'batch'/'seq'."""
        self._require_open()
        names = select_outputs(self.facts.outputs, outputs)
        given = {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}
        if self._stager is not None:  # host arrays into a warm bucket: one native pass
            out = self._stager.serve(self, given, names, to_host)
            if out is not None:
                return out
        return self._serve(self.check(given), names, to_host)

    def _serve(self, arrays: dict[str, Any], names: list[str], to_host: bool) -> dict[str, Any]:
        """A checked request through its bucket (session.Session routes some elsewhere)."""
        batch, seq = arrays["input_ids"].shape
        if not self.pad:
            return self._run_unpadded(arrays, names, to_host, batch, seq)
        mask = arrays.get("input_mask")
        with self._lock, GATE.running():
            self._require_open()  # closed while this request waited for the lock
            self._claim.claim(self)
            key = self.bucket_for(batch, seq)
            if self.validate and key not in self._buckets:
                # A new bucket runs ORT to capture it: refuse bad values before that.
                check_ranges(arrays, self.facts, staged=True)
            bucket = self.bucket(*key)
            bucket.fill(arrays, batch, seq, self.validate)
            mode = self.session_for(mask, bucket, batch, seq)
            bucket.run(mode, self.sessions[mode])
            return bucket.results(names, to_host, batch, seq)

    def _run_unpadded(self, arrays: dict[str, Any], names: list[str], to_host: bool,
                      batch: int, seq: int) -> dict[str, Any]:
        """The request at its own shape, through the raw session (values already checked)."""
        feeds = shape_probe(self.facts.inputs, batch, seq)  # mask ones, segments zeros
        for name, value in arrays.items():
            feeds[name] = np.asarray(value, np.int32)
        with self._lock, GATE.running():
            self._require_open()
            got = self.session.run(names, feeds)
        if to_host:
            return dict(zip(names, got))
        return {"batch": batch, "seq": seq, **{n: self._ort.OrtValue.ortvalue_from_numpy(v)
                                               for n, v in zip(names, got)}}

    def replay_call(self, mask: np.ndarray) -> Callable[[], None]:
        """ORT's run alone (the graph replay) of the warm bucket and mask variant that a request
        with this [batch, seq] mask is served by: benchmarks time it apart from preparing
        the request."""
        self._require_open()
        mask = unmask_empty_rows(np.asarray(mask))  # as run() stages it
        batch, seq = mask.shape
        if not self.pad:
            feeds = shape_probe(self.facts.inputs, batch, seq)
            feeds.update({"input_mask": mask.astype(np.int32)} if "input_mask" in feeds else {})
            return lambda: self.session.run(None, feeds)
        bucket = self._buckets[self.bucket_for(batch, seq)]
        mode = self.session_for(mask, bucket, batch, seq)
        return bucket.replay_call(mode, self.sessions[mode])

    def check(self, given: dict[str, Any]) -> dict[str, Any]:
        """The request {role: array or None} checked as run() checks it (padded, host values
        are range-checked once staged: Bucket.fill; unpadded, here)."""
        return check_request(given, self.facts, self.max_batch, self.max_seq, self.validate,
                             staged_ranges=self.pad)

    def _require_open(self) -> None:
        if self._closed:
            raise ClosedError(f"this {type(self).__name__} is closed")

    def close(self) -> None:
        """Releases the ORT sessions, the buckets' buffers and bindings and their page-locked
        staging; later calls raise ClosedError. Idempotent. Waits for a running request. The
        memory is freed through the capture gate (a free during another thread's stream
        capture would break it), and not under the session's lock: a pool job waiting for
        that lock inside the gate would wait for us forever."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for bucket in self._buckets.values():  # graphs before the memory they record
                bucket.release_graphs()
            held = [self._buckets, self.sessions]  # bindings and buffers first, then sessions
            self._buckets, self.sessions, self.session = {}, {}, None
        with GATE.capturing():
            while held:
                held.pop(0).clear()

    def __enter__(self) -> "PaddedSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def device_memory_used(self) -> int | None:
        """Bytes in use on the device (cudaMemGetInfo), or None off the GPU."""
        return device_memory_used(self.device)
