"""ONNX models from someone else: what is checked from the proto before any command uses one.

Every command that reads a user's .onnx (inspect, diff, verify, optimize, strip-weights, serve,
score, export-triton, the Python API's Session) parses it without its external data and calls
`check_stranger` before anything reads a weight, allocates from a declared size, rewrites or
copies it:

* limits (`LIMITS`): the node count, and every declared size (initializer dims, the dims of
  inputs, outputs and value_info), checked from the proto before any allocation;
* external data: each tensor's `location` is a relative path without '..', whose real path
  (symbolic links followed) stays inside the model's folder, as ONNX Runtime requires, and
  whose offset and length lie inside the file; the declared bytes fit in them;
* the graph: every node input made by a node, a graph input or an initializer (names a
  subgraph reads from outside count as its node's inputs), no name written twice, no cycle.

Each refusal is one BertfuseError line naming the file, the tensor or node, and the limit or
path. All of it is linear in the size of the proto (dicts and one topological sort).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterator

import onnx
from onnx import TensorProto

from bertfuse.errors import BertfuseError

# The limits, far above any BERT. Nodes: a raw 2-layer export from tf2onnx has 167 nodes
# (Hugging Face style: 224, about 100 a layer), so BERT-large (24 layers) has ~2,500. The
# optimize passes take a time linear in the nodes, about 1.6 ms a node on one CPU core
# (chains of 2,000 / 5,000 / 10,000 nodes: 3.2 / 8.0 / 16.6 s), so 50,000 nodes bound optimize
# to under two minutes and a 100,000-node file of 3 MB is refused at once. Elements: 2^31
# float32 are 8 GB, 250 times BERT-large's largest tensor (the 30522 x 1024 word table). Dims:
# none past int32, which ONNX Runtime's CUDA kernels index with.
LIMITS = {
    "nodes": 50_000,                  # nodes in all graphs and functions together
    "tensor elements": 2**31,         # elements of one initializer, or of one declared shape
    "dim": 2**31 - 1,                 # one declared dimension
}
# Bits per element where numpy's dtype says otherwise (packed sub-byte types).
_BITS = {TensorProto.INT4: 4, TensorProto.UINT4: 4,
         getattr(TensorProto, "FLOAT4E2M1", -1): 4,
         getattr(TensorProto, "INT2", -2): 2, getattr(TensorProto, "UINT2", -3): 2}


def check_stranger(model: onnx.ModelProto, path: str | os.PathLike) -> list[str]:
    """Refuses a model past the limits, with external data outside its folder, or whose graph
    is not a graph (dangling input, name written twice, cycle); returns its external data
    files as the model names them (relative to its folder), in order."""
    path = Path(path)
    graphs, attr_tensors, main_subs = _walk(model, path)  # counts the nodes first
    file_size = path.stat().st_size
    files: dict[str, None] = {}  # in order, once each
    for where, t in _tensors(graphs, attr_tensors):
        available = None if t.data_location == TensorProto.EXTERNAL else file_size
        if t.data_location == TensorProto.EXTERNAL:
            rel, available = _external(t, where, path)
            files[rel] = None
        _check_tensor_size(t, where, path, available)
    for where, v in _value_infos(model.graph):
        _check_declared(v, where, path)
    check_graph(model.graph, path, main_subs)
    return list(files)


def _check_node_count(count: int, path: Path) -> None:
    if count > LIMITS["nodes"]:
        raise BertfuseError(f"{path}: {count} nodes or more, past bertfuse's limit of "
                            f"{LIMITS['nodes']} (a BERT has a few thousand); not read further")


def _walk(model: onnx.ModelProto, path: Path) -> tuple[
        list[onnx.GraphProto], list[tuple[str, TensorProto]], dict[int, list[onnx.GraphProto]]]:
    """Every graph (the main one, If/Loop/Scan bodies, in functions too), every tensor in a
    node attribute (Constant's value), and the subgraphs of the main graph's nodes by index,
    in one pass over the nodes, counted against the limit as it goes: protobuf's field access
    is the cost here (microseconds a field), so each node's attributes are read once."""
    graphs: list[onnx.GraphProto] = []
    tensors: list[tuple[str, TensorProto]] = []
    main_subs: dict[int, list[onnx.GraphProto]] = {}
    todo: list = [(model.graph, model.graph.node, True)] + \
        [(None, f.node, False) for f in model.functions]
    count = 0
    while todo:
        graph, nodes, main = todo.pop()
        count += len(nodes)
        _check_node_count(count, path)
        if graph is not None:
            graphs.append(graph)
        for i, n in enumerate(nodes):
            for a in n.attribute:
                subs = ([a.g] if a.HasField("g") else []) + list(a.graphs)
                if subs and main:
                    main_subs.setdefault(i, []).extend(subs)
                todo += [(g, g.node, False) for g in subs]
                for t in ([a.t] if a.HasField("t") else []) + list(a.tensors):
                    tensors.append((f"node {_show(n.name)} attribute {_show(a.name)}", t))
    return graphs, tensors, main_subs


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [a.g for a in node.attribute if a.HasField("g")] + \
        [g for a in node.attribute for g in a.graphs]


def _tensors(graphs: list[onnx.GraphProto], attr_tensors: list[tuple[str, TensorProto]]
             ) -> Iterator[tuple[str, TensorProto]]:
    """(what it is, tensor) for every tensor that holds data: initializers, sparse ones,
    and the tensors in node attributes."""
    for g in graphs:
        for t in g.initializer:
            yield f"initializer {_show(t.name)}", t
        for s in g.sparse_initializer:
            yield f"sparse initializer {_show(s.values.name)}", s.values
            yield f"sparse initializer {_show(s.values.name)} (indices)", s.indices
    yield from attr_tensors


def _value_infos(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.ValueInfoProto]]:
    for part in ("input", "output", "value_info"):
        for v in getattr(graph, part):
            yield f"{part.replace('_', ' ')} {_show(v.name)}", v


def _refuse_elements(count: int, what: str, path: Path) -> None:
    if count > LIMITS["tensor elements"]:
        raise BertfuseError(f"{path}: {what} declares {count} elements, past bertfuse's limit "
                            f"of {LIMITS['tensor elements']} for one tensor")


def _check_tensor_size(t: TensorProto, where: str, path: Path, available: int | None) -> None:
    """Declared dims before any allocation: none negative, elements under the limit, and
    bytes no more than the file (or the external data's length) holds."""
    if any(d < 0 for d in t.dims):
        raise BertfuseError(f"{path}: {where} has a negative dim {list(t.dims)}")
    if any(d > LIMITS["dim"] for d in t.dims):
        raise BertfuseError(f"{path}: {where} has a dim past bertfuse's limit of "
                            f"{LIMITS['dim']} ({list(t.dims)})")
    count = math.prod(t.dims)
    _refuse_elements(count, where, path)
    # raw_data holds the bytes; the typed fields (int64_data, ...) take at least a byte an
    # element (varints), and so do the strings (a length each).
    bits = _bits(t.data_type) if t.HasField("raw_data") or \
        t.data_location == TensorProto.EXTERNAL else 8
    need = (count * bits + 7) // 8
    if available is not None and need > available:
        held = "its external data holds" if t.data_location == TensorProto.EXTERNAL else \
            "the whole file has"
        raise BertfuseError(f"{path}: {where} declares dims {list(t.dims)} ({need} bytes), "
                            f"but {held} {available}")


def _bits(data_type: int) -> int:
    if data_type in _BITS:
        return _BITS[data_type]
    if data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return 8
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize * 8
    except Exception:  # a type this onnx does not know: the checker names it later
        return 8


def _check_declared(v: onnx.ValueInfoProto, where: str, path: Path) -> None:
    """A declared shape (input, output, value_info): each dim within the limit, and the
    known dims together within the element limit (probe inputs are made from them)."""
    t = v.type.tensor_type if v.type.HasField("tensor_type") else None
    if t is None or not t.HasField("shape"):
        return
    known = [d.dim_value for d in t.shape.dim if d.HasField("dim_value")]
    bad = [d for d in known if d < 0 or d > LIMITS["dim"]]
    if bad:
        raise BertfuseError(f"{path}: {where} declares dim {bad[0]}, outside [0, "
                            f"{LIMITS['dim']}]")
    _refuse_elements(math.prod(known), where, path)


def _external(t: TensorProto, where: str, path: Path) -> tuple[str, int]:
    """The data file of an external tensor as the model names it, and the bytes
    its offset and length leave it; refused unless it is a regular file inside the folder
    once symbolic links are followed."""
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    beside = "keep the data files inside the model's folder, as ONNX Runtime requires"
    if not loc or "\0" in loc:
        raise BertfuseError(f"{path}: {where} has external data without a usable location "
                            f"({_show(loc)})")
    if os.path.isabs(loc) or loc.startswith(("/", "\\")) or ":" in loc[:3]:
        raise BertfuseError(f"{path}: {where} has its external data at the absolute path "
                            f"{_show(loc)}; {beside}")
    if ".." in loc.replace("\\", "/").split("/"):
        raise BertfuseError(f"{path}: {where} has its external data at {_show(loc)}, which climbs "
                            f"out with '..'; {beside}")
    folder = os.path.realpath(path.parent)
    real = os.path.realpath(os.path.join(folder, loc))
    if os.path.commonpath([folder, real]) != folder:
        raise BertfuseError(f"{path}: {where} has its external data at {_show(loc)}, which leads "
                            f"outside the model's folder (to {real}); {beside}")
    if not os.path.isfile(real):
        raise BertfuseError(f"{path}: {where} has its external data at {_show(loc)}, which is "
                            f"{'not a regular file' if os.path.exists(real) else 'missing'}")
    try:
        size = os.path.getsize(real)
        with open(real, "rb"):  # readable: ONNX Runtime would fail on it later, unnamed
            pass
    except OSError as exc:
        raise BertfuseError(f"{path}: {where} has its external data at {_show(loc)}, which cannot "
                            f"be read ({exc.strerror})") from None
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else size - offset
    except ValueError:
        raise BertfuseError(f"{path}: {where} has an external data offset or length that "
                            f"is not a number ({_show(info.get('offset', ''))}, "
                            f"{_show(info.get('length', ''))})") from None
    if offset < 0 or length < 0 or offset + length > size:
        raise BertfuseError(f"{path}: {where} reads bytes {offset} to {offset + length} of "
                            f"{_show(loc)}, which has {size}")
    return os.path.normpath(loc), length  # as the model names it: a copy keeps the name


def check_graph(graph: onnx.GraphProto, path: str | os.PathLike,
                subs: dict[int, list[onnx.GraphProto]] | None = None) -> None:
    """Every node input made by someone, no name written twice, no cycle (ONNX Runtime cannot
    load a cyclic graph; the passes would loop on it). One line naming the node. subs: the
    subgraphs of the nodes by index, where the caller has them."""
    nodes = list(graph.node)
    if subs is None:
        subs = {i: g for i, n in enumerate(nodes) if (g := _subgraphs(n))}
    sources = {i.name for i in graph.input} | {t.name for t in graph.initializer} | \
        {s.values.name for s in graph.sparse_initializer}
    made_by: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for out in node.output:
            if not out:
                continue
            if out in made_by:
                raise BertfuseError(f"{path}: {_node(node, i)} writes {_show(out)}, which "
                                    f"{_node(nodes[made_by[out]], made_by[out])} writes too")
            if out in sources:
                raise BertfuseError(f"{path}: {_node(node, i)} writes {_show(out)}, which is a "
                                    f"graph input or initializer")
            made_by[out] = i
    reads = [_reads(node, subs.get(i, ())) for i, node in enumerate(nodes)]
    readers: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, names in enumerate(reads):
        for name in names:
            if name in made_by:
                readers[made_by[name]].append(i)
                waiting[i] += 1
            elif name not in sources:
                raise BertfuseError(f"{path}: {_node(nodes[i], i)} reads {_show(name)}, which no "
                                    f"node, graph input or initializer makes")
    for out in graph.output:
        if out.name not in made_by and out.name not in sources:
            raise BertfuseError(f"{path}: graph output {_show(out.name)} is made by no node")
    ready = [i for i, w in enumerate(waiting) if w == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for j in readers[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    if done < len(nodes):
        i = _on_cycle(reads, waiting, made_by)
        raise BertfuseError(f"{path}: the graph has a cycle through {_node(nodes[i], i)} "
                            f"({len(nodes) - done} nodes cannot be ordered)")


def _reads(node: onnx.NodeProto, subs) -> list[str]:
    """The names a node reads, its subgraphs' reads from outside them included, once each."""
    names = dict.fromkeys(n for n in node.input if n)
    for sub in subs:
        names.update(dict.fromkeys(sorted(_free_names(sub))))
    return list(names)


def _on_cycle(reads: list[list[str]], waiting: list[int], made_by: dict[str, int]) -> int:
    """A node on a cycle: from a node left waiting, step to a waiting producer of one of its
    inputs until a node comes round again."""
    i = next(k for k, w in enumerate(waiting) if w > 0)
    seen = set()
    while i not in seen:
        seen.add(i)
        i = next(made_by[n] for n in reads[i] if n in made_by and waiting[made_by[n]] > 0)
    return i


def _free_names(graph: onnx.GraphProto) -> set[str]:
    """The names a subgraph reads from the graphs around it."""
    made = {i.name for i in graph.input} | {t.name for t in graph.initializer} | \
        {s.values.name for s in graph.sparse_initializer} | \
        {o for n in graph.node for o in n.output}
    read = {n for node in graph.node for n in node.input if n} | {o.name for o in graph.output}
    for node in graph.node:
        for sub in _subgraphs(node):
            read |= _free_names(sub)
    return read - made


def _node(node: onnx.NodeProto, index: int) -> str:
    op = node.op_type[:60]
    return f"node {_show(node.name)} ({op})" if node.name else f"node #{index} ({op})"


def _show(text: str, most: int = 200) -> str:
    """A name or path from the file, quoted, cut where an attacker made it long."""
    return repr(text) if len(text) <= most else repr(text[:most]) + f"... ({len(text)} chars)"
