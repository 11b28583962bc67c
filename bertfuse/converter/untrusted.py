"""Ops that reach outside the model, found in a TF model's graphs before TensorFlow runs them.

Converting and verifying run the model's own TensorFlow graph: loading it (table
initialisers), tracing and freezing its signature, and the parity run. A graph op such as
`WriteFile` or `EagerPyFunc` then acts outside the model, and tf2onnx drops it from the ONNX
model, which keeps no trace of it. So every graph that will run is read first, with protobuf
only (nothing executed), and an op of the table below is refused in one line naming it,
unless the user trusts the model (`--trust-model`: the report's notes then name the ops).

    frozen GraphDef (.pb)   its nodes and its function library
    SavedModel              saved_model.pb (or .pbtxt): the MetaGraphDef's nodes and every function of
                            its library, read once; TF's own saver graph (the save/restore
                            nodes of `saver_def` and the functions only they call) may hold
                            the checkpoint ops, which read the SavedModel's variables/; its
                            asset names stay inside the model's folder
    .keras                  config.json: a TFSMLayer loads a SavedModel from any path (Keras'
                            safe mode already refuses a Lambda's Python code)
    checkpoint              bertfuse builds the graph itself: nothing of the user's runs

Op types are matched, never node names.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format

from bertfuse.errors import BertfuseError
from bertfuse.optional import optional

_OUTSIDE: dict[str, str] = {}


def _ops(what: str, *ops: str) -> None:
    _OUTSIDE.update(dict.fromkeys(ops, what))


_ops("writes files", "WriteFile", "Save", "SaveV2", "SaveSlices", "MergeV2Checkpoints",
     "WriteSummary", "WriteRawProtoSummary", "WriteScalarSummary", "WriteHistogramSummary",
     "WriteImageSummary", "WriteAudioSummary", "WriteGraphSummary", "ImportEvent",
     "CreateSummaryFileWriter", "CreateSummaryDbWriter", "FlushSummaryWriter",
     "CloseSummaryWriter", "SaveDataset", "SaveDatasetV2", "DistributedSave", "CacheDataset",
     "CacheDatasetV2", "DatasetToTFRecord", "ExperimentalDatasetToTFRecord",
     "DebugIdentity", "DebugIdentityV2", "DebugIdentityV3", "DebugNanCount",
     "DebugNumericSummary", "DebugNumericSummaryV2")
_ops("reads files", "ReadFile", "Restore", "RestoreV2", "RestoreSlice", "ImmutableConst",
     "TextLineDataset", "TFRecordDataset", "TFRecordDatasetV2", "FixedLengthRecordDataset",
     "FixedLengthRecordDatasetV2", "CSVDataset", "CSVDatasetV2", "ExperimentalCSVDataset",
     "LMDBDataset", "ExperimentalLMDBDataset", "LoadDataset", "SnapshotDataset",
     "SnapshotDatasetV2", "SnapshotDatasetReader", "SnapshotNestedDatasetReader",
     "TextLineReader", "TextLineReaderV2", "TFRecordReader", "TFRecordReaderV2",
     "FixedLengthRecordReader", "FixedLengthRecordReaderV2", "WholeFileReader",
     "WholeFileReaderV2", "LMDBReader", "LoadAndRemapMatrix", "GenerateVocabRemapping")
_ops("lists files", "MatchingFiles", "MatchingFilesDataset", "ExperimentalMatchingFilesDataset")
_ops("runs Python code", "PyFunc", "PyFuncStateless", "EagerPyFunc")
_ops("reaches the network", "RpcClient", "RpcCall", "RpcServer", "RpcServerStart",
     "RpcServerRegister", "DataServiceDataset", "DataServiceDatasetV2", "DataServiceDatasetV3",
     "DataServiceDatasetV4", "SqlDataset", "ExperimentalSqlDataset")
OUTSIDE_OPS = frozenset(_OUTSIDE)
# TF's own saver graph restores the SavedModel's variables/ with these.
CHECKPOINT_OPS = frozenset({"Save", "SaveV2", "SaveSlices", "Restore", "RestoreV2",
                            "RestoreSlice", "MergeV2Checkpoints"})
RESTORE_OPS = frozenset({"Restore", "RestoreV2", "RestoreSlice"})
# A vocab table read from a file: allowed where the file is the SavedModel's own asset.
TEXT_FILE_TABLES = frozenset({"InitializeTableFromTextFile", "InitializeTableFromTextFileV2"})


@dataclass(frozen=True)
class Finding:
    op: str
    node: str
    function: str | None  # None: a node of the graph itself
    what: str

    def where(self) -> str:
        if self.op in ("TFSMLayer", "Lambda"):
            return f"layer {self.node!r}"
        if self.op == "asset":
            return f"assets/{self.node}"
        place = f"function {self.function!r}" if self.function else "the graph"
        return f"node {self.node!r} in {place}"


def _what(node, asset_bound: bool) -> str | None:
    """What `node` does outside the model, or None."""
    op = node.op
    if op in _OUTSIDE:
        return _OUTSIDE[op]
    if op == "PrintV2" and node.attr["output_stream"].s.startswith(b"file://"):
        return "writes files"
    if op in ("DecodeProtoV2", "EncodeProto"):
        source = node.attr["descriptor_source"].s
        if source and not source.startswith((b"local://", b"bytes://")):
            return "reads files"
    if op in TEXT_FILE_TABLES and not asset_bound:
        return "reads files (a table from a path that is not the model's own asset)"
    return None


def _called(node) -> list[str]:
    """The functions a node calls (its op itself, or through `f`, branches, bodies...)."""
    names = [a.func.name for a in node.attr.values() if a.func.name]
    for a in node.attr.values():
        names += [f.name for f in a.list.func]
    return names


def _tensor_node(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


class _Library:
    """A GraphDef's functions, and which function arguments are the SavedModel's assets."""

    def __init__(self, graph_def, asset_tensors: set[str], objects=None) -> None:
        self.functions = {f.signature.name: f for f in graph_def.library.function}
        self.asset_tensors = asset_tensors
        self.objects = objects  # a SavedModel's object graph: what its functions capture
        self.nodes = {n.name: n for n in graph_def.node}
        self.assigns: dict[str, list[str]] = {}  # a variable of the graph -> values assigned
        for node in graph_def.node:
            if node.op in ("AssignVariableOp", "Assign") and len(node.input) > 1:
                self.assigns.setdefault(_tensor_node(node.input[0]), []).append(node.input[1])
        # (function, arg index) <- (caller function or None, call node) for every call site
        self.calls: dict[str, list[tuple[str | None, object]]] = {}
        for node in graph_def.node:
            self._note_calls(None, node)
        for name, fdef in self.functions.items():
            for node in fdef.node_def:
                self._note_calls(name, node)

    def _note_calls(self, caller: str | None, node) -> None:
        targets = _called(node) + ([node.op] if node.op in self.functions else [])
        for fn in targets:
            self.calls.setdefault(fn, []).append((caller, node))

    def _graph_bound(self, ref: str, roots: set[str], depth: int) -> bool:
        """A graph tensor of `roots`, or one that reads a variable only assigned such
        tensors (TF2 SavedModels hold each asset's path in a variable of the graph)."""
        node = self.nodes.get(_tensor_node(ref))
        if node is None or depth > 32:
            return False
        if node.name in roots:
            return True
        data = [i for i in node.input if not i.startswith("^")]
        if node.op == "Identity" and data:
            return self._graph_bound(data[0], roots, depth + 1)
        if node.op == "ReadVariableOp" and data:
            values = self.assigns.get(_tensor_node(data[0]), [])
            return bool(values) and all(self._graph_bound(v, roots, depth + 1) for v in values)
        return False

    def bound(self, function: str | None, ref: str, roots: set[str], capture: str | None,
              depth: int = 0) -> bool:
        """Whether tensor `ref` inside `function` (None: the graph) is a path the loader
        gives: a graph tensor of `roots` (a TF1 asset tensor, the saver's filename), or an
        argument that every call site binds to one and that the object graph, where it
        captures the argument, binds to an object of kind `capture` (TF2 binds a table
        initialiser's captured asset when it loads it)."""
        if depth > 32:
            return False
        if function is None:
            return self._graph_bound(ref, roots, depth)
        args = [a.name for a in self.functions[function].signature.input_arg]
        if ref not in args:
            return False
        index = args.index(ref)
        calls = self.calls.get(function, [])
        for caller, node in calls:
            if node.op not in ("PartitionedCall", "StatefulPartitionedCall", function):
                return False
            data = [i for i in node.input if not i.startswith("^")]
            if index >= len(data) or not self.bound(caller, data[index], roots, capture,
                                                    depth + 1):
                return False
        saved = self.objects.concrete_functions if self.objects is not None else {}
        if function not in saved:
            return bool(calls)
        restored = saved[function]
        position = index - (len(args) - len(restored.bound_inputs))
        if not 0 <= position < len(restored.bound_inputs):
            return bool(calls)  # an argument, not a capture: its callers bind it
        node = self.objects.nodes[restored.bound_inputs[position]]
        return node.WhichOneof("kind") == capture


def _reach(roots, step) -> set[str]:
    """Every name reached from `roots` through `step(name) -> the names it leads to`."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += step(name)
    return seen


def _closure(roots, functions: dict) -> set[str]:
    """The functions of `roots` and every function they call."""
    return _reach([r for r in roots if r in functions], lambda name: [
        f for node in functions[name].node_def for f in _called(node) + [node.op]
        if f in functions])


def _ancestors(graph_def, names: set[str]) -> set[str]:
    """The nodes `names` and every node they read (control inputs included)."""
    nodes = {n.name: n for n in graph_def.node}
    return _reach([n for n in names if n in nodes], lambda name: [
        _tensor_node(i) for i in nodes[name].input if _tensor_node(i) in nodes])


def scan_graph(graph_def, saver_nodes: set[str] = frozenset(), objects=None,
               asset_tensors: set[str] = frozenset(),
               saver_file: str = "") -> list[Finding]:
    """The ops of `graph_def` and its functions that reach outside the model. The saver
    graph (the ancestors of `saver_nodes`, and the functions only it calls) may hold the
    checkpoint ops, restoring only from `saver_file` (the path the loader feeds);
    `objects`: a SavedModel's object graph."""
    lib = _Library(graph_def, set(asset_tensors), objects)
    object_functions = list(objects.concrete_functions) if objects is not None else []
    saver = _ancestors(graph_def, set(saver_nodes))
    saver_calls = _closure([f for n in graph_def.node if n.name in saver
                            for f in _called(n) + [n.op]], lib.functions)
    others = _closure([*[f for n in graph_def.node if n.name not in saver
                         for f in _called(n) + [n.op]], *object_functions,
                       *(set(lib.functions) - saver_calls)], lib.functions)
    saver_only = saver_calls - others
    found: list[Finding] = []

    def check(function: str | None, node, in_saver: bool) -> None:
        data = [i for i in node.input if not i.startswith("^")]
        if in_saver and node.op in CHECKPOINT_OPS:
            # Loading never saves; a restore reads the variables/ path that the loader feeds.
            if node.op not in RESTORE_OPS or (data and lib.bound(
                    function, data[0], {_tensor_node(saver_file)}, None)):
                return
        bound = node.op in TEXT_FILE_TABLES and len(data) > 1 and lib.bound(
            function, data[1], lib.asset_tensors, "asset")
        what = _what(node, bound)
        if what:
            found.append(Finding(node.op, node.name, function, what))

    for node in graph_def.node:
        check(None, node, node.name in saver)
    for name, fdef in lib.functions.items():
        for node in fdef.node_def:
            check(name, node, name in saver_only)
    return found


def scan_savedmodel(path: str | Path) -> list[Finding]:
    """The ops of a SavedModel that reach outside it (saved_model.pb read once); an asset
    named outside the model's folder is one too."""
    saved_model_pb2 = optional("tensorflow.core.protobuf", "saved_model_pb2",
                               why="TensorFlow runs the source model (tf extra)")

    proto = saved_model_pb2.SavedModel()
    # What TensorFlow's loader reads: saved_model.pb, else saved_model.pbtxt (text format).
    pb, text = Path(path, "saved_model.pb"), Path(path, "saved_model.pbtxt")
    try:
        if pb.exists():
            if not pb.is_file():  # a fifo: TensorFlow's own load says what is wrong
                return []
            proto.ParseFromString(pb.read_bytes())
        elif text.is_file():
            text_format.Parse(text.read_text(encoding="utf-8"), proto)
    except Exception:  # not ours to judge: the loader says what is wrong with it
        return []
    root = Path(path).resolve()
    found: list[Finding] = []
    for meta in proto.meta_graphs:
        saver = {_tensor_node(meta.saver_def.save_tensor_name),
                 _tensor_node(meta.saver_def.restore_op_name)} - {""}
        assets = {_tensor_node(a.tensor_info.name) for a in meta.asset_file_def}
        for asset in meta.asset_file_def:
            if not (root / "assets" / asset.filename).resolve().is_relative_to(root):
                found.append(Finding("asset", asset.filename, None,
                                     "points outside the model's folder"))
        found += scan_graph(meta.graph_def, saver, meta.object_graph_def, assets,
                            meta.saver_def.filename_tensor_name)
    return found


def scan_keras(path: str | Path) -> list[Finding]:
    """A .keras file's layers that would run code from elsewhere: a TFSMLayer (a SavedModel
    at a path of its config) and a Lambda holding Python bytecode (Keras' safe mode refuses
    it too, but says so in a message written for its own API)."""
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except Exception:  # not ours to judge: Keras' own load says what is wrong with it
        return []
    found: list[Finding] = []
    todo: list[tuple[object, str]] = [(config, "?")]
    while todo:
        item, layer = todo.pop()
        if isinstance(item, list):
            todo += [(i, layer) for i in item]
            continue
        if not isinstance(item, dict):
            continue
        cfg = item.get("config") if isinstance(item.get("config"), dict) else {}
        if isinstance(cfg.get("name"), str):
            layer = cfg["name"]
        if item.get("class_name") == "TFSMLayer":
            found.append(Finding("TFSMLayer", layer, None, f"loads and runs the SavedModel at "
                                 f"{cfg.get('filepath', '?')!r}, outside the .keras file"))
        elif item.get("class_name") == "__lambda__":
            found.append(Finding("Lambda", layer, None, "holds Python bytecode, which loading "
                                 "would run (Keras' safe mode refuses it)"))
        todo += [(v, layer) for v in item.values()]
    return found


def scan(path: str, kind: str) -> list[Finding]:
    """What runs outside the model, for a SavedModel or a .keras file (a frozen graph is
    scanned where it is parsed, converter/frozen.py; a checkpoint's graph is bertfuse's)."""
    if kind == "savedmodel":
        return scan_savedmodel(path)
    if kind == "keras":
        return scan_keras(path)
    return []


def enforce(path: str, findings: list[Finding], trust: bool) -> list[str]:
    """Refuses the first finding in one line unless `trust`; returns the report's notes."""
    if not findings:
        return []
    first = findings[0]
    if not trust:
        raise BertfuseError(
            f"{path}: {first.op} ({first.where()}) {first.what}; converting and verifying run "
            f"the model's own TensorFlow code, so bertfuse refuses it: remove it from the "
            f"model, or pass --trust-model (Python: trust_model=True) if you trust its author")
    shown = ", ".join(f"{f.op} ({f.where()})" for f in findings[:5])
    more = f" and {len(findings) - 5} more" if len(findings) > 5 else ""
    return [f"--trust-model: the model runs what reaches outside it: {shown}{more}"]
