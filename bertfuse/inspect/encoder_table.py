"""Per-layer fusion status of an encoder, read off the graph (no weights needed).

Layers are found by their attention core: each Attention node (fused) or Softmax (unfused)
starts a layer; the nodes after it up to the next one belong to it. What a layer should
hold once fused: 1 Attention, 2 SkipLayerNormalization, 1 GELU-family op; before the first
layer, 1 EmbedLayerNormalization. Whatever is still raw there is listed, and the reasons the
passes recorded are attached to the layers that are not fully fused: a miss recorded in a
layer (passes number layers the same way: passes.base.Layers) goes to that layer, a layer-less
one to every unfused layer. Misses of the passes that do not decide a layer's fusion (cleanup,
the pooler's Gemm, fp16, shared weights) stay in the pass diagnostics only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from rich.table import Table

from bertfuse.ops.bertfuse.embed_layernorm import EMBEDDING_OPS

GELU_OPS = ("BiasGelu", "FastGelu", "Gelu", "GemmFastGelu", "DenseBiasGelu", "DenseBiasGeluFp8")
# The ai.bertfuse ops (--ops bertfuse) count as the contrib ops they replace.
ATTENTION_OPS = ("Attention", "BertAttention", "PackedBertAttention")
SKIP_LN_OPS = ("SkipLayerNormalization", "DenseBiasSkipLayerNorm", "DenseBiasSkipLayerNormFp8")
# Pass components whose misses do not explain an unfused layer (embed_layernorm has its row).
NOT_LAYER = ("embed_layernorm", "cleanup", "dense_gemm", "first_token", "gemm_to_matmul", "fp16",
             "shared_weights", "fp8_weights")
RAW_LN_OPS = ("ReduceMean", "GlobalAveragePool", "InstanceNormalization", "LayerNormalization")


@dataclass
class LayerStatus:
    layer: int
    attention: bool
    skip_layernorm: int
    gelu: bool
    leftovers: dict[str, int] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    @property
    def fused(self) -> bool:
        return self.attention and self.skip_layernorm == 2 and self.gelu

    def to_json(self) -> dict:
        return {"layer": self.layer, "attention": self.attention,
                "skip_layernorm": self.skip_layernorm, "gelu": self.gelu,
                "fused": self.fused, "leftovers": dict(sorted(self.leftovers.items())),
                "reasons": self.reasons}


@dataclass
class EncoderTable:
    embed_layernorm: bool
    embed_reasons: list[str]
    layers: list[LayerStatus]

    @property
    def fully_fused(self) -> bool:
        return self.embed_layernorm and bool(self.layers) and all(l.fused for l in self.layers)

    def unfused(self) -> list[str]:
        out = []
        if not self.embed_layernorm:
            out.append("embeddings: EmbedLayerNormalization not fused" +
                       (f" ({'; '.join(self.embed_reasons)})" if self.embed_reasons else ""))
        for l in self.layers:
            missing = []
            if not l.attention:
                missing.append("attention")
            if l.skip_layernorm != 2:
                missing.append(f"skip-LN {l.skip_layernorm}/2")
            if not l.gelu:
                missing.append("GELU")
            if missing:
                why = f" ({'; '.join(l.reasons)})" if l.reasons else ""
                out.append(f"layer {l.layer}: {', '.join(missing)} not fused{why}")
        return out

    def to_json(self) -> dict:
        return {"embed_layernorm": self.embed_layernorm, "embed_reasons": self.embed_reasons,
                "layers": [l.to_json() for l in self.layers], "fully_fused": self.fully_fused}


def encoder_table(op_types: Sequence[str], diagnostics: Iterable = ()) -> EncoderTable:
    """From node op types in topological order (domain-free), plus pass diagnostics."""
    segments: list[list[str]] = [[]]
    for op in op_types:
        if op in ATTENTION_OPS + ("Softmax",):
            segments.append([])
        segments[-1].append(op)
    prelude, layer_ops = segments[0], segments[1:]
    if len(layer_ops) > 1 and set(layer_ops[-1]) <= {"Softmax", "Cast", "Identity"} and \
            layer_ops[-1].count("Softmax") == 1:
        layer_ops.pop()  # a lone Softmax after the last layer (fp16: and its output's Cast):
        # a classifier's probabilities
    diagnostics = list(diagnostics)
    layers = []
    for i, ops in enumerate(layer_ops):
        counts = Counter(ops)
        if i == len(layer_ops) - 1 and counts["Tanh"]:
            counts["Tanh"] -= 1  # the pooler's activation follows the last layer
        leftovers = {op: counts[op] for op in ("Softmax",) + RAW_LN_OPS + ("Erf", "Tanh")
                     if counts[op]}
        layers.append(LayerStatus(i, any(counts[a] for a in ATTENTION_OPS),
                                  sum(counts[s] for s in SKIP_LN_OPS),
                                  any(counts[g] for g in GELU_OPS), leftovers))
    misses = [d for d in diagnostics if not d.fused and d.reason and
              d.component not in NOT_LAYER]
    # Layer-less findings (embedding LayerNorm, 3-D restructuring, ...) go to every unfused layer.
    general = [_reason(d) for d in misses if d.layer is None]
    for l in layers:
        if not l.fused:
            l.reasons = [_reason(d) for d in misses if d.layer == l.layer]
            l.reasons.extend(r for r in general if r not in l.reasons)
    embed = any(op in prelude or op in op_types[:3] for op in EMBEDDING_OPS)
    embed_reasons = [d.reason for d in diagnostics
                     if d.component == "embed_layernorm" and not d.fused]
    return EncoderTable(embed, embed_reasons, layers)


def _reason(d) -> str:
    """Attention's reasons as they are (the column names it), the others with their pass."""
    return d.reason if d.component == "attention" else f"{d.component}: {d.reason}"


def print_encoder_table(table: EncoderTable, console) -> None:
    """layer N: attention / skip-LN x2 / GELU, fused or not and why; embeddings first."""
    t = Table(title="encoder fusion")
    t.add_column("layer")
    t.add_column("attention")
    t.add_column("skip-LN")
    t.add_column("GELU")
    t.add_column("not fused because")

    def mark(ok: bool, text: str = "") -> str:
        return f"[green]{text or 'fused'}[/green]" if ok else f"[red]{text or 'no'}[/red]"

    t.add_row("embed", mark(table.embed_layernorm, "EmbedLayerNorm" if table.embed_layernorm
                                else "not fused"), "", "", "; ".join(table.embed_reasons))
    for l in table.layers:
        left = ", ".join(f"{op} x{n}" for op, n in l.leftovers.items())
        why = "; ".join(l.reasons) + (f" [dim](left: {left})[/dim]" if left else "")
        t.add_row(str(l.layer), mark(l.attention), mark(l.skip_layernorm == 2,
                                                         f"{l.skip_layernorm}/2"),
                  mark(l.gelu), why if not l.fused else "")
    console.print(t)
    for line in table.unfused():
        console.print(f"[yellow]warning:[/yellow] {line}", highlight=False)
