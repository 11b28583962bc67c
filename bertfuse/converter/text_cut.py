"""Cut a frozen text-in graph where its tokenizer hands dense integer ids to the encoder.

A text-in SavedModel (a tensorflow-text BertTokenizer and BERT packing in front of the
encoder, TF Hub's preprocess models, keras-hub's preprocessors) is one graph from strings
to the encoder's outputs. The encoder starts where the ragged word pieces become dense:

    text (string) ─► CaseFoldUTF8 ─► ... ─► WordpieceTokenizeWithOffsets ─► RaggedGather ...
        ─► RaggedTensorToTensor ──[Cast | Identity]*──► ids, mask, type ids ─► encoder ─► outputs
           (the dense makers)      (followed while it is the only reader)   ▲
                                                                    the cut: each becomes an
                                                                    int32 Placeholder

The tokenizer side is every node that a dense maker depends on and that depends on the text
(the "core"); the cut tensors are the core's outputs that something outside the core, on
the way to the outputs, reads. Shape reads of the ids stay below the cut (they read the new
placeholder). Refused, naming the tensor: a cut tensor that is not a [batch, seq] integer,
and a graph whose outputs still need the text after the cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertfuse.errors import BertfuseError
from bertfuse.converter.serving_cut import int32_feed
from bertfuse.optional import optional

# Ops that turn ragged or sparse token ids into the dense [batch, seq] tensors an encoder reads.
DENSE_MAKERS = ("RaggedTensorToTensor", "SparseToDense")
_FOLLOW = ("Cast", "Identity", "EnsureShape")  # int -> int steps the cut moves past
_INTS = ("int32", "int64")


@dataclass
class Cut:
    """The cut graph and what it takes: {placeholder name: the tensor it replaces in the
    full graph} (the tensors to fetch from the full graph to see the tokenizer's own ids)."""

    graph_def: object
    replaced: dict[str, str]
    seq: int | None  # the [batch, seq] tensors' fixed length, where the packing fixes one


def _name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _tensor(ref: str) -> str:
    ref = ref.lstrip("^")
    return ref if ":" in ref else f"{ref}:0"


def _closure(start: set[str], edges: dict[str, set[str]]) -> set[str]:
    seen, todo = set(start), list(start)
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def cut_at_dense_ids(graph_def, text_inputs: list[str], outputs: list[str], path: str,
                     names: list[str] | None = None) -> Cut:
    """The graph from `text_inputs` (placeholder names) to `outputs` (tensors), cut at the
    dense integer tensors the tokenizer hands on. The new placeholders are named `names`
    (in the order the cut finds them) or cut_0, cut_1, ...; int32, the cut tensor's shape."""
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    nodes = {n.name: n for n in graph_def.node}
    readers: dict[str, set[str]] = {}
    feeds: dict[str, set[str]] = {}
    for n in graph_def.node:
        for ref in n.input:
            if not ref.startswith("^"):
                readers.setdefault(_name(ref), set()).add(n.name)
                feeds.setdefault(n.name, set()).add(_name(ref))
    text_side = _closure(set(text_inputs), readers)
    makers = {n for n in text_side if nodes[n].op in DENSE_MAKERS}
    if not makers:
        raise BertfuseError(f"{path}: the text input never becomes dense token ids (no "
                            f"{' or '.join(DENSE_MAKERS)} after it); bertfuse cuts a text-in "
                            f"model where its tokenizer's packed ids enter the encoder")
    core = _closure(makers, feeds) & text_side
    needed = _closure({_name(o) for o in outputs}, feeds)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    cuts: list[str] = []
    for name in sorted(core, key=list(nodes).index):
        for ref_node in sorted(readers.get(name, ()), key=list(nodes).index):
            if ref_node in core or ref_node not in needed:
                continue
            for ref in nodes[ref_node].input:
                if not ref.startswith("^") and _name(ref) == name:
                    tensor = _follow(_tensor(ref), graph, readers, needed)
                    if tensor not in cuts:
                        cuts.append(tensor)
    return _rewire(graph_def, graph, cuts, core | set(text_inputs), needed, outputs, path,
                   names)


def _follow(tensor: str, graph, readers: dict[str, set[str]], needed: set[str]) -> str:
    """Past int -> int Cast / Identity steps while each is the tensor's only reader on the
    way to the outputs (the ids an encoder reads, not the tokenizer's int64)."""
    for _ in range(8):
        name = _name(tensor)
        users = [u for u in readers.get(name, ()) if u in needed]
        if not tensor.endswith(":0") or len(users) != 1:
            return tensor
        op = graph.get_operation_by_name(users[0])
        if op.type not in _FOLLOW or op.outputs[0].dtype.name not in _INTS:
            return tensor
        tensor = op.outputs[0].name
    return tensor


def _rewire(graph_def, graph, cuts: list[str], tokenizer: set[str], needed: set[str],
            outputs: list[str], path: str, names: list[str] | None) -> Cut:
    """New int32 placeholders for the cut tensors, their readers rewired, then pruned to
    the outputs. Control edges go only to nodes the outputs read outside the tokenizer: the
    tokenizer's asserts and the inlined call's input barrier (which waits on its lookup
    table) stay behind."""
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    taken = {n.name for n in out.node} | set(names or [])
    names = list(names or [])
    seqs = set()
    swap: dict[str, str] = {}
    replaced: dict[str, str] = {}
    for i, tensor in enumerate(cuts):
        t = graph.get_tensor_by_name(tensor)
        shape = t.shape
        if t.dtype.name not in _INTS or shape.rank not in (None, 2):
            raise BertfuseError(f"{path}: the tokenizer hands the encoder {tensor} "
                                f"({t.dtype.name}, shape {shape}), not [batch, seq] integer "
                                f"ids; bertfuse cuts a text-in model only at those")
        seq = shape[1] if shape.rank == 2 else None
        seqs.add(seq)
        name = names[i] if i < len(names) else f"cut_{i}"
        # the graph reads int64: cast inside it
        feed = int32_feed(out, name, [-1, -1 if seq is None else seq],
                          t.dtype.as_datatype_enum, taken, f"{name}/to_{t.dtype.name}")
        swap[tensor] = f"{feed}:0"
        replaced[name] = tensor
    for node in out.node:
        if node.name in replaced or node.op == "Placeholder":
            continue
        kept = []
        for ref in node.input:
            if ref.startswith("^"):
                if _name(ref) in needed and _name(ref) not in tokenizer:
                    kept.append(ref)
            else:
                kept.append(swap.get(_tensor(ref), ref))
        del node.input[:]
        node.input.extend(kept)
    deprecation = optional("tensorflow.python.util", "deprecation",
                           why="TensorFlow runs the source model (tf extra)")

    with deprecation.silence():  # a TF1 API, and the one that prunes a GraphDef
        pruned = tf.compat.v1.graph_util.extract_sub_graph(out, [_name(o) for o in outputs])
    still = sorted({n.name for n in pruned.node} & tokenizer,
                   key=lambda n: (graph.get_operation_by_name(n).type == "Placeholder", len(n)))
    if still:
        raise BertfuseError(f"{path}: after cutting at the tokenizer's dense ids "
                            f"({', '.join(cuts)}), the outputs still read the text through "
                            f"{still[0]}; bertfuse cannot separate this tokenizer from the "
                            f"encoder")
    seqs.discard(None)
    return Cut(pruned, replaced, seqs.pop() if len(seqs) == 1 else None)


def rename_nodes(graph_def, names: dict[str, str]):
    """A copy with nodes renamed (and every reference to them, `old/...` children included:
    the cut's casts)."""
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    taken = {n.name.split("/")[0] for n in graph_def.node} - set(names)
    names = {old: new for old, new in names.items() if new not in taken}  # else keep it

    def new(name: str) -> str:
        head, sep, tail = name.partition("/")
        head, colon, slot = head.partition(":")
        return names[head] + colon + slot + sep + tail if head in names else name

    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        node.name = new(node.name)
        refs = [("^" if r.startswith("^") else "") + new(r.lstrip("^")) for r in node.input]
        del node.input[:]
        node.input.extend(refs)
    return out
