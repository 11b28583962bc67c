"""TFSource -> raw ONNX through tf2onnx, with weights kept out of tf2onnx.

tf2onnx holds several copies of every constant while it converts (12-14 GB peak RSS for a
3-layer, 183 MB model). Our sources hand it a GraphDef whose large weights are placeholders,
so it converts structure only; the real weights become ONNX initializers afterwards, by name.
Shape-only arithmetic on weights that tf2onnx would have folded is folded by our cleanup pass.
tf2onnx runs with two fixes where its output differs from the TF math (tf2onnx_fixes.py).
"""

from __future__ import annotations

import json
import logging
import os

import onnx
from onnx import TensorProto, helper, numpy_helper

from bertfuse._version import __version__
from bertfuse.converter.source import ROLES, TFSource
from bertfuse.errors import BertfuseError
from bertfuse.converter.tf2onnx_fixes import from_graph_def

SUPPORTED_OPSETS = (17, 18)
# Ops tf2onnx emits when it cannot map a TF op: they load in no runtime.
_ONNX_DOMAINS = ("", "ai.onnx", "com.microsoft")


def _quiet_tf2onnx() -> None:
    """tf2onnx's and TensorFlow's Python loggers at errors only, unless a level was chosen
    (the CLI's --log-level, cli/logs.py)."""
    for name in ("tf2onnx", "tensorflow"):
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def tf_to_onnx(src: TFSource, opset: int) -> onnx.ModelProto:
    """Converts with tf2onnx and renames I/O to the canonical interface."""
    if opset not in SUPPORTED_OPSETS:
        raise BertfuseError(f"--opset {opset} is not supported by tf2onnx 1.17 "
                            f"(choose {' or '.join(map(str, SUPPORTED_OPSETS))})")
    _quiet_tf2onnx()

    weight_inputs = [f"{name}:0" for name in src.weights]
    try:
        model = from_graph_def(src.graph_def,
                               input_names=[src.inputs[r] for r in src.inputs] + weight_inputs,
                               output_names=list(src.outputs.values()), opset=opset)
    except Exception as exc:
        raise BertfuseError(f"tf2onnx could not convert the graph: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:300] if str(exc) else ''}") from None
    _check_ops(model)
    _attach_weights(model, src)
    _canonicalise_io(model, src)
    meta = {"bertfuse_version": __version__, "source_kind": src.kind,
            "original_names": json.dumps(src.original_names, sort_keys=True),
            "output_roles": json.dumps(src.output_table())}
    if src.config:
        meta["bert_config"] = json.dumps(src.config, sort_keys=True)
    del model.metadata_props[:]
    for k, v in meta.items():
        model.metadata_props.add(key=k, value=v)
    # The raw graph stays tf2onnx's (ORT's bert_tf optimizer checks the producer);
    # the passes mark what they write as bertfuse's.
    return model


def _check_ops(model: onnx.ModelProto) -> None:
    """tf2onnx leaves an unmappable TF op in the graph under its TF name: refuse it here."""
    for node in model.graph.node:
        if node.domain in _ONNX_DOMAINS:
            try:
                onnx.defs.get_schema(node.op_type, max_inclusive_version=99, domain=node.domain)
                continue
            except onnx.defs.SchemaError:
                if node.domain == "com.microsoft":
                    continue  # contrib ops: ORT checks them when it loads the model
        raise BertfuseError(f"tf2onnx could not map TF op {node.op_type!r} (node {node.name!r});"
                            f" no ONNX equivalent is registered")


def _attach_weights(model: onnx.ModelProto, src: TFSource) -> None:
    graph = model.graph
    keep = []
    for inp in graph.input:
        name = inp.name[:-2] if inp.name.endswith(":0") else inp.name
        if name in src.weights:
            graph.initializer.append(numpy_helper.from_array(src.weights[name], inp.name))
        else:
            keep.append(inp)
    del graph.input[:]
    graph.input.extend(keep)
    # Weight names read better without tf2onnx's ":0".
    renames = {i.name: i.name[:-2] for i in graph.initializer if i.name.endswith(":0")}
    rename_values(graph, renames)


def rename_values(graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    if not renames:
        return
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        for i, name in enumerate(node.output):
            if name in renames:
                node.output[i] = renames[name]
    for coll in (graph.input, graph.output, graph.value_info, graph.initializer):
        for item in coll:
            if item.name in renames:
                item.name = renames[item.name]


def _canonicalise_io(model: onnx.ModelProto, src: TFSource) -> None:
    """Inputs input_ids/input_mask/segment_ids int32 [batch, seq]; canonical output names."""
    graph = model.graph
    tf_to_role = {src.inputs[r]: r for r in src.inputs}
    renames: dict[str, str] = {}
    casts = []
    for inp in graph.input:
        role = tf_to_role.get(inp.name)
        if role is None:
            raise BertfuseError(f"unexpected graph input {inp.name!r} after export")
        if inp.type.tensor_type.elem_type != TensorProto.INT32:
            # The model wants int64 (Keras does); serve int32 and cast inside the graph.
            casts.append(helper.make_node("Cast", [role], [inp.name], to=inp.type.tensor_type.elem_type,
                                          name=f"{role}_cast"))
        else:
            renames[inp.name] = role
    rename_values(graph, renames)
    new_inputs = []
    order = {r: i for i, r in enumerate(ROLES)}
    # [batch, choices, seq] for multiple choice (the model flattens them itself)
    dims = ["batch"] + (["choices"] if src.input_rank == 3 else []) + [src.fixed_seq or "seq"]
    for inp in sorted(graph.input, key=lambda i: order.get(tf_to_role.get(i.name, i.name), 9)):
        role = tf_to_role.get(inp.name, inp.name)
        new_inputs.append(helper.make_tensor_value_info(role, TensorProto.INT32, dims))
    # One interface for every model: a model without token types (DistilBERT, RoBERTa-style
    # encoders) still takes segment_ids, and ignores it, so servers need no per-model case.
    for role in ROLES:
        if role not in src.inputs and role != "input_ids":
            new_inputs.append(helper.make_tensor_value_info(role, TensorProto.INT32, dims))
    new_inputs.sort(key=lambda i: order.get(i.name, 9))
    del graph.input[:]
    graph.input.extend(new_inputs)
    for c in reversed(casts):
        graph.node.insert(0, c)

    tf_to_out = {t: n for n, t in src.outputs.items()}
    out_renames = {o.name: tf_to_out[o.name] for o in graph.output if o.name in tf_to_out}
    rename_values(graph, out_renames)
    for out in graph.output:
        dims = out.type.tensor_type.shape.dim
        if out.name == "sequence_output" and len(dims) == 3:
            dims[0].dim_param, dims[1].dim_param = "batch", "seq"
        elif len(dims) >= 1 and not dims[0].dim_value:
            dims[0].dim_param = "batch"
            if src.input_rank == 3 and len(dims) == 2 and not dims[1].dim_value:
                dims[1].dim_param = "choices"  # a multiple-choice model's [batch, choices]
