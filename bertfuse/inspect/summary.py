"""Inspect an ONNX model without reading its weights, and the stable summary JSON.

``onnx.load(path, load_external_data=False)`` still parses every inline ``raw_data`` (1.3 GB
for BERT-large). ``load_light`` walks the protobuf wire format over an mmap instead: graph
fields are copied, and each initializer is copied without its data fields (``raw_data`` and
the packed ``*_data`` arrays), whose pages are never touched. What comes back is an ordinary
``ModelProto`` whose initializers carry names, dims and dtypes but no values.

The summary (``summarize``) is what ``bertfuse summarize`` writes and ``bertfuse diff`` reads:

    format        "bertfuse-summary/1"
    producer      {"name", "version"}            ir_version
    opsets        {"ai.onnx": 17, "com.microsoft": 1, ...}
    inputs        [{"name", "dtype", "shape": ["batch", "seq"]}]        outputs  (same)
    nodes         node count                     ops   {op_type: count}
    weights       {"count", "bytes", "by_dtype": {"float32": {"count", "bytes"}}}
    initializers  {name: {"dtype", "shape"}}
    encoder       EncoderTable.to_json() without the pass reasons (a saved model has none)

No weight values, sorted keys, so it can be committed as a golden file.
"""

from __future__ import annotations

import json
import mmap
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from rich.markup import escape
from rich.table import Table

from bertfuse.inspect.encoder_table import EncoderTable, encoder_table
from bertfuse.errors import BertfuseError
from bertfuse.io.limits import MAX_SUMMARY_BYTES, json_text
from bertfuse.inspect.encoder_table import LayerStatus, print_encoder_table
from bertfuse.io.onnx_in import check_stranger
from bertfuse.io.schemas import first_error

SUMMARY_FORMAT = "bertfuse-summary/1"

# TensorProto fields holding the values: float_data 4, int32_data 5, string_data 6,
# int64_data 7, raw_data 9, double_data 10, uint64_data 11.
_DATA_FIELDS = {4, 5, 6, 7, 9, 10, 11}
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise ValueError("malformed varint")


def _enc_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf, start: int, end: int):
    """(field number, wire type, field start, value start, value end) over one message."""
    pos = start
    while pos < end:
        fstart = pos
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos2 = _varint(buf, pos)
        elif wire == 1:
            pos2 = pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            pos2 = pos + length
        elif wire == 5:
            pos2 = pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos2 > end:
            raise ValueError("truncated message")
        yield field, wire, fstart, pos, pos2
        pos = pos2


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _enc_varint(field << 3 | 2) + _enc_varint(len(payload)) + payload


def _strip_tensor(buf, start: int, end: int) -> bytes:
    return b"".join(bytes(buf[f0:v1]) for field, wire, f0, v0, v1 in _fields(buf, start, end)
                    if not (field in _DATA_FIELDS and wire == 2))


def _strip_graph(buf, start: int, end: int) -> bytes:
    parts = []
    for field, wire, f0, v0, v1 in _fields(buf, start, end):
        if field == _GRAPH_INITIALIZER and wire == 2:
            parts.append(_length_delimited(field, _strip_tensor(buf, v0, v1)))
        else:
            parts.append(bytes(buf[f0:v1]))
    return b"".join(parts)


def load_light(path: str | Path) -> onnx.ModelProto:
    """The model without its weight values (initializers keep name, dims, data_type)."""
    path = Path(path)
    if not path.exists():
        raise BertfuseError(f"{path}: no such file")
    if path.is_dir():
        raise BertfuseError(f"{path}: is a directory, expected an .onnx file")
    with open(path, "rb") as f:
        if path.stat().st_size == 0:
            raise BertfuseError(f"{path}: not an ONNX model (empty file)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = memoryview(mm)
            try:
                parts = []
                for field, wire, f0, v0, v1 in _fields(buf, 0, len(buf)):
                    if field == _MODEL_GRAPH and wire == 2:
                        parts.append(_length_delimited(field, _strip_graph(buf, v0, v1)))
                    else:
                        parts.append(bytes(buf[f0:v1]))
                model = onnx.ModelProto.FromString(b"".join(parts))
            except Exception as exc:
                raise BertfuseError(f"{path}: not a readable ONNX model "
                                    f"({type(exc).__name__})") from None
            finally:
                buf.release()
    if not model.opset_import or not model.graph.node:
        raise BertfuseError(f"{path}: not an ONNX model (no graph or no opset)")

    check_stranger(model, path)  # limits, external data inside the model's folder, the graph
    return model


def dtype_name(elem_type: int) -> str:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:
        return onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "undefined"


def _itemsize(elem_type: int) -> int:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except Exception:
        return 0


def _value_info(v: onnx.ValueInfoProto) -> dict:
    t = v.type.tensor_type
    shape = None
    if t.HasField("shape"):
        shape = [d.dim_param if d.dim_param else (d.dim_value if d.HasField("dim_value") else "?")
                 for d in t.shape.dim]
    return {"name": v.name, "dtype": dtype_name(t.elem_type), "shape": shape}


def _opset_key(domain: str) -> str:
    return domain or "ai.onnx"


def table_from_model(model: onnx.ModelProto) -> EncoderTable:
    return encoder_table([n.op_type for n in model.graph.node])


def summarize(model: onnx.ModelProto | str | Path) -> dict:
    """The stable summary of a model (a path is read with load_light)."""
    if not isinstance(model, onnx.ModelProto):
        model = load_light(model)
    g = model.graph
    ops = Counter(n.op_type for n in g.node)
    by_dtype: dict[str, dict[str, int]] = {}
    inits = {}
    total = 0
    for t in g.initializer:
        name = dtype_name(t.data_type)
        size = int(np.prod(t.dims, dtype=np.int64)) * _itemsize(t.data_type)
        slot = by_dtype.setdefault(name, {"count": 0, "bytes": 0})
        slot["count"] += 1
        slot["bytes"] += size
        total += size
        inits[t.name] = {"dtype": name, "shape": [int(d) for d in t.dims]}
    encoder = table_from_model(model).to_json()
    encoder.pop("embed_reasons", None)
    for layer in encoder["layers"]:
        layer.pop("reasons", None)
    return {
        "format": SUMMARY_FORMAT,
        "producer": {"name": model.producer_name, "version": model.producer_version},
        "ir_version": int(model.ir_version),
        "opsets": {_opset_key(o.domain): int(o.version) for o in model.opset_import},
        "inputs": [_value_info(v) for v in g.input if v.name not in inits],
        "outputs": [_value_info(v) for v in g.output],
        "nodes": len(g.node),
        "ops": dict(sorted(ops.items())),
        "weights": {"count": len(g.initializer), "bytes": total,
                    "by_dtype": dict(sorted(by_dtype.items()))},
        "initializers": dict(sorted(inits.items())),
        "encoder": encoder,
    }


def dumps(summary: dict) -> str:
    """Sorted keys; a value that fits on one line (an initializer, a layer) stays on one:
    small, stable, line-per-fact diffs."""
    return _pretty(summary, 0) + "\n"


def _pretty(value, indent: int, width: int = 120) -> str:
    flat = json.dumps(value, sort_keys=True, separators=(", ", ": "))
    if indent and len(flat) + indent <= width or not isinstance(value, (dict, list)) \
            or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {_pretty(value[k], indent + 2, width)}"
                 for k in sorted(value)]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + _pretty(v, indent + 2, width) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def load_summary(path: str | Path) -> dict:
    """A model (.onnx) or a summary JSON, as a summary."""
    path = Path(path)
    if not path.exists():
        raise BertfuseError(f"{path}: no such file")
    if path.is_dir():
        raise BertfuseError(f"{path}: is a directory, expected an .onnx model or a summary "
                            f".json")
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    if head.startswith(b"{"):
        try:  # bounded in size and nesting before it is parsed (io/limits.py)
            data = json.loads(json_text(path, MAX_SUMMARY_BYTES, "a bertfuse summary"))
        except ValueError as exc:
            raise BertfuseError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != SUMMARY_FORMAT:
            raise BertfuseError(f"{path}: not a bertfuse summary (expected \"format\": "
                                f"\"{SUMMARY_FORMAT}\"; write one with bertfuse summarize)")

        where = first_error(data, "summary.json")  # a hand-edited field of the wrong type
        if where is not None:
            raise BertfuseError(f"{path}: not a valid bertfuse summary ({where}; was it "
                                f"edited?)")
        return data
    return summarize(load_light(path))


# ------------------------------------------------------------------------------ rendering


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _shape(shape) -> str:
    return "?" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


def _encoder_object(enc: dict) -> EncoderTable:
    layers = [LayerStatus(l["layer"], l["attention"], l["skip_layernorm"], l["gelu"],
                          dict(l.get("leftovers", {})), list(l.get("reasons", [])))
              for l in enc["layers"]]
    return EncoderTable(enc["embed_layernorm"], list(enc.get("embed_reasons", [])), layers)


def print_summary(s: dict, console, path: str = "") -> None:
    opsets = ", ".join(f"{d} {v}" for d, v in sorted(s["opsets"].items()))
    console.print(f"[bold]{escape(path)}[/bold]  producer {escape(s['producer']['name'])} "
                  f"{escape(s['producer']['version'])}, IR {s['ir_version']}, opsets: {opsets}",
                  highlight=False)
    t = Table(title="inputs / outputs")
    for col in ("", "name", "dtype", "shape"):
        t.add_column(col)
    for kind in ("inputs", "outputs"):
        for v in s[kind]:
            t.add_row(kind[:-1], escape(v["name"]), v["dtype"], escape(_shape(v["shape"])))
    console.print(t)
    t = Table(title=f"ops ({s['nodes']} nodes)")
    t.add_column("op")
    t.add_column("count", justify="right")
    for op, n in sorted(s["ops"].items(), key=lambda kv: (-kv[1], kv[0])):
        t.add_row(op, str(n))
    console.print(t)
    w = s["weights"]
    t = Table(title=f"weights ({w['count']} initializers, {_fmt_bytes(w['bytes'])})")
    for col in ("dtype", "count", "bytes"):
        t.add_column(col, justify="right" if col != "dtype" else "left")
    for dt, v in w["by_dtype"].items():
        t.add_row(dt, str(v["count"]), f"{v['bytes']:,} ({_fmt_bytes(v['bytes'])})")
    console.print(t)
    print_encoder_table(_encoder_object(s["encoder"]), console)


def summary_markdown(s: dict, path: str = "") -> str:
    opsets = ", ".join(f"{d} {v}" for d, v in sorted(s["opsets"].items()))
    out = [f"### {path or 'model'}", "",
           f"producer {s['producer']['name']} {s['producer']['version']}, IR {s['ir_version']}, "
           f"opsets: {opsets}, {s['nodes']} nodes", "",
           "| | name | dtype | shape |", "| --- | --- | --- | --- |"]
    for kind in ("inputs", "outputs"):
        out += [f"| {kind[:-1]} | `{v['name']}` | {v['dtype']} | {_shape(v['shape'])} |"
                for v in s[kind]]
    out += ["", "| op | count |", "| --- | ---: |"]
    out += [f"| {op} | {n} |" for op, n in sorted(s["ops"].items(),
                                                   key=lambda kv: (-kv[1], kv[0]))]
    w = s["weights"]
    out += ["", f"weights: {w['count']} initializers, {_fmt_bytes(w['bytes'])}", "",
            "| dtype | count | bytes |", "| --- | ---: | ---: |"]
    out += [f"| {dt} | {v['count']} | {v['bytes']:,} |" for dt, v in w["by_dtype"].items()]
    out += ["", encoder_markdown(s["encoder"])]
    return "\n".join(out) + "\n"


def encoder_markdown(enc: dict) -> str:
    ok = lambda b, text="fused": text if b else "**no**"  # noqa: E731
    out = ["| layer | attention | skip-LN | GELU | left unfused |", "| --- | --- | --- | --- | --- |",
           f"| embed | {ok(enc['embed_layernorm'], 'EmbedLayerNorm')} | | | |"]
    for l in enc["layers"]:
        left = ", ".join(f"{op} x{n}" for op, n in l.get("leftovers", {}).items())
        sln = f"{l['skip_layernorm']}/2" + ("" if l["skip_layernorm"] == 2 else " **!**")
        out.append(f"| {l['layer']} | {ok(l['attention'])} | {sln} | {ok(l['gelu'])} | {left} |")
    return "\n".join(out)
