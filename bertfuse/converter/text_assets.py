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


def table_asset(path: str, signature: str, capture: int) -> Path:
    """The vocab file that the `capture`-th captured input of `signature` (a lookup table) is
    initialised from."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(Path(path, "saved_model.pb").read_bytes())
    meta = proto.meta_graphs[0]
    graph = meta.object_graph_def

    def refuse(why: str) -> BertfuseError:
        return BertfuseError(f"{path}: cannot find the tokenizer's vocab file ({why}); convert "
                             f"the encoder alone and tokenize with its vocab.txt")

    name = _signature_function(graph, signature)
    bound = graph.concrete_functions[name].bound_inputs if name in graph.concrete_functions \
        else []
    if capture >= len(bound):
        raise refuse(f"signature {signature!r} does not capture the table in saved_model.pb")
    table = graph.nodes[bound[capture]]
    if table.WhichOneof("kind") != "resource":
        raise refuse("the WordPiece table is not a restored resource")
    init = next((_function_of(graph, graph.nodes[c.node_id]) for c in table.children
                 if c.local_name == "_initialize"), None)
    fdef = next((f for f in meta.graph_def.library.function if f.signature.name == init), None)
    if fdef is None or init not in graph.concrete_functions:
        raise refuse("the table has no initializer function")
    ops = [n for n in fdef.node_def if n.op == "InitializeTableFromTextFileV2"]
    if len(ops) != 1 or ops[0].attr["key_index"].i != _WHOLE_LINE or \
            ops[0].attr["value_index"].i != _LINE_NUMBER:
        raise refuse("the table is not initialised from a vocab file, one token a line")
    assets = [graph.nodes[i].asset.asset_file_def_index
              for i in graph.concrete_functions[init].bound_inputs
              if graph.nodes[i].WhichOneof("kind") == "asset"]
    if len(assets) != 1 or not 0 <= assets[0] < len(meta.asset_file_def):
        raise refuse("the table's initializer captures no single asset")
    root = Path(path).resolve()
    file = (root / "assets" / meta.asset_file_def[assets[0]].filename).resolve()
    if not file.is_relative_to(root):
        raise refuse(f"its asset name points outside the model's folder")
    if not file.is_file():
        raise refuse(f"assets/{meta.asset_file_def[assets[0]].filename} is missing")
    return file
