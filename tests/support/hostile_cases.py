"""The hostile-input case table for tests/hostile/test_hostile.py (CLI cases, run in-process).

A case is argv tokens with placeholders, the exit code, a substring of the one stderr line,
and set-up steps. Placeholders: {w} the case's private workspace, {out} a new file in it,
{NAME} a library input copied into the workspace on first use (LIBRARY), any other {NAME} the
workspace path NAME (made by a set-up step). Set-up steps, run in order before the snapshot:

    ("file", NAME, bytes|str)      ("mkdir", NAME)        ("fifo", NAME)    ("rm", NAME)
    ("link", NAME, TARGET)         ("hard", NAME, TARGET) ("trunc", NAME, SOURCE, NBYTES)
    ("copy", NAME, SOURCE)         ("cfg", NAME, {key: value | DROP} | raw text)
    ("meta", NAME, SOURCE, key, value | None)   (an ONNX copy with one metadata entry edited)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

# Library inputs: placeholder -> file name in the workspace (built once per session).
LIBRARY = {"ckpt": "ckpt", "fused": "fused.onnx", "raw": "raw.onnx", "summary": "summary.json",
           "skel": "skel.onnx", "nan": "nan.onnx", "inf": "inf.onnx", "toy": "toy.onnx",
           "frozen": "frozen.pb", "savedmodel": "savedmodel"}
DROP = object()  # ("cfg", ...) edit: remove the key
SHARD = "bert_model.ckpt.data-00000-of-00001"
INDEX = "bert_model.ckpt.index"
GARBAGE = bytes((i * 151 + 7) % 256 for i in range(4096))  # no protobuf, no JSON, no UTF-8


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    code: int = 2
    needle: str | None = None  # in the one stderr line (code 1: stderr or stdout)
    setup: tuple[tuple, ...] = ()
    creates: tuple[str, ...] = ()  # workspace names a successful run adds
    xfail: str | None = None  # a real bug not fixed here: strict xfail with this reason


def C(name: str, argv: str | list[str], code: int = 2, needle: str | None = None, setup=(),
      creates=(), xfail: str | None = None) -> Case:
    """argv: one string split on single spaces, or a list (names holding spaces)."""
    tokens = argv.split(" ") if isinstance(argv, str) else argv
    return Case(name, tuple(tokens), code, needle, tuple(setup), tuple(creates), xfail)


# ------------------------------------------------------------ bad files for every ONNX slot

# kind -> (set-up, the path token, needle)
BAD_FILES: dict[str, tuple[tuple, str, str]] = {
    "missing": ((), "{w}/nope.onnx", "no such file"),
    "empty": ((("file", "empty.onnx", b""),), "{empty.onnx}", "empty.onnx"),
    "garbage": ((("file", "garbage.onnx", GARBAGE),), "{garbage.onnx}", "garbage.onnx"),
    "text": ((("file", "text.onnx", "hello, I am not a model\n"),), "{text.onnx}", "text.onnx"),
    "truncated": ((("trunc", "trunc.onnx", "{fused}", 700_000),), "{trunc.onnx}",
                  "trunc.onnx"),
    "directory": ((("mkdir", "dir.onnx"),), "{dir.onnx}", "dir.onnx"),
    "summary_json": ((), "{summary}", "summary.json"),
    "dev_null": ((), "/dev/null", "/dev/null"),
}

# command slot -> argv with M where the bad file goes
ONNX_SLOTS = {
    "optimize": "optimize M -o {out}",
    "strip": "strip-weights M -o {out}",
    "fill": "strip-weights M --fill 1 -o {out}",
    "inspect": "inspect M",
    "summarize": "summarize M -o {w}/s.json",
    "verify": "verify M --against {ckpt}",
    "diff_a": "diff M {fused}",
    "diff_b": "diff {fused} M",
    "draw": "draw M -o {w}/d.dot",
    "draw_before": "draw {fused} --before M -o {w}/d.dot",
}


def _bad_file_cases() -> list[Case]:
    out = []
    for slot, argv in ONNX_SLOTS.items():
        for kind, (setup, token, needle) in BAD_FILES.items():
            if kind == "summary_json" and slot.startswith("diff"):
                continue  # a summary is a valid diff operand (see MIXES)
            out.append(C(f"{slot}-{kind}", argv.replace("M", token), 2, needle, setup))
    return out


# ------------------------------------------------------------------- convert: bad sources


SOURCES = [
    C("src-missing", "convert {w}/nope -o {out}", 2, "no such file"),
    C("src-empty-file-no-ext", "convert {model} -o {out}", 2, "model",
      [("file", "model", b"")]),
    C("src-garbage-pb", "convert {g.pb} -o {out}", 2, "not a TensorFlow GraphDef",
      [("file", "g.pb", GARBAGE)]),
    C("src-empty-pb", "convert {e.pb} -o {out}", 2, "e.pb", [("file", "e.pb", b"")]),
    C("src-garbage-pbtxt", "convert {g.pbtxt} -o {out}", 2, "g.pbtxt",
      [("file", "g.pbtxt", "node { name: 'x' op: [[[ }\n")]),
    C("src-garbage-keras", "convert {g.keras} -o {out}", 2, "g.keras",
      [("file", "g.keras", GARBAGE)]),
    C("src-empty-keras", "convert {e.keras} -o {out}", 2, "e.keras", [("file", "e.keras", b"")]),
    C("src-empty-dir", "convert {d} -o {out}", 2, "neither a SavedModel nor a checkpoint",
      [("mkdir", "d")]),
    C("src-garbage-savedmodel", "convert {sm} -o {out}", 2, "SavedModel",
      [("mkdir", "sm"), ("file", "sm/saved_model.pb", GARBAGE)]),
    C("src-ckpt-empty-index", "convert {ckpt} -o {out}", 2, "checkpoint",
      [("file", "{ckpt}/" + INDEX, b"")]),
    C("src-ckpt-truncated-shard", "convert {ckpt} -o {out}", 2, "cannot read variable values",
      [("trunc", "{ckpt}/" + SHARD, "{ckpt}/" + SHARD, 1000)]),
    C("src-ckpt-missing-shard", "convert {ckpt} -o {out}", 2, "ckpt",
      [("rm", "{ckpt}/" + SHARD)]),
    C("src-ckpt-missing-index", "convert {ckpt} -o {out}", 2, "ckpt",
      [("rm", "{ckpt}/" + INDEX)]),
    C("src-ckpt-missing-config", "convert {ckpt} -o {out}", 2, "bert_config.json",
      [("rm", "{ckpt}/bert_config.json")]),
    C("src-ckpt-config-is-dir", "convert {ckpt} -o {out}", 2, "bert_config.json",
      [("rm", "{ckpt}/bert_config.json"), ("mkdir", "{ckpt}/bert_config.json")]),
    C("src-ckpt-prefix-missing", "convert {ckpt}/nope.ckpt -o {out}", 2, "nope.ckpt"),
    C("src-dev-null", "convert /dev/null -o {out}", 2, "/dev/null"),
    C("src-onnx-file", "convert {fused} -o {out}", 2, "fused.onnx"),
    C("src-format-frozen-on-dir", "convert {ckpt} --format frozen -o {out}", 2,
      "is a directory"),
    C("src-format-savedmodel-on-ckpt", "convert {ckpt} --format savedmodel -o {out}", 2,
      "SavedModel"),
    C("src-format-keras-on-pb", "convert {frozen} --format keras -o {out}", 2, "frozen.pb"),
    C("src-format-checkpoint-on-onnx", "convert {fused} --format checkpoint -o {out}", 2,
      "fused.onnx"),
    C("src-format-unknown", "convert {ckpt} --format torch -o {out}", 2, "--format"),
    C("src-format-empty", "convert {ckpt} --format  -o {out}", 2, "--format"),
    C("src-config-beside-mismatch", "convert {ckpt} -o {out}", 2, "does not match checkpoint",
      [("cfg", "{ckpt}/bert_config.json", {"hidden_size": 256})]),
]


# --------------------------------------------------------- convert --config: JSON edge cases


def _cfg(name: str, edit: Any, needle: str, code: int = 2, xfail: str | None = None) -> Case:
    return C(f"config-{name}", "convert {ckpt} --config {cfg.json} -o {out}", code, needle,
             [("cfg", "cfg.json", edit)], xfail=xfail)


CONFIGS = [
    C("config-missing", "convert {ckpt} --config {w}/nope.json -o {out}", 2, "nope.json"),
    C("config-is-dir", "convert {ckpt} --config {cd} -o {out}", 2, "bert_config.json",
      [("mkdir", "cd")]),
    C("config-dev-null", "convert {ckpt} --config /dev/null -o {out}", 2, "/dev/null"),
    _cfg("empty", "", "not valid JSON"),
    _cfg("not-json", "{not json, 'vocab_size': 1000", "not valid JSON"),
    _cfg("binary", GARBAGE, "NUL byte"),
    _cfg("utf8-bom", "\ufeff{}", "cfg.json"),
    _cfg("list", "[1, 2, 3]", "cfg.json"),
    _cfg("string", '"bert"', "cfg.json"),
    _cfg("null", "null", "cfg.json"),
    _cfg("nested", "[" * 50_000 + "]" * 50_000, "nested too deeply"),
    _cfg("no-vocab", {"vocab_size": DROP}, "vocab_size"),
    _cfg("no-hidden", {"hidden_size": DROP}, "word_embeddings"),  # default 768
    _cfg("no-layers", {"num_hidden_layers": DROP}, "layer_2"),  # default 12
    _cfg("hidden-string", {"hidden_size": "128"}, "hidden_size"),
    _cfg("hidden-fraction", {"hidden_size": 128.5}, "hidden_size"),
    _cfg("hidden-bool", {"hidden_size": True}, "hidden_size"),
    _cfg("hidden-negative", {"hidden_size": -128}, "hidden_size"),
    _cfg("hidden-null", {"hidden_size": None}, "hidden_size"),
    _cfg("vocab-nan", '{"vocab_size": NaN}', "vocab_size"),
    _cfg("vocab-infinity", {"vocab_size": float("inf")}, "vocab_size"),
    _cfg("vocab-1e300", {"vocab_size": 1e300}, "over the limit"),
    _cfg("layers-zero", {"num_hidden_layers": 0}, "num_hidden_layers"),
    _cfg("layers-negative", {"num_hidden_layers": -2}, "num_hidden_layers"),
    _cfg("layers-more", {"num_hidden_layers": 3}, "layer_2"),
    _cfg("layers-fewer", {"num_hidden_layers": 1}, "layer_1"),
    _cfg("hidden-256", {"hidden_size": 256, "num_attention_heads": 2},
         "does not match checkpoint"),
    _cfg("vocab-2000", {"vocab_size": 2000}, "does not match checkpoint"),
    _cfg("intermediate-256", {"intermediate_size": 256}, "does not match checkpoint"),
    _cfg("positions-64", {"max_position_embeddings": 64}, "does not match checkpoint"),
    _cfg("type-vocab-3", {"type_vocab_size": 3}, "does not match checkpoint"),
    _cfg("heads-not-dividing", {"num_attention_heads": 3}, "num_attention_heads"),
    _cfg("hidden-act-unknown", {"hidden_act": "swish"}, "hidden_act"),
    _cfg("hidden-act-markup", {"hidden_act": "[bold]x[/x]"}, "[bold]x[/x]"),
]


# ------------------------------------------------------------------- verify --against

AGAINST = [
    C("against-missing", "verify {fused} --against {w}/nope", 2, "no such file"),
    C("against-garbage-pb", "verify {fused} --against {g.pb}", 2, "not a TensorFlow GraphDef",
      [("file", "g.pb", GARBAGE)]),
    C("against-empty-dir", "verify {fused} --against {d}", 2, "neither a SavedModel",
      [("mkdir", "d")]),
    C("against-onnx", "verify {fused} --against {raw}", 2, "raw.onnx"),
    C("against-config-mismatch", "verify {fused} --against {ckpt} --config {c.json}", 2,
      "layer_2", [("cfg", "c.json", {"num_hidden_layers": 3})]),
    C("against-config-missing", "verify {fused} --against {ckpt} --config {w}/nope.json", 2,
      "nope.json"),
    C("against-format-frozen-on-ckpt", "verify {fused} --against {ckpt} --format frozen", 2,
      "is a directory"),
    C("against-ckpt-inputs", "verify {fused} --against {ckpt} --inputs input_ids=x", 2,
      "do not apply to a checkpoint"),
]


# ------------------------------------------------------------------------ refused outputs

OUTPUTS = [
    # convert
    C("out-convert-ckpt-config", "convert {ckpt} -o {ckpt}/bert_config.json", 2,
      "inside the source directory"),
    C("out-convert-ckpt-new-file", "convert {ckpt} -o {ckpt}/m.onnx", 2,
      "inside the source directory"),
    C("out-convert-dotdot", "convert {ckpt} -o {w}/x/../ckpt/checkpoint", 2,
      "inside the source directory", [("mkdir", "x")]),
    C("out-convert-symlink-to-index", "convert {ckpt} -o {l.onnx}", 2, "symbolic link",
      [("link", "l.onnx", "{ckpt}/" + INDEX)]),
    C("out-convert-hardlink-to-shard", "convert {ckpt} -o {h.onnx}", 2, "hard link",
      [("hard", "h.onnx", "{ckpt}/" + SHARD)]),
    C("out-convert-prefix-index", "convert {ckpt}/bert_model.ckpt -o {ckpt}/" + INDEX, 2,
      "is the input"),
    C("out-convert-config-option", "convert {ckpt} --config {c.json} -o {c.json}", 2,
      "is the input", [("cfg", "c.json", {})]),
    C("out-convert-dev-null", "convert {ckpt} -o /dev/null", 2, "not a regular file"),
    C("out-convert-link-dev-null", "convert {ckpt} -o {n.onnx}", 2, "symbolic link",
      [("link", "n.onnx", "/dev/null")]),
    C("out-convert-fifo", "convert {ckpt} -o {p.onnx}", 2, "not a regular file",
      [("fifo", "p.onnx")]),
    C("out-convert-dir", "convert {ckpt} -o {d.onnx}", 2, "is a directory", [("mkdir", "d.onnx")]),
    C("out-convert-missing-parent", "convert {ckpt} -o {w}/no/m.onnx", 2, "does not exist"),
    C("out-convert-parent-is-file", "convert {ckpt} -o {f}/m.onnx", 2, "not a directory",
      [("file", "f", "x")]),
    C("out-convert-empty-string", "convert {ckpt} -o ", 2, None),
    C("out-convert-sidecar-link", "convert {ckpt} -o {out}", 2, "out.onnx.data",
      [("link", "out.onnx.data", "/dev/null")]),
    C("out-convert-savedmodel-dir", "convert {sm} -o {sm}/m.onnx", 2,
      "inside the source directory", [("mkdir", "sm"), ("file", "sm/saved_model.pb", GARBAGE)]),
    C("out-convert-through-dir-alias", "convert {ckpt} -o {alias}/m.onnx", 2,
      "inside the source directory", [("link", "alias", "{ckpt}")]),
    C("out-convert-source-is-alias", "convert {alias} -o {ckpt}/m.onnx", 2,
      "inside the source directory", [("link", "alias", "{ckpt}")]),
    C("out-convert-index-as-source", "convert {ckpt}/" + INDEX + " -o {ckpt}/" + SHARD, 2,
      "is the input"),
    C("out-convert-long-name", "convert {ckpt} -o {w}/" + "n" * 300 + ".onnx", 2,
      "too long"),
    # optimize
    C("out-optimize-input", "optimize {raw} -o {raw}", 2, "is the input"),
    C("out-optimize-dotdot", "optimize {raw} -o {w}/x/../raw.onnx", 2, "is the input",
      [("mkdir", "x")]),
    C("out-optimize-symlink", "optimize {raw} -o {l.onnx}", 2, "symbolic link",
      [("link", "l.onnx", "{raw}")]),
    C("out-optimize-hardlink", "optimize {raw} -o {h.onnx}", 2, "is the input",
      [("hard", "h.onnx", "{raw}")]),
    C("out-optimize-dev-null", "optimize {raw} -o /dev/null", 2, "not a regular file"),
    C("out-optimize-fifo", "optimize {raw} -o {p.onnx}", 2, "not a regular file",
      [("fifo", "p.onnx")]),
    C("out-optimize-dir", "optimize {raw} -o {d}", 2, "is a directory", [("mkdir", "d")]),
    C("out-optimize-in-place-and-o", "optimize {raw} --in-place -o {out}", 2, "--in-place"),
    C("out-optimize-neither", "optimize {raw}", 2, "--in-place"),
    C("out-optimize-in-place-link-dev-null", "optimize {n.onnx} --in-place", 2,
      "not a regular file", [("link", "n.onnx", "/dev/null")]),
    C("out-optimize-in-place-dir", "optimize {d} --in-place", 2, "d", [("mkdir", "d")]),
    C("out-optimize-in-place-missing", "optimize {w}/nope.onnx --in-place", 2, "no such file"),
    C("out-optimize-in-place-fifo", "optimize {p.onnx} --in-place", 2, "not a regular file",
      [("fifo", "p.onnx")]),
    # strip-weights
    C("out-strip-input", "strip-weights {fused} -o {fused}", 2, "is the input"),
    C("out-strip-symlink-to-input", "strip-weights {fused} -o {l.onnx}", 2, "symbolic link",
      [("link", "l.onnx", "{fused}")]),
    C("out-strip-hardlink", "strip-weights {fused} -o {h.onnx}", 2, "is the input",
      [("hard", "h.onnx", "{fused}")]),
    C("out-strip-dev-null", "strip-weights {fused} -o /dev/null", 2, "not a regular file"),
    C("out-strip-fifo", "strip-weights {fused} -o {p.onnx}", 2, "not a regular file",
      [("fifo", "p.onnx")]),
    C("out-strip-dir", "strip-weights {fused} -o {d}", 2, "is a directory", [("mkdir", "d")]),
    C("out-strip-in-place-dir", "strip-weights {d} --in-place", 2, "d", [("mkdir", "d")]),
    C("out-fill-onto-input", "strip-weights {skel} --fill 1 -o {skel}", 2, "is the input"),
    # summarize
    C("out-summarize-input", "summarize {fused} -o {fused}", 2, "is the input"),
    C("out-summarize-hardlink", "summarize {fused} -o {h.json}", 2, "is the input",
      [("hard", "h.json", "{fused}")]),
    C("out-summarize-symlink", "summarize {fused} -o {l.json}", 2, "symbolic link",
      [("link", "l.json", "{summary}")]),
    C("out-summarize-dev-null", "summarize {fused} -o /dev/null", 2, "not a regular file"),
    C("out-summarize-fifo", "summarize {fused} -o {p.json}", 2, "not a regular file",
      [("fifo", "p.json")]),
    C("out-summarize-dir", "summarize {fused} -o {d}", 2, "is a directory", [("mkdir", "d")]),
    C("out-summarize-missing-parent", "summarize {fused} -o {w}/no/s.json", 2,
      "does not exist"),
    # draw
    C("out-draw-model", "draw {fused} -o {fused}", 2, "is the input"),
    C("out-draw-before", "draw {fused} --before {raw} -o {raw}", 2, "is the input"),
    C("out-draw-dev-null", "draw {fused} -o /dev/null", 2, "/dev/null"),
    C("out-draw-fifo", "draw {fused} -o {p.dot}", 2, "not a regular file", [("fifo", "p.dot")]),
    C("out-draw-dir", "draw {fused} -o {d.dot}", 2, "is a directory", [("mkdir", "d.dot")]),
    C("out-draw-symlink", "draw {fused} -o {l.svg}", 2, "symbolic link",
      [("link", "l.svg", "{fused}")]),
    C("out-draw-gif", "draw {fused} -o {w}/x.gif", 2, "unsupported picture format"),
    C("out-draw-no-extension", "draw {fused} -o {w}/layer", 2, "unsupported picture format"),
    C("out-draw-missing-parent", "draw {fused} -o {w}/no/x.dot", 2, "does not exist"),
    # example
    C("out-example-foreign-dir", "example --config tiny -o {d}", 2, "not replacing",
      [("mkdir", "d"), ("file", "d/notes.txt", "keep me")]),
    C("out-example-marked-dir-with-foreign-file", "example --config tiny -o {ckpt}", 2,
      "other files", [("file", "{ckpt}/notes.txt", "keep me")]),
    C("out-example-unmarked-ckpt", "example --config tiny -o {ckpt}", 2, "did not write",
      [("rm", "{ckpt}/.bertfuse-example")]),
    C("out-example-file", "example --config tiny -o {f}", 2, "not a directory",
      [("file", "f", "x")]),
    C("out-example-dev-null", "example --config tiny -o /dev/null", 2, "/dev/null"),
    C("out-example-symlink-to-dir", "example --config tiny -o {l}", 2, "symbolic link",
      [("mkdir", "d"), ("link", "l", "{d}")]),
    C("out-example-fifo", "example --config tiny -o {p}", 2, "not a directory", [("fifo", "p")]),
    C("out-example-root", "example --config tiny -o /", 2, "/"),
]


# ------------------------------------------------------------------ numeric option values

def _num(cmd: str, argv: str, option: str, values: list[str], needle: str | None = None
         ) -> list[Case]:
    return [C(f"num-{cmd}{option}={v or 'empty'}", argv.replace("V", f"{option} {v}"), 2,
              needle or option) for v in values]


NUMERIC = [
    *_num("convert", "convert {ckpt} V -o {out}", "--batch", ["0", "-1", "nan", "inf", "1e8",
                                                               "four", ""]),
    *_num("convert", "convert {ckpt} V -o {out}", "--seq", ["0", "1", "-5", "nan", "2.5"]),
    *_num("convert", "convert {ckpt} V -o {out}", "--seed", ["-1", "nan", "inf", "1.5", "x"]),
    *_num("convert", "convert {ckpt} V -o {out}", "--atol", ["-1", "nan", "inf", "-inf", "x",
                                                              "-0.0001"]),
    *_num("convert", "convert {ckpt} V -o {out}", "--rtol", ["-0.1", "nan", "inf"]),
    *_num("convert", "convert {ckpt} V -o {out}", "--opset", ["0", "-1", "19", "x", "1e8",
                                                               "nan"]),
    C("num-convert-size-cap", "convert {ckpt} --batch 100000000 --seq 512 -o {out}", 2,
      "at most"),
    *_num("verify", "verify {fused} --against {ckpt} V", "--atol", ["nan", "-1"]),
    *_num("verify", "verify {fused} --against {ckpt} V", "--rtol", ["nan"]),
    *_num("verify", "verify {fused} --against {ckpt} V", "--seed", ["-1"]),
    *_num("verify", "verify {fused} --against {ckpt} V", "--batch", ["0"]),
    *_num("diff", "diff {fused} {raw} --numeric V", "--atol", ["nan", "-1", "inf"]),
    *_num("diff", "diff {fused} {raw} --numeric V", "--batch", ["0"]),
    *_num("diff", "diff {fused} {raw} --numeric V", "--seq", ["1"]),
    *_num("diff", "diff {fused} {raw} --numeric V", "--seed", ["-1"]),
    C("num-diff--seq=past-positions", "diff {fused} {raw} --numeric --seq 129", 2, "seq 129"),
    *_num("draw", "draw {fused} V -o {w}/d.dot", "--layer", ["-1", "x", "1e8", "nan"]),
    C("num-draw--layer=past-last", "draw {fused} --layer 2 -o {w}/d.dot", 2, "no layer 2"),
    C("num-draw--layer=huge", "draw {fused} --layer 100000000 -o {w}/d.dot", 2, "no layer"),
    *_num("strip", "strip-weights {skel} V -o {out}", "--fill", ["-1", "nan", "x", "1e8"]),
    *_num("example", "example --config tiny V -o {w}/ex", "--seed", ["-1", "nan", "x"]),
    C("example-config-empty", "example --config  -o {w}/ex", 2, "unknown example config"),
    C("example-config-path", "example --config {ckpt}/bert_config.json -o {w}/ex", 2,
      "unknown example config"),
    C("example-hidden-act-markup", "example --config tiny --hidden-act [bold]x -o {w}/ex", 2,
      "[bold]x"),
]


# ------------------------------------------------------------- name mappings and formats

MAPPINGS = [
    *[C(f"map-inputs-{tag}", "convert {frozen} --inputs " + value + " -o {out}", 2, needle)
      for tag, value, needle in [
          ("empty", "", None), ("equals", "=", "--inputs"), ("no-name", "input_ids=", "--inputs"),
          ("no-role", "=input_ids", "--inputs"), ("no-equals", "input_ids", "ROLE=NAME"),
          ("unknown-role", "bogus=input_ids", "bogus"),
          ("duplicate-role", "input_ids=input_ids,input_ids=input_mask", "input_ids"),
          ("two-equals", "input_ids=a=b", "--inputs"),
          ("missing-tensor", "input_ids=[/bold]nosuch", "[/bold]nosuch")]],
    C("map-inputs-on-checkpoint", "convert {ckpt} --inputs input_ids=x -o {out}", 2,
      "do not apply to a checkpoint"),
    *[C(f"map-outputs-{tag}", "convert {frozen} --outputs " + value + " -o {out}", 2, needle)
      for tag, value, needle in [("empty", "", None), ("commas", ",,", "no node ''"),
                                 ("unknown", "nosuch_node", "nosuch_node"),
                                 ("one-unknown", "sequence_output,[x]", "[x]")]],
    C("map-outputs-on-checkpoint", "convert {ckpt} --outputs a -o {out}", 2,
      "do not apply to a checkpoint"),
    C("map-signature-on-garbage-savedmodel", "convert {sm} --signature nosuch -o {out}", 2,
      "SavedModel", [("mkdir", "sm"), ("file", "sm/saved_model.pb", GARBAGE)]),
    C("map-signature-unknown", "convert {savedmodel} --signature [bold]nosuch -o {out}", 2,
      "no signature '[bold]nosuch'"),
    C("map-signature-empty", "convert {savedmodel} --signature  -o {out}", 2, "signature"),
    C("map-inputs-savedmodel-unknown-name",
      "convert {savedmodel} --inputs input_ids=nosuch -o {out}", 2, "nosuch"),
    C("map-outputs-savedmodel-unknown", "convert {savedmodel} --outputs nosuch -o {out}", 2,
      "nosuch"),
    *[C(f"map-optimize-inputs-{tag}", "optimize {raw} --inputs " + value + " -o {out}", 2,
        needle) for tag, value, needle in [
          ("unknown-role", "bogus=input_ids", "bogus"), ("no-equals", "input_ids", "ROLE=NAME"),
          ("missing-name", "input_ids=[red]nosuch", "[red]nosuch"),
          ("duplicate-role", "input_ids=input_ids,input_ids=input_mask", "input_ids"),
          ("empty", "", "--inputs")]],
    C("map-precision-unknown", "optimize {raw} --precision fp4 -o {out}", 2, "--precision"),
    C("map-unknown-command", "frobnicate", 2, "frobnicate"),
    C("map-no-command", "", 2, None),
    C("map-unknown-option", "inspect {fused} --frob", 2, "--frob"),
]


# ------------------------------------------------ diff: mixes, policies, edited summaries

def _summary_edit(name: str, text: str, needle: str = "summ.json") -> Case:
    return C(f"diff-summary-{name}", "diff {summ.json} {fused}", 2, needle,
             [("file", "summ.json", text)])


DIFFS = [
    C("mix-model-vs-summary", "diff {fused} {summary}", 0),
    C("mix-summary-vs-model", "diff {summary} {fused}", 0),
    C("mix-summary-vs-summary", "diff {summary} {summary}", 0),
    C("mix-numeric-summary-a", "diff {summary} {fused} --numeric", 2, "needs two models"),
    C("mix-numeric-summary-b", "diff {fused} {summary} --numeric", 2, "needs two models"),
    C("mix-numeric-no-shared-output", "diff {fused} {toy} --numeric --fail-on none", 2,
      None),
    C("mix-numeric-skeleton", "diff {skel} {fused} --numeric", 2, "skel.onnx"),
    C("mix-numeric-nan-fails", "diff {fused} {nan} --numeric --fail-on none", 0),
    C("mix-numeric-nan-default", "diff {fused} {nan} --numeric", 1, "NaN"),
    C("mix-numeric-inf-default", "diff {fused} {inf} --numeric", 1, None),
    C("policy-unknown", "diff {fused} {raw} --fail-on bogus", 2, "bogus"),
    C("policy-empty", "diff {fused} {raw} --fail-on ", 2, "--fail-on"),
    C("policy-commas", "diff {fused} {raw} --fail-on ,,", 2, "--fail-on"),
    C("policy-fusion-loss", "diff {fused} {raw}", 1, None),
    _summary_edit("format-version", json.dumps({"format": "bertfuse-summary/999"})),
    _summary_edit("list", "[1, 2]"),
    _summary_edit("null", "null"),
    _summary_edit("nan-literal", '{"format": NaN}'),
    _summary_edit("binary", GARBAGE),
    _summary_edit("deep", "{" + '"a":{' * 30_000 + "}" * 30_001),
]


# ------------------------------------------------------------- tampered ONNX metadata

def _meta(name: str, argv: str, key: str | None, value: str | None, code: int,
          needle: str | None, src: str = "{fused}") -> Case:
    """key None: the library model as it is (already tampered: skel, nan, inf, toy)."""
    setup = [("meta", "m.onnx", src, key, value)] if key else []
    return C(f"meta-{name}", argv, code, needle, setup)


META = [
    _meta("orig-names-garbage-inspect", "inspect {m.onnx}", "original_names", "[[[[", 0, None),
    _meta("orig-names-garbage-verify", "verify {m.onnx} --against {ckpt}", "original_names",
          "[[[[", 0, None),
    _meta("orig-names-wrong-types-inspect", "inspect {m.onnx} --json", "original_names",
          json.dumps({"input_ids": 5, "x": [1]}), 0, None),
    _meta("bert-config-negative-diff", "diff {m.onnx} {fused} --numeric", "bert_config",
          json.dumps({"vocab_size": -5}), 0, None),
    _meta("bert-config-deep-diff", "diff {fused} {m.onnx} --numeric", "bert_config",
          "[" * 50_000 + "]" * 50_000, 0, None),
    _meta("bert-config-garbage-markdown", "inspect {m.onnx} --markdown", "bert_config",
          "[bold]{", 0, None),
    _meta("source-kind-markup", "inspect {m.onnx}", "source_kind", "[bold]x[/x]", 0, None),
    _meta("stripped-not-json-fill", "strip-weights {m.onnx} --fill 1 -o {out}",
          "bertfuse_stripped", "not json", 2, "metadata is damaged", src="{skel}"),
    _meta("stripped-bool-dim-fill", "strip-weights {m.onnx} --fill 1 -o {out}",
          "bertfuse_stripped", json.dumps([{"name": "embeddings_word", "shape": [True, 7],
                                            "dtype": "float32"}]), 2, "damaged", src="{skel}"),
    _meta("stripped-huge-shape-fill", "strip-weights {m.onnx} --fill 1 -o {out}",
          "bertfuse_stripped", json.dumps([{"name": "embeddings_word",
                                            "shape": [10 ** 12, 10 ** 12],
                                            "dtype": "float32"}]), 2, "damaged", src="{skel}"),
    C("meta-stripped-empty-record-fill", "strip-weights {m.onnx} --fill 1 -o {out}", 0, None,
      [("meta", "m.onnx", "{fused}", "bertfuse_stripped", "[]")], creates=("out.onnx",)),
    _meta("stripped-skeleton-verify", "verify {skel} --against {ckpt}", None, None, 2,
          "skel.onnx"),
    _meta("stripped-skeleton-optimize", "optimize {skel} -o {out}", None, None, 2, None),
    _meta("nan-weights-verify", "verify {nan} --against {ckpt}", None, None, 1, "NaN"),
    _meta("toy-model-verify", "verify {toy} --against {ckpt}", None, None, 2, "toy.onnx"),
]


# ------------------------------------------- structurally damaged graphs (weights, topology)

def _graph(name: str, argv: str, how: str, arg: Any = None, code: int = 2,
           needle: str | None = "m.onnx", xfail: str | None = None) -> Case:
    return C(f"graph-{name}", argv, code, needle, [("tamper", "m.onnx", "{fused}", how, arg)],
             xfail=xfail)


GRAPHS = [
    _graph("external-absolute-optimize", "optimize {m.onnx} -o {out}", "external",
           "/etc/hostname"),
    _graph("external-escape-verify", "verify {m.onnx} --against {ckpt}", "external",
           "../../../../etc/hostname"),
    _graph("external-escape-numeric", "diff {m.onnx} {fused} --numeric", "external",
           "../../etc/hostname"),
    _graph("external-missing-strip", "strip-weights {m.onnx} -o {out}", "external",
           "nope.bin"),
    _graph("dims-vs-bytes-optimize", "optimize {m.onnx} -o {out}", "dims", [2**62, 1024]),
    _graph("dims-small-optimize", "optimize {m.onnx} -o {out}", "dims", [7, 128]),
    _graph("dims-vs-bytes-numeric", "diff {fused} {m.onnx} --numeric", "dims", [7, 128]),
    _graph("cycle-optimize", "optimize {m.onnx} -o {out}", "cycle"),
    _graph("cycle-verify", "verify {m.onnx} --against {ckpt}", "cycle"),
    _graph("duplicate-output-optimize", "optimize {m.onnx} -o {out}", "dup_output"),
    _graph("duplicate-output-numeric", "diff {fused} {m.onnx} --numeric", "dup_output"),
]


# ---------------------------------------------------- odd but valid names: printed literally

NAMES = [
    C("name-markup-missing", "inspect {w}/[/x]nope[bold].onnx", 2, "[/x]nope[bold].onnx"),
    C("name-newline-missing", "inspect {w}/a\nb.onnx", 2, None),
    C("name-long-missing", "inspect {w}/" + "x" * 300 + ".onnx", 2, None),
    C("name-markup-inspect-ok", ["inspect", "{m [bold].onnx}"], 0, None,
      [("copy", "m [bold].onnx", "{fused}")]),
    C("name-unicode-strip-ok", ["strip-weights", "{fused}", "-o", "{w}/模型 é [bold]x[red].onnx"],
      0, None, creates=("模型 é [bold]x[red].onnx",)),
    C("name-space-summarize-ok", ["summarize", "{fused}", "-o", "{w}/my summary [red].json"], 0, None,
      creates=("my summary [red].json",)),
    C("name-markup-draw-ok", "draw {fused} --layer 1 -o {w}/[x]/l.dot", 0, None,
      [("mkdir", "[x]")], creates=("[x]/l.dot",)),
    C("name-markup-convert-missing", "convert {w}/[bold]src[/bold] -o {out}", 2,
      "[bold]src[/bold]"),
]


# ------------------------------------------------------------------------------ bench

BENCH = [
    C("bench-no-args", "bench", 2, "--skeletons"),
    C("bench-missing-skeletons", "bench --skeletons {w}/nope", 2, "skeleton"),
    C("bench-skeletons-is-file", "bench --skeletons {f}", 2, None, [("file", "f", "x")]),
    C("bench-iters-not-int", "bench --skeletons {w} --iters x", 2, "--iters"),
    C("bench-unknown-workload", "bench --skeletons {w} --workloads nosuch", 2, "nosuch"),
    C("bench-no-gpu", "bench --skeletons {s} --workloads --packed", 2, "CUDA",
      [("mkdir", "s")]),
]


ALL_CASES: list[Case] = [*_bad_file_cases(), *SOURCES, *CONFIGS, *AGAINST, *OUTPUTS, *NUMERIC,
                         *MAPPINGS, *DIFFS, *META, *GRAPHS, *NAMES, *BENCH]


# ------------------------------------------------------------------ runtime API (CPU EP)
# A request is run(**kwargs) on a Session(fused, max_batch=4, max_seq=16): (name, kwargs,
# substring of the RequestError).

IDS = (np.arange(16, dtype=np.int32).reshape(2, 8) * 37) % 1000
MASK = np.ones((2, 8), np.int32)
SEGS = np.zeros((2, 8), np.int32)


def req(**over: Any) -> dict[str, Any]:
    return {"input_ids": IDS, "input_mask": MASK, "segment_ids": SEGS, **over}


def _set(arr: np.ndarray, value: Any, dtype: Any = None) -> np.ndarray:
    out = arr.astype(dtype or arr.dtype)
    out[1, 3] = value
    return out


REQUESTS = [
    ("ids-float32", req(input_ids=IDS.astype(np.float32)), "integer"),
    ("ids-nan", req(input_ids=np.full((2, 8), np.nan)), "integer"),
    ("ids-bool", req(input_ids=IDS.astype(bool)), "integer"),
    ("ids-strings", req(input_ids=IDS.astype(str)), "integer"),
    ("ids-complex", req(input_ids=IDS.astype(np.complex64)), "integer"),
    ("ids-object-none", req(input_ids=[[1, None], [2, 3]], input_mask=None, segment_ids=None),
     "integer"),
    ("ids-ragged-list", req(input_ids=[[1, 2], [3]], input_mask=None, segment_ids=None),
     "input_ids"),
    ("ids-1d", req(input_ids=IDS[0], input_mask=None, segment_ids=None), "[batch, seq]"),
    ("ids-3d", req(input_ids=IDS[None], input_mask=None, segment_ids=None), "[batch, seq]"),
    ("ids-0d", req(input_ids=np.int32(5), input_mask=None, segment_ids=None), "[batch, seq]"),
    ("mask-shape", req(input_mask=MASK[:, :4]), "shape"),
    ("segments-shape", req(segment_ids=SEGS[:1]), "shape"),
    ("ids-negative", req(input_ids=_set(IDS, -1)), "input_ids values"),
    ("ids-vocab", req(input_ids=_set(IDS, 1000)), "input_ids values"),
    ("ids-int64-wraps-to-0", req(input_ids=_set(IDS, 2**32, np.int64)), "input_ids values"),
    ("ids-uint64-huge", req(input_ids=_set(IDS, 2**63, np.uint64)), "input_ids values"),
    ("ids-int8-negative", req(input_ids=_set(IDS % 100, -1, np.int8)), "input_ids values"),
    ("mask-two", req(input_mask=_set(MASK, 2)), "input_mask values"),
    ("mask-negative", req(input_mask=_set(MASK, -1)), "input_mask values"),
    ("segments-two", req(segment_ids=_set(SEGS, 2)), "segment_ids values"),
    ("segments-int32-max", req(segment_ids=_set(SEGS, 2**31 - 1)), "segment_ids values"),
    ("batch-over-max", req(input_ids=np.ones((5, 8), np.int32), input_mask=None,
                           segment_ids=None), "batch 5"),
    ("seq-over-max", req(input_ids=np.ones((2, 17), np.int32), input_mask=None,
                         segment_ids=None), "sequence length 17"),
    ("batch-zero", req(input_ids=np.ones((0, 8), np.int32), input_mask=None, segment_ids=None),
     "batch 0"),
    ("seq-zero", req(input_ids=np.ones((2, 0), np.int32), input_mask=None, segment_ids=None),
     "sequence length 0"),
    ("ids-missing", req(input_ids=None), "input_ids is required"),
    ("outputs-unknown", req(outputs=["nosuch"]), "no output 'nosuch'"),
    ("outputs-empty", req(outputs=[]), "outputs is empty"),
    ("outputs-markup", req(outputs="[bold]"), "no output '[bold]'"),
]

# Session(MODEL, **kwargs): (name, model file kind or None for the fused model, kwargs, needle)
CONSTRUCTORS = [
    ("model-garbage", "garbage", {}, "garbage.onnx"),
    ("model-empty", "empty", {}, "empty.onnx"),
    ("model-text", "text", {}, "text.onnx"),
    ("model-directory", "directory", {}, "dir.onnx"),
    ("model-summary-json", "summary_json", {}, "summary.json"),
    ("model-skeleton", "skel", {}, "skel.onnx"),
    ("model-none", "none", {}, "model must be a path"),
    ("model-bytes", "bytes", {}, "model must be a path"),
    ("max-batch-inf", None, {"max_batch": float("inf")}, "max_batch must be an integer"),
    ("max-seq-float", None, {"max_seq": 16.0}, "max_seq must be an integer"),
    ("max-batch-huge-seq", None, {"max_seq": 10**9}, "max_seq must be 1..128"),
    ("batch-buckets-string", None, {"batch_buckets": "124"}, "batch_buckets must be"),
    ("seq-buckets-mixed", None, {"seq_buckets": [16, "32"]}, "seq_buckets must be an integer"),
    ("seq-buckets-none", None, {"seq_buckets": None}, "seq_buckets must be"),
    ("device-none", None, {"device": None}, "device must be"),
    ("device-upper", None, {"device": "CPU"}, "device must be"),
    ("right-padded-none", None, {"right_padded": None}, "right_padded must be"),
    ("pack-fill-string", None, {"pack_below_fill": "0.5"}, "pack_below_fill"),
    ("pack-fill-inf", None, {"pack_below_fill": float("inf")}, "pack_below_fill"),
    ("token-steps-float", None, {"token_steps": 1.5}, "token_steps must be an integer"),
    ("provider-options-string", None, {"provider_options": "x"}, "provider_options"),
    ("pinned-string", None, {"pinned": "yes"}, "pinned must be True or False"),
    ("mask-variants-none", None, {"mask_variants": None}, "mask_variants must be"),
]

WARMUPS = [
    ("negative-batch", [(-1, 4)], "warmup batch"),
    ("none-batch", [(None, 4)], "warmup batch must be an integer"),
    ("string-pair", [("2", "4")], "warmup batch must be an integer"),
    ("set", {(1, 2)}, "must be a list"),
    ("second-past-max-seq", [(1, 2), (1, 99)], "warmup seq"),
]

POOL_REPLICAS = [0, -1, 1.5, "2", True, None]
