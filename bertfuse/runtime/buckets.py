"""One shape bucket of the padded session (padded.py): its buffers and bindings, its CUDA
graphs, its staging, its mask variants checked.

    PaddedSession.bucket(b, s) ─► Bucket.build(spec, sessions, b, s, graph id):
        host staging (pinned) + one device buffer for all inputs + one per output
        ─► per mask variant: bound once, two plain runs (ORT's graph capture, or the warm-up
           before an own capture)
        ─► own graphs (graphs.py) where the session captures them: each checked against a
           plain run on a probe request, else that variant runs uncaptured (graph_notes); for
           the fast lane (staging.py) a second one that starts with the staged request's
           host->device copy, checked on two probes in a row
        ─► mask variants checked against the raw mask (variants.check_variants)

    a request ─► bucket.fill (staged, range-checked, copied up) ─► bucket.run(mode, session)
              ─► bucket.results / bucket.mirrored (the request's rows)

A bucket reads its session's fixed parts from one BucketSpec (the session maker, the model's
facts and output shapes) and is handed the ORT session of a mask variant where it runs one;
the session calls only the methods here, and the bucket writes nothing of the session's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import numpy as np

from bertfuse.runtime.device import SessionMaker, device_copy, fetch, replay, staging, upload
from bertfuse.runtime.graphs import OwnGraph
from bertfuse.runtime.request_checks import ModelFacts, check_range, upper_bound
from bertfuse.runtime.variants import check_variants

LOG = logging.getLogger("bertfuse.runtime")


@dataclass
class BucketSpec:
    """What every bucket of one PaddedSession is made from (the session keeps one)."""

    ort: ModuleType
    device: str
    facts: ModelFacts
    output_dims: dict[str, tuple]  # per output, ('B', 'S', 768)-style
    maker: SessionMaker
    pinned: bool  # page-locked host staging
    stream: int | None  # the session's own CUDA stream
    upper: np.ndarray  # per input, the first value out of range as uint32


@dataclass
class Bucket:
    spec: BucketSpec
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
    graph_notes: dict[tuple[int, int, str], str] = field(default_factory=dict)  # uncaptured: why
    variant_notes: dict[tuple[int, int, str], str] = field(default_factory=dict)  # off: why

    @classmethod
    def build(cls, spec: BucketSpec, sessions: dict[str, Any], batch: int, seq: int,
              graph_id: int, *, validate: bool, lane: bool) -> Bucket:
        """The bucket [batch, seq] (called inside the capture gate) for `sessions` (mask
        variant -> ORT session); `graph_id`: one per bucket, in each variant's session;
        `validate`: as fill's; `lane`: the session has a fast lane (staging.py), so its own
        graphs are captured with the upload inside too."""
        ort = spec.ort
        dev = "cuda" if spec.device == "cuda" else "cpu"
        names = spec.facts.inputs
        # All inputs live in one [n_inputs, batch, seq] buffer: one host->device copy a request.
        host = staging((len(names), batch, seq), spec.pinned)
        packed = ort.OrtValue.ortvalue_from_numpy(host, dev, 0)
        outputs = {}
        for name in spec.facts.outputs:
            shape = [batch if d == "B" else seq if d == "S" else d for d in spec.output_dims[name]]
            outputs[name] = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, dev, 0)
        bindings, options = {}, {}
        for mode, sess in sessions.items():
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
            ro = options[mode] = spec.maker.run_options(graph_id)
            for _ in range(2):
                sess.run_with_iobinding(binding, ro)
        bucket = cls(spec, batch, seq, options, bindings, packed, outputs, host, host.ctypes.data)
        if spec.maker.own_graphs:
            # The run alone; for the fast lane (pinned staging), also with its copy inside.
            kinds = (False, True) if spec.pinned and lane else (False,)
            for mode, sess in sessions.items():
                for copies in kinds:
                    graph, why = cls._capture(bucket, mode, sess, copies)
                    if graph is not None:
                        (bucket.staged if copies else bucket.graphs)[mode] = graph
                        continue
                    key = (batch, seq, mode + (", the copy inside" if copies else ""))
                    bucket.graph_notes[key] = why
                    LOG.warning("bertfuse: bucket %s runs without a CUDA graph: %s", key, why)
                    break
        cls._verify_variants(bucket, sessions, validate)
        return bucket

    def _capture(self, mode: str, sess: Any, copies: bool = False
                 ) -> tuple[OwnGraph | None, str]:
        """The bucket's run for `mode` as an own CUDA graph (with `copies`, the pinned staging
        buffer's host->device copy first, inside the graph), launched once on a probe request
        other than the one it was captured with (work that escaped the capture would show)
        and compared bit for bit with a plain run: (graph, '') or (None, why)."""
        spec = self.spec
        binding = self.bindings[mode]
        ro = spec.maker.capture_options()

        def record() -> None:
            if copies:
                upload(self.packed, self.host, spec.stream)
            replay(sess, binding, ro)

        try:
            graph = OwnGraph.capture(spec.stream, record)
        except Exception as exc:
            return None, f"capture failed: {str(exc).splitlines()[0][:200]}"
        host = self.host
        rng = np.random.default_rng(self.batch * 1000 + self.seq)
        # With the copy inside, two probes one after the other: the second must not see the first.
        for _ in range(2 if copies else 1):
            for i, name in enumerate(spec.facts.inputs):
                high = min(int(spec.upper[i]), 30000 if name == "input_ids" else 2)
                host[i] = 1 if name == "input_mask" else rng.integers(0, high, host[i].shape)
            upload(self.packed, host, None)
            replay(sess, binding, self.run_options[mode])
            want = {n: v.numpy() for n, v in self.outputs.items()}
            if copies:  # the graph must bring the probe over itself
                self.packed.update_inplace(np.zeros_like(host))
            for value in self.outputs.values():  # the launch must write every output itself
                value.update_inplace(np.full(value.shape(), np.nan, np.float32))
            graph.launch()
            if not all(np.array_equal(want[n], v.numpy(), equal_nan=True)
                       for n, v in self.outputs.items()):
                graph.release()
                return None, "the captured graph's outputs differ from a plain run's"
        return graph, ""

    def _verify_variants(self, sessions: dict[str, Any], validate: bool) -> None:
        """Turns off, in this bucket, every mask variant that disagrees with the raw mask on a
        probe request (variants.check_variants); `variant_notes` keeps why."""
        spec = self.spec
        modes = [m for m in sessions if m != "raw"]
        if not modes:
            return
        b, q = self.batch, self.seq

        def run(mode: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            self.fill(arrays, b, q, validate)
            sessions[mode].run_with_iobinding(self.bindings[mode], self.run_options[mode])
            return {n: v.numpy().astype(np.float64) for n, v in self.outputs.items()}

        for mode, why in check_variants(modes, b, q, spec.facts.inputs, spec.facts.vocab_size,
                                        run).items():
            self.disabled.add(mode)
            self.variant_notes[(b, q, mode)] = why

    # -- a request --------------------------------------------------------------------------

    def fill(self, arrays: dict[str, Any], batch: int, seq: int, validate: bool) -> None:
        """A checked request into the bucket's inputs (padding: mask 0; with `validate`,
        host values range-checked here, once staged), copied up to the device."""
        spec, host = self.spec, self.host
        inputs = spec.facts.inputs
        host.fill(0)
        device_inputs = []
        for i, name in enumerate(inputs):
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
        if validate:  # host inputs: one reduction over the staged buffer, all roles
            over = host.reshape(len(inputs), -1).view(np.uint32).max(axis=1) >= spec.upper
            if over.any():
                name = inputs[int(np.argmax(over))]
                check_range(arrays[name], name, upper_bound(spec.facts, name))
        upload(self.packed, host, None if device_inputs else spec.stream)
        for i, src in device_inputs:  # device arrays: copied on the device, not via the host
            device_copy(self.packed, i, src, batch, seq, inputs[i] == "input_mask")

    def run(self, mode: str, sess: Any) -> None:
        """The staged request through mask variant `mode` (its ORT session `sess`): the
        bucket's own graph, else ORT's run."""
        graph = self.graphs.get(mode)
        if graph is not None:
            graph.launch()
        else:
            replay(sess, self.bindings[mode], self.run_options[mode])

    def replay_call(self, mode: str, sess: Any) -> Callable[[], None]:
        """What run(mode, sess) calls, alone (benchmarks time it apart from the request)."""
        if mode in self.graphs:
            return self.graphs[mode].launch
        binding, options = self.bindings[mode], self.run_options[mode]
        return lambda: replay(sess, binding, options)

    def results(self, names: list[str], to_host: bool, batch: int,
                seq: int) -> dict[str, Any]:
        """The outputs after a run, as PaddedSession.run() returns them."""
        if not to_host:
            return {"batch": batch, "seq": seq, **{n: self.outputs[n] for n in names}}
        dims = self.spec.output_dims
        return {n: fetch(self.outputs[n], batch, seq, dims[n][1:2] == ("S",)) for n in names}

    def mirrored(self, name: str, batch: int, seq: int) -> np.ndarray:
        """An output the fast lane copied into its host mirror (or, where it has none, from
        the device), as run() returns it: a new array of the request's rows (and positions)."""
        has_seq = self.spec.output_dims[name][1:2] == ("S",)
        host = self.mirrors.get(name)
        if host is None or batch > len(host):  # not copied there (staging.FastStager.mirrors)
            return fetch(self.outputs[name], batch, seq, has_seq)
        out = host[:batch].copy()
        return out[:, :seq] if has_seq else out

    def release_graphs(self) -> None:
        """The own graphs, before the memory they record is freed."""
        for graph in [*self.graphs.values(), *self.staged.values()]:
            graph.release()
