"""Which FP8 scaling keeps a model's outputs within the FP8 gate, before any kernel is written
for it (CPU): every encoder GEMM of an fp32 ONNX model fake-quantised to e4m3 four ways, each
run in ONNX Runtime against the unquantised model, in the FP8 gate's terms (cosine per row and
per valid token, argmax agreement; bertfuse/pipeline/fp8_gate.py).

    weights   per tensor: s = max|W| / 448            per channel: s_n = max_k |W[k, n]| / 448
    inputs    per tensor: s = max|X| / 448 over the   per token:   s_m = max_k |X[m, k]| / 448,
              inputs below (calibrated, as --fp8)                  at run time

    W ─► e4m3(W / s) * s  (offline)      X ─► Div s ─► Clip ±448 ─► Cast e4m3 ─► Cast f32 ─► Mul s
                                                                              ─► MatMul ─►

Per-tensor weights with per-tensor inputs is the arithmetic of today's `--precision fp8`
(its GELU aside: the FP8 form computes it in its tanh form); `--skip` leaves GEMMs in fp32 by
their place in the layer (qkv, out, up, down), to find where the error comes from.

The model: `bertfuse convert SRC --no-fuse --no-verify --opset 18 -o raw.onnx` (the raw tf2onnx
graph; opset 18, raised here to 19 for e4m3 casts, which changes no op it holds). The inputs:
`--inputs FILE.npz` (e.g. `bertfuse convert ... --text-file T --vocab V --save-inputs FILE.npz`)
or random padded ones (`--batch`, `--seq`, `--seed`).

    python benchmarks/convert/fp8_scales.py raw.onnx --inputs text.npz [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from bertfuse.io.inputs import random_inputs
from bertfuse.ops.bertfuse.dense_fp8 import E4M3_MAX, e4m3
from bertfuse.pipeline.fp8_gate import Fp8Gate, measure

PLACES = ("qkv", "out", "up", "down")
SCHEMES = {  # name: (weights per channel, inputs per token)
    "W tensor, X tensor (today's)": (False, False),
    "W channel, X tensor": (True, False),
    "W tensor, X token": (False, True),
    "W channel, X token": (True, True),
}


def encoder_gemms(model: onnx.ModelProto) -> list[tuple[int, str]]:
    """(the MatMul's index in the graph, its place in the layer) for every GEMM of the
    encoder, a MatMul with a 2-D weight initializer named by what follows it: three MatMuls
    on one input -> qkv; a GELU -> up; a LayerNorm (ReduceMean) within a few ops -> out, then
    down, in the graph's order. Others (the pooler, a head, a one-hot embedding) are not the
    encoder's."""
    inits = {i.name: i for i in model.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    by_input: dict[str, int] = {}
    gemms = [(i, n) for i, n in enumerate(model.graph.node) if n.op_type == "MatMul"
             and n.input[1] in inits and len(inits[n.input[1]].dims) == 2]
    for _, n in gemms:
        by_input[n.input[0]] = by_input.get(n.input[0], 0) + 1

    def downstream(name: str, depth: int = 4) -> set[str]:
        seen, todo = set(), [(name, 0)]
        while todo:
            t, d = todo.pop()
            for c in consumers.get(t, []):
                seen.add(c.op_type)
                if d < depth:
                    todo += [(o, d + 1) for o in c.output]
        return seen

    out, residual = [], 0
    made_by = {o: n.op_type for n in model.graph.node for o in n.output}
    for i, n in gemms:
        if made_by.get(n.input[0]) == "OneHot":
            continue  # a token-type embedding as a one-hot product
        after = downstream(n.output[0])
        if by_input[n.input[0]] >= 3:
            place = "qkv"
        elif "Erf" in after or "Pow" in after:
            place = "up"
        elif "ReduceMean" in after:  # into the residual sum's LayerNorm
            place = ("out", "down")[residual % 2]
            residual += 1
        else:
            continue  # the pooler, a head, a one-hot embedding: not the encoder's
        out.append((i, place))
    return out


def fake_quantised(model: onnx.ModelProto, gemms, per_channel: bool, per_token: bool,
                   x_amax: dict[str, float], skip: set[str]) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name: i for i in m.graph.initializer}
    new_nodes, done_inputs = [], {}
    for index, place in gemms:
        node = m.graph.node[index]
        if place in skip:
            continue
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        s = (np.abs(w).max(axis=0, keepdims=True) if per_channel else np.abs(w).max()) / E4M3_MAX
        s = np.where(s > 0, s, 1.0).astype(np.float32)
        wq = e4m3(w / s).astype(np.float32) * s
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(wq, node.input[1]))
        x = node.input[0]
        if x not in done_inputs:
            tag = f"fq_{len(done_inputs)}"
            if per_token:
                new_nodes += [helper.make_node("Abs", [x], [f"{tag}_abs"]),
                              helper.make_node("ReduceMax", [f"{tag}_abs", f"{tag}_axes"],
                                               [f"{tag}_amax"], keepdims=1),
                              helper.make_node("Div", [f"{tag}_amax", f"{tag}_448"], [f"{tag}_s0"]),
                              helper.make_node("Max", [f"{tag}_s0", f"{tag}_tiny"], [f"{tag}_s"])]
                m.graph.initializer.extend([
                    numpy_helper.from_array(np.array([-1], np.int64), f"{tag}_axes"),
                    numpy_helper.from_array(np.array(E4M3_MAX, np.float32), f"{tag}_448"),
                    numpy_helper.from_array(np.array(1e-30, np.float32), f"{tag}_tiny")])
            else:
                scale = max(x_amax[x], 1e-30) / E4M3_MAX
                m.graph.initializer.append(
                    numpy_helper.from_array(np.array(scale, np.float32), f"{tag}_s"))
            m.graph.initializer.extend([
                numpy_helper.from_array(np.array(-E4M3_MAX, np.float32), f"{tag}_lo"),
                numpy_helper.from_array(np.array(E4M3_MAX, np.float32), f"{tag}_hi")])
            new_nodes += [helper.make_node("Div", [x, f"{tag}_s"], [f"{tag}_d"]),
                          helper.make_node("Clip", [f"{tag}_d", f"{tag}_lo", f"{tag}_hi"],
                                           [f"{tag}_c"]),
                          helper.make_node("Cast", [f"{tag}_c"], [f"{tag}_q"],
                                           to=TensorProto.FLOAT8E4M3FN),
                          helper.make_node("Cast", [f"{tag}_q"], [f"{tag}_f"],
                                           to=TensorProto.FLOAT),
                          helper.make_node("Mul", [f"{tag}_f", f"{tag}_s"], [f"{tag}_x"])]
            done_inputs[x] = f"{tag}_x"
        node.input[0] = done_inputs[x]
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(new_nodes + nodes)  # sorted again below
    return topo_sorted(m)


def topo_sorted(m: onnx.ModelProto) -> onnx.ModelProto:
    graph = gs.import_onnx(m)
    graph.toposort()
    return gs.export_onnx(graph)


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the math as written
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], extra: list[str] = ()):
    m = model
    if extra:
        m = onnx.ModelProto()
        m.CopyFrom(model)
        m.graph.output.extend(helper.make_tensor_value_info(x, TensorProto.FLOAT, None)
                              for x in extra)
    sess = session(m)
    names = {i.name for i in sess.get_inputs()}
    out = sess.run(None, {k: v for k, v in feeds.items() if k in names})
    return dict(zip([o.name for o in sess.get_outputs()], out))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--inputs", help=".npz by role (convert --save-inputs)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", default="", help="places left in fp32, e.g. down or qkv,down")
    p.add_argument("--json", help="write the table here too")
    args = p.parse_args()
    model = onnx.load(args.model)
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            if op.version < 18:
                raise SystemExit("fp8_scales: convert with --opset 18 (ReduceMax takes its axes "
                                 "as an input from 18)")
            op.version = max(op.version, 19)
    model.ir_version = max(model.ir_version, 9)
    if args.inputs:
        feeds = {k: v.astype(np.int32) for k, v in np.load(args.inputs).items()}
    else:
        vocab = max(numpy_helper.to_array(i).shape[0] for i in model.graph.initializer
                    if len(i.dims) == 2)
        feeds = dict(random_inputs(args.batch, args.seq, vocab, seed=args.seed))
    gemms = encoder_gemms(model)
    places = {pl: sum(1 for _, q in gemms if q == pl) for pl in PLACES}
    print(f"encoder GEMMs: {places}; inputs {feeds['input_ids'].shape}", flush=True)
    xs = sorted({model.graph.node[i].input[0] for i, _ in gemms})
    ref = run(model, feeds, xs)
    x_amax = {x: float(np.abs(ref[x]).max()) for x in xs}
    want = {o.name: ref[o.name] for o in model.graph.output}
    skip = {s for s in args.skip.split(",") if s}
    rows = []
    for name, (per_channel, per_token) in SCHEMES.items():
        got = run(fake_quantised(model, gemms, per_channel, per_token, x_amax, skip), feeds)
        terms = measure(want, got, feeds.get("input_mask"))
        rows.append({"scheme": name, "skip": sorted(skip), "failure": Fp8Gate().failure(terms),
                     "outputs": [t.to_json() for t in terms]})
        print(f"{name}: " + "; ".join(t.summary() for t in terms), flush=True)
    print("\n| scheme | " + " | ".join(f"{t['name']} min cos" if t["cosine_min"] is not None
                                      else f"{t['name']} argmax" if t["argmax_agreement"]
                                      is not None else f"{t['name']} top-{t['k']}"
                                      for t in rows[0]["outputs"])
          + " | within the gate |")
    print("|---" * (len(rows[0]["outputs"]) + 2) + "|")
    for r in rows:
        cells = [f"{t['cosine_min']:.6f}" if t["cosine_min"] is not None else
                 f"{t['argmax_agreement']:.2%}" if t["argmax_agreement"] is not None else
                 "-" if t["topk_agreement"] is None else f"{t['topk_agreement']:.0%}"
                 for t in r["outputs"]]
        print(f"| {r['scheme']} | " + " | ".join(cells) + f" | {'yes' if not r['failure'] else 'no'} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "places": places,
                                               "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
