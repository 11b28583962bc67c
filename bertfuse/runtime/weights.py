"""Weight stripping for transport, and seeded refilling.

A stripped model keeps every large initializer's name, shape and dtype (in the model's
metadata, `bertfuse_stripped`) and drops its bytes, so a BERT-large skeleton is a few hundred
KB. `fill_weights` puts seeded random values back: normal(0, 0.02) for matrices and biases,
near 1 for LayerNorm scales (recognised by the op that reads them, or by name). Filling the
raw model and then running the passes on it gives raw and fused models with the same
weights, comparable anywhere, without TensorFlow.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
from onnx import numpy_helper

from bertfuse.errors import BertfuseError
from bertfuse.ops.bertfuse.embed_layernorm import EMBEDDING_OPS

META_KEY = "bertfuse_stripped"
# The record's digest: an edited shape would otherwise refill a model with wrong dims.
DIGEST_KEY = "bertfuse_stripped_sha256"
MIN_ELEMENTS = 1024

# (op, input index) pairs that read a LayerNorm scale.
_SCALE_SLOTS = {("LayerNormalization", 1), ("SkipLayerNormalization", 2),
                *((op, 5) for op in EMBEDDING_OPS)}


def _record(model: onnx.ModelProto) -> list[dict] | None:
    """The `bertfuse_stripped` record, checked: metadata may have been edited by hand."""
    text = next((p.value for p in model.metadata_props if p.key == META_KEY), None)
    if text is None:
        return None
    bad = f"the model's {META_KEY} metadata is damaged"
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError):
        raise BertfuseError(f"{bad} (not JSON)") from None
    names = {i.name for i in model.graph.initializer}
    if not isinstance(meta, list):
        raise BertfuseError(f"{bad} (expected a list)")
    for e in meta:
        ok = isinstance(e, dict) and isinstance(e.get("name"), str) and \
            isinstance(e.get("shape"), list) and isinstance(e.get("dtype"), str) and \
            all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31
                for d in e["shape"])
        if not ok:
            raise BertfuseError(f"{bad} (entry {str(e)[:80]})")
        if e["name"] not in names:
            raise BertfuseError(f"{bad} (no initializer {e['name']!r})")
        try:
            dtype = np.dtype(e["dtype"])
        except TypeError:
            raise BertfuseError(f"{bad} (dtype {e['dtype']!r})") from None
        if dtype.kind not in "fiub" or int(np.prod(e["shape"], dtype=np.int64)) > 2**31:
            raise BertfuseError(f"{bad} ({e['name']}: {e['dtype']} {e['shape']})")
    digest = next((p.value for p in model.metadata_props if p.key == DIGEST_KEY), None)
    if digest is not None and digest != _digest(meta):  # skeletons made before: no digest
        raise BertfuseError(f"{bad} (it differs from what strip-weights recorded)")
    return meta


def _digest(meta: list[dict]) -> str:
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


def _set_meta(model: onnx.ModelProto, values: dict[str, str]) -> None:
    """Replaces the stripped-weights metadata (none left when `values` is empty)."""
    props = [p for p in model.metadata_props if p.key not in (META_KEY, DIGEST_KEY)]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    for key, value in values.items():
        model.metadata_props.add(key=key, value=value)


def strip_weights(model: onnx.ModelProto, min_elements: int = MIN_ELEMENTS) -> int:
    """Strips initializers with at least `min_elements` values in place; returns the count.
    Stripping a stripped model keeps its record (and strips nothing more of it)."""
    meta = _record(model) or []
    done = {e["name"] for e in meta}
    before = len(meta)
    for init in model.graph.initializer:
        if init.name in done:
            continue
        numel = int(np.prod(init.dims)) if init.dims else 1
        if numel < min_elements:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        meta.append({"name": init.name, "shape": list(init.dims), "dtype": str(dtype)})
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                      "external_data"):
            init.ClearField(field)
        init.data_location = onnx.TensorProto.DEFAULT
        init.dims[:] = [0]
    _set_meta(model, {META_KEY: json.dumps(meta), DIGEST_KEY: _digest(meta)})
    return len(meta) - before


def is_stripped(model: onnx.ModelProto) -> bool:
    return any(p.key == META_KEY for p in model.metadata_props)


def _scale_names(model: onnx.ModelProto) -> set[str]:
    names = set()
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if (node.op_type, i) in _SCALE_SLOTS:
                names.add(name)
    return names


def fill_weights(model: onnx.ModelProto, seed: int = 0, std: float = 0.02) -> int:
    """Refills a stripped model in place with seeded values; returns the count."""
    meta = _record(model)
    if meta is None:
        return 0
    rng = np.random.default_rng(seed)
    scales = _scale_names(model)
    by_name = {i.name: i for i in model.graph.initializer}
    for entry in meta:
        shape, dtype, name = entry["shape"], np.dtype(entry["dtype"]), entry["name"]
        if dtype.kind == "f":
            values = rng.standard_normal(shape) * std
            lowered = name.lower()
            if len(shape) == 1 and (name in scales or "gamma" in lowered or
                                    "layernorm/scale" in lowered or "layer_norm/scale" in lowered):
                values += 1.0
        else:
            values = rng.integers(0, 2, size=shape)
        by_name[name].CopyFrom(numpy_helper.from_array(values.astype(dtype), name))
    _set_meta(model, {})
    return len(meta)
