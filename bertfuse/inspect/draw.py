"""One encoder layer as a picture, laid out by Graphviz ``dot``; raw beside fused.

Which nodes are layer N: layers are numbered as in the encoder table (one per Attention or
Softmax node, the "core"). Layer N's input is the hidden-state tensor that feeds both its
attention (an ancestor of core N) and its residual Add / SkipLayerNorm (a descendant of core
N); among such tensors, the one produced deepest in the graph (the mask also feeds every
layer, but it is shallow). Layer N is every node downstream of that producer and upstream of
layer N+1's input producer (the last layer: of the shallowest graph output below it).
Tensors coming from outside (mask, shape arithmetic) are drawn as small notes; weights are
not drawn, their shapes go into the node's label.

Colours: fused ops by kind (Attention, SkipLayerNorm, GELU family, EmbedLayerNorm, other
contrib ops); in the model drawn, ops that the encoder table counts as left unfused
(Softmax, the LayerNorm reductions, Erf/Tanh) are red. In the --before model the same ops are
tinted with the colour of the fusion that replaces them.
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import onnx

from bertfuse.inspect.encoder_table import ATTENTION_OPS, GELU_OPS, RAW_LN_OPS, SKIP_LN_OPS
from bertfuse.ops.bertfuse.embed_layernorm import EMBEDDING_OPS
from bertfuse.errors import BertfuseError
from bertfuse.io.safety import mode_of, replace_file, temp_file

CORE_OPS = ATTENTION_OPS + ("Softmax",)
FUSED = {  # op -> (fill, legend label); --ops bertfuse's ops as the ones they replace
    **{a: ("#f4a261", "Attention") for a in ATTENTION_OPS + ("DenseBias", "DenseBiasFp8")},
    **{s: ("#8ecae6", "SkipLayerNorm") for s in SKIP_LN_OPS},
    **{e: ("#cdb4db", "EmbedLayerNorm") for e in EMBEDDING_OPS},
    **{g: ("#95d5b2", "GELU family") for g in GELU_OPS},
}
CONTRIB_FILL = "#e9c46a"
LEFTOVER_OF = {"Softmax": "Attention", "Erf": "BiasGelu", "Tanh": "BiasGelu",
               **{op: "SkipLayerNormalization" for op in RAW_LN_OPS}}
TINT = {"Attention": "#fbd6b6", "SkipLayerNormalization": "#d3ecf5", "BiasGelu": "#d5f0e0"}
RED = "#d62828"


class _Graph:
    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.nodes = list(g.node)
        self.inits = {t.name: list(t.dims) for t in g.initializer}
        self.constants = set()
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for i, n in enumerate(self.nodes):
            if n.op_type == "Constant":
                self.constants.update(n.output)
            for t in n.output:
                self.producer[t] = i
            for t in n.input:
                if t:
                    self.consumers[t].append(i)
        self.outputs = [o.name for o in g.output]
        self.depth = self._depths()
        self.cores = [i for i, n in enumerate(self.nodes) if n.op_type in CORE_OPS]

    def _depths(self) -> list[int]:
        depth = [0] * len(self.nodes)
        for i, n in enumerate(self.nodes):  # topological order
            ds = [depth[self.producer[t]] + 1 for t in n.input if t in self.producer]
            depth[i] = max(ds, default=0)
        return depth

    def preds(self, i: int) -> list[int]:
        return [self.producer[t] for t in self.nodes[i].input if t in self.producer]

    def succs(self, i: int) -> list[int]:
        return [c for t in self.nodes[i].output for c in self.consumers.get(t, ())]

    def closure(self, start, step) -> set[int]:
        seen, todo = set(), list(start)
        while todo:
            i = todo.pop()
            for j in step(i):
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        return seen

    def layer_start(self, n: int) -> int | None:
        """The node producing layer n's hidden-state input (None: a graph input)."""
        core = self.cores[n]
        up = self.closure([core], self.preds) | {core}
        down = self.closure([core], self.succs)
        prev = (self.closure([self.cores[n - 1]], self.succs) | {self.cores[n - 1]}) \
            if n > 0 else None
        best, best_depth = None, -2
        for t, users in self.consumers.items():
            if t in self.inits or t in self.constants:
                continue
            if not any(u in up for u in users) or not any(u in down for u in users):
                continue
            p = self.producer.get(t)
            if prev is not None and p not in prev:
                continue
            d = -1 if p is None else self.depth[p]
            if d > best_depth:
                best, best_depth = p, d
        return best

    def layer_nodes(self, n: int) -> tuple[list[int], int | None]:
        start = self.layer_start(n)
        if n + 1 < len(self.cores):
            end = self.layer_start(n + 1)
            ends = [end] if end is not None else []
        else:
            below = self.closure([self.cores[n]], self.succs)
            outs = [self.producer[o] for o in self.outputs if self.producer.get(o) in below]
            ends = [min(outs, key=lambda i: self.depth[i])] if outs else sorted(below)[-1:]
        up = self.closure(ends, self.preds) | set(ends)
        if start is None:
            down = set(range(len(self.nodes)))
        else:
            down = self.closure([start], self.succs)
        return sorted(up & down), start


def _short(name: str, limit: int = 28) -> str:
    base = name.rsplit("/", 1)[-1].split(":")[0]
    return base if len(base) <= limit else base[: limit - 1] + "…"


def _dims(d: list[int]) -> str:
    return "[" + ",".join(str(x) for x in d) + "]" if d else "scalar"


def _node_style(op: str, role: str) -> dict[str, str]:
    """role: 'after' (the model drawn) or 'before' (the --before model)."""
    if op in FUSED:
        return {"fillcolor": FUSED[op][0], "penwidth": "1.5"}
    if op in LEFTOVER_OF:
        if role == "after":
            return {"fillcolor": "#ffd6d6", "color": RED, "penwidth": "3", "fontcolor": RED}
        return {"fillcolor": TINT[LEFTOVER_OF[op]]}
    return {"fillcolor": "#f1f1f1", "color": "#888888"}


def _anchors(g: _Graph, ids: list[int], prefix: str) -> dict[str, list[str]]:
    """Per fused kind, the nodes standing for it in order: the fused op itself, or in a raw
    layer the op it replaces (Softmax; the first reduction of each LayerNorm; Erf/Tanh)."""
    out: dict[str, list[str]] = defaultdict(list)
    reductions = 0
    for i in ids:
        op = g.nodes[i].op_type
        if op in CORE_OPS:
            out["attention"].append(f"{prefix}{i}")
        elif op in GELU_OPS or op in ("Erf", "Tanh"):
            out["gelu"].append(f"{prefix}{i}")
        elif op in SKIP_LN_OPS + ("LayerNormalization", "InstanceNormalization"):
            out["ln"].append(f"{prefix}{i}")
        elif op in ("ReduceMean", "GlobalAveragePool"):
            if reductions % 2 == 0:  # mean, then variance: one LayerNorm
                out["ln"].append(f"{prefix}{i}")
            reductions += 1
    return out


def _cluster(g: _Graph, layer: int, prefix: str, title: str, role: str) -> list[str]:
    ids, start = g.layer_nodes(layer)
    inside = set(ids)
    lines = [f"subgraph cluster_{prefix} {{",
             f'label=<<b>{html.escape(title)}</b><br/><font point-size="11">{len(ids)} nodes'
             f"</font>>; labeljust=c; labelloc=t; fontsize=16; style=rounded; color=\"#bbbbbb\";"]
    contrib = 0
    for i in ids:
        n = g.nodes[i]
        weights = [_dims(g.inits[t]) for t in n.input if t in g.inits and len(g.inits[t]) >= 2]
        op = n.op_type
        sub = ("<br/>" + html.escape(" ".join(weights))) if weights else ""
        if op in LEFTOVER_OF and role == "after":
            sub += '<br/><font point-size="9">left unfused</font>'
        style = _node_style(op, role)
        if op not in FUSED and n.domain == "com.microsoft":
            style = {"fillcolor": CONTRIB_FILL, "penwidth": "1.5"}
            contrib += 1
        attrs = " ".join(f'{k}="{v}"' for k, v in style.items())
        label = f'<<b>{html.escape(op)}</b>' + (f'<font point-size="9">{sub}</font>' if sub
                                                else "") + ">"
        tooltip = html.escape(n.name or op, quote=True)
        lines.append(f'{prefix}{i} [label={label} {attrs} tooltip="{tooltip}"];')
    # Inputs from outside the layer (the hidden state, the mask, shape arithmetic).
    ext: dict[str, str] = {}
    for i in ids:
        for t in g.nodes[i].input:
            if not t or t in g.inits or t in g.constants or g.producer.get(t) in inside:
                continue
            if t not in ext:
                ext[t] = f"{prefix}x{len(ext)}"
                p = g.producer.get(t)
                if p is not None and p == start:
                    label, style = "layer input", 'shape=box style="rounded,bold" fillcolor="white"'
                else:
                    src = t if p is None else (g.nodes[p].name or t)
                    label = html.escape(_short(src))
                    style = 'shape=note fontsize=9 fillcolor="white" color="#999999" ' \
                            'fontcolor="#555555"'
                lines.append(f'{ext[t]} [label="{label}" {style}];')
            lines.append(f"{ext[t]} -> {prefix}{i} [color=\"#999999\"];")
    for i in ids:
        for j in sorted(set(g.succs(i))):
            if j in inside:
                lines.append(f"{prefix}{i} -> {prefix}{j};")
    # The layer's output: what leaves the layer.
    leaving = [i for i in ids if any(j not in inside for j in g.succs(i))
               or any(t in g.outputs for t in g.nodes[i].output)]
    if leaving:
        lines.append(f'{prefix}out [label="layer output" shape=box style="rounded,bold" '
                     f'fillcolor="white"];')
        last = max(leaving, key=lambda i: g.depth[i])
        lines.append(f"{prefix}{last} -> {prefix}out;")
    lines.append("}")
    return lines


def _legend(has_contrib: bool) -> str:
    rows = [(FUSED["Attention"][0], "Attention (fused)", "black"),
            (FUSED["SkipLayerNormalization"][0], "SkipLayerNorm (fused)", "black"),
            (FUSED["BiasGelu"][0], "GELU family (fused)", "black"),
            (FUSED["EmbedLayerNormalization"][0], "EmbedLayerNorm (fused)", "black")]
    if has_contrib:
        rows.append((CONTRIB_FILL, "other contrib op", "black"))
    rows += [("#ffd6d6", "left unfused (Softmax, LN reductions, Erf/Tanh)", RED),
             (TINT["Attention"], "in --before: the op a fusion replaces, tinted by kind",
              "black"),
             ("#f1f1f1", "plain ONNX op (weights: shapes)", "black")]
    cells = "".join(f'<tr><td bgcolor="{c}" width="18"> </td>'
                    f'<td align="left"><font color="{fc}">{html.escape(t)}</font></td></tr>'
                    for c, t, fc in rows)
    return f'<<table border="0" cellborder="1" cellspacing="2" cellpadding="3">{cells}</table>>'


def layer_count(model: onnx.ModelProto) -> int:
    return sum(1 for n in model.graph.node if n.op_type in CORE_OPS)


def to_dot(model: onnx.ModelProto, layer: int, before: onnx.ModelProto | None = None,
           name: str = "model", before_name: str = "raw") -> str:
    graphs = [(before, before_name, "b", "before")] if before is not None else []
    graphs.append((model, name, "a", "after"))
    body: list[str] = []
    anchors = []
    contrib = False
    for m, title, prefix, role in graphs:
        g = _Graph(m)
        if not 0 <= layer < len(g.cores):
            raise BertfuseError(f"{title}: no layer {layer} (the model has {len(g.cores)} "
                                f"encoder layers, 0..{len(g.cores) - 1})")
        body += _cluster(g, layer, prefix, f"{title}: layer {layer}", role)
        anchors.append(_anchors(g, g.layer_nodes(layer)[0], prefix))
        contrib |= any(g.nodes[i].domain == "com.microsoft" and g.nodes[i].op_type not in FUSED
                       for i in g.layer_nodes(layer)[0])
    if len(anchors) == 2:  # line each fused op up with what it replaced
        for kind in ("attention", "ln", "gelu"):
            for x, y in zip(anchors[0][kind], anchors[1][kind]):
                body.append(f"{{rank=same; {x}; {y};}}")
    head = ["digraph layer {", "rankdir=TB; newrank=true; nodesep=0.25; ranksep=0.3;",
            'fontname="Helvetica"; bgcolor="white"; labelloc=b;',
            'node [shape=box style="rounded,filled" fontname="Helvetica" fontsize=12 '
            'height=0.35 margin="0.12,0.04"];',
            'edge [arrowsize=0.6 color="#444444"];',
            f"label={_legend(contrib)};"]
    return "\n".join(head + body + ["}"]) + "\n"


def render(dot_source: str, output: str | Path, dpi: int = 110) -> Path:
    """Writes .dot as is; .svg / .png through Graphviz dot (atomic)."""
    output = Path(output)
    fmt = output.suffix.lower().lstrip(".")
    if fmt not in ("svg", "png", "dot"):
        raise BertfuseError(f"{output}: unsupported picture format .{fmt} (use .svg, .png or "
                            f".dot)")
    if not output.parent.exists():
        raise BertfuseError(f"{output.parent}: output directory does not exist")
    with temp_file(output) as tmp:  # removed on every exit path, signals included
        if fmt == "dot":
            tmp.write_text(dot_source)
        else:
            dot = shutil.which("dot")
            if dot is None:
                raise BertfuseError("Graphviz 'dot' not found: install it (apt-get install "
                                    "graphviz, brew install graphviz) or write .dot")
            args = [dot, f"-T{fmt}", "-o", str(tmp)] + ([f"-Gdpi={dpi}"] if fmt == "png"
                                                        else [])
            proc = subprocess.run(args, input=dot_source.encode(), capture_output=True,
                                  timeout=120)
            if proc.returncode != 0:
                raise BertfuseError(f"dot failed: {proc.stderr.decode(errors='replace')[:200]}")
        os.chmod(tmp, mode_of(output))
        replace_file(tmp, output)
    return output
