"""Output roles by meaning: what a TF output computes, read off the frozen graph.

A source's output names say little: keras-hub calls its one output `output_0`, bert4keras
`Transformer-2-FeedForward-Norm` and `Pooler-Dense`, a ranker `score`, a sentence embedder
`sentence_embedding`. What makes an output `sequence_output`, `pooled_output` or `logits` is
the op that computes it, looked at through pass-through ops (Identity, Reshape, Cast, ...):

    rank 3 ◄─ a layer norm            (an Rsqrt/Sqrt over a Mean of the centred values, or a
                                       FusedBatchNorm)                      -> sequence_output
    rank 2 ◄─ Tanh ◄─ a dense layer   (BERT's pooler)                      -> pooled_output
    rank 2 ◄─ a dense layer           (MatMul | Einsum [+ BiasAdd | Add])  -> logits
    rank 3 ◄─ a dense layer           (token classification)               -> token_logits

An output computed by anything else a model ends on (Sigmoid, Softmax, an L2 normalisation,
a Mean or Sum pooling, ...) has no role: it keeps its source name exactly, case included.
Where the graph does not tell (another op), the name does (OUTPUT_ROLES' aliases), and a
single unnamed output is named by its rank as before. Where two outputs have one role by
meaning (per-layer outputs requested with --outputs), the one computed last (the most ops
upstream) takes the role; the others keep their names.
"""

from __future__ import annotations

from collections import deque

from bertfuse.converter.source import OUTPUT_ROLES

_PASS = {"Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "Cast", "StopGradient",
         "Snapshot", "EnsureShape", "CheckNumerics"}
_MATMUL = {"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"}
_BIAS = {"BiasAdd", "Add", "AddV2"}
_NORM_ROOT = {"Rsqrt", "Sqrt"}
_FUSED_NORM = {"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"}
# What a model may end on that is none of the roles.
_NO_ROLE = {"Sigmoid", "Softmax", "LogSoftmax", "Relu", "Relu6", "Elu", "Selu", "Softplus",
            "Mean", "Sum", "Max", "Min", "Prod", "ArgMax", "ArgMin", "TopKV2", "RealDiv", "Div",
            "DivNoNan", "Exp", "Log", "Square", "Abs", "Neg", "Sign"}
NO_ROLE = "none"  # what `meaning` returns for an output that is none of the roles


class _Graph:
    def __init__(self, graph_def) -> None:
        self.nodes = {n.name: n for n in graph_def.node}

    def node(self, ref: str):
        return self.nodes.get(ref.lstrip("^").split(":")[0])

    def producer(self, ref: str):
        """The op computing `ref`, through pass-through ops."""
        node = self.node(ref)
        for _ in range(64):
            if node is None or node.op not in _PASS or not node.input:
                return node
            if node.op == "IdentityN":
                slot = ref.split(":")[1] if ":" in ref else "0"
                ref = node.input[int(slot)] if slot.isdigit() and int(slot) < len(node.input) \
                    else node.input[0]
            else:
                ref = node.input[0]
            node = self.node(ref)
        return node

    def ancestors(self, node, depth: int):
        """(node, distance) of every op within `depth` inputs of `node`, nearest first."""
        seen, todo = {node.name}, deque([(node, 0)])
        while todo:
            cur, d = todo.popleft()
            yield cur, d
            if d == depth:
                continue
            for ref in cur.input:
                nxt = self.node(ref)
                if nxt is not None and nxt.name not in seen:
                    seen.add(nxt.name)
                    todo.append((nxt, d + 1))

    def upstream_count(self, node) -> int:
        return sum(1 for _ in self.ancestors(node, 1 << 30))

    def is_dense(self, node) -> bool:
        if node is None:
            return False
        if node.op in _MATMUL:
            return True
        return node.op in _BIAS and any(
            (p := self.producer(ref)) is not None and p.op in _MATMUL for ref in node.input[:2])

    def centred(self, root) -> bool:
        """Whether the values under a square root are centred first (a variance: x - mean(x)),
        as a layer norm's are and an L2 norm's are not."""
        for cur, _ in self.ancestors(root, 5):
            if cur.op == "SquaredDifference":
                return True
            if cur.op == "Sub" and any((p := self.producer(ref)) is not None and p.op == "Mean"
                                       for ref in cur.input[:2]):
                return True
        return False

    def normalisation(self, node) -> str | None:
        """'layer' or 'l2' for the normalisation nearest the output (within a few ops), None
        where there is none."""
        for cur, _ in self.ancestors(node, 6):
            if cur.op in _FUSED_NORM:
                return "layer"
            if cur.op in _NORM_ROOT:
                return "layer" if self.centred(cur) else "l2"
        return None


def meaning(graph_def, tensor: str, rank: int | None, graph: _Graph | None = None) -> str | None:
    """The output role `tensor` has by what computes it; NO_ROLE where it is clearly none of
    them; None where the graph does not tell."""
    g = graph or _Graph(graph_def)
    node = g.producer(tensor)
    if node is None:
        return None
    if node.op in _NO_ROLE:
        return NO_ROLE
    if node.op == "Tanh" and rank == 2:
        return "pooled_output" if g.is_dense(g.producer(node.input[0])) else NO_ROLE
    if g.is_dense(node):
        return {2: "logits", 3: "token_logits"}.get(rank)
    norm = g.normalisation(node)
    if norm == "l2":
        return NO_ROLE
    if norm == "layer" and rank == 3:
        return "sequence_output"
    return None


def alias_role(name: str, rank: int | None, used: set[str]) -> str | None:
    """The role OUTPUT_ROLES' aliases give a name (a `logits` of rank 3 is `token_logits`)."""
    base = name.split(":")[0].rsplit("/", 1)[-1].lower()
    # Whole names first: `start_logits` is a span head's, not a `...logits` classifier's.
    for hit in (lambda a: base == a, base.endswith):
        for canon, (aliases, _) in OUTPUT_ROLES.items():
            if canon not in used and any(hit(a) for a in aliases):
                if canon == "logits" and rank == 3 and "token_logits" not in used:
                    return "token_logits"
                return canon
    return None


def name_outputs(graph_def, tensors: list[str], shown: dict[str, str],
                 ranks: dict[str, int | None]) -> tuple[dict[str, str], dict[str, str | None]]:
    """({output name: tensor}, {output name: role or None}) for the source's outputs; `shown`
    is each tensor's source name."""
    g = _Graph(graph_def)
    by_meaning = {t: meaning(graph_def, t, ranks.get(t), g) for t in tensors}
    # One tensor per role by meaning: the one computed last.
    owner: dict[str, str] = {}
    for t, role in by_meaning.items():
        if role in OUTPUT_ROLES:
            cur = owner.get(role)
            if cur is None or g.upstream_count(g.node(t)) > g.upstream_count(g.node(cur)):
                owner[role] = t
    # Outputs with no role keep their source names; a role never takes a name one of them has.
    kept = {shown[t] for t in tensors if by_meaning[t] is not None and owner.get(
        by_meaning[t]) != t}
    names: dict[str, str] = {}
    roles: dict[str, str | None] = {}
    used = set(owner) | kept
    for t in tensors:
        role = by_meaning[t]
        if role in OUTPUT_ROLES and owner[role] == t and role not in kept:
            name = role
        elif role is None and (alias := alias_role(shown[t], ranks.get(t), used)):
            name = role = alias
            used.add(alias)
        else:
            name, role = shown[t], None
        names[name] = t
        roles[name] = role
    # A single output the graph and its name leave open: named by its rank (a backbone's
    # [B, S, H] is the sequence output, a classifier's [B, C] its logits).
    if len(names) == 1 and by_meaning[tensors[0]] is None and not any(roles.values()):
        (only,) = names
        role = {3: "sequence_output", 2: "logits"}.get(ranks.get(tensors[0]))
        if role:
            names = {role: names[only]}
            roles = {role: role}
    return names, roles
