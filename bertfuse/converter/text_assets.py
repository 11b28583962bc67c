"""The vocab file behind a SavedModel's lookup table, read off saved_model.pb's object graph:

    signatures/<key> ─► its concrete function's bound inputs ─► [i]: the table (a resource)
        ─► its `_initialize` function: InitializeTableFromTextFileV2 (a token a line, the
           line number its id) ─► the asset that function captures ─► assets/<filename>

The path must stay inside the model's folder (a SavedModel is data: its asset names are not
trusted to point anywhere else).
"""

from __future__ import annotations

from pathlib import Path

from bertfuse.errors import BertfuseError
from bertfuse.optional import optional

_WHOLE_LINE, _LINE_NUMBER = -2, -1  # tf.lookup.TextFileIndex


def _signature_function(graph, signature: str) -> str | None:
    root = graph.nodes[0]
    for child in root.children:
        if child.local_name == "signatures":
            for sig in graph.nodes[child.node_id].children:
                if sig.local_name == signature:
                    node = graph.nodes[sig.node_id]
                    return node.bare_concrete_function.concrete_function_name or None
    return None


def _function_of(graph, node) -> str | None:
    kind = node.WhichOneof("kind")
    if kind == "function" and node.function.concrete_functions:
        return node.function.concrete_functions[0]
    if kind == "bare_concrete_function":
        return node.bare_concrete_function.concrete_function_name
    return None


def table_asset(path: str, signature: str, capture: int | None) -> Path:
    """The vocab file that the `capture`-th captured input of `signature` (a lookup table) is
    initialised from; capture None (the model's own call, traced anew, not the signature):
    the SavedModel's one table initialised from a vocab file."""
    saved_model_pb2 = optional("tensorflow.core.protobuf", "saved_model_pb2",
                               why="TensorFlow runs the source model (tf extra)")

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(Path(path, "saved_model.pb").read_bytes())
    meta = proto.meta_graphs[0]
    graph = meta.object_graph_def

    def refuse(why: str) -> BertfuseError:
        return BertfuseError(f"{path}: cannot find the tokenizer's vocab file ({why}); convert "
                             f"the encoder alone and tokenize with its vocab.txt")

    if capture is None:
        tables = [n for n in graph.nodes if n.WhichOneof("kind") == "resource" and
                  not isinstance(_vocab_of(meta, n), str)]
        if len(tables) != 1:
            raise refuse(f"{len(tables)} lookup tables are initialised from a vocab file")
        table = tables[0]
    else:
        name = _signature_function(graph, signature)
        bound = graph.concrete_functions[name].bound_inputs \
            if name in graph.concrete_functions else []
        if capture >= len(bound):
            raise refuse(f"signature {signature!r} does not capture the table in saved_model.pb")
        table = graph.nodes[bound[capture]]
    found = _vocab_of(meta, table)
    if isinstance(found, str):
        raise refuse(found)
    root = Path(path).resolve()
    file = (root / "assets" / found[0]).resolve()
    if not file.is_relative_to(root):
        raise refuse("its asset name points outside the model's folder")
    if not file.is_file():
        raise refuse(f"assets/{found[0]} is missing")
    return file


def _vocab_of(meta, table) -> tuple[str] | str:
    """(the asset's file name,) of a table initialised from a vocab file, else why not."""
    graph = meta.object_graph_def
    if table.WhichOneof("kind") != "resource":
        return "the WordPiece table is not a restored resource"
    init = next((_function_of(graph, graph.nodes[c.node_id]) for c in table.children
                 if c.local_name == "_initialize"), None)
    if init not in graph.concrete_functions:
        return "the table has no initializer function"
    ops = _called_ops(meta, init, "InitializeTableFromTextFileV2")
    if len(ops) != 1 or ops[0].attr["key_index"].i != _WHOLE_LINE or \
            ops[0].attr["value_index"].i != _LINE_NUMBER:
        return "the table is not initialised from a vocab file, one token a line"
    assets = [graph.nodes[i].asset.asset_file_def_index
              for i in graph.concrete_functions[init].bound_inputs
              if graph.nodes[i].WhichOneof("kind") == "asset"]
    if len(assets) != 1 or not 0 <= assets[0] < len(meta.asset_file_def):
        return "the table's initializer captures no single asset"
    return (meta.asset_file_def[assets[0]].filename,)


def _called_ops(meta, name: str, op: str) -> list:
    """The `op` nodes of function `name` and the functions it calls (a SavedModel saved
    again, e.g. in hub.KerasLayer, initialises its tables through the first one's function)."""
    functions = {f.signature.name: f for f in meta.graph_def.library.function}
    found, todo, seen = [], [name], set()
    while todo:
        fdef = functions.get(todo.pop())
        if fdef is None or fdef.signature.name in seen:
            continue
        seen.add(fdef.signature.name)
        for node in fdef.node_def:
            if node.op == op:
                found.append(node)
            todo += [a.func.name for a in node.attr.values() if a.func.name]
    return found
