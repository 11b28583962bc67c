"""One shape bucket of the padded session (padded.py): its buffers and bindings, its CUDA
graphs, its mask variants checked.

    PaddedSession._bucket(b, s) ─► new_bucket(session, b, s):
        host staging (pinned) + one device buffer for all inputs + one per output
        ─► per mask variant: bound once, two plain runs (ORT's graph capture, or the warm-up
           before an own capture)
        ─► own graphs (graphs.py) where the session captures them: each checked against a
           plain run on a probe request, else that variant runs uncaptured (graph_notes); for
           the fast lane (staging.py) a second one that starts with the staged request's
           host->device copy, checked on two probes in a row
        ─► mask variants checked against the raw mask (variants.check_variants)

The functions take the session itself: a bucket is part of it, kept in its own room because
the request path does not need to read how one is built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bertfuse.runtime.device import replay, staging, upload
from bertfuse.runtime.graphs import OwnGraph
from bertfuse.runtime.variants import check_variants

LOG = logging.getLogger("bertfuse.runtime")


@dataclass
class Bucket:
    batch: int
    seq: int
    run_options: dict[str, Any]  # per mask variant (its own session and CUDA graph), made once
    bindings: dict[str, Any]
    packed: Any  # device [n_inputs, batch, seq] int32, bound as the inputs
    outputs: dict[str, Any]
    host: np.ndarray  # host staging for `packed`
    host_ptr: int  # host's address, for the native staging (staging.py)
    disabled: set[str] = field(default_factory=set)  # variants that failed check_variants
    graphs: dict[str, OwnGraph] = field(default_factory=dict)  # per mode, where captured here
    staged: dict[str, OwnGraph] = field(default_factory=dict)  # the same, the upload inside
    lane: Any = None  # the fast lane's native state for this bucket (staging.FastStager)
    mirrors: dict[str, np.ndarray] = field(default_factory=dict)  # page-locked output copies


def new_bucket(s: Any, batch: int, seq: int) -> Bucket:
    """The bucket [batch, seq] of PaddedSession `s` (called inside the capture gate)."""
    ort = s._ort
    dev = "cuda" if s.device == "cuda" else "cpu"
    names = s.facts.inputs
    # All inputs live in one [n_inputs, batch, seq] buffer: one host->device copy a request.
    host = staging((len(names), batch, seq), s.pinned)
    packed = ort.OrtValue.ortvalue_from_numpy(host, dev, 0)
    outputs = {}
    for name in s.facts.outputs:
        shape = [batch if d == "B" else seq if d == "S" else d for d in s._output_dims[name]]
        outputs[name] = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, dev, 0)
    bindings, options = {}, {}
    graph_id = len(s._buckets)  # one graph id per bucket, in each variant's session
    for mode, sess in s.sessions.items():
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
        ro = options[mode] = s._maker.run_options(graph_id)
        for _ in range(2):
            sess.run_with_iobinding(binding, ro)
    bucket = Bucket(batch, seq, options, bindings, packed, outputs, host, host.ctypes.data)
    if s._maker.own_graphs:
        # The run alone; for the fast lane (pinned staging), also with its copy inside.
        kinds = (False, True) if s.pinned and s._stager is not None else (False,)
        for mode in s.sessions:
            for copies in kinds:
                graph, why = capture(s, bucket, mode, copies)
                if graph is not None:
                    (bucket.staged if copies else bucket.graphs)[mode] = graph
                    continue
                key = (batch, seq, mode + (", the copy inside" if copies else ""))
                s.graph_notes[key] = why
                LOG.warning("bertfuse: bucket %s runs without a CUDA graph: %s", key, why)
                break
    verify_variants(s, bucket)
    return bucket


def capture(s: Any, bucket: Bucket, mode: str, copies: bool = False
            ) -> tuple[OwnGraph | None, str]:
    """The bucket's run for `mode` as an own CUDA graph (with `copies`, the pinned staging
    buffer's host->device copy first, inside the graph), launched once on a probe request
    other than the one it was captured with (work that escaped the capture would show) and
    compared bit for bit with a plain run: (graph, '') or (None, why)."""
    sess, binding = s.sessions[mode], bucket.bindings[mode]
    ro = s._maker.capture_options()

    def record() -> None:
        if copies:
            upload(bucket.packed, bucket.host, s.stream)
        replay(sess, binding, ro)

    try:
        graph = OwnGraph.capture(s.stream, record)
    except Exception as exc:
        return None, f"capture failed: {str(exc).splitlines()[0][:200]}"
    host = bucket.host
    rng = np.random.default_rng(bucket.batch * 1000 + bucket.seq)
    # With the copy inside, two probes one after the other: the second must not see the first.
    for _ in range(2 if copies else 1):
        for i, name in enumerate(s.facts.inputs):
            high = min(int(s._upper[i]), 30000 if name == "input_ids" else 2)
            host[i] = 1 if name == "input_mask" else rng.integers(0, high, host[i].shape)
        upload(bucket.packed, host, None)
        replay(sess, binding, bucket.run_options[mode])
        want = {n: v.numpy() for n, v in bucket.outputs.items()}
        if copies:  # the graph must bring the probe over itself
            bucket.packed.update_inplace(np.zeros_like(host))
        for value in bucket.outputs.values():  # the launch must write every output itself
            value.update_inplace(np.full(value.shape(), np.nan, np.float32))
        graph.launch()
        if not all(np.array_equal(want[n], v.numpy(), equal_nan=True)
                   for n, v in bucket.outputs.items()):
            graph.release()
            return None, "the captured graph's outputs differ from a plain run's"
    return graph, ""


def verify_variants(s: Any, bucket: Bucket) -> None:
    """Turns off, in this bucket, every mask variant that disagrees with the raw mask on a
    probe request (variants.check_variants); the session's `variant_notes` keeps why."""
    modes = [m for m in s.sessions if m != "raw"]
    if not modes:
        return
    b, q = bucket.batch, bucket.seq

    def run(mode: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        s._fill(bucket, arrays, b, q)
        s.sessions[mode].run_with_iobinding(bucket.bindings[mode], bucket.run_options[mode])
        return {n: v.numpy().astype(np.float64) for n, v in bucket.outputs.items()}

    for mode, why in check_variants(modes, b, q, s.facts.inputs, s.facts.vocab_size,
                                    run).items():
        bucket.disabled.add(mode)
        s.variant_notes[(b, q, mode)] = why
