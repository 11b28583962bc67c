"""Triton's model configuration (ModelConfig, model_config.proto) of a model: the one builder
behind `bertfuse export-triton`'s config.pbtxt and `bertfuse serve`'s GET
/v2/models/NAME/config. protobuf writes both from the same message: text_format the
config.pbtxt (its string escaping: a tensor name cannot write config of its own),
json_format the JSON, int64 fields as numbers as Triton's own /config answer gives them.

    model.onnx ─► describe: inputs (initializers excluded) and outputs, Triton's data types,
                  dims less the batch dimension (-1 where the size varies)
               ─► model_config(...) ─► ModelConfig ─┬─► config_pbtxt (+ comment lines)
                                                    └─► config_json

The schema is the part of Triton's ModelConfig these configs use, declared here with
protobuf's descriptors in a pool of its own; tests/unit/export holds every field of it to
the ModelConfig that tritonclient ships (names, numbers, types, enum values) and parses each
config.pbtxt with that. Not tritonclient's model_config_pb2 itself: tritonclient is a test
dependency, not bertfuse's; its module imports only through `tritonclient.grpc`, whose
__init__ raises without grpcio ("The installation does not include grpc support"), and 2.73's
gencode refuses a protobuf runtime older than 6.33.5 (runtime_version's check), which an
environment with bertfuse[tf] on an older TensorFlow can have. onnx brings protobuf itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import onnx
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory, \
    text_format

from bertfuse.errors import BertfuseError

PLATFORM = "onnxruntime_onnx"
# ONNX element type -> Triton data type (the ones a BERT model's I/O can have).
TYPES = {onnx.TensorProto.INT32: "TYPE_INT32", onnx.TensorProto.INT64: "TYPE_INT64",
         onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.FLOAT16: "TYPE_FP16",
         onnx.TensorProto.BFLOAT16: "TYPE_BF16", onnx.TensorProto.BOOL: "TYPE_BOOL"}
INT32_MAX = 2**31 - 1  # max_batch_size, count, intra_op_thread_count: int32 in ModelConfig

_F = descriptor_pb2.FieldDescriptorProto
# message: [(field, number, type, repeated, message or enum type)], as model_config.proto has them
SCHEMA: dict[str, list[tuple[str, int, int, bool, str]]] = {
    "ModelTensorReshape": [("shape", 1, _F.TYPE_INT64, True, "")],
    "ModelInput": [("name", 1, _F.TYPE_STRING, False, ""),
                   ("data_type", 2, _F.TYPE_ENUM, False, "DataType"),
                   ("dims", 4, _F.TYPE_INT64, True, ""),
                   ("reshape", 5, _F.TYPE_MESSAGE, False, "ModelTensorReshape")],
    "ModelOutput": [("name", 1, _F.TYPE_STRING, False, ""),
                    ("data_type", 2, _F.TYPE_ENUM, False, "DataType"),
                    ("dims", 3, _F.TYPE_INT64, True, ""),
                    ("reshape", 5, _F.TYPE_MESSAGE, False, "ModelTensorReshape")],
    "ModelInstanceGroup": [("name", 1, _F.TYPE_STRING, False, ""),
                           ("count", 2, _F.TYPE_INT32, False, ""),
                           ("kind", 4, _F.TYPE_ENUM, False, "ModelInstanceGroup.Kind")],
    "ModelDynamicBatching": [("max_queue_delay_microseconds", 2, _F.TYPE_UINT64, False, "")],
    "ModelOperations": [("op_library_filename", 1, _F.TYPE_STRING, True, "")],
    "ModelParameter": [("string_value", 1, _F.TYPE_STRING, False, "")],
    "ModelConfig": [("name", 1, _F.TYPE_STRING, False, ""),
                    ("platform", 2, _F.TYPE_STRING, False, ""),
                    ("max_batch_size", 4, _F.TYPE_INT32, False, ""),
                    ("input", 5, _F.TYPE_MESSAGE, True, "ModelInput"),
                    ("output", 6, _F.TYPE_MESSAGE, True, "ModelOutput"),
                    ("instance_group", 7, _F.TYPE_MESSAGE, True, "ModelInstanceGroup"),
                    ("dynamic_batching", 11, _F.TYPE_MESSAGE, False, "ModelDynamicBatching"),
                    ("parameters", 14, _F.TYPE_MESSAGE, True, "ModelConfig.ParametersEntry"),
                    ("model_operations", 18, _F.TYPE_MESSAGE, False, "ModelOperations")],
}
ENUMS = {"DataType": ["TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32",
                      "TYPE_UINT64", "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64",
                      "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING", "TYPE_BF16"],
         "ModelInstanceGroup.Kind": ["KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"]}


def _message_classes() -> dict[str, Any]:
    """The schema's message classes, from a FileDescriptorProto in a pool of bertfuse's own
    (tritonclient's model_config.proto may be in the default pool under the same names)."""
    proto = descriptor_pb2.FileDescriptorProto(name="bertfuse_model_config.proto",
                                               package="inference", syntax="proto3")
    enum = proto.enum_type.add(name="DataType")
    enum.value.extend(descriptor_pb2.EnumValueDescriptorProto(name=n, number=i)
                      for i, n in enumerate(ENUMS["DataType"]))
    for name, fields in SCHEMA.items():
        msg = proto.message_type.add(name=name)
        for field, number, kind, repeated, type_name in fields:
            msg.field.add(name=field, number=number, type=kind, json_name=field,
                          label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
                          type_name=f".inference.{type_name}" if type_name else None)
        if name == "ModelInstanceGroup":
            kind_enum = msg.enum_type.add(name="Kind")
            kind_enum.value.extend(descriptor_pb2.EnumValueDescriptorProto(name=n, number=i)
                                   for i, n in enumerate(ENUMS["ModelInstanceGroup.Kind"]))
        if name == "ModelConfig":  # map<string, ModelParameter> parameters
            entry = msg.nested_type.add(name="ParametersEntry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL,
                            json_name="key")
            entry.field.add(name="value", number=2, type=_F.TYPE_MESSAGE, json_name="value",
                            label=_F.LABEL_OPTIONAL, type_name=".inference.ModelParameter")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"inference.{name}"))
            for name in SCHEMA}


MESSAGES = _message_classes()


@dataclass
class Tensor:
    name: str
    data_type: str
    dims: list[int]  # without the batch dimension; -1 where the size varies
    scalar: bool = False  # [batch] in the model: dims [1], reshaped to [] for the backend


def _tensors(values, what: str) -> list[Tensor]:
    out = []
    for v in values:
        t = v.type.tensor_type
        if not v.type.HasField("tensor_type") or t.elem_type not in TYPES:
            kind = onnx.TensorProto.DataType.Name(t.elem_type) if t.elem_type else "no tensor"
            raise BertfuseError(f"{what} {v.name!r}: type {kind} has no Triton equivalent here")
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        if not t.HasField("shape") or not dims or dims[0] > 0:
            raise BertfuseError(f"{what} {v.name!r}: no variable batch dimension first "
                                f"(shape {dims}); Triton's batching needs one")
        out.append(Tensor(v.name, TYPES[t.elem_type], dims[1:] or [1], scalar=len(dims) == 1))
    return out


def describe(model: onnx.ModelProto) -> tuple[list[Tensor], list[Tensor]]:
    """The model's inputs (initializers excluded) and outputs, as Triton sees them."""
    inits = {i.name for i in model.graph.initializer}
    return (_tensors([i for i in model.graph.input if i.name not in inits], "input"),
            _tensors(model.graph.output, "output"))


def precision_of(model: onnx.ModelProto) -> str:
    """fp16 when the weights are half precision (bertfuse --precision fp16), else fp32."""
    half = any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer)
    return "fp16" if half else "fp32"


def model_config(model: onnx.ModelProto, name: str, max_batch: int = 32, instances: int = 1,
                 kind: str = "gpu", delay_us: int = 100, threads: int | None = None,
                 op_library: str | None = None, outputs: Sequence[str] | None = None) -> Any:
    """Triton's ModelConfig of `model`: platform onnxruntime_onnx, Triton's batching
    (max_batch_size; each tensor's dims less the batch), one instance group, dynamic
    batching. op_library: the op library's path as Triton will see it (model_operations);
    threads: ORT's intra-op threads per instance; outputs: those served (default all)."""
    inputs, outs = describe(model)
    if outputs is not None:
        outs = [t for t in outs if t.name in set(outputs)]
    cfg = MESSAGES["ModelConfig"](name=name, platform=PLATFORM, max_batch_size=max_batch)
    for field, tensors in ((cfg.input, inputs), (cfg.output, outs)):
        for t in tensors:
            one = field.add(name=t.name, data_type=t.data_type, dims=t.dims)
            if t.scalar:  # [batch] in the model: [1] for Triton, reshaped to [] for the backend
                one.reshape.SetInParent()
    cfg.instance_group.add(kind="KIND_GPU" if kind == "gpu" else "KIND_CPU", count=instances)
    cfg.dynamic_batching.SetInParent()
    cfg.dynamic_batching.max_queue_delay_microseconds = delay_us
    if op_library is not None:  # the onnxruntime backend registers it on each session
        cfg.model_operations.op_library_filename.append(op_library)
    if threads is not None:  # ORT's threads per instance: instances x threads <= cores
        cfg.parameters["intra_op_thread_count"].string_value = str(threads)
    return cfg


def config_pbtxt(cfg: Any, comments: Sequence[str] = ()) -> str:
    """config.pbtxt: `comments` as # lines, then the message in protobuf's text format."""
    head = "".join(f"# {line}\n" for line in comments)
    return head + text_format.MessageToString(cfg, as_utf8=True)


def config_json(cfg: Any) -> dict:
    """The message as Triton's GET /v2/models/NAME/config gives it: field names as in the
    .proto, int64 values as JSON numbers (protobuf's JSON mapping writes them as strings)."""
    return _numbers(json_format.MessageToDict(cfg, preserving_proto_field_name=True),
                    cfg.DESCRIPTOR)


def _numbers(data: dict, desc: Any) -> dict:
    out = {}
    for key, value in data.items():
        field = desc.fields_by_name[key]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            sub = field.message_type.fields_by_name["value"].message_type
            out[key] = {k: _numbers(v, sub) for k, v in value.items()}
        elif field.message_type is not None:
            out[key] = [_numbers(v, field.message_type) for v in value] \
                if isinstance(value, list) else _numbers(value, field.message_type)
        elif field.type in (_F.TYPE_INT64, _F.TYPE_UINT64):
            out[key] = [int(v) for v in value] if isinstance(value, list) else int(value)
        else:
            out[key] = value
    return out
