"""The TF side of the parity gate, computed with oneDNN's graph rewrites off.

With oneDNN on (TensorFlow's default on many x86 CPUs), grappler fuses a layer norm written
with a positive reduction axis and constant gamma/beta (tf.contrib.layers.layer_norm's form,
hence every frozen Google BERT) into _MklLayerNorm with epsilon 0.001 instead of the graph's
1e-12: TF itself is then wrong by 0.1-1 and the gate would blame a correct ONNX model.

TF reads TF_ENABLE_ONEDNN_OPTS once, when it is first imported. So:

* TF not imported yet: ``prefer_onednn_off()`` sets TF_ENABLE_ONEDNN_OPTS=0 and the
  reference runs in this process;
* TF already imported with oneDNN on (a notebook, a test process): the graph, weights and
  feeds go to a temporary directory and a worker (``python -m bertfuse.converter.reference
  DIR``) started with TF_ENABLE_ONEDNN_OPTS=0 computes the reference there.

Either way the reference runs on the CPU (a GPU's TF32 matmuls are no reference).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bertfuse.io.safety import scratch_dir
from bertfuse.optional import optional

ENV = "TF_ENABLE_ONEDNN_OPTS"


def prefer_onednn_off() -> None:
    """Before TF's first import: have it start with oneDNN's rewrites off."""
    if "tensorflow" not in sys.modules:
        os.environ[ENV] = "0"


def onednn_on() -> bool:
    """Whether the imported TF runs oneDNN's rewrites (TF caches the answer at import)."""
    try:
        _pywrap_util_port = optional("tensorflow.python.util", "_pywrap_util_port",
                                     why="TensorFlow runs the source model (tf extra)")

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):  # a TF without the probe: assume the worst
        return True


def in_process() -> bool:
    """True when this process can compute the reference itself (imports TF if needed)."""
    prefer_onednn_off()
    optional("tensorflow", why="the import fixes oneDNN's state")

    return not onednn_on()


def describe(where: str) -> str:
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    return f"TensorFlow {tf.__version__} CPU, oneDNN rewrites off, {where}"


def run_graph(graph_def, weights: dict[str, np.ndarray], inputs: dict[str, str],
              dtypes: dict[str, Any], outputs: dict[str, str],
              feed_sets: list[dict[str, np.ndarray]], session=None) -> list[dict[str, np.ndarray]]:
    """Runs the graph once per feed set (role-keyed) on the CPU; canonical-name-keyed outputs."""
    sess = session or new_session(graph_def)
    try:
        names = list(outputs)
        fetches = [outputs[n] for n in names]
        result = []
        for feeds in feed_sets:
            feed = {inputs[r]: feeds[r].astype(dtypes[r]) for r in inputs}
            feed.update({f"{name}:0": value for name, value in weights.items()})
            result.append(dict(zip(names, sess.run(fetches, feed_dict=feed))))
        return result
    finally:
        if session is None:
            sess.close()


def new_session(graph_def):
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    config = tf.compat.v1.ConfigProto(device_count={"GPU": 0})
    return tf.compat.v1.Session(graph=graph, config=config)


# ------------------------------------------------------------------------------ the worker


def _save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> list[str]:
    """npz keyed by position (TF names hold '/' and ':'); returns the names in order."""
    names = list(arrays)
    np.savez(path, *[arrays[n] for n in names])
    return names


def _load_arrays(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {n: data[f"arr_{i}"] for i, n in enumerate(names)}


def run_in_subprocess(source, feed_sets: list[dict[str, np.ndarray]],
                      timeout: float | None = None) -> list[dict[str, np.ndarray]]:
    """The reference from a fresh Python with TF_ENABLE_ONEDNN_OPTS=0; the temp dir goes away
    on every exit path (the worker is killed first if we are interrupted)."""
    with scratch_dir("bertfuse-reference-") as d:
        tmp = str(d)
        (d / "graph.pb").write_bytes(source.graph_def.SerializeToString())
        spec = {"weights": _save_arrays(d / "weights.npz", source.weights),
                "inputs": source.inputs,
                "dtypes": {r: np.dtype(t).name for r, t in source.input_dtypes.items()},
                "outputs": source.outputs, "feeds": []}
        for i, feeds in enumerate(feed_sets):
            spec["feeds"].append(_save_arrays(d / f"feeds_{i}.npz", feeds))
        (d / "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, ENV: "0", "TF_CPP_MIN_LOG_LEVEL": "3"}
        with open(d / "stderr.txt", "wb") as err:
            proc = subprocess.run([sys.executable, "-m", "bertfuse.converter.reference", tmp],
                                  stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env,
                                  timeout=timeout)
        if (d / "error.json").exists():
            _reraise(json.loads((d / "error.json").read_text()))
        if proc.returncode != 0:
            lines = [ln for ln in (d / "stderr.txt").read_text(errors="replace").splitlines()
                     if ln.strip()]
            raise RuntimeError(f"the TensorFlow reference worker failed (exit "
                               f"{proc.returncode}): {lines[-1] if lines else 'no message'}")
        names = list(source.outputs)
        return [_load_arrays(d / f"out_{i}.npz", names) for i in range(len(feed_sets))]


def _reraise(error: dict) -> None:
    """The worker's failure as this process would have raised it (TF's errors keep their
    class: running the user's model on bad inputs is their input, not our bug)."""
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    kind, message = error["type"], error["message"]
    if kind == "MemoryError":
        raise MemoryError(message)
    cls = getattr(tf.errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, tf.errors.OpError):
        raise cls(None, None, message)
    raise RuntimeError(f"the TensorFlow reference worker failed: {kind}: {message}")


def _worker(directory: str) -> int:
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    if onednn_on():  # TF_ENABLE_ONEDNN_OPTS=0 did not take: refuse rather than mislead
        print(f"{ENV}=0 did not turn oneDNN off in the worker", file=sys.stderr)
        return 4
    d = Path(directory)
    spec = json.loads((d / "spec.json").read_text())
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString((d / "graph.pb").read_bytes())
    weights = _load_arrays(d / "weights.npz", spec["weights"])
    feed_sets = [_load_arrays(d / f"feeds_{i}.npz", names)
                 for i, names in enumerate(spec["feeds"])]
    dtypes = {r: np.dtype(t) for r, t in spec["dtypes"].items()}
    try:
        results = run_graph(graph_def, weights, spec["inputs"], dtypes, spec["outputs"],
                            feed_sets)
    except (tf.errors.OpError, MemoryError) as exc:
        (d / "error.json").write_text(json.dumps({"type": type(exc).__name__,
                                                  "message": getattr(exc, "message", str(exc))}))
        return 1
    for i, out in enumerate(results):
        _save_arrays(d / f"out_{i}.npz", out)
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1]))
