"""TF2 SavedModel and Keras (.keras, Keras-exported SavedModel) sources -> frozen -> TFSource."""

from __future__ import annotations

from pathlib import Path

from bertfuse.converter.frozen import source_from_graph_def
from bertfuse.converter.roles import assign_roles
from bertfuse.converter.source import TFSource
from bertfuse.errors import BertfuseError


def _freeze(concrete) -> tuple[object, dict[str, str], dict[str, str]]:
    """Freezes a concrete function; returns (graph_def, {arg name: tensor}, {out key: tensor})."""
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    frozen = convert_variables_to_constants_v2(concrete)
    graph_def = frozen.graph.as_graph_def()
    arg_names = [t.name for t in frozen.inputs]
    # Signature keys, flattened in sorted order as tf.nest does, name the flat inputs.
    _, kwargs = concrete.structured_input_signature
    if kwargs and len(kwargs) == len(arg_names):
        structured = dict(zip(sorted(kwargs), arg_names))
    else:
        structured = {n.split(":")[0]: n for n in arg_names}
    outs = concrete.structured_outputs
    if isinstance(outs, dict):
        out_map = {k: frozen.outputs[i].name for i, k in enumerate(sorted(outs))}
    else:
        out_map = {t.name.split(":")[0]: t.name for t in frozen.outputs}
    return graph_def, structured, out_map


def _source_from_concrete(concrete, kind: str, path: str, role_override: dict[str, str],
                          outputs: list[str] | None) -> TFSource:
    graph_def, structured, out_map = _freeze(concrete)
    roles = assign_roles(list(structured), role_override)
    inputs = {r: structured[n] for r, n in roles.items()}
    if outputs:
        missing = [o for o in outputs if o not in out_map]
        if missing:
            raise BertfuseError(f"{path}: no output {missing[0]!r} (outputs: "
                                f"{', '.join(out_map)})")
        out_map = {k: out_map[k] for k in outputs}
    tensors = list(out_map.values())
    names = {t: k for k, t in out_map.items()}
    src = source_from_graph_def(graph_def, kind, path, inputs, tensors, {}, output_names=names)
    src.original_names.update({r: n for r, n in roles.items()})
    return src


def load_savedmodel(path: str, signature: str, role_override: dict[str, str],
                    outputs: list[str] | None) -> TFSource:
    import tensorflow as tf

    try:
        loaded = tf.saved_model.load(path)
    except Exception as exc:
        raise BertfuseError(f"{path}: cannot load SavedModel ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    sigs = getattr(loaded, "signatures", {})
    if signature not in sigs:
        raise BertfuseError(f"{path}: no signature {signature!r} "
                            f"(signatures: {', '.join(sigs) or 'none'})")
    return _source_from_concrete(sigs[signature], "savedmodel", path, role_override, outputs)


def load_keras(path: str, role_override: dict[str, str], outputs: list[str] | None) -> TFSource:
    import tensorflow as tf

    try:
        import keras

        model = keras.saving.load_model(path, compile=False)
    except Exception as exc:
        raise BertfuseError(f"{path}: cannot load Keras model ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    specs = {}
    inputs = model.inputs if isinstance(model.inputs, (list, tuple)) else [model.inputs]
    for t in inputs:
        name = t.name.split(":")[0]
        specs[name] = tf.TensorSpec([None, t.shape[1]], t.dtype, name=name)
    input_struct = model.input if isinstance(model.input, dict) else None

    @tf.function
    def serve(**kwargs):
        args = kwargs if input_struct is not None else [kwargs[k] for k in specs]
        out = model(args, training=False)
        return out if isinstance(out, dict) else {"output": out}

    concrete = serve.get_concrete_function(**specs)
    return _source_from_concrete(concrete, "keras", path, role_override, outputs)


def is_savedmodel(path: Path) -> bool:
    return path.is_dir() and (path / "saved_model.pb").exists()
