"""Frozen GraphDef sources (.pb), and the freezing that SavedModel/Keras sources share.

Every non-checkpoint source ends as a frozen GraphDef. Its large constants are then turned
into placeholders (`externalize_weights`) so tf2onnx converts structure only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from google.protobuf import text_format

from bertfuse.converter.roles import UnknownInput, assign_roles
from bertfuse.converter.source import TFSource
from bertfuse.errors import BertfuseError
from bertfuse.converter import serving_cut, untrusted
from bertfuse.converter.graph_roles import roles_from_graph
from bertfuse.converter.output_meaning import alias_role, name_outputs
from bertfuse.optional import optional

# Constants at least this large are weights: they bypass tf2onnx (see export.py).
WEIGHT_BYTES = 16 * 1024


def externalize_weights(graph_def) -> dict[str, np.ndarray]:
    """Replaces large float Const nodes by Placeholders of the same name, shape and dtype."""
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    weights: dict[str, np.ndarray] = {}
    for node in graph_def.node:
        if node.op != "Const":
            continue
        tensor = node.attr["value"].tensor
        if tensor.dtype not in (tf.float32.as_datatype_enum, tf.float16.as_datatype_enum):
            continue
        numel = int(np.prod([d.size for d in tensor.tensor_shape.dim])) if \
            tensor.tensor_shape.dim else 1
        if numel * 4 < WEIGHT_BYTES:
            continue
        weights[node.name] = tf.make_ndarray(tensor)
        dtype = node.attr["dtype"].type
        shape = tensor.tensor_shape
        node.op = "Placeholder"
        node.attr.clear()
        node.attr["dtype"].type = dtype
        node.attr["shape"].shape.CopyFrom(shape)
    return weights


def canonical_output_name(name: str, rank: int | None, used: set[str]) -> str:
    """An output role by alias (OUTPUT_ROLES; a `logits` of rank 3 is `token_logits`), else
    the model's own name (case kept)."""
    return alias_role(name, rank, used) or name.split(":")[0]


def _placeholders(graph_def) -> list:
    return [n for n in graph_def.node if n.op == "Placeholder"]


def _detect_outputs(graph_def) -> list[str]:
    """Nodes nothing consumes, minus constants/no-ops: a frozen graph's outputs."""
    consumed = set()
    for node in graph_def.node:
        for inp in node.input:
            consumed.add(inp.lstrip("^").split(":")[0])
    return [n.name for n in graph_def.node
            if n.name not in consumed and n.op not in ("Const", "NoOp", "Placeholder", "Assert",
                                                        "SaveV2", "RestoreV2")]


def source_from_graph_def(graph_def, kind: str, path: str, inputs: dict[str, str] | None,
                          outputs: list[str] | None, role_override: dict[str, str],
                          output_names: dict[str, str] | None = None,
                          output_ranks: dict[str, int | None] | None = None) -> TFSource:
    """Shared tail of frozen/SavedModel/Keras: roles, outputs, externalised weights."""
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    int_types = {tf.int32.as_datatype_enum, tf.int64.as_datatype_enum}
    phs = {n.name: n for n in _placeholders(graph_def)}
    if inputs is None:
        names = list(phs)
        try:
            roles = assign_roles(names, role_override,
                                 {n for n, p in phs.items() if p.attr["dtype"].type in int_types})
        except UnknownInput:
            raise
        except BertfuseError:  # names do not tell: what each input feeds does

            roles = roles_from_graph(graph_def, {n: n for n in names}, role_override)
        inputs = {r: f"{n}:0" for r, n in roles.items()}
    dtypes = {}
    fixed_seq = None
    ranks = set()
    for role, tensor in inputs.items():
        node = phs.get(tensor.split(":")[0])
        if node is None:
            raise BertfuseError(f"{path}: input {tensor!r} is not a placeholder of the graph")
        dtypes[role] = np.dtype(tf.dtypes.as_dtype(node.attr["dtype"].type).as_numpy_dtype)
        dims = node.attr["shape"].shape.dim
        if len(dims) in (2, 3) and dims[-1].size > 0:
            fixed_seq = dims[-1].size
        ranks.add(len(dims) if node.attr["shape"].HasField("shape") and
                  not node.attr["shape"].shape.unknown_rank else 2)
    input_rank = 3 if ranks == {3} else 2  # [batch, choices, seq]: multiple choice
    if outputs is None:
        outputs = [f"{n}:0" for n in _detect_outputs(graph_def)]
    # `--outputs` names nodes; tf2onnx wants tensors.
    outputs = [o if ":" in o else f"{o}:0" for o in outputs]
    if not outputs:
        raise BertfuseError(f"{path}: no outputs found; name them with --outputs")
    _check_outputs(graph_def, outputs, path)

    if output_ranks is None:
        output_ranks = _static_ranks(graph_def, outputs)
    original: dict[str, str] = {r: t.split(":")[0] for r, t in inputs.items()}
    shown = {out: (output_names or {}).get(out, out[:-2] if out.endswith(":0") else out)
             for out in outputs}
    canon, roles = name_outputs(graph_def, outputs, shown, output_ranks or {})
    original.update({name: shown[t] for name, t in canon.items()})
    weights = externalize_weights(graph_def)
    vocab, type_vocab, max_pos = _table_sizes(graph_def, weights)
    return TFSource(kind=kind, path=path, graph_def=graph_def, weights=weights, inputs=inputs,
                    input_dtypes=dtypes, outputs=canon, original_names=original,
                    output_roles=roles,
                    vocab_size=vocab, type_vocab_size=type_vocab, max_positions=max_pos,
                    fixed_seq=fixed_seq, input_rank=input_rank)


def _check_outputs(graph_def, tensors: list[str], path: str) -> None:
    node_names = {n.name for n in graph_def.node}
    for out in tensors:
        if out.split(":")[0] not in node_names:
            raise BertfuseError(f"{path}: no node {out.split(':')[0]!r} in the graph")


def _static_ranks(graph_def, tensors: list[str]) -> dict[str, int | None]:
    """Each tensor's rank as TF infers it (a frozen graph's outputs carry no signature)."""
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        return {t: graph.get_tensor_by_name(t).shape.rank for t in tensors}
    except Exception:  # a graph TF cannot import: tf2onnx's own error names why
        return {t: None for t in tensors}


def _table_sizes(graph_def, weights: dict[str, np.ndarray]) -> tuple[int | None, int, int | None]:
    """Vocab size = rows of the largest 2-D table read by a gather (for valid random ids);
    max positions = rows of a table named `position`, else of a 2-D weight read by a slice
    (modeling.py's and keras-hub's position tables)."""
    nodes = {n.name: n for n in graph_def.node}

    def source(name: str) -> str:
        # Frozen SavedModels read weights through Identity chains (ReadVariableOp, function
        # inputs); weights there are named `unknown_N`.
        name = name.lstrip("^").split(":")[0]
        seen = 0
        while name in nodes and nodes[name].op == "Identity" and nodes[name].input and seen < 64:
            name = nodes[name].input[0].lstrip("^").split(":")[0]
            seen += 1
        return name

    gathered, sliced = set(), set()
    for node in graph_def.node:
        if node.op in ("GatherV2", "Gather", "ResourceGather"):
            gathered.add(source(node.input[0]))
        elif node.op in ("Slice", "StridedSlice"):
            sliced.add(source(node.input[0]))
    tables = sorted((w.shape[0] for n, w in weights.items() if w.ndim == 2 and
                     (n in gathered or not gathered)), reverse=True)
    vocab = tables[0] if tables else None
    type_vocab = 2
    for name, w in weights.items():
        if w.ndim == 2 and ("type" in name.lower() or "segment" in name.lower()) and w.shape[0] < 16:
            type_vocab = w.shape[0]
    max_pos = None
    for name, w in weights.items():
        if w.ndim == 2 and "position" in name.lower():
            max_pos = w.shape[0]
    if max_pos is None:
        rows = [w.shape[0] for n, w in weights.items() if w.ndim == 2 and n in sliced
                and w.shape[0] != vocab]
        max_pos = min(rows) if rows else None
    return vocab, type_vocab, max_pos


def load_frozen(path: str, outputs: list[str] | None,
                role_override: dict[str, str], trust: bool = False) -> TFSource:
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    if Path(path).is_dir():
        raise BertfuseError(f"{path}: is a directory, expected a frozen GraphDef (.pb) file")
    data = Path(path).read_bytes()
    graph_def = tf.compat.v1.GraphDef()
    try:
        if path.endswith(".pbtxt"):  # detect_kind maps .pbtxt here: text format

            text_format.Parse(data.decode("utf-8"), graph_def)
        else:
            graph_def.ParseFromString(data)
    except Exception:
        raise BertfuseError(f"{path}: not a TensorFlow GraphDef (protobuf parse failed)") from None
    if not graph_def.node:
        raise BertfuseError(f"{path}: empty or not a TensorFlow GraphDef")

    # Ops that reach outside the model: refused before TF imports or runs the graph.
    notes = untrusted.enforce(path, untrusted.scan_graph(graph_def), trust)

    # tf.Example parsing cut off, unread inputs left out (the outputs: as given or detected).
    tensors = [o if ":" in o else f"{o}:0" for o in outputs or _detect_outputs(graph_def)]
    _check_outputs(graph_def, tensors, path)  # --outputs naming nothing: before any cut
    placeholders = {n.name: f"{n.name}:0" for n in _placeholders(graph_def)}
    cut = serving_cut.cut(graph_def, placeholders, dict(zip(tensors, tensors)), role_override)
    src = source_from_graph_def(cut.graph_def, "frozen", path, None, outputs, cut.override)
    src.notes.extend([*notes, *cut.notes])
    return src
