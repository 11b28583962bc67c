"""Shared contract dataclasses and the one-node model builder for the fused ops bertfuse emits.

A contract records what ONNX Runtime's kernel really does (checked against ORT's own schema
and kernels), not what a fusion pass hopes it does; the README renders the same facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper
import onnx_graphsurgeon as gs

MS_DOMAIN = "com.microsoft"
ONNX_DOMAIN = ""  # ai.onnx
ONNX_OPSET = 17  # LayerNormalization first appears in opset 17
MS_OPSET = 1  # every com.microsoft op here is version 1
BERTFUSE_DOMAIN = "ai.bertfuse"  # bertfuse's own op library (CUDA EP only)
BERTFUSE_OPSET = 1
# IR 8 is the IR of opset 17 (ONNX 1.12); newer onnx writes IR versions older ORT builds refuse.
IR_VERSION = 8
FP8_IR_VERSION = 9  # float8e4m3fn tensors (FP8 weights, e4m3 outputs) need IR 9
# What a fused form may differ from its reference by (max and mean |diff|), per precision: the
# convert gate against TensorFlow and the runtime's check of bertfuse's ops both read it.
TOLERANCES = {"fp32": {"max": 1e-4, "mean": 1e-4}, "fp16": {"max": 4e-2, "mean": 2e-3}}

# Shape symbols used throughout the contracts.
#   B batch, S sequence length, H hidden size, N num_heads, D head size (H/N),
#   V vocab size, P max positions, T type-vocab (segments), K/M/N generic matmul dims.


@dataclass(frozen=True)
class TensorSpec:
    """One input or output slot. Slots are positional: an omitted optional one is ''."""

    name: str
    shape: tuple[str, ...]
    dtypes: tuple[str, ...]
    optional: bool = False
    doc: str = ""

    def shape_str(self) -> str:
        return "[" + ", ".join(self.shape) + "]"


@dataclass(frozen=True)
class AttrSpec:
    """One node attribute. default=None together with required=False means 'unset by default'."""

    name: str
    type: str  # "int" | "float" | "ints"
    default: Any
    meaning: str
    required: bool = False


@dataclass(frozen=True)
class OpContract:
    op_type: str
    domain: str
    since_version: int
    summary: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attributes: tuple[AttrSpec, ...] = ()
    # Float types for which ORT's CPU EP registers a *native* kernel (checked by a test against
    # ORT's kernel registry). Other float types still "run" on CPU because ORT's mandatory
    # InsertCastTransformer wraps the node in Casts to float32: that is emulation, not a kernel.
    cpu_kernel_types: tuple[str, ...] = ()
    pitfalls: tuple[str, ...] = field(default=())

    @property
    def qualified_name(self) -> str:
        return f"{self.domain or 'ai.onnx'}.{self.op_type}"

    def input(self, name: str) -> TensorSpec:
        return _by_name(self.inputs, name, self.op_type)

    def output(self, name: str) -> TensorSpec:
        return _by_name(self.outputs, name, self.op_type)

    def attribute(self, name: str) -> AttrSpec:
        for a in self.attributes:
            if a.name == name:
                return a
        raise KeyError(f"{self.op_type} has no attribute {name!r}")

    def node(self, name: str, inputs: Sequence[Any], outputs: Sequence[Any], **attrs: Any):
        """An onnx-graphsurgeon node of this op, checked against the contract.

        ``inputs``/``outputs`` are positional slots: ``None`` (or an empty tensor) skips an
        optional slot, trailing skipped slots are dropped. Every required slot must be filled,
        attributes must be known to the op (required ones given); ``None`` leaves one unset.
        A fusion that breaks the contract fails here, at build time, not in ORT at load time."""
        ins = self._slots(inputs, self.inputs, "input", gs)
        outs = self._slots(outputs, self.outputs, "output", gs)
        known = {a.name: a for a in self.attributes}
        unknown = sorted(set(attrs) - set(known))
        if unknown:
            raise ValueError(f"{self.op_type} has no attribute {', '.join(unknown)}")
        checked: dict[str, Any] = {}
        for key, spec in known.items():
            value = attrs.get(key)
            if value is None:
                if spec.required:
                    raise ValueError(f"{self.op_type} needs attribute {key!r}")
                continue
            checked[key] = _attr_value(self.op_type, spec, value)
        return gs.Node(self.op_type, name, checked, inputs=ins, outputs=outs,
                       domain=self.domain or None)

    def _slots(self, given: Sequence[Any], specs: Sequence[TensorSpec], kind: str, gs) -> list:
        if len(given) > len(specs):
            raise ValueError(f"{self.op_type} takes at most {len(specs)} {kind}s, got {len(given)}")
        slots = [t if t is not None and getattr(t, "name", "") != "" else None for t in given]
        while slots and slots[-1] is None:
            slots.pop()
        for i, spec in enumerate(specs):
            if not spec.optional and (i >= len(slots) or slots[i] is None):
                raise ValueError(f"{self.op_type} {kind} {i} ({spec.name}) is required")
        return [t if t is not None else gs.Variable.empty() for t in slots]

    def to_markdown(self) -> str:
        """Input/output/attribute tables in the README's format."""

        def cell(text: str) -> str:  # a bare '|' would end the table cell
            return text.replace("|", "\\|")

        lines = ["| slot | name | shape | dtype | optional | notes |", "|---|---|---|---|---|---|"]
        for kind, specs in (("in", self.inputs), ("out", self.outputs)):
            for i, t in enumerate(specs):
                lines.append(
                    f"| {kind} {i} | `{t.name}` | `{cell(t.shape_str())}` | {', '.join(t.dtypes)} | "
                    f"{'yes' if t.optional else 'no'} | {cell(t.doc)} |"
                )
        if self.attributes:
            lines += ["", "| attribute | type | default | meaning |", "|---|---|---|---|"]
            for a in self.attributes:
                default = "required" if a.required else ("unset" if a.default is None else repr(a.default))
                lines.append(f"| `{a.name}` | {a.type} | {default} | {cell(a.meaning)} |")
        return "\n".join(lines)


def _attr_value(op: str, spec: AttrSpec, value: Any) -> Any:
    """The attribute value as its declared type (an int where a float is declared is widened)."""
    if spec.type == "int" and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if spec.type == "float" and isinstance(value, (int, float, np.integer, np.floating)) and \
            not isinstance(value, bool):
        return float(value)
    if spec.type == "ints" and isinstance(value, (list, tuple)) and \
            all(isinstance(v, (int, np.integer)) for v in value):
        return [int(v) for v in value]
    raise TypeError(f"{op} attribute {spec.name!r} must be {spec.type}, got {value!r}")


def _by_name(specs: Sequence[TensorSpec], name: str, op: str) -> TensorSpec:
    for t in specs:
        if t.name == name:
            return t
    raise KeyError(f"{op} has no slot {name!r}")


# (name, dtype, shape) of a graph input/output; None in a node slot means "optional, omitted".
ValueSpec = tuple[str, "np.dtype[Any] | type | int", "Sequence[int | str | None] | None"]


def _value_info(spec: ValueSpec) -> onnx.ValueInfoProto:
    name, dtype, shape = spec  # dtype: a NumPy dtype, or a TensorProto type (FLOAT8E4M3FN)
    elem = dtype if isinstance(dtype, int) else helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def one_node_model(
    op_type: str,
    domain: str,
    inputs: Sequence[ValueSpec | None],
    outputs: Sequence[ValueSpec | None],
    attrs: dict[str, Any] | None = None,
) -> onnx.ModelProto:
    """A model with one node whose graph inputs/outputs are exactly the node's present slots.

    ``None`` entries become '' in the node (ONNX's way to skip an optional positional slot);
    trailing ``None`` entries are dropped so the node carries no dangling empty names.
    """
    ins = list(inputs)
    outs = list(outputs)
    while ins and ins[-1] is None:
        ins.pop()
    while outs and outs[-1] is None:
        outs.pop()
    attrs = {k: v for k, v in (attrs or {}).items() if v is not None}
    node = helper.make_node(
        op_type,
        [s[0] if s is not None else "" for s in ins],
        [s[0] if s is not None else "" for s in outs],
        domain=domain,
        **attrs,
    )
    graph = helper.make_graph(
        [node],
        f"{op_type}_single",
        [_value_info(s) for s in ins if s is not None],
        [_value_info(s) for s in outs if s is not None],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(ONNX_DOMAIN, ONNX_OPSET), helper.make_opsetid(MS_DOMAIN, MS_OPSET)]
        + ([helper.make_opsetid(BERTFUSE_DOMAIN, BERTFUSE_OPSET)] if domain == BERTFUSE_DOMAIN else []),
        producer_name="bertfuse.ops",
    )
    model.ir_version = IR_VERSION
    return model


def as_dtype(x: np.ndarray, like: np.ndarray) -> np.ndarray:
    """Cast a float64 reference result back to the op's tensor dtype (T)."""
    return np.asarray(x).astype(like.dtype, copy=False)
