"""A serving session: preallocated IO buffers per shape bucket, IO binding, CUDA graphs.

    request [B, S] ─► validate ─► smallest bucket (b ≥ B, s ≥ S) ─► copy into its input buffers
                      (pad: mask 0) ─► replay the bucket's CUDA graph ─► outputs sliced [:B, :S]

Each bucket owns device buffers for every input and output, allocated once and bound once
with IO binding; with `cuda_graph=True` each bucket's run is captured as its own CUDA graph
(ONNX Runtime's `gpu_graph_id`) and replayed. After `warmup()` a request allocates no device
memory. On the CPU EP the same API runs without graphs, so CI exercises it.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from bertfuse.errors import BertfuseError
from bertfuse.runtime.pinned import copy_to_device_async, copy_to_host, new_stream, pinned_empty
from bertfuse.runtime.pool import GATE
from bertfuse.runtime.requests import (ConfigError, ModelFacts, RequestError,  # noqa: F401
                                       check_flag, check_options, check_range, check_ranges,
                                       check_request, check_sizes, check_warmup, load_model,
                                       model_facts, select_outputs, unmask_empty_rows,
                                       upper_bound)
from bertfuse.runtime.variants import attention_mask_variant, mask_mode

ROLES = ("input_ids", "input_mask", "segment_ids")
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
DEFAULT_SEQ_BUCKETS = (32, 64, 128, 256, 512)
AUTO_KEYLEN_MIN_SEQ = 128
# A variant differing from the raw mask by more than this on a probe misreads the mask:
# genuine differences are kernel rounding (fp16 about 1e-2), a misread mask is O(1).
VARIANT_TOLERANCE = 5e-2  # right_padded='auto': [3B+2] below this bucket length, [B] from it


class ThreadError(BertfuseError, RuntimeError):
    """A session with CUDA graphs called from a second thread."""


class ClosedError(BertfuseError, RuntimeError):
    """A session used after close()."""


def claim_thread(session: Any) -> None:
    """ONNX Runtime's CUDA EP keeps CUDA graphs per thread and rules out Run() from several
    threads with graphs on: a second thread would capture every graph again, and its capture
    can break another thread's run. So a session with graphs serves the first thread that
    runs or warms it; SessionPool serves many threads with one replica per worker thread."""
    if not session.cuda_graph:
        return
    me = threading.get_ident()
    if session._owner is None:
        session._owner = me
    elif session._owner != me:
        raise ThreadError(f"this {type(session).__name__} captured its CUDA graphs on another "
                          "thread, and ONNX Runtime keeps graphs per thread: call it from that "
                          "thread only, or serve several threads with bertfuse.runtime.pool."
                          "SessionPool")


@dataclass
class _Bucket:
    batch: int
    seq: int
    run_options: dict[str, Any]  # per mask variant (its own session and CUDA graph), made once
    bindings: dict[str, Any]
    packed: Any  # device [n_inputs, batch, seq] int32, bound as the inputs
    outputs: dict[str, Any]
    host: np.ndarray  # host staging for `packed`
    disabled: set[str] = field(default_factory=set)  # variants that failed _verify_variants


class Session:
    """`Session(model, max_batch, max_seq).run(input_ids, input_mask, segment_ids)`."""

    def __init__(self, model: str | onnx.ModelProto, max_batch: int = 32,
                 max_seq: int | None = None,
                 batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
                 seq_buckets: Sequence[int] = DEFAULT_SEQ_BUCKETS, device: str = "cuda",
                 cuda_graph: bool = True, provider_options: Mapping[str, str] | None = None,
                 validate: bool = True, mask_variants: bool = True,
                 variant_min_seq: int = 0, packed_model: str | onnx.ModelProto | None = None,
                 pack_below_fill: float = 0.65, pinned: bool = True,
                 own_stream: bool = True, right_padded: str = "auto",
                 token_steps: int = 8) -> None:
        """max_seq None: the model's position table (512 where the model does not show it).
        Arguments are checked before any work: a ConfigError names the first bad one."""
        import onnxruntime as ort

        self._ort = ort
        self._closed = False
        if device not in ("cuda", "cpu"):
            raise ConfigError(f"device must be 'cuda' or 'cpu', not {device!r}")
        if right_padded not in ("auto", "keylen", "keyseq"):
            raise ConfigError("right_padded must be 'auto', 'keylen' or 'keyseq', not "
                              f"{right_padded!r}")
        check_options(provider_options, pack_below_fill, token_steps, variant_min_seq,
                      {"cuda_graph": cuda_graph, "validate": validate, "pinned": pinned,
                       "mask_variants": mask_variants, "own_stream": own_stream})
        proto = load_model(model)
        self.facts = model_facts(proto)
        # Per input, the first value out of range as uint32 (negatives wrap to >= 2**31).
        self._upper = np.array([min(upper_bound(self.facts, n) or 2**31, 2**31)
                                for n in self.facts.inputs], np.uint32)
        unknown = [n for n in self.facts.inputs if n not in ROLES]
        if unknown:
            raise BertfuseError(f"model inputs {unknown} are not bertfuse's canonical "
                                f"{list(ROLES)}; convert or optimize it with bertfuse first")
        max_batch, max_seq = check_sizes(self.facts, max_batch, max_seq, batch_buckets,
                                         seq_buckets)
        self.max_batch, self.max_seq = max_batch, max_seq
        self.batch_buckets = _buckets(batch_buckets, max_batch)
        self.seq_buckets = _buckets(seq_buckets, max_seq)
        # Low-fill requests can go to the packed form of the same model (CUDA only). Measured
        # (docs/benchmarks.md §4): packing pays below ~70% fill at 3 layers b20 s64 and below
        # ~85% at BERT-base b32 s128; full batches lose 9-11% packed.
        self.pack_below_fill = pack_below_fill
        self.packed = None
        if packed_model is not None:
            from bertfuse.runtime.packed import PackedSession

            self.packed = PackedSession(packed_model, max_batch, max_seq, batch_buckets,
                                        seq_buckets, token_steps, device=device,
                                        cuda_graph=cuda_graph, provider_options=provider_options,
                                        validate=validate, pinned=pinned)
        self.device = device
        self.validate = validate
        self.pinned = pinned and device == "cuda"  # page-locked host staging for the copy
        # Rows that are right-padded (or full) can use a narrower mask form with faster
        # attention kernels, each provably equal to the raw mask for them (variants.py):
        # 'keylen' ([B]: cuDNN flash attention), 'keyseq' ([3B+2]: cutlass memory-efficient
        # attention). Measured on the H200 (docs/benchmarks.md §3): keyseq is fastest below
        # seq 128 (243 -> 229 us GPU at 3 layers b20 s64), cuDNN's keylen from 128 on, so
        # 'auto' splits there. variant_min_seq keeps the raw mask below a bucket length.
        self.right_padded = right_padded
        self.variant_min_seq = variant_min_seq
        self.variant_notes: dict[tuple[int, int, str], str] = {}
        # [3B+2] selects cutlass attention in fp16 only; fp32 would take the unfused path.
        self.fp16 = any(i.data_type == onnx.TensorProto.FLOAT16 for i in proto.graph.initializer)
        self._lock = threading.Lock()
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._owner: int | None = None  # the thread its CUDA graphs belong to (claim_thread)

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if device == "cuda":
            self.stream = new_stream() if own_stream and self.pinned else None
            providers: list = cuda_providers(ort, cuda_graph, self.stream, provider_options)
        else:
            cuda_graph = False
            self.stream = None
            providers = ["CPUExecutionProvider"]
        self.cuda_graph = cuda_graph
        self.fallback_reason = ""
        self._opts, self._providers = opts, providers
        self.sessions = {"raw": self._make_session(proto)}
        if mask_variants and "input_mask" in self.facts.inputs:
            used = {self._variant_for(kind, s) for kind in ("keylen", "nomask")
                    for s in self.seq_buckets if s >= variant_min_seq}
            for mode in sorted(used - {"raw"}):
                variant = attention_mask_variant(proto, mode)
                if variant is not None:
                    self.sessions[mode] = self._make_session(variant)
        self.session = self.sessions["raw"]
        with GATE.capturing():
            self._output_dims = _declared_output_dims(proto) or self._probe_output_dims()

    def _session_for(self, mask: Any, bucket: _Bucket, batch: int, seq: int) -> str:
        """The session (mask variant) that serves this request in this bucket."""
        if len(self.sessions) == 1:
            return "raw"
        kind = "nomask" if mask is None else \
            mask_mode(mask) if isinstance(mask, np.ndarray) else "raw"
        if kind == "nomask" and (bucket.batch, bucket.seq) != (batch, seq):
            kind = "keylen"  # bucket padding adds padded keys to every row: right padding
        mode = self._variant_for(kind, bucket.seq)
        return "raw" if mode not in self.sessions or mode in bucket.disabled else mode

    def _variant_for(self, kind: str, bucket_seq: int) -> str:
        """The session for a request whose mask is of `kind` (mask_mode) in a bucket."""
        if kind == "raw" or bucket_seq < self.variant_min_seq:
            return "raw"
        if self.right_padded == "auto":
            if bucket_seq < AUTO_KEYLEN_MIN_SEQ:  # right-padded and full rows alike
                return "keyseq" if self.fp16 else "raw"
            return kind
        return self.right_padded if kind == "keylen" else kind

    def _make_session(self, proto: onnx.ModelProto):
        ort = self._ort
        data = proto.SerializeToString()
        with GATE.capturing():  # ORT allocates weights on the device: not during a capture
            try:
                return ort.InferenceSession(data, self._opts, providers=self._providers)
            except Exception as exc:
                if not self.cuda_graph:
                    raise
                # Capture needs every node on the GPU; fall back to plain IO binding.
                self.cuda_graph = False
                self.fallback_reason = str(exc).splitlines()[0][:200]
                name, opts = self._providers[0]
                self._providers = [(name, {**opts, "enable_cuda_graph": "0"})]
                return ort.InferenceSession(data, self._opts, providers=self._providers)

    # -- buckets ----------------------------------------------------------------------------

    def bucket_for(self, batch: int, seq: int) -> tuple[int, int]:
        return smallest(self.batch_buckets, batch), smallest(self.seq_buckets, seq)

    def warmup(self, buckets: Sequence[tuple[int, int]] | None = None,
               packed: bool = False) -> None:
        """Allocates, binds and captures every bucket (or those serving the given [batch,
        seq] request shapes) up front. With packed=True also the packed model's token
        buckets for them (8 graphs per bucket, so by default they are captured on first use
        instead)."""
        check_flag("packed", packed)
        shapes = None if buckets is None else check_warmup(buckets, self.max_batch, self.max_seq)
        with self._lock:
            self._require_open()
            claim_thread(self)
            keys = [(b, s) for b in self.batch_buckets for s in self.seq_buckets] \
                if shapes is None else [self.bucket_for(b, s) for b, s in shapes]
            for key in dict.fromkeys(keys):
                self._bucket(*key)
        if packed and self.packed is not None:
            self.packed.warmup(keys)

    def _probe_output_dims(self) -> dict[str, tuple[str | int, ...]]:
        """Output shapes as ('B', 'S', 768)-style templates, from one tiny CPU-side run."""
        dims = {}
        b, s = 2, 3
        feeds = {n: np.zeros((b, s), np.int32) for n in self.facts.inputs}
        feeds.get("input_mask", np.zeros(0))[...] = 1
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name in self.facts.outputs:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding, self._run_options(-1))
        for name, value in zip(self.facts.outputs, binding.copy_outputs_to_cpu()):
            dims[name] = tuple("B" if i == 0 and d == b else "S" if i == 1 and d == s else d
                               for i, d in enumerate(value.shape))
        return dims

    def _run_options(self, graph_id: int):
        return run_options(self._ort, self.cuda_graph, graph_id)

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
            ro = options[mode] = self._run_options(graph_id)
            for _ in range(2):
                sess.run_with_iobinding(binding, ro)
        bucket = _Bucket(batch, seq, options, bindings, packed, outputs, host)
        self._verify_variants(bucket)
        return bucket

    def _verify_variants(self, bucket: _Bucket) -> None:
        """Every mask variant must match the raw mask on a probe request in this bucket
        (right-padded; all ones for 'nomask'). ORT picks attention kernels per shape,
        precision and GPU, and a kernel that misreads the narrower mask form (seen on the
        H200: [3B+2] with fp32 CUDA) must never serve requests: such a variant is turned off
        for the bucket and the reason kept in `variant_notes`."""
        modes = [m for m in self.sessions if m != "raw"]
        if not modes:
            return
        b, s = bucket.batch, bucket.seq
        rng = np.random.default_rng(b * 1000 + s)
        lengths = rng.integers(1, max(s, 2), b)  # every row padded (when s > 1) ...
        lengths[1:2] = s  # ... but the second, full
        ids = rng.integers(0, min(self.facts.vocab_size or 100, 30000), (b, s)).astype(np.int32)
        for mode in modes:
            keep = np.arange(s)[None, :] < (np.full((b, 1), s) if mode == "nomask"
                                            else lengths[:, None])
            arrays = {"input_ids": ids, "input_mask": keep.astype(np.int32),
                      "segment_ids": np.zeros((b, s), np.int32)}
            arrays = {k: v for k, v in arrays.items() if k in self.facts.inputs}
            got = {}
            for run_mode in ("raw", mode):
                self._fill(bucket, arrays, b, s)
                self.sessions[run_mode].run_with_iobinding(bucket.bindings[run_mode],
                                                           bucket.run_options[run_mode])
                got[run_mode] = {n: v.numpy().astype(np.float64) for n, v in
                                 bucket.outputs.items()}
            worst = 0.0
            for name, want in got["raw"].items():
                diff = np.abs(got[mode][name] - want)
                worst = max(worst, float((diff[keep] if diff.ndim == 3 else diff).max()))
            if not worst <= VARIANT_TOLERANCE:  # NaN too
                bucket.disabled.add(mode)
                self.variant_notes[(b, s, mode)] = f"max |diff| {worst:.3g} vs the raw mask"

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
        arrays = self._check(given)
        batch, seq = arrays["input_ids"].shape
        mask = arrays.get("input_mask")
        tokens = tokens_to_pack(mask, self.pack_below_fill) if self.packed is not None else None
        if tokens is not None and all(isinstance(a, np.ndarray) for a in arrays.values()):
            if self.validate:  # the packed path stages them otherwise: check them now
                check_ranges(arrays, self.facts, staged=True)
            out = self.packed.run_checked(arrays, to_host=to_host, outputs=names, tokens=tokens)
            return out if to_host else {"batch": batch, "seq": seq, **out}
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
            self.sessions[mode].run_with_iobinding(bucket.bindings[mode],
                                                   bucket.run_options[mode])
            if not to_host:
                return {"batch": batch, "seq": seq, **{n: bucket.outputs[n] for n in names}}
            return {n: fetch(bucket.outputs[n], batch, seq, self._output_dims[n][1:2] == ("S",))
                    for n in names}

    def replay_call(self, mask: np.ndarray) -> Callable[[], None]:
        """ORT's run alone (the graph replay) of the warm bucket and mask variant that a request
        with this [batch, seq] mask is served by: benchmarks time it apart from preparing
        the request."""
        self._require_open()
        mask = unmask_empty_rows(np.asarray(mask))  # as run() stages it
        batch, seq = mask.shape
        bucket = self._buckets[self.bucket_for(batch, seq)]
        mode = self._session_for(mask, bucket, batch, seq)
        session, binding, options = self.sessions[mode], bucket.bindings[mode], \
            bucket.run_options[mode]
        return lambda: session.run_with_iobinding(binding, options)

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
            _device_copy(bucket.packed, i, src, batch, seq, self.facts.inputs[i] == "input_mask")

    def _check(self, given: dict[str, Any]) -> dict[str, Any]:
        return check_request(given, self.facts, self.max_batch, self.max_seq, self.validate,
                             staged_ranges=True)

    def _require_open(self) -> None:
        if self._closed:
            raise ClosedError(f"this {type(self).__name__} is closed")

    def close(self) -> None:
        """Releases the ORT sessions, the buckets' buffers and bindings, their page-locked
        staging and the packed session; later calls raise ClosedError. Idempotent. Waits
        for a running request. The memory is freed through the capture gate (a free during
        another thread's stream capture would break it), and not under the session's lock:
        a pool job waiting for that lock inside the gate would wait for us forever."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            held = [self._buckets, self.sessions]  # bindings and buffers first, then sessions
            self._buckets, self.sessions, self.session = {}, {}, None
        with GATE.capturing():
            while held:
                held.pop(0).clear()
        if self.packed is not None:
            self.packed.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def device_memory_used(self) -> int | None:
        """Bytes in use on the device (cudaMemGetInfo), or None off the GPU."""
        if self.device != "cuda":
            return None
        try:
            import cupy

            free, total = cupy.cuda.runtime.memGetInfo()
            return int(total - free)
        except Exception:
            return None


def cuda_providers(ort: Any, cuda_graph: bool, stream: int | None,
                   provider_options: Mapping[str, str] | None) -> list:
    """The CUDA EP as bertfuse runs it: CUDA graphs on or off, and on our own stream when
    there is one (the request's copy is queued on it ahead of the replay)."""
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise BertfuseError("device='cuda' needs onnxruntime-gpu (pip install 'bertfuse[gpu]'); "
                            f"this onnxruntime has {ort.get_available_providers()}")
    opts = {"enable_cuda_graph": "1" if cuda_graph else "0"}
    if stream is not None:
        opts["user_compute_stream"] = str(stream)
    return [("CUDAExecutionProvider", {**opts, **(provider_options or {})})]


def run_options(ort: Any, cuda_graph: bool, graph_id: int):
    """RunOptions replaying (or capturing) CUDA graph `graph_id`; -1 runs uncaptured."""
    ro = ort.RunOptions()
    if cuda_graph:
        ro.add_run_config_entry("gpu_graph_id", str(graph_id))
    return ro


def upload(device: Any, host: np.ndarray, stream: int | None) -> None:
    """host -> device: queued on `stream` (ORT's end-of-run sync covers it), else a
    synchronous copy."""
    if stream is not None:
        copy_to_device_async(device.data_ptr(), host, stream)
    else:
        device.update_inplace(host)


def smallest(buckets: Sequence[int], value: int) -> int:
    """The smallest bucket that holds `value` (buckets sorted, value within the last)."""
    return buckets[bisect.bisect_left(buckets, value)]


def staging(shape: tuple[int, ...], pinned: bool) -> np.ndarray:
    """A zeroed int32 host buffer for requests, page-locked when asked and possible."""
    host = pinned_empty(shape, np.int32) if pinned else None
    if host is None:
        return np.zeros(shape, np.int32)
    host.fill(0)
    return host


def fetch(value: Any, batch: int, seq: int, has_seq: bool) -> np.ndarray:
    """A bucket output's rows [:batch] (and positions [:seq] when has_seq) as a new host
    array. On the GPU only those rows cross the bus; on the CPU EP a copy of the slice."""
    if value.device_name() == "cuda":
        shape = value.shape()
        host = np.empty([batch] + list(shape[1:]), np.float32)
        if not copy_to_host(host, value.data_ptr()):
            host = value.numpy()[:batch]
    else:
        host = value.numpy()[:batch].copy()  # a view of the bucket's buffer otherwise
    return host[:, :seq] if has_seq else host


def tokens_to_pack(mask: Any, below_fill: float) -> int | None:
    """The request's kept-token count when it should be packed: its fill (kept tokens / all
    positions) is under `below_fill` and every row keeps a token. None otherwise, and for
    device-resident masks, which stay on the padded path. Full batches are turned away
    after one count."""
    if not isinstance(mask, np.ndarray):
        return None
    tokens = int(np.count_nonzero(mask))
    if tokens >= below_fill * mask.size or not mask.any(axis=1).all():
        return None
    return tokens


def _declared_output_dims(model: onnx.ModelProto) -> dict[str, tuple] | None:
    """('B', 'S', 768)-style templates from the declared output shapes, if all are known."""
    dims = {}
    for out in model.graph.output:
        shape = out.type.tensor_type.shape.dim
        template: list = []
        for i, d in enumerate(shape):
            if d.dim_value > 0:
                template.append(d.dim_value)
            elif d.dim_param and i == 0:
                template.append("B")
            elif d.dim_param and i == 1 and len(shape) == 3:
                template.append("S")
            else:
                return None
        if not template:
            return None
        dims[out.name] = tuple(template)
    return dims


def _buckets(values: Sequence[int], limit: int) -> list[int]:
    out = sorted({v for v in values if 0 < v <= limit} | {limit})
    return out


def _device_copy(packed: Any, index: int, src: Any, batch: int, seq: int,
                 is_mask: bool) -> None:
    """packed[index, :batch, :seq] <- src (a DLPack device array), via CuPy."""
    import cupy

    shape = tuple(packed.shape())
    mem = cupy.cuda.UnownedMemory(packed.data_ptr(), int(np.prod(shape)) * 4, packed)
    view = cupy.ndarray(shape, cupy.int32, cupy.cuda.MemoryPointer(mem, 0))
    rows = view[index, :batch, :seq]
    rows[...] = cupy.from_dlpack(src).astype(cupy.int32, copy=False)
    if is_mask:  # all-masked rows unmasked, as unmask_empty_rows does for host masks
        rows += (~rows.any(axis=1, keepdims=True)).astype(cupy.int32)
    cupy.cuda.get_current_stream().synchronize()
