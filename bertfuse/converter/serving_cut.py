"""Serving-signature surgery on a frozen GraphDef: the model's int inputs instead of what its
serving signature takes.

An Estimator export (`export_saved_model` with a parsing receiver, as google-research/bert's
run_classifier.py / run_squad.py are served) takes serialized tf.Example strings and parses
them in the graph. The graph is cut after the parse op; each parsed feature the outputs read
becomes an int32 input named after its feature (`input_ids`, `input_mask`, ...), so roles
come from feature names as from any signature's:

    examples (string) ─► ParseExample[V2] ─┬─ :k  input_ids   int64 ─► model
                                           ├─ :m  label_ids   int64 ─► (loss only)
                                           └─ :j  payload ─► DecodeRaw ─► Reshape ─► model
    ==>  input_ids (int32 [B, S]) ─► Cast(int64) ─► model
         payload   (int32 [B, n]) ─► Cast(out_type) ─► Reshape ─► model

    ParseSingleExample (one example a call): cut after its ExpandDims(axis 0), the batch.

`--inputs ROLE=TENSOR` may name any graph tensor (`bert/embeddings/Reshape:0`): the graph is
cut there the same way, for what the recognition misses. Then, for every source form:
inputs no kept output reads (a classifier export's `label_ids`, the string input after a
cut) are removed, and an output that only passes an input through (run_squad's
`unique_ids`) is left out unless `--outputs` names it. Every change is a note for the run
report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from bertfuse.errors import BertfuseError
from bertfuse.optional import optional

PARSE_OPS = ("ParseExample", "ParseExampleV2", "ParseSingleExample")
DECODE_OPS = ("DecodeRaw",)
# Ops that pass their first input's values through (an output made only of these echoes it).
_PASS = ("Identity", "Cast", "Reshape", "ExpandDims", "Squeeze", "StopGradient")


@dataclass
class Cut:
    graph_def: object
    inputs: dict[str, str]  # input name -> placeholder tensor
    outputs: dict[str, str]  # output key -> tensor
    override: dict[str, str]  # --inputs, with graph tensors replaced by the new inputs' names
    notes: list[str] = field(default_factory=list)


@dataclass
class _Feature:
    key: str  # the feature's name (or the role named by --inputs)
    tensor: str  # the tensor the new input replaces
    dtype: int  # its DataType enum
    dims: list[int]  # its shape, -1 unknown
    via: str  # what made it, for the note


def _name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _ref(ref: str) -> str:
    """`node` and `node:0` are one tensor."""
    ref = ref.lstrip("^")
    return ref if ":" in ref else f"{ref}:0"


def _strings(nodes: dict, ref: str) -> list[str] | None:
    """The values of a string constant (through Identity), or None."""
    node = nodes.get(_name(ref))
    for _ in range(16):
        if node is None or node.op != "Identity":
            break
        node = nodes.get(_name(node.input[0]))
    if node is None or node.op != "Const":
        return None
    return [s.decode("utf-8", "replace") for s in node.attr["value"].tensor.string_val]


def _dims(shape) -> list[int]:
    return [d.size for d in shape.dim]


def _parsed(graph_def, nodes: dict, node) -> list[_Feature]:
    """The dense features a parse op yields: key, output tensor, dtype, shape with batch."""
    a = node.attr
    if node.op == "ParseExampleV2":
        keys = _strings(nodes, node.input[3]) or []
        sparse = a["num_sparse"].i
    elif node.op == "ParseExample":
        sparse, dense = a["Nsparse"].i, a["Ndense"].i
        refs = node.input[2 + sparse:2 + sparse + dense]
        keys = [(_strings(nodes, r) or ["?"])[0] for r in refs]
    else:  # ParseSingleExample: keys are attributes, no batch dimension
        keys = [k.decode() for k in a["dense_keys"].list.s]
        sparse = a["num_sparse"].i
    # ParseExampleV2 also parses a scalar (tf.io.parse_single_example): no batch dimension.
    batch = [] if node.op == "ParseSingleExample" or \
        _static(graph_def, _ref(node.input[0]))[1] == [] else [-1]
    types, shapes = list(a["Tdense"].list.type), list(a["dense_shapes"].list.shape)
    if len(keys) != len(types):
        raise BertfuseError(f"{node.op} {node.name!r}: cannot read its feature names; pass "
                            f"--inputs ROLE=TENSOR naming the tensors the model reads")
    return [_Feature(k, f"{node.name}:{3 * sparse + j}", types[j], batch + _dims(shapes[j]),
                     f"{node.op} {node.name!r}") for j, k in enumerate(keys)]


def _consumers(graph_def) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for n in graph_def.node:
        for slot, ref in enumerate(n.input):
            if not ref.startswith("^"):
                out.setdefault(_ref(ref), []).append((n, slot))
    return out


def _follow(feature: _Feature, nodes: dict, consumers: dict) -> _Feature:
    """A batched feature read through DecodeRaw (bytes -> numbers): the decoded tensor is the
    model's input. A feature without a batch dimension (ParseSingleExample) is cut after the
    ExpandDims(axis 0) that makes one."""
    readers = consumers.get(feature.tensor, [])
    batched = bool(feature.dims) and feature.dims[0] == -1
    if batched and readers and all(n.op in DECODE_OPS and slot == 0 for n, slot in readers) \
            and len({n.name for n, _ in readers}) == 1:
        node = readers[0][0]
        return _Feature(feature.key, f"{node.name}:0", node.attr["out_type"].type,
                        [-1] * (len(feature.dims) + 1), f"{feature.via} + {node.op}")
    if batched:
        return feature
    if len(readers) == 1 and readers[0][0].op == "ExpandDims" and readers[0][1] == 0:
        axis = nodes.get(_name(readers[0][0].input[1]))
        if axis is not None and axis.op == "Const":
            tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

            if tf.make_ndarray(axis.attr["value"].tensor).reshape(-1).tolist() == [0]:
                return _Feature(feature.key, f"{readers[0][0].name}:0", feature.dtype,
                                [-1, *feature.dims], f"{feature.via} + ExpandDims")
    raise BertfuseError(f"{feature.via} parses one example per call and its feature "
                        f"{feature.key!r} has no batch dimension; pass --inputs ROLE=TENSOR "
                        f"naming the batched tensors the model reads")


def _read_tensors(graph_def, outputs: list[str]) -> tuple[set[str], set[str]]:
    """(nodes the outputs depend on, tensors those nodes read)."""
    nodes = {n.name: n for n in graph_def.node}
    todo, seen, read = [_name(t) for t in outputs], set(), {_ref(t) for t in outputs}
    while todo:
        name = todo.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        for ref in nodes[name].input:
            read.add(_ref(ref))
            todo.append(_name(ref))
    return seen, read


def _static(graph_def, tensor: str) -> tuple[int, list[int] | None]:
    """dtype enum and static shape (None: unknown rank) of a tensor, asked of TF with only
    the nodes it depends on imported."""
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    keep, _ = _read_tensors(graph_def, [tensor])
    part = type(graph_def)()
    part.versions.CopyFrom(graph_def.versions)
    part.library.CopyFrom(graph_def.library)
    part.node.extend(n for n in graph_def.node if n.name in keep)
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(part, name="")
        t = g.get_tensor_by_name(tensor)
    dims = None if t.shape.rank is None else [-1 if d is None else d for d in t.shape.as_list()]
    return t.dtype.as_datatype_enum, dims


def _numeric(dtype: int) -> bool:
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    d = tf.dtypes.as_dtype(dtype)
    return d.is_integer or d.is_floating or d.is_bool


def _dtype_name(dtype: int) -> str:
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    return tf.dtypes.as_dtype(dtype).name


def _unique(base: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.\-]", "_", base) or "input"
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def int32_feed(graph_def, name: str, dims: list[int], dtype: int, taken: set[str],
               cast_name: str | None = None) -> str:
    """Adds an int32 Placeholder `name` of `dims` (-1: unknown) and, where the graph reads
    another dtype, a Cast to it (`cast_name`, else `name/cast`); returns the node the graph's
    readers take instead."""
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    int32 = tf.int32.as_datatype_enum
    ph = graph_def.node.add(name=name, op="Placeholder")
    ph.attr["dtype"].type = int32
    for d in dims:
        ph.attr["shape"].shape.dim.add(size=d)
    if dtype == int32:
        return name
    cast = graph_def.node.add(name=cast_name or _unique(f"{name}/cast", taken), op="Cast",
                              input=[name])
    cast.attr["SrcT"].type = int32
    cast.attr["DstT"].type = dtype
    cast.attr["Truncate"].b = False
    return cast.name


def _replace(graph_def, features: list[_Feature]) -> list[str]:
    """Each feature's tensor fed by a new int32 Placeholder (Cast where the graph wants
    another dtype). Returns the new inputs' names, in the features' order."""
    taken = {n.name for n in graph_def.node}
    new, swap = [], {}
    for f in features:
        name = _unique(f.key, taken)
        swap[f.tensor] = int32_feed(graph_def, name, f.dims, f.dtype, taken)
        new.append(name)
    for n in graph_def.node:
        for i, ref in enumerate(n.input):
            if not ref.startswith("^") and _ref(ref) in swap:
                n.input[i] = swap[_ref(ref)]
    return new


def _echo(graph_def, tensor: str, inputs: dict[str, str], parsed: dict[str, str]) -> str | None:
    """The input or feature an output only passes through, else None."""
    nodes = {n.name: n for n in graph_def.node}
    by_tensor = {_ref(t): k for k, t in inputs.items()}
    ref = _ref(tensor)
    for _ in range(32):
        if ref in by_tensor:
            return by_tensor[ref]
        if ref in parsed:
            return parsed[ref]
        node = nodes.get(_name(ref))
        if node is None or node.op not in _PASS or not node.input:
            return None
        ref = _ref(node.input[0])
    return None


def _keep_only(graph_def, keep: set[str]):
    """Drops the nodes not in `keep`, in place (few go: no copy of a model's weights)."""
    for i in reversed([i for i, n in enumerate(graph_def.node) if n.name not in keep]):
        del graph_def.node[i]
    return graph_def


def cut(graph_def, inputs: dict[str, str], outputs: dict[str, str], override: dict[str, str],
        select: Callable[[dict[str, str]], dict[str, str]] | None = None) -> Cut:
    """The serving surgery (module docstring), on `graph_def` in place. `inputs`: input name
    -> placeholder tensor; `outputs`: output key -> tensor; `select`: picks the outputs to keep
    once passed-through ones are left out (None: keep all, as `--outputs` asked)."""
    nodes = {n.name: n for n in graph_def.node}
    consumers = _consumers(graph_def)
    notes: list[str] = []
    override = dict(override)
    parse_ops = {n.name: _parsed(graph_def, nodes, n) for n in graph_def.node
                 if n.op in PARSE_OPS}
    parsed = {f.tensor: f.key for fs in parse_ops.values() for f in fs}
    outputs = dict(outputs)
    if select is not None:  # outputs that only echo an input: left out
        for key, tensor in list(outputs.items()):
            src = _echo(graph_def, tensor, inputs, parsed)
            if src is not None and len(outputs) > 1:
                del outputs[key]
                notes.append(f"output {key} passes the input {src} through: left out "
                             f"(--outputs keeps it)")
        outputs = select(outputs)
    _, read = _read_tensors(graph_def, list(outputs.values()))
    features: list[_Feature] = []
    placeholders = {t.split(":")[0] for t in inputs.values()}
    for role, name in override.items():  # --inputs ROLE=TENSOR: a cut point
        node = nodes.get(_name(name))
        if node is None and re.fullmatch(r".+:\d+", name) and name not in inputs:
            raise BertfuseError(f"--inputs {role}={name}: the model has no input and no graph "
                                f"tensor {name!r} (inputs: {', '.join(inputs)})")
        if name in inputs or _name(name) in placeholders or node is None or \
                node.op == "Placeholder":
            continue  # an input: roles.assign_roles places it (or says it has none)
        dtype, dims = _static(graph_def, _ref(name))
        if not _numeric(dtype):
            raise BertfuseError(f"--inputs {role}={name}: a {_dtype_name(dtype)} tensor cannot "
                                f"be fed as int32 ids; name the numeric tensor the model reads")
        features.append(_Feature(role, _ref(name), dtype, [-1, -1] if dims is None else dims,
                                 f"--inputs {role}={name}"))
    named = {f.tensor for f in features}
    unread: list[str] = []
    for fs in parse_ops.values():
        for f in fs:
            if f.tensor not in read:
                unread.append(f.key)
                continue
            f = _follow(f, nodes, consumers)
            if f.tensor not in named:
                features.append(f)
    if features:
        names = _replace(graph_def, features)
        by_via: dict[str, list[str]] = {}
        for f, name in zip(features, names):
            if f.via.startswith("--inputs"):
                override[f.key] = name
            by_via.setdefault(f.via, []).append(name)
        for via, got in by_via.items():
            notes.append(f"cut after {via}: input{'s' if len(got) > 1 else ''} "
                         f"{', '.join(got)} (int32)")
        inputs = {**inputs, **{name: f"{name}:0" for name in names}}
    if unread:
        notes.append(f"parsed feature{'s' if len(unread) > 1 else ''} {', '.join(unread)} "
                     f"read by no kept output: left out")
    return prune(graph_def, inputs, outputs, override, notes, bool(features))


def prune(graph_def, inputs: dict[str, str], outputs: dict[str, str], override: dict[str, str],
          notes: list[str], changed: bool = False) -> Cut:
    """Inputs no output reads are removed (with the nodes only they fed)."""
    keep, _ = _read_tensors(graph_def, list(outputs.values()))
    unread = [k for k, t in inputs.items() if _name(t) not in keep]
    if not unread and not changed:
        return Cut(graph_def, inputs, outputs, override, notes)
    for k in unread:
        notes.append(f"input {k} is read by no kept output: left out")
    inputs = {k: t for k, t in inputs.items() if k not in unread}
    return Cut(_keep_only(graph_def, keep), inputs, outputs, override, notes)
