"""`bertfuse export-triton`: every config.pbtxt it writes parses as Triton's ModelConfig
(the protobuf schema the tritonclient package ships) and matches the ONNX model's I/O; the
repository is written whole or not at all, and never over an input."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import text_format

from bertfuse.cli import main

_ONNX_TO_TRITON = {onnx.TensorProto.INT32: "TYPE_INT32", onnx.TensorProto.FLOAT: "TYPE_FP32",
                   onnx.TensorProto.FLOAT16: "TYPE_FP16", onnx.TensorProto.INT64: "TYPE_INT64"}


def _model_config_pb2():
    """tritonclient/grpc/model_config_pb2.py, loaded from its file: the package's __init__
    would import grpcio, which the schema does not need."""
    spec = importlib.util.find_spec("tritonclient")
    assert spec is not None and spec.origin, "tritonclient is not installed (the test extra)"
    path = Path(spec.origin).parent / "grpc" / "model_config_pb2.py"
    mod_spec = importlib.util.spec_from_file_location("triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


PB2 = _model_config_pb2()


def parse(path: Path):
    """config.pbtxt -> ModelConfig; an unknown field or enum value raises ParseError."""
    return text_format.Parse(path.read_text(), PB2.ModelConfig())


def _one_error_line(capsys, argv: list[str]) -> str:
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err)
    return lines[0]


def _check_against_model(cfg, model_path: Path) -> None:
    """Every input and output of the ONNX model, in order, with its type and its dims less
    the batch dimension (a named dimension is -1)."""
    model = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    for got, values in ((cfg.input, [i for i in model.graph.input if i.name not in inits]),
                        (cfg.output, list(model.graph.output))):
        assert [t.name for t in got] == [v.name for v in values]
        for t, v in zip(got, values):
            tt = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            assert dims[0] == -1  # the batch: Triton's, through max_batch_size
            assert list(t.dims) == dims[1:]
            assert PB2.DataType.Name(t.data_type) == _ONNX_TO_TRITON[tt.elem_type]


def test_schema_check_can_fail():
    good = 'name: "m" platform: "onnxruntime_onnx" max_batch_size: 8'
    assert text_format.Parse(good, PB2.ModelConfig()).max_batch_size == 8
    for bad in (good.replace("max_batch_size", "max_batch_sise"),
                good + ' input [ { name: "x" data_type: TYPE_INT33 dims: [ -1 ] } ]',
                good + " dynamic_batching { max_queue_delay_us: 100 }",
                good + " instance_group [ { kind: KIND_TPU count: 1 } ]"):
        with pytest.raises(text_format.ParseError):
            text_format.Parse(bad, PB2.ModelConfig())


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_export_matches_the_model(tiny_onnx, tmp_path, capsys, precision):
    import onnxruntime as ort

    src = Path(tiny_onnx[precision])
    repo = tmp_path / "repo"
    assert main(["export-triton", str(src), "-o", str(repo), "--name", "bert", "--max-batch",
                 "16", "--instances", "2", "--dynamic-batching-delay-us", "250"]) == 0
    capsys.readouterr()
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == \
        ["bert", "bert/1", "bert/1/model.onnx", "bert/config.pbtxt"]
    cfg = parse(repo / "bert" / "config.pbtxt")
    assert (cfg.name, cfg.platform, cfg.max_batch_size) == ("bert", "onnxruntime_onnx", 16)
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 250
    assert [(g.kind, g.count) for g in cfg.instance_group] == \
        [(PB2.ModelInstanceGroup.KIND_GPU, 2)]
    _check_against_model(cfg, src)
    assert [PB2.DataType.Name(t.data_type) for t in cfg.input] == ["TYPE_INT32"] * 3
    # bertfuse's fp16 models take int32 ids and give fp32 outputs; the comment says fp16
    assert {PB2.DataType.Name(t.data_type) for t in cfg.output} == {"TYPE_FP32"}
    assert f"# Model precision: {precision} " in (repo / "bert" / "config.pbtxt").read_text()
    copy = repo / "bert" / "1" / "model.onnx"
    assert copy.read_bytes() == src.read_bytes()
    if precision == "fp32":  # the copy runs on ORT CPU (the fp16 kernels are CUDA's)
        ids = np.ones((2, 8), np.int32)
        out = ort.InferenceSession(str(copy), providers=["CPUExecutionProvider"]).run(
            None, {"input_ids": ids, "input_mask": ids, "segment_ids": 0 * ids})
        assert out[0].shape == (2, 8, 128)


def test_cpu_kind_and_threads(tiny_onnx, tmp_path, capsys):
    import json

    rc = main(["export-triton", tiny_onnx["fp32"], "-o", str(tmp_path / "r"), "--kind", "cpu",
               "--instances", "3", "--intra-op-threads", "1", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["precision"] == "fp32" and report["name"] == Path(
        tiny_onnx["fp32"]).stem
    cfg = parse(Path(report["config"]))
    assert [(g.kind, g.count) for g in cfg.instance_group] == \
        [(PB2.ModelInstanceGroup.KIND_CPU, 3)]
    assert cfg.parameters["intra_op_thread_count"].string_value == "1"
    assert cfg.max_batch_size == 32 and cfg.dynamic_batching.max_queue_delay_microseconds == 100
    assert [t["name"] for t in report["inputs"]] == ["input_ids", "input_mask", "segment_ids"]


def test_external_data_is_copied(tiny_onnx, tmp_path, capsys):
    import onnxruntime as ort

    src_dir = tmp_path / "src"
    src_dir.mkdir()
    src = src_dir / "ext.onnx"
    onnx.save_model(onnx.load(tiny_onnx["fp32"]), str(src), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="ext.weights", size_threshold=0)
    assert main(["export-triton", str(src), "-o", str(tmp_path / "repo")]) == 0
    capsys.readouterr()
    version = tmp_path / "repo" / "ext" / "1"
    assert (version / "ext.weights").read_bytes() == (src_dir / "ext.weights").read_bytes()
    _check_against_model(parse(tmp_path / "repo" / "ext" / "config.pbtxt"), src)
    ids = np.arange(12, dtype=np.int32).reshape(2, 6)
    feeds = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": 0 * ids}
    run = lambda p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(  # noqa: E731
        None, feeds)
    for a, b in zip(run(version / "model.onnx"), run(src)):
        assert np.array_equal(a, b)


def test_a_batch_vector_output_is_reshaped(tmp_path, capsys):
    """A [batch] output (a score per row) is dims [1] reshaped to [], as Triton wants."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceMax", ["x"], ["score"], keepdims=0, axes=[1])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch"])])
    path = tmp_path / "score.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["export-triton", str(path), "-o", str(tmp_path / "repo")]) == 0
    capsys.readouterr()
    cfg = parse(tmp_path / "repo" / "score" / "config.pbtxt")
    assert list(cfg.output[0].dims) == [1] and cfg.output[0].HasField("reshape")
    assert list(cfg.output[0].reshape.shape) == [] and list(cfg.input[0].dims) == [-1]
    # a fixed batch dimension cannot be batched by Triton: refused
    model = onnx.load(path)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 4
    onnx.save(model, tmp_path / "fixed.onnx")
    assert "no variable batch dimension" in _one_error_line(
        capsys, ["export-triton", tmp_path / "fixed.onnx", "-o", tmp_path / "repo"])


def test_output_safety(tiny_onnx, tmp_path, capsys):
    src = tmp_path / "m.onnx"
    src.write_bytes(Path(tiny_onnx["fp32"]).read_bytes())
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "mine.txt").write_text("keep")
    assert "exists and is not empty; pass --force" in _one_error_line(
        capsys, ["export-triton", src, "-o", repo])
    assert (repo / "m" / "mine.txt").read_text() == "keep"
    assert main(["export-triton", str(src), "-o", str(repo), "--force"]) == 0
    capsys.readouterr()
    assert sorted(os.listdir(repo / "m")) == ["1", "config.pbtxt"]
    assert os.listdir(repo) == ["m"]  # no temporary left beside it
    # the model inside the entry it would replace: refused even with --force, model kept
    inner = repo / "m" / "1" / "model.onnx"
    before = inner.read_bytes()
    assert "holds the input" in _one_error_line(
        capsys, ["export-triton", inner, "-o", repo, "--name", "m", "--force"])
    assert inner.read_bytes() == before and os.listdir(repo) == ["m"]
    # the repository may not be an input file
    assert "is not a directory" in _one_error_line(capsys, ["export-triton", src, "-o", src])
    assert src.read_bytes() == Path(tiny_onnx["fp32"]).read_bytes()
    for name in ("../x", ".hidden", "a/b", ""):
        assert "--name" in _one_error_line(
            capsys, ["export-triton", src, "-o", repo, "--name", name, "--force"])
    assert "no CUDA-graph option" in _one_error_line(
        capsys, ["export-triton", src, "-o", tmp_path / "other", "--cuda-graphs"])
    assert not (tmp_path / "other").exists()
    assert "--max-batch: must be at least 1" in _one_error_line(
        capsys, ["export-triton", src, "-o", tmp_path / "other", "--max-batch", "0"])


def _identity_model(path: Path, outputs: list[str], domain: str = "", inputs=("x",)) -> Path:
    """x [batch, 4] float -> one Identity (or an op of `domain`) per output name."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Identity" if not domain else "Dense", [inputs[0]], [o],
                              domain=domain) for o in outputs] or \
        [helper.make_node("Identity", [inputs[0]], ["unused"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, ["batch", 4])
                     for i in inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["batch", 4]) for o in outputs])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    return path


def test_tensor_names_cannot_write_config(tmp_path, capsys):
    """#25 item 9: a quote, a newline or a backslash in a tensor name is escaped; Triton's
    parser reads back exactly the model's names and nothing else (no backend, one output
    each)."""
    evil = ['p" data_type: TYPE_FP32 dims: [ 4 ] } ] backend: "python" output [ { name: "q',
            "a\nb", "back\\slash", "caf\u00e9"]
    src = _identity_model(tmp_path / "evil.onnx", evil)
    assert main(["export-triton", str(src), "-o", str(tmp_path / "repo")]) == 0
    capsys.readouterr()
    cfg = parse(tmp_path / "repo" / "evil" / "config.pbtxt")
    assert [t.name for t in cfg.output] == evil and [t.name for t in cfg.input] == ["x"]
    assert cfg.backend == "" and cfg.platform == "onnxruntime_onnx"
    _check_against_model(cfg, src)


def test_refused_combinations_exit_2(tiny_onnx, tmp_path, capsys):
    """What Triton could not load or batch: one line, exit 2, nothing written."""
    repo = tmp_path / "repo"
    from onnx import TensorProto, helper

    const = helper.make_graph([helper.make_node("Constant", [], ["y"], value=helper.make_tensor(
        "v", TensorProto.FLOAT, [1], [1.0]))], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(const), tmp_path / "no_inputs.onnx")
    cases = [
        (["--max-batch", str(10 ** 12)], tiny_onnx["fp32"], "--max-batch must be an integer in"),
        (["--instances", str(2 ** 31)], tiny_onnx["fp32"], "2147483647"),
        ([], tmp_path / "no_inputs.onnx", "has no inputs"),
        ([], _identity_model(tmp_path / "no_outputs.onnx", []), "has no outputs"),
        (["--kind", "cpu"], _identity_model(tmp_path / "packed.onnx", ["y"],
                                            inputs=("token_index",)), "CUDA only"),
        ([], tmp_path / "packed.onnx", "export the padded model"),
        (["--kind", "cpu"], _identity_model(tmp_path / "ops.onnx", ["y"], "ai.bertfuse"),
         "not --kind cpu"),
        (["--triton-repo-path", "models"], tmp_path / "ops.onnx", "must be absolute"),
    ]
    for extra, model, words in cases:
        line = _one_error_line(capsys, ["export-triton", model, "-o", repo, *extra])
        assert words in line, (extra, model, line)
    assert not repo.exists()


def test_bertfuse_ops_bring_their_library(tmp_path, capsys, monkeypatch):
    """A model with ai.bertfuse ops: the built op library is copied beside config.pbtxt and
    named in model_operations (at REPO's path, or where --triton-repo-path says Triton sees
    it); without a built library, exit 2 and the build command."""
    import bertfuse.kernels.library as library

    src = _identity_model(tmp_path / "ops.onnx", ["y"], "ai.bertfuse")
    monkeypatch.setenv(library.KERNELS_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(library, "detect_sm", lambda: 90)
    repo = tmp_path / "repo"
    line = _one_error_line(capsys, ["export-triton", src, "-o", repo])
    assert "`bertfuse kernels build` first" in line and not repo.exists()
    built = library.library_path(1, 90)
    built.parent.mkdir(parents=True)
    built.write_bytes(b"\x7fELF not really")
    assert main(["export-triton", str(src), "-o", str(repo), "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    copy = repo / "ops" / library.LIB_NAME
    assert report["op_library"] == str(copy) and copy.read_bytes() == built.read_bytes()
    cfg = parse(repo / "ops" / "config.pbtxt")
    assert list(cfg.model_operations.op_library_filename) == [str(copy.absolute())]
    _check_against_model(cfg, src)
    other = tmp_path / "my ops\".so"  # any path, escaped in the config
    other.write_bytes(b"mine")
    assert main(["export-triton", str(src), "-o", str(repo), "--force", "--op-library",
                 str(other), "--triton-repo-path", "/models"]) == 0
    capsys.readouterr()
    cfg = parse(repo / "ops" / "config.pbtxt")
    assert list(cfg.model_operations.op_library_filename) == [f"/models/ops/{library.LIB_NAME}"]
    assert copy.read_bytes() == b"mine"
    assert "--op-library" in _one_error_line(capsys, ["export-triton", src, "-o", repo,
                                                      "--force", "--op-library", tmp_path / "x"])


def test_the_builders_schema_is_tritons_model_config():
    """io/triton_config.py declares the part of ModelConfig it writes: every message, field
    (number, type, repeated, message or enum type) and enum value as tritonclient's schema."""
    from bertfuse.io.triton_config import ENUMS, MESSAGES, SCHEMA

    for name, fields in SCHEMA.items():
        theirs = getattr(PB2, name).DESCRIPTOR
        ours = MESSAGES[name].DESCRIPTOR
        for field, number, kind, repeated, type_name in fields:
            t, o = theirs.fields_by_name[field], ours.fields_by_name[field]
            assert (t.number, t.type, t.is_repeated) == (o.number, o.type, o.is_repeated) == \
                (number, kind, repeated), (name, field)
            sub = t.message_type or t.enum_type
            assert (sub.full_name if sub else "") == \
                (f"inference.{type_name}" if type_name else ""), (name, field)
    assert [v.name for v in PB2.DataType.DESCRIPTOR.values] == ENUMS["DataType"]
    assert [v.name for v in PB2.ModelInstanceGroup.Kind.DESCRIPTOR.values] == \
        ENUMS["ModelInstanceGroup.Kind"]
    assert [v.number for v in PB2.DataType.DESCRIPTOR.values] == list(range(15))


def test_pbtxt_and_json_are_one_message(tmp_path, capsys):
    """config.pbtxt (protobuf's text format) and the JSON serve answers GET
    /v2/models/NAME/config with are the same ModelConfig: the evil names included."""
    from google.protobuf import json_format

    from bertfuse.io.triton_config import config_json, model_config

    evil = ['p" data_type: TYPE_FP32 } ] backend: "python" output [ { name: "q', "a\nb"]
    src = _identity_model(tmp_path / "evil.onnx", evil)
    assert main(["export-triton", str(src), "-o", str(tmp_path / "repo"), "--kind", "cpu",
                 "--intra-op-threads", "2", "--max-batch", "7"]) == 0
    capsys.readouterr()
    written = parse(tmp_path / "repo" / "evil" / "config.pbtxt")
    built = config_json(model_config(onnx.load(str(src)), "evil", 7, kind="cpu", threads=2))
    assert json_format.ParseDict(built, PB2.ModelConfig()) == written
    assert built["output"][0]["name"] == evil[0] and built["output"][0]["dims"] == [4]
    assert built["parameters"] == {"intra_op_thread_count": {"string_value": "2"}}
