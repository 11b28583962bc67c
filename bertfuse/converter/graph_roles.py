"""Input roles from the graph, for inputs whose names do not tell.

bert4keras and keras-bert call their inputs `Input-Token` and `Input-Segment` (float32 in a
SavedModel signature), a positional signature calls them `args_0`, `input_1` ... What each
input does is in the graph instead:

    input ─► [Cast | Identity | Reshape | ExpandDims | Squeeze]* ─► Gather(table, ·)
        the largest table gathered (vocab rows) ─► input_ids
        a small table (< 16 rows: token types) ─► segment_ids
    input ─► anything but such a gather (mask arithmetic: Cast, Sub, Mul ...) ─► input_mask

The choice is recorded as the source's original names (the report's `original names` line);
`--inputs` overrides it, role by role.
"""

from __future__ import annotations

from bertfuse.errors import BertfuseError

_PASS = ("Cast", "Identity", "Reshape", "ExpandDims", "Squeeze", "Floor", "Round")
_GATHERS = ("GatherV2", "Gather", "ResourceGather")
_MAX_TYPES = 16  # a token-type table has a few rows; a vocab has thousands (tiny tests: 100)


def _node_name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _table_rows(nodes: dict, ref: str) -> int | None:
    """Rows of the constant a gather reads, through Identity chains (frozen variables)."""
    name = _node_name(ref)
    for _ in range(64):
        node = nodes.get(name)
        if node is None:
            return None
        if node.op == "Const":
            dims = node.attr["value"].tensor.tensor_shape.dim
            return dims[0].size if len(dims) == 2 else None
        if node.op == "Placeholder":  # an externalised weight
            dims = node.attr["shape"].shape.dim
            return dims[0].size if len(dims) == 2 else None
        if node.op != "Identity" or not node.input:
            return None
        name = _node_name(node.input[0])
    return None


def gathered_rows(graph_def, placeholder: str) -> tuple[list[int], bool]:
    """(rows of each table the input's values index, whether it is read any other way)."""
    nodes = {n.name: n for n in graph_def.node}
    consumers: dict[str, list] = {}
    for n in graph_def.node:
        for i, ref in enumerate(n.input):
            if not ref.startswith("^"):
                consumers.setdefault(_node_name(ref), []).append((n, i))
    rows, other, todo, seen = [], False, [placeholder], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node, slot in consumers.get(name, []):
            if node.op in _GATHERS and slot == 1:
                size = _table_rows(nodes, node.input[0])
                if size:
                    rows.append(size)
            elif node.op in _PASS and slot == 0:
                todo.append(node.name)
            else:
                other = True
    return rows, other


def _rank(graph_def, node_name: str) -> int | None:
    """The placeholder's declared rank (None: not declared or not found)."""
    for node in graph_def.node:
        if node.name == node_name and "shape" in node.attr:
            shape = node.attr["shape"].shape
            return None if shape.unknown_rank else len(shape.dim)
    return None


def roles_from_graph(graph_def, names: dict[str, str], override: dict[str, str]
                     ) -> dict[str, str]:
    """{role: input name}: the override's roles, the rest decided from what each input feeds
    (`names`: input name -> its placeholder tensor). Raises naming the inputs it cannot tell."""
    roles = dict(override)
    free = [n for n in names if n not in roles.values()]
    facts = {n: gathered_rows(graph_def, _node_name(names[n])) for n in free}
    by_vocab = sorted((max(rows), n) for n, (rows, _) in facts.items() if rows)
    if "input_ids" not in roles and by_vocab and by_vocab[-1][0] >= _MAX_TYPES:
        roles["input_ids"] = by_vocab[-1][1]
    types = [n for size, n in by_vocab if size < _MAX_TYPES and n not in roles.values()]
    if "segment_ids" not in roles and len(types) == 1:
        roles["segment_ids"] = types[0]
    # A mask is [B, S]: a float [B, S, H] input added somewhere is read by arithmetic too.
    masks = [n for n, (rows, other) in facts.items() if not rows and other
             and _rank(graph_def, _node_name(names[n])) in (None, 2)]
    if "input_mask" not in roles and len(masks) == 1:
        roles["input_mask"] = masks[0]
    left = [n for n in names if n not in roles.values()]
    if "input_ids" not in roles or left:
        raise BertfuseError(
            f"cannot tell the role of input{'s' if len(left) > 1 else ''} "
            f"{', '.join(left or names)} from names or from the graph (token ids feed the "
            f"largest embedding lookup, segment ids a small one, the mask neither); pass "
            f"--inputs input_ids=NAME,...")
    return roles
