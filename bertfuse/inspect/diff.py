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

from dataclasses import dataclass, field

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
        out.append("numeric (ORT CPU, the same inputs for both):")
        for r in res.numeric:
            if r["max_abs"] is not None:
                out.append(f"     {r['output']:<20} max |diff| {r['max_abs']:.3g}  "
                           f"mean |diff| {r['mean_abs']:.3g}{_nonfinite_text(r)}")
    out.append(diff_verdict(res))
    return "\n".join(out) + "\n"


def _nonfinite_text(row: dict) -> str:
    n = row.get("nonfinite_a", 0) + row.get("nonfinite_b", 0)
    return f"  ({n} NaN/Inf, left out of max/mean)" if n else ""


def diff_verdict(res: DiffResult) -> str:
    """The one-line result: ok, or FAIL with the categories that failed."""
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
    out += ["", diff_verdict(res)]
    return "\n".join(out) + "\n"
