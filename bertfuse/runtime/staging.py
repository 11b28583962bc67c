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

What it saves: the checked path (requests.check_request, variants.mask_mode, session._fill)
is about ten NumPy passes over the request, 25-30 us of host time per request. Whatever the
fast lane does not take (device arrays, other dtypes, a cold bucket, a value out of range)
returns None and goes the checked way, so every error message is the checked path's own.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Sequence

import numpy as np

from bertfuse.runtime.device import GATE, claim_thread, upload
from bertfuse.runtime.graphs import GraphError, cuda
from bertfuse.runtime.pinned import address, pinned_empty
from bertfuse.kernels.library import locate
from bertfuse.runtime.requests import upper_bound

LOG = logging.getLogger("bertfuse.runtime")
ROLES = ("input_ids", "input_mask", "segment_ids")
FORMS = ("nomask", "keylen", "raw")  # bf_stage_request's return value, as variants.mask_mode
_I32 = ctypes.c_int
LAUNCHED = 8  # bf_stage_launch: 8 + form once the bucket's graph ran
# What bf_stage_request reads: native-order int32 and int64 (np.dtype compares byte order).
_DTYPES = frozenset(np.dtype(t) for t in (np.int32, np.int64))


OUTPUTS = 4  # stage.cc's kLaneOutputs: outputs past these are fetched the ordinary way
MIRROR_BYTES = 1 << 20  # the largest output copy that goes through a host mirror


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

    def lane(self, session: Any, bucket: Any, graphs: bool = True) -> Lane:
        """The bucket's BfLane: the staging arguments, and per form (and whether a request
        fills the bucket) the own graph that serves it, copy inside, where captured."""
        lane = Lane(self._roles.ctypes.data, len(self._roles), self._upper.ctypes.data,
                    bucket.host_ptr, bucket.batch, bucket.seq)
        cu = cuda() if graphs and bucket.staged else None
        if cu is not None:
            for full, shape in enumerate([(0, 0), (bucket.batch, bucket.seq)]):
                for f, form in enumerate(FORMS):  # the variant as _session_for picks it
                    graph = bucket.staged.get(session._session_for(bucket.host, bucket, *shape,
                                                                   form))
                    lane.graphs[3 * full + f] = graph.handle if graph is not None else None
            lane.launch, lane.sync, lane.copy = cu.pointers
            lane.stream = session.stream
            for i, value in enumerate(list(bucket.outputs.values())[:OUTPUTS]):
                shape = value.shape()
                lane.out_dev[i] = value.data_ptr()
                lane.out_row_bytes[i] = int(np.prod(shape[1:])) * 4  # fp32, as fetch reads them
        return lane

    def mirrors(self, bucket: Any, lane: Lane, names: list[str], batch: int) -> int:
        """The bits of `names` whose outputs the native call copies into their page-locked
        mirrors (each made on first use); 0 where the lane launches nothing. Only copies of up
        to MIRROR_BYTES go this way: past a few MB, the copy out of the mirror into the array
        run() returns costs more than it saves (measured, docs/benchmarks/kernels.md)."""
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
    def for_session(cls, session: Any) -> "FastStager | None":
        """A stager for a padded CUDA session whose model runs on the op library, else None."""
        if session.device != "cuda" or not session.pad or not session._maker.kernels \
                or not set(session.facts.inputs) <= set(ROLES):
            return None
        try:
            fn = stage_function(str(locate()))
        except Exception as exc:  # the library registered with ORT, yet not found here
            LOG.debug("bertfuse: no fast staging: %s", exc)
            return None
        if fn is None:
            return None

        return cls(fn, session.facts.inputs,
                   [upper_bound(session.facts, n) for n in session.facts.inputs])

    def serve(self, session: Any, given: dict[str, Any], names: list[str],
              to_host: bool) -> dict[str, Any] | None:
        """The request through its warm bucket, or None for the checked path."""
        ids = given["input_ids"]
        if type(ids) is not np.ndarray or ids.ndim != 2 or ids.dtype not in _DTYPES \
                or getattr(session, "packed", None) is not None:  # router.Session packs some
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
        batch, seq = shape
        with session._lock, GATE.running():
            session._require_open()
            bucket = session._buckets.get(key)
            if bucket is None:  # a new bucket captures: the checked path does it
                return None
            claim_thread(session)
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
                    return session._outputs(bucket, names, to_host, batch, seq)
                return {n: session._mirrored(bucket, n, batch, seq) for n in names}
            if got == -1:
                return None
            if got < 0:  # -2: a CUDA error in the launch, an output's copy or the wait
                what = ("cudaGraphLaunch", "cudaStreamSynchronize after the graph",
                        "cudaMemcpyAsync of an output")[lane.failed]
                raise GraphError(f"{what}: CUDA error {lane.status}")
            mode = session._session_for(mask, bucket, batch, seq, FORMS[got])
            upload(bucket.packed, bucket.host, session.stream)
            return session._replay(bucket, mode, names, to_host, batch, seq)
