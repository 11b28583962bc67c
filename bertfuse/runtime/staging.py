"""The request path's fast lane: one native call serves a warm bucket's request.

    run(ids, mask, segments) -> FastStager.serve: host int32/int64 arrays, a warm bucket
        -> bf_stage_launch, one native call (the op library's csrc/stage.cc):
             bf_stage_request: range check, empty rows unmasked, padding, the mask's form, in
             one pass into the pinned buffer
             -> where the bucket holds an own CUDA graph for that form's variant that begins
                with the host->device copy (graphs.py): cudaGraphLaunch, then, for outputs
                asked for on the host (up to MIRROR_BYTES each), cudaMemcpyAsync of the
                request's rows into their page-locked mirrors, one cudaStreamSynchronize
        -> run() returns copies of the mirrored rows, and fetches the rest
        -> else (no such graph) upload (cudaMemcpyAsync on the session's stream) -> the replay

What it saves: the checked path (request_checks.check_request, variants.mask_mode, buckets.Bucket.fill)
is about ten NumPy passes over the request, 25-30 us of host time per request. Whatever the
fast lane does not take (device arrays, other dtypes, a cold bucket, a value out of range)
returns None and goes the checked way, so every error message is the checked path's own.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Protocol, Sequence

import numpy as np

from bertfuse.runtime.device import upload
from bertfuse.runtime.graphs import GraphError, OwnGraph, cuda
from bertfuse.runtime.pinned import address, pinned_empty
from bertfuse.runtime.request_checks import ModelFacts, upper_bound
from bertfuse.kernels.library import locate

LOG = logging.getLogger("bertfuse.runtime")
ROLES = ("input_ids", "input_mask", "segment_ids")
FORMS = ("nomask", "keylen", "raw")  # bf_stage_request's return value, as variants.mask_mode
_I32 = ctypes.c_int
LAUNCHED = 8  # bf_stage_launch: 8 + form once the bucket's graph ran
# What bf_stage_request reads: native-order int32 and int64 (np.dtype compares byte order).
_DTYPES = frozenset(np.dtype(t) for t in (np.int32, np.int64))


OUTPUTS = 4  # stage.cc's kLaneOutputs: outputs past these are fetched the ordinary way
MIRROR_BYTES = 1 << 20  # the largest output copy that goes through a host mirror


class StagedBucket(Protocol):
    """What the fast lane reads and calls of a bucket (buckets.Bucket)."""

    batch: int
    seq: int
    host: np.ndarray
    host_ptr: int
    packed: Any
    outputs: dict[str, Any]
    staged: dict[str, OwnGraph]
    mirrors: dict[str, np.ndarray]
    lane: Any

    def run(self, mode: str, sess: Any) -> None: ...

    def results(self, names: list[str], to_host: bool, batch: int,
                seq: int) -> dict[str, Any]: ...

    def mirrored(self, name: str, batch: int, seq: int) -> np.ndarray: ...


class LaneSession(Protocol):
    """What the fast lane reads and calls of its session (padded.PaddedSession)."""

    max_batch: int
    max_seq: int
    validate: bool
    stream: int | None
    sessions: dict[str, Any]  # mask variant -> ORT session

    def bucket_for(self, batch: int, seq: int) -> tuple[int, int]: ...

    def session_for(self, mask: Any, bucket: Any, batch: int, seq: int,
                    form: str | None = None) -> str: ...

    def on_warm_bucket(self, key: tuple[int, int], fn: Any, *args: Any) -> Any: ...


class Lane(ctypes.Structure):
    """stage.cc's BfLane: one bucket's fixed arguments, filled once (FastStager.lane), and its
    outputs' host mirrors as they are first asked for (FastStager.mirrors)."""

    _fields_ = [("slot_role", ctypes.c_void_p), ("n_inputs", _I32), ("upper", ctypes.c_void_p),
                ("host", ctypes.c_void_p), ("bucket_batch", _I32), ("bucket_seq", _I32),
                ("graphs", ctypes.c_void_p * 6), ("launch", ctypes.c_void_p),
                ("sync", ctypes.c_void_p), ("copy", ctypes.c_void_p),
                ("stream", ctypes.c_void_p), ("out_host", ctypes.c_void_p * OUTPUTS),
                ("out_dev", ctypes.c_void_p * OUTPUTS), ("out_row_bytes", ctypes.c_int64 * OUTPUTS),
                ("status", _I32), ("failed", _I32)]


def stage_function(path: str) -> Any | None:
    """bf_stage_launch of the library at `path`, or None (a library built before it, or
    one that does not load)."""
    try:
        fn = ctypes.CDLL(path).bf_stage_launch  # CDLL: the GIL is dropped while it waits
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, _I32] * 3 + [_I32, _I32, _I32, ctypes.c_void_p,
                                                 ctypes.c_uint]
    fn.restype = _I32
    return fn


class FastStager:
    """The fast lane of one PaddedSession (see the module docstring)."""

    def __init__(self, fn: Any, inputs: Sequence[str], uppers: Sequence[int | None]) -> None:
        self._fn = fn
        self._roles = np.array([ROLES.index(n) for n in inputs], np.int32)
        self._upper = np.array([u or 0 for u in uppers], np.int64)
        self._absent = [r for r in ROLES if r not in inputs]
        self._keys: dict[tuple[int, int], tuple[int, int]] = {}  # request shape -> bucket

    def lane(self, session: LaneSession, bucket: StagedBucket, graphs: bool = True) -> Lane:
        """The bucket's BfLane: the staging arguments, and per form (and whether a request
        fills the bucket) the own graph that serves it, copy inside, where captured."""
        lane = Lane(self._roles.ctypes.data, len(self._roles), self._upper.ctypes.data,
                    bucket.host_ptr, bucket.batch, bucket.seq)
        cu = cuda() if graphs and bucket.staged else None
        if cu is not None:
            for full, shape in enumerate([(0, 0), (bucket.batch, bucket.seq)]):
                for f, form in enumerate(FORMS):  # the variant as session_for picks it
                    graph = bucket.staged.get(session.session_for(bucket.host, bucket, *shape,
                                                                  form))
                    lane.graphs[3 * full + f] = graph.handle if graph is not None else None
            lane.launch, lane.sync, lane.copy = cu.pointers
            lane.stream = session.stream
            for i, value in enumerate(list(bucket.outputs.values())[:OUTPUTS]):
                shape = value.shape()
                lane.out_dev[i] = value.data_ptr()
                lane.out_row_bytes[i] = int(np.prod(shape[1:])) * 4  # fp32, as fetch reads them
        return lane

    def mirrors(self, bucket: StagedBucket, lane: Lane, names: list[str], batch: int) -> int:
        """The bits of `names` whose outputs the native call copies into their page-locked
        mirrors (each made on first use); 0 where the lane launches nothing. Only copies of up
        to MIRROR_BYTES go this way: past a few MB, the copy out of the mirror into the array
        run() returns costs more than it saves (measured, docs/journal/kernels.md)."""
        if not lane.launch:
            return 0
        want = 0
        for i, name in enumerate(list(bucket.outputs)[:OUTPUTS]):
            if name not in names:
                continue
            host = bucket.mirrors.get(name)
            if host is None:
                host = bucket.mirrors[name] = self._mirror(bucket.outputs[name],
                                                           lane.out_row_bytes[i])
                lane.out_host[i] = host.ctypes.data if len(host) else None
            if batch <= len(host):
                want |= 1 << i
        return want

    @staticmethod
    def _mirror(value: Any, row_bytes: int) -> np.ndarray:
        """A page-locked fp32 mirror of a bucket output, of as many batch rows as fit in
        MIRROR_BYTES (none where they cannot be had: the output is then fetched)."""
        shape = tuple(value.shape())
        rows = min(shape[0], MIRROR_BYTES // max(row_bytes, 1))
        host = pinned_empty((rows, *shape[1:]), np.float32) \
            if rows and value.device_name() == "cuda" else None
        return host if host is not None else np.empty((0, *shape[1:]), np.float32)

    @classmethod
    def for_model(cls, facts: ModelFacts) -> FastStager | None:
        """A stager for a padded CUDA session whose model runs on the op library (the
        session asks only then), else None."""
        if not set(facts.inputs) <= set(ROLES):
            return None
        try:
            fn = stage_function(str(locate()))
        except Exception as exc:  # the library registered with ORT, yet not found here
            LOG.debug("bertfuse: no fast staging: %s", exc)
            return None
        if fn is None:
            return None
        return cls(fn, facts.inputs, [upper_bound(facts, n) for n in facts.inputs])

    def serve(self, session: LaneSession, given: dict[str, Any], names: list[str],
              to_host: bool) -> dict[str, Any] | None:
        """The request through its warm bucket, or None for the checked path."""
        ids = given["input_ids"]
        if type(ids) is not np.ndarray or ids.ndim != 2 or ids.dtype not in _DTYPES \
                or getattr(session, "packed", None) is not None:  # session.Session packs some
            return None
        shape = ids.shape
        mask, segments = given["input_mask"], given["segment_ids"]
        for arr in (ids, mask, segments):
            if arr is not None and (type(arr) is not np.ndarray or arr.dtype not in _DTYPES
                                    or arr.shape != shape or not arr.flags.c_contiguous):
                return None
        for role in self._absent:  # given for an input the model does not have
            if given[role] is not None:
                return None
        key = self._keys.get(shape)
        if key is None:
            batch, seq = shape
            if not (1 <= batch <= session.max_batch and 1 <= seq <= session.max_seq):
                return None
            key = self._keys[shape] = session.bucket_for(batch, seq)
        # Under the session's lock; None where the bucket is new (its capture: the checked path).
        return session.on_warm_bucket(key, self._launch, session, given, names, to_host)

    def _launch(self, bucket: StagedBucket, session: LaneSession, given: dict[str, Any],
                names: list[str], to_host: bool) -> dict[str, Any] | None:
        """The request staged natively into the warm bucket and run; None for the checked
        path (a value the native pass refuses)."""
        ids, mask, segments = given["input_ids"], given["input_mask"], given["segment_ids"]
        batch, seq = ids.shape
        if bucket.lane is None:
            lane = self.lane(session, bucket)
            bucket.lane = (lane, ctypes.addressof(lane))
        lane, at = bucket.lane
        want = self.mirrors(bucket, lane, names, batch) if to_host else 0
        got = self._fn(address(ids), ids.itemsize,
                       address(mask) if mask is not None else None,
                       mask.itemsize if mask is not None else 0,
                       address(segments) if segments is not None else None,
                       segments.itemsize if segments is not None else 0,
                       batch, seq, int(session.validate), at, want)
        if got >= LAUNCHED:
            if not want:
                return bucket.results(names, to_host, batch, seq)
            return {n: bucket.mirrored(n, batch, seq) for n in names}
        if got == -1:
            return None
        if got < 0:  # -2: a CUDA error in the launch, an output's copy or the wait
            what = ("cudaGraphLaunch", "cudaStreamSynchronize after the graph",
                    "cudaMemcpyAsync of an output")[lane.failed]
            raise GraphError(f"{what}: CUDA error {lane.status}")
        mode = session.session_for(mask, bucket, batch, seq, FORMS[got])
        upload(bucket.packed, bucket.host, session.stream)
        bucket.run(mode, session.sessions[mode])
        return bucket.results(names, to_host, batch, seq)
