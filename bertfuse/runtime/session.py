"""The padded session: preallocated IO buffers per shape bucket, IO binding, CUDA graphs.

    request [B, S] ─► validate ─► smallest bucket (b ≥ B, s ≥ S) ─► copy into its input buffers
                      (pad: mask 0) ─► replay the bucket's CUDA graph ─► outputs sliced [:B, :S]

Each bucket owns device buffers for every input and output, allocated once and bound once
with IO binding; with `cuda_graph=True` each bucket's run is captured as its own CUDA graph
(ONNX Runtime's `gpu_graph_id`) and replayed. After `warmup()` a request allocates no device
memory. On the CPU a request runs at its own shape through one ORT session (no buckets, no
mask variants: what is fast there); `pad_to_buckets=True` runs the bucket machinery on the
CPU EP too, so CI exercises it. router.Session adds the packed model on top.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import onnx

from bertfuse.io.inputs import shape_probe
from bertfuse.runtime.device import (GATE, SessionMaker, claim_thread, device_copy,
                                     device_memory_used, fetch, probe_output_dims, replay,
                                     staging, upload)
from bertfuse.runtime.kernels import choose, file_identity
from bertfuse.runtime.options import SessionOptions, session_options
from bertfuse.runtime.pinned import new_stream
from bertfuse.runtime.progress import check_progress, steps
from bertfuse.runtime.requests import (ClosedError, bucket_list, check_canonical, check_range,
                                       check_ranges, check_request, check_sizes, check_warmup,
                                       declared_output_dims, load_model, model_facts,
                                       select_outputs, smallest, unmask_empty_rows,
                                       upper_bound)
from bertfuse.runtime.staging import FastStager
from bertfuse.runtime.variants import VariantPolicy, attention_mask_variant, check_variants, \
    has_own_attention


@dataclass
class _Bucket:
    batch: int
    seq: int
    run_options: dict[str, Any]  # per mask variant (its own session and CUDA graph), made once
    bindings: dict[str, Any]
    packed: Any  # device [n_inputs, batch, seq] int32, bound as the inputs
    outputs: dict[str, Any]
    host: np.ndarray  # host staging for `packed`
    host_ptr: int  # host's address, for the native staging (staging.py)
    disabled: set[str] = field(default_factory=set)  # variants that failed check_variants


class PaddedSession:
    """`PaddedSession(model, SessionOptions(...))` or `PaddedSession(model, max_batch=8, ...)`,
    then `.run(input_ids, input_mask, segment_ids)`."""

    def __init__(self, model: str | onnx.ModelProto, options: SessionOptions | None = None,
                 **overrides: Any) -> None:
        """Arguments are checked before any work: a ConfigError names the first bad one."""
        import onnxruntime as ort

        self._ort = ort
        self._closed = False
        self.options = opts = session_options(options, overrides)
        proto = load_model(model)
        self.facts = model_facts(proto)
        # Per input, the first value out of range as uint32 (negatives wrap to >= 2**31).
        self._upper = np.array([min(upper_bound(self.facts, n) or 2**31, 2**31)
                                for n in self.facts.inputs], np.uint32)
        check_canonical(self.facts)
        self.max_batch, self.max_seq = check_sizes(self.facts, opts.max_batch, opts.max_seq,
                                                   opts.batch_buckets, opts.seq_buckets)
        # The kernels this machine runs (runtime/kernels.py): lowered here, not at convert.
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
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._owner: int | None = None  # the thread its CUDA graphs belong to (claim_thread)
        self.stream = new_stream() if self.device == "cuda" and opts.own_stream \
            and self.pinned else None
        self._maker = SessionMaker(ort, self.device, opts.cuda_graph, self.stream,
                                   opts.provider_options)
        self.sessions = {"raw": self._maker.open(proto.SerializeToString())}
        if opts.variants and "input_mask" in self.facts.inputs:
            for mode in self.policy.modes_used(self.seq_buckets):
                variant = attention_mask_variant(proto, mode)
                if variant is not None:
                    self.sessions[mode] = self._maker.open(variant.SerializeToString())
        self.session = self.sessions["raw"]
        self._stager = FastStager.for_session(self)
        with GATE.capturing():
            self._output_dims = declared_output_dims(proto) or probe_output_dims(
                self.session, self.facts, self._maker.run_options(-1))

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

    def _session_for(self, mask: Any, bucket: _Bucket, batch: int, seq: int,
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
            claim_thread(self)
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
                        self._bucket(*key)
                    else:
                        self.session.run(None, shape_probe(self.facts.inputs, *key))
                    step(key)
        return keys

    def _bucket(self, batch: int, seq: int) -> _Bucket:
        key = (batch, seq)
        if key in self._buckets:
            return self._buckets[key]
        with GATE.capturing():
            bucket = self._new_bucket(batch, seq)
        self._buckets[key] = bucket
        return bucket

    def _new_bucket(self, batch: int, seq: int) -> _Bucket:
        ort = self._ort
        dev = "cuda" if self.device == "cuda" else "cpu"
        names = self.facts.inputs
        # All inputs live in one [n_inputs, batch, seq] buffer: one host->device copy a request.
        host = staging((len(names), batch, seq), self.pinned)
        packed = ort.OrtValue.ortvalue_from_numpy(host, dev, 0)
        outputs = {}
        for name in self.facts.outputs:
            shape = [batch if d == "B" else seq if d == "S" else d for d in self._output_dims[name]]
            outputs[name] = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, dev, 0)
        bindings, options = {}, {}
        graph_id = len(self._buckets)  # one graph id per bucket, in each variant's session
        for mode, sess in self.sessions.items():
            binding = sess.io_binding()
            for i, name in enumerate(names):
                binding.bind_input(name, dev, 0, np.int32, [batch, seq],
                                   packed.data_ptr() + i * batch * seq * 4)
            for name, value in outputs.items():
                binding.bind_ortvalue_output(name, value)
            bindings[mode] = binding
            # The first runs of a graph id capture it; run twice so capture is out of the way.
            if "input_mask" in names:
                host[names.index("input_mask")] = 1
            packed.update_inplace(host)
            ro = options[mode] = self._maker.run_options(graph_id)
            for _ in range(2):
                sess.run_with_iobinding(binding, ro)
        bucket = _Bucket(batch, seq, options, bindings, packed, outputs, host, host.ctypes.data)
        self._verify_variants(bucket)
        return bucket

    def _verify_variants(self, bucket: _Bucket) -> None:
        """Turns off, in this bucket, every mask variant that disagrees with the raw mask on
        a probe request (variants.check_variants); `variant_notes` keeps why."""
        modes = [m for m in self.sessions if m != "raw"]
        if not modes:
            return
        b, s = bucket.batch, bucket.seq

        def run(mode: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            self._fill(bucket, arrays, b, s)
            self.sessions[mode].run_with_iobinding(bucket.bindings[mode],
                                                   bucket.run_options[mode])
            return {n: v.numpy().astype(np.float64) for n, v in bucket.outputs.items()}

        for mode, why in check_variants(modes, b, s, self.facts.inputs, self.facts.vocab_size,
                                        run).items():
            bucket.disabled.add(mode)
            self.variant_notes[(b, s, mode)] = why

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
        return self._serve(self._check(given), names, to_host)

    def _serve(self, arrays: dict[str, Any], names: list[str], to_host: bool) -> dict[str, Any]:
        """A checked request through its bucket (router.Session routes some elsewhere)."""
        batch, seq = arrays["input_ids"].shape
        if not self.pad:
            return self._run_unpadded(arrays, names, to_host, batch, seq)
        mask = arrays.get("input_mask")
        with self._lock, GATE.running():
            self._require_open()  # closed while this request waited for the lock
            claim_thread(self)
            key = self.bucket_for(batch, seq)
            if self.validate and key not in self._buckets:
                # A new bucket runs ORT to capture it: refuse bad values before that.
                check_ranges(arrays, self.facts, staged=True)
            bucket = self._bucket(*key)
            mode = self._session_for(mask, bucket, batch, seq)
            self._fill(bucket, arrays, batch, seq)
            return self._replay(bucket, mode, names, to_host, batch, seq)

    def _replay(self, bucket: _Bucket, mode: str, names: list[str], to_host: bool, batch: int,
                seq: int) -> dict[str, Any]:
        """The staged bucket through its variant's graph; the outputs as run() returns them."""
        replay(self.sessions[mode], bucket.bindings[mode], bucket.run_options[mode])
        if not to_host:
            return {"batch": batch, "seq": seq, **{n: bucket.outputs[n] for n in names}}
        return {n: fetch(bucket.outputs[n], batch, seq, self._output_dims[n][1:2] == ("S",))
                for n in names}

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
        mode = self._session_for(mask, bucket, batch, seq)
        session, binding, options = self.sessions[mode], bucket.bindings[mode], \
            bucket.run_options[mode]
        return lambda: replay(session, binding, options)

    def _fill(self, bucket: _Bucket, arrays: dict[str, Any], batch: int, seq: int) -> None:
        host = bucket.host
        host.fill(0)
        device_inputs = []
        for i, name in enumerate(self.facts.inputs):
            src = arrays.get(name)
            if src is None:
                if name == "input_mask":
                    host[i, :batch, :seq] = 1
            elif isinstance(src, np.ndarray):
                host[i, :batch, :seq] = src
            else:
                device_inputs.append((i, src))
            if name == "input_mask":
                host[i, batch:, 0] = 1  # bucket rows past the batch: one key, never zero
        if self.validate:  # host inputs: one reduction over the staged buffer, all roles
            over = host.reshape(len(self.facts.inputs), -1).view(np.uint32).max(axis=1) \
                >= self._upper
            if over.any():
                name = self.facts.inputs[int(np.argmax(over))]
                check_range(arrays[name], name, upper_bound(self.facts, name))
        upload(bucket.packed, host, None if device_inputs else self.stream)
        for i, src in device_inputs:  # device arrays: copied on the device, not via the host
            device_copy(bucket.packed, i, src, batch, seq, self.facts.inputs[i] == "input_mask")

    def _check(self, given: dict[str, Any]) -> dict[str, Any]:
        # Padded, host values are range-checked once staged (_fill); unpadded, here.
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
