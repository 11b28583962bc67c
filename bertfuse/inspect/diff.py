"""What changed between two models (or summaries), and whether a CI should fail on it.

Findings come in categories; ``--fail-on`` picks the ones that make the exit code 1:

    fusion-loss   a layer lost Attention / a SkipLayerNorm / GELU, or EmbedLayerNorm went
    io-change     an input or output was added, removed, or changed dtype or shape
    opset-change  an opset (any domain) was added, removed or changed version
    op-change     the op histogram changed
    init-change   an initializer was added, removed, or changed shape or dtype
    numeric       with --numeric: max |diff| of an output above --atol, or NaN/Inf in either

Fusion gained, node-count and weight-size changes are reported, never failed on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from bertfuse.errors import BertfuseError

CATEGORIES = ("fusion-loss", "io-change", "opset-change", "op-change", "init-change", "numeric")
DEFAULT_FAIL_ON = ("fusion-loss", "io-change", "numeric")


def parse_fail_on(text: str | None) -> tuple[str, ...]:
    if text is None:
        return DEFAULT_FAIL_ON
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    if not items:  # an unset shell variable, say: a gate must not open silently
        raise BertfuseError("--fail-on is empty (name categories, all, or none)")
    if items == ("none",):
        return ()
    if items == ("all",):
        return CATEGORIES
    unknown = [t for t in items if t not in CATEGORIES]
    if unknown:
        raise BertfuseError(f"--fail-on: unknown categor{'ies' if len(unknown) > 1 else 'y'} "
                            f"{', '.join(unknown)} (choose from {', '.join(CATEGORIES)}, all, "
                            f"none)")
    return items


@dataclass
class Finding:
    category: str  # one of CATEGORIES, or "fusion-gain" / "info"
    message: str
    layer: int | None = None  # encoder layer, for fusion findings; -1 = embeddings

    def to_json(self) -> dict:
        return {"category": self.category, "message": self.message, "layer": self.layer}


@dataclass
class DiffResult:
    a: str
    b: str
    findings: list[Finding] = field(default_factory=list)
    ops: dict[str, tuple[int, int]] = field(default_factory=dict)
    numeric: list[dict] | None = None
    fail_on: tuple[str, ...] = DEFAULT_FAIL_ON

    @property
    def failing(self) -> list[Finding]:
        return [f for f in self.findings if f.category in self.fail_on]

    @property
    def exit_code(self) -> int:
        return 1 if self.failing else 0

    def to_json(self) -> dict:
        return {"a": self.a, "b": self.b, "fail_on": list(self.fail_on),
                "exit_code": self.exit_code, "failing": [f.to_json() for f in self.failing],
                "findings": [f.to_json() for f in self.findings],
                "ops": {op: {"a": a, "b": b, "delta": b - a} for op, (a, b) in self.ops.items()},
                "numeric": self.numeric}


# ------------------------------------------------------------------------------ comparing


def _layer_parts(layer: dict) -> dict[str, str]:
    return {"attention": "Attention" if layer["attention"] else "",
            "skip_layernorm": f"SkipLayerNorm {layer['skip_layernorm']}/2",
            "gelu": "GELU" if layer["gelu"] else ""}


def _fusion(a: dict, b: dict, out: list[Finding]) -> None:
    ea, eb = a["encoder"], b["encoder"]
    if ea["embed_layernorm"] != eb["embed_layernorm"]:
        lost = ea["embed_layernorm"]
        out.append(Finding("fusion-loss" if lost else "fusion-gain",
                           f"embeddings: EmbedLayerNormalization {'lost' if lost else 'gained'}",
                           -1))
    la, lb = ea["layers"], eb["layers"]
    if len(la) != len(lb):
        out.append(Finding("fusion-loss" if len(lb) < len(la) else "info",
                           f"encoder layers found: {len(la)} -> {len(lb)}"))
    for i in range(min(len(la), len(lb))):
        x, y = la[i], lb[i]
        lost, gained = [], []
        for key, label in (("attention", "Attention"), ("gelu", "GELU")):
            if x[key] and not y[key]:
                lost.append(label)
            elif y[key] and not x[key]:
                gained.append(label)
        if y["skip_layernorm"] < x["skip_layernorm"]:
            lost.append(f"SkipLayerNorm {x['skip_layernorm']}/2 -> {y['skip_layernorm']}/2")
        elif y["skip_layernorm"] > x["skip_layernorm"]:
            gained.append(f"SkipLayerNorm {x['skip_layernorm']}/2 -> {y['skip_layernorm']}/2")
        left = ", ".join(f"{op} x{n}" for op, n in sorted(y.get("leftovers", {}).items()))
        if lost:
            out.append(Finding("fusion-loss", f"layer {i}: lost {', '.join(lost)}"
                               + (f" (left unfused: {left})" if left else ""), i))
        if gained:
            out.append(Finding("fusion-gain", f"layer {i}: gained {', '.join(gained)}", i))


def _io(a: dict, b: dict, out: list[Finding]) -> None:
    for kind in ("inputs", "outputs"):
        xa = {v["name"]: v for v in a[kind]}
        xb = {v["name"]: v for v in b[kind]}
        for name in xa.keys() - xb.keys():
            out.append(Finding("io-change", f"{kind[:-1]} {name!r} removed"))
        for name in xb.keys() - xa.keys():
            out.append(Finding("io-change", f"{kind[:-1]} {name!r} added"))
        for name in sorted(xa.keys() & xb.keys()):
            va, vb = xa[name], xb[name]
            for key in ("dtype", "shape"):
                if va[key] != vb[key]:
                    out.append(Finding("io-change", f"{kind[:-1]} {name!r}: {key} "
                                                    f"{_fmt(va[key])} -> {_fmt(vb[key])}"))
        common = [n for n in xa if n in xb]
        if common != [n for n in xb if n in xa]:
            out.append(Finding("io-change", f"{kind} reordered: {', '.join(common)} -> "
                                            f"{', '.join(n for n in xb if n in xa)}"))


def _fmt(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(str(d) for d in v) + "]"
    return str(v)


def _opsets(a: dict, b: dict, out: list[Finding]) -> None:
    for dom in sorted(a["opsets"].keys() | b["opsets"].keys()):
        va, vb = a["opsets"].get(dom), b["opsets"].get(dom)
        if va != vb:
            out.append(Finding("opset-change", f"opset {dom}: {va if va is not None else '-'} "
                                               f"-> {vb if vb is not None else '-'}"))


def _ops(a: dict, b: dict, out: list[Finding]) -> dict[str, tuple[int, int]]:
    delta = {}
    for op in sorted(a["ops"].keys() | b["ops"].keys()):
        x, y = a["ops"].get(op, 0), b["ops"].get(op, 0)
        if x != y:
            delta[op] = (x, y)
    if delta:
        shown = sorted(delta.items(), key=lambda kv: (-abs(kv[1][1] - kv[1][0]), kv[0]))
        text = ", ".join(f"{op} {y - x:+d}" for op, (x, y) in shown[:6])
        more = f" (+{len(shown) - 6} more op types)" if len(shown) > 6 else ""
        out.append(Finding("op-change", f"op histogram: {text}{more}"))
    if a["nodes"] != b["nodes"]:
        out.append(Finding("info", f"nodes: {a['nodes']} -> {b['nodes']}"))
    return delta


def _inits(a: dict, b: dict, out: list[Finding], limit: int = 8) -> None:
    ia, ib = a["initializers"], b["initializers"]
    removed, added = sorted(ia.keys() - ib.keys()), sorted(ib.keys() - ia.keys())

    def names(xs):
        return ", ".join(xs[:limit]) + (f" (+{len(xs) - limit} more)" if len(xs) > limit else "")

    if removed:
        out.append(Finding("init-change", f"{len(removed)} initializers removed: {names(removed)}"))
    if added:
        out.append(Finding("init-change", f"{len(added)} initializers added: {names(added)}"))
    groups: dict[str, list[str]] = {}
    for name in sorted(ia.keys() & ib.keys()):
        x, y = ia[name], ib[name]
        if x["shape"] != y["shape"]:
            key = f"shape {_fmt(x['shape'])} -> {_fmt(y['shape'])}"
            if x["dtype"] != y["dtype"]:
                key += f", dtype {x['dtype']} -> {y['dtype']}"
            groups.setdefault(key, []).append(name)
        elif x["dtype"] != y["dtype"]:
            groups.setdefault(f"dtype {x['dtype']} -> {y['dtype']}", []).append(name)
    for change, xs in groups.items():
        what = f"initializer {xs[0]}" if len(xs) == 1 else f"{len(xs)} initializers"
        out.append(Finding("init-change", f"{what}: {change}"
                                          + (f" ({names(xs)})" if len(xs) > 1 else "")))
    wa, wb = a["weights"], b["weights"]
    if wa["bytes"] != wb["bytes"]:
        out.append(Finding("info", f"weight bytes: {wa['bytes']:,} -> {wb['bytes']:,}"))


def diff_summaries(a: dict, b: dict, name_a: str = "A", name_b: str = "B",
                   fail_on: tuple[str, ...] = DEFAULT_FAIL_ON) -> DiffResult:
    res = DiffResult(name_a, name_b, fail_on=fail_on)
    _fusion(a, b, res.findings)
    _io(a, b, res.findings)
    _opsets(a, b, res.findings)
    res.ops = _ops(a, b, res.findings)
    _inits(a, b, res.findings)
    pa, pb = a["producer"], b["producer"]
    if pa != pb:
        res.findings.append(Finding("info", f"producer: {pa['name']} {pa['version']} -> "
                                            f"{pb['name']} {pb['version']}"))
    return res


# ------------------------------------------------------------------------------ numeric


def _feeds(sess, batch: int, seq: int, seed: int, vocab: int, type_vocab: int) -> dict:
    from bertfuse.converter.export import random_inputs

    base = random_inputs(batch, seq, vocab, type_vocab, seed=seed, pad_anywhere=True)
    feeds = {}
    for inp in sess.get_inputs():
        low = inp.name.lower()
        role = ("input_mask" if "mask" in low else
                "segment_ids" if "segment" in low or "type" in low else "input_ids")
        dtype = {"tensor(int32)": np.int32, "tensor(int64)": np.int64,
                 "tensor(float)": np.float32}.get(inp.type)
        if dtype is None:
            raise BertfuseError(f"--numeric: input {inp.name!r} has type {inp.type}; only "
                                f"int32/int64/float BERT inputs are supported")
        feeds[inp.name] = base[role].astype(dtype)
    return feeds


def _vocab(path: str) -> tuple[int, int]:
    import json

    from bertfuse.inspect.summary import load_light

    meta = {p.key: p.value for p in load_light(path).metadata_props}
    try:
        cfg = json.loads(meta.get("bert_config", "{}"))
        return int(cfg.get("vocab_size", 100)), int(cfg.get("type_vocab_size", 2))
    except (ValueError, TypeError, AttributeError, RecursionError):  # edited metadata
        return 100, 2


def numeric_diff(path_a: str, path_b: str, batch: int = 4, seq: int = 32, seed: int = 0
                 ) -> list[dict]:
    """Both models on ORT CPU, the same random padded inputs; |diff| per common output."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sessions = []
    for p in (path_a, path_b):
        try:
            sessions.append(ort.InferenceSession(p, opts, providers=["CPUExecutionProvider"]))
        except Exception as exc:
            raise BertfuseError(f"{p}: ONNX Runtime cannot load the model: "
                                f"{str(exc).splitlines()[0][:200]}") from None
    vocab = min(_vocab(path_a), _vocab(path_b))
    names_a = [o.name for o in sessions[0].get_outputs()]
    names_b = {o.name for o in sessions[1].get_outputs()}
    common = [n for n in names_a if n in names_b]
    if not common:
        raise BertfuseError("--numeric: the two models share no output name")
    results = []
    for p, s in zip((path_a, path_b), sessions):
        feeds = _feeds(s, batch, seq, seed, *vocab)
        try:  # e.g. --seq past the model's position table: the user's input, not a bug
            results.append(s.run(common, feeds))
        except Exception as exc:
            raise BertfuseError(f"{p}: ONNX Runtime fails on the --numeric inputs (batch "
                                f"{batch}, seq {seq}): {str(exc).splitlines()[0][:200]}") from None
    rows = []
    for name, x, y in zip(common, *results):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.shape != y.shape:
            rows.append({"output": name, "shape_a": list(x.shape), "shape_b": list(y.shape),
                         "max_abs": None, "mean_abs": None})
            continue
        # NaN/Inf fail closed: counted per side, left out of max/mean (strict JSON has no NaN).
        bad_a, bad_b = ~np.isfinite(x), ~np.isfinite(y)
        d = np.abs(x - y)[~(bad_a | bad_b)]
        rows.append({"output": name, "shape_a": list(x.shape), "shape_b": list(y.shape),
                     "max_abs": float(d.max()) if d.size else 0.0,
                     "mean_abs": float(d.mean()) if d.size else 0.0,
                     "nonfinite_a": int(bad_a.sum()), "nonfinite_b": int(bad_b.sum())})
    return rows


def add_numeric(res: DiffResult, rows: list[dict], atol: float, batch: int, seq: int) -> None:
    if not (math.isfinite(atol) and atol >= 0):  # a NaN atol would pass every difference
        raise BertfuseError(f"--atol must be a finite number >= 0, got {atol!r}")
    res.numeric = rows
    for r in rows:
        bad = {side: r.get(f"nonfinite_{side}", 0) for side in ("a", "b")}
        if r["max_abs"] is None:
            res.findings.append(Finding("numeric", f"output {r['output']}: shape "
                                                   f"{r['shape_a']} -> {r['shape_b']}"))
        elif bad["a"] or bad["b"]:
            where = ", ".join(f"{n} in {side.upper()}" for side, n in bad.items() if n)
            res.findings.append(Finding("numeric", f"output {r['output']}: NaN/Inf values "
                                                   f"({where}; batch {batch}, seq {seq}, "
                                                   f"padded)"))
        elif not r["max_abs"] <= atol:
            res.findings.append(Finding("numeric", f"output {r['output']}: max |diff| "
                                                   f"{r['max_abs']:.3g} > atol {atol:g} "
                                                   f"(batch {batch}, seq {seq}, padded)"))


# ------------------------------------------------------------------------------ rendering


_HEAD = {"fusion-loss": "fusion lost", "fusion-gain": "fusion gained", "io-change": "I/O",
         "opset-change": "opset", "op-change": "ops", "init-change": "initializers",
         "numeric": "numeric", "info": "other"}


def diff_text(res: DiffResult) -> str:
    out = [f"--- {res.a}", f"+++ {res.b}"]
    if not res.findings and not res.numeric:
        out.append("no differences")
    for f in res.findings:
        mark = "FAIL" if f.category in res.fail_on else "    "
        out.append(f"{mark} {_HEAD[f.category]:<13} {f.message}")
    if res.ops:
        out.append("op histogram (A -> B):")
        out += [f"     {op:<28} {a:>5} -> {b:<5} ({b - a:+d})" for op, (a, b) in res.ops.items()]
    if res.numeric:
        out.append("numeric (ORT CPU, same random padded inputs):")
        for r in res.numeric:
            if r["max_abs"] is not None:
                out.append(f"     {r['output']:<20} max |diff| {r['max_abs']:.3g}  "
                           f"mean |diff| {r['mean_abs']:.3g}{_nonfinite_text(r)}")
    out.append(_verdict(res))
    return "\n".join(out) + "\n"


def _nonfinite_text(row: dict) -> str:
    n = row.get("nonfinite_a", 0) + row.get("nonfinite_b", 0)
    return f"  ({n} NaN/Inf, left out of max/mean)" if n else ""


def _verdict(res: DiffResult) -> str:
    if res.failing:
        cats = sorted({f.category for f in res.failing})
        return f"result: FAIL ({len(res.failing)} finding(s) in {', '.join(cats)}; " \
               f"fail-on {','.join(res.fail_on) or 'none'})"
    return f"result: ok (fail-on {','.join(res.fail_on) or 'none'})"


def diff_markdown(res: DiffResult) -> str:
    icon = ":x:" if res.failing else ":white_check_mark:"
    out = [f"### bertfuse diff {icon}", "", f"`{res.a}` → `{res.b}`", ""]
    if not res.findings and not res.numeric:
        out.append("No differences.")
    if res.findings:
        out += ["| | what | change |", "| --- | --- | --- |"]
        for f in res.findings:
            mark = "**fail**" if f.category in res.fail_on else ""
            out.append(f"| {mark} | {_HEAD[f.category]} | {f.message.replace('|', '/')} |")
    if res.ops:
        out += ["", "<details><summary>op histogram delta</summary>", "",
                "| op | A | B | Δ |", "| --- | ---: | ---: | ---: |"]
        out += [f"| {op} | {a} | {b} | {b - a:+d} |" for op, (a, b) in res.ops.items()]
        out += ["", "</details>"]
    if res.numeric:
        out += ["", "| output | max \\|diff\\| | mean \\|diff\\| |", "| --- | ---: | ---: |"]
        out += [f"| {r['output']} | {r['max_abs']:.3g} | {r['mean_abs']:.3g}"
                f"{_nonfinite_text(r)} |"
                for r in res.numeric if r["max_abs"] is not None]
    out += ["", _verdict(res)]
    return "\n".join(out) + "\n"
