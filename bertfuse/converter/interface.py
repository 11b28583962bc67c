"""Match an ONNX model's inputs/outputs to a TFSource's canonical interface, for `verify`.

Models written by `bertfuse convert` already use the canonical names (input_ids / input_mask /
segment_ids, int32; sequence_output / pooled_output / ...). A model that a user exported with
tf2onnx and then ran through `bertfuse optimize` keeps the TF names (`input_word_ids`,
`input_ids:0`, `bert/pooler/...:0`) and dtypes. Verification feeds and reads canonical names,
so such a model is verified through a renamed copy.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from bertfuse.converter.roles import assign_roles
from bertfuse.converter.source import ROLES, TFSource
from bertfuse.errors import BertfuseError
from bertfuse.converter.export import rename_values


def _base(name: str) -> str:
    return name[:-2] if name.endswith(":0") else name


def match_interface(model: onnx.ModelProto, source: TFSource, model_path: str, src_path: str,
                    role_override: dict[str, str] | None = None) -> onnx.ModelProto:
    """Returns the model, or a copy with canonical I/O names and int32 inputs."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    names = [i.name for i in inputs]
    if all(n in ROLES for n in names):
        roles = {n: n for n in names}
    else:
        roles = assign_roles(names, role_override)
    by_name = {n: r for r, n in roles.items()}
    missing = [by_name[n] for n in names if by_name[n] not in source.inputs]
    if missing:
        raise BertfuseError(f"{model_path}: takes {', '.join(missing)}, which {src_path} has no "
                            f"input for (its inputs: {', '.join(source.inputs)})")

    known = {o: o for o in source.outputs}
    for canon, shown in source.original_names.items():
        if canon in source.outputs:
            known.setdefault(shown, canon)
            known.setdefault(_base(shown), canon)
    for canon, tensor in source.outputs.items():
        known.setdefault(tensor, canon)
        known.setdefault(_base(tensor), canon)
    out_renames = {}
    for out in graph.output:
        canon = known.get(out.name) or known.get(_base(out.name))
        if canon and canon != out.name:
            out_renames[out.name] = canon
    out_names = {out_renames.get(o.name, o.name) for o in graph.output}
    if not out_names & set(source.outputs):
        raise BertfuseError(f"{model_path}: outputs {', '.join(o.name for o in graph.output)} "
                            f"match none of {src_path}'s ({', '.join(source.outputs)})")

    return _renamed(model, by_name, out_renames)


def role_inputs(model: onnx.ModelProto, role_override: dict[str, str]) -> onnx.ModelProto:
    """`optimize --inputs`: the model, or a copy whose inputs are named for their roles and
    fed as int32 (what bertfuse's Session takes); inputs the override leaves out are
    recognised by name, as for verify."""
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    by_name = {n: r for r, n in assign_roles(names, role_override).items()}
    return _renamed(model, by_name, {})


def _renamed(model: onnx.ModelProto, by_name: dict[str, str],
             out_renames: dict[str, str]) -> onnx.ModelProto:
    """A copy with inputs renamed to their roles (a Cast feeds a non-int32 one from its
    int32 role) and outputs renamed; the model itself when nothing changes."""
    inputs = [i for i in model.graph.input if i.name in by_name]
    casts = [i for i in inputs if i.type.tensor_type.elem_type != TensorProto.INT32]
    in_renames = {n: r for n, r in by_name.items() if n != r}
    if not (in_renames or out_renames or casts):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    cast_names = {i.name for i in casts}
    # Inputs that need a cast keep their name inside the graph; a Cast feeds it from the role.
    rename_values(graph, {n: r for n, r in in_renames.items() if n not in cast_names})
    rename_values(graph, out_renames)
    new_inputs = []
    for inp in graph.input:
        if inp.name in cast_names:
            role = by_name[inp.name]
            graph.node.insert(0, helper.make_node("Cast", [role], [inp.name],
                                                  to=inp.type.tensor_type.elem_type,
                                                  name=f"{role}_cast_in"))
            served = onnx.ValueInfoProto()
            served.CopyFrom(inp)  # the same shape, fed as int32 under the role's name
            served.name = role
            served.type.tensor_type.elem_type = TensorProto.INT32
            new_inputs.append(served)
        else:
            new_inputs.append(inp)
    del graph.input[:]
    graph.input.extend(new_inputs)
    return copy
