"""TF2 SavedModel and Keras (.keras, Keras-exported SavedModel) sources -> frozen -> TFSource."""

from __future__ import annotations

from pathlib import Path

from bertfuse.converter.frozen import canonical_output_name, source_from_graph_def
from bertfuse.converter.roles import HUB_EXTRAS, UnknownInput, assign_roles
from bertfuse.converter.source import OUTPUT_ROLES, TFSource
from bertfuse.errors import BertfuseError
from bertfuse.converter import serving_cut
from bertfuse.converter.graph_roles import roles_from_graph
from bertfuse.converter.text_front import TextFront, text_ops
from bertfuse.converter.xla import freezable
from bertfuse.optional import optional


def _freeze(concrete) -> tuple[object, dict[str, str], dict[str, str], list[int | None]]:
    """Freezes a concrete function; returns (graph_def, {arg name: tensor}, {out key: tensor},
    the outputs' ranks)."""
    convert_variables_to_constants_v2 = optional("tensorflow.python.framework.convert_to_constants",
                                                 "convert_variables_to_constants_v2",
                                                 why="TensorFlow runs the source model (tf extra)")

    nest = optional("tensorflow.python.util", "nest",
                    why="TensorFlow runs the source model (tf extra)")

    frozen = convert_variables_to_constants_v2(concrete)
    graph_def = frozen.graph.as_graph_def()
    # Captured resources that freezing keeps as inputs (a tokenizer's lookup table) are no
    # signature inputs.
    arg_names = [t.name for t in frozen.inputs if t.dtype.name != "resource"]
    # A function's flat inputs are its structured signature flattened by tf.nest (dict keys
    # sorted), captures removed by freezing. A signature placeholder is named after its key,
    # so match by name first and use the flat position only for specs whose name is not a
    # placeholder (renamed or uniquified ones).
    flat_in = nest.flatten_with_tuple_paths(concrete.structured_input_signature)
    if len(flat_in) != len(arg_names):
        raise BertfuseError(f"cannot match the {len(flat_in)} signature inputs to the "
                            f"{len(arg_names)} graph inputs of the frozen function")
    by_name = {n.split(":")[0]: n for n in arg_names}
    structured: dict[str, str] = {}
    for i, (path, spec) in enumerate(flat_in):
        spec_name = getattr(spec, "name", None)
        if path[0] == 1:  # a keyword argument (what signatures have): its key names it
            key = "_".join(str(p) for p in path[1:])
        else:  # positional: the TensorSpec's name, else the placeholder's
            key = spec_name or arg_names[i].split(":")[0]
        tensor = (by_name.get(spec_name) if spec_name else None) or by_name.get(key)
        structured[key] = tensor or arg_names[i]
    if len(set(structured.values())) != len(structured):
        # Names collide (uniquified placeholders): the flat order is TF's contract.
        structured = dict(zip(structured, arg_names))
    # Outputs: structured_outputs flattened by tf.nest, in the order of the function's outputs.
    flat_out = nest.flatten_with_tuple_paths(concrete.structured_outputs)
    if len(flat_out) != len(frozen.outputs):
        raise BertfuseError(f"cannot match the {len(flat_out)} signature outputs to the "
                            f"{len(frozen.outputs)} graph outputs of the frozen function")
    out_map = {}
    for i, (path, _) in enumerate(flat_out):
        key = "_".join(str(p) for p in path)
        if not key:  # a single tensor
            key = frozen.outputs[i].name.split(":")[0]
        elif all(isinstance(p, int) for p in path):  # a list/tuple of tensors
            key = f"output_{key}"
        out_map[key] = frozen.outputs[i].name
    return graph_def, structured, out_map, [t.shape.rank for t in frozen.outputs]


def _role_outputs(out_map: dict[str, str]) -> dict[str, str]:
    """The signature's outputs less TF Hub's extras (`default`, `encoder_outputs_N`), which
    are kept only when --outputs names them; every other output is kept, under its role where
    it has one and its own name where not (converter/output_meaning.py)."""
    keep = {k: t for k, t in out_map.items() if not HUB_EXTRAS.fullmatch(k)}
    return keep or out_map


def _roles(graph_def, structured: dict[str, str], override: dict[str, str]) -> dict[str, str]:
    """By name where names tell, else from what each input feeds in the graph."""
    try:
        return assign_roles(list(structured), override)
    except UnknownInput:
        raise
    except BertfuseError:
        return roles_from_graph(graph_def, structured, override)


def _source_from_concrete(concrete, kind: str, path: str, role_override: dict[str, str],
                          outputs: list[str] | None, front=None) -> TFSource:
    graph_def, structured, out_map, ranks = _freeze(concrete)
    if front is not None:  # text in: the encoder from its tokenizer's ids (text_front.py)
        graph_def, structured = front.cut(graph_def, structured, list(out_map.values()))
    rank_of = dict(zip(out_map.values(), ranks))
    if outputs:
        missing = [o for o in outputs if o not in out_map]
        if missing:
            raise BertfuseError(f"{path}: no output {missing[0]!r} (outputs: "
                                f"{', '.join(out_map)})")
        out_map = {k: out_map[k] for k in outputs}
    # tf.Example parsing cut off, unread inputs and passed-through outputs left out.
    cut = serving_cut.cut(graph_def, structured, out_map, role_override,
                          None if outputs else _role_outputs)
    graph_def, structured, out_map = cut.graph_def, cut.inputs, cut.outputs
    roles = _roles(graph_def, structured, cut.override)
    inputs = {r: structured[n] for r, n in roles.items()}
    tensors = list(out_map.values())
    names = {t: k for k, t in out_map.items()}
    src = source_from_graph_def(graph_def, kind, path, inputs, tensors, {}, output_names=names,
                                output_ranks={t: rank_of.get(t) for t in tensors})
    src.original_names.update({r: n for r, n in roles.items()})
    src.notes.extend(cut.notes)
    return src


def load_savedmodel(path: str, signature: str, role_override: dict[str, str],
                    outputs: list[str] | None) -> TFSource:
    notes: list[str] = []
    with freezable(path, notes) as load_path:  # XLA-compiled functions: unmarked to inline
        src = _load_signature(load_path, path, signature, role_override, outputs)
    src.notes[:0] = notes
    return src


def _load_signature(load_path: str, path: str, signature: str, role_override: dict[str, str],
                    outputs: list[str] | None) -> TFSource:
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    text = text_ops(path)  # tensorflow-text's ops registered, or one line saying how
    try:
        loaded = tf.saved_model.load(load_path)
    except Exception as exc:
        raise BertfuseError(f"{path}: cannot load SavedModel ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    sigs = getattr(loaded, "signatures", {})
    if signature not in sigs:
        raise BertfuseError(f"{path}: no signature {signature!r} "
                            f"(signatures: {', '.join(sigs) or 'none'})")
    concrete = _keyed_call(loaded, sigs[signature]) or sigs[signature]
    if text:
        front = TextFront(path, signature, concrete, text)
        front.loaded = loaded  # its tables live as long as the object
        src = _source_from_concrete(concrete, "savedmodel", path, role_override, outputs,
                                    front)
        src.text, src.config = front, front.config()
        return src
    return _source_from_concrete(concrete, "savedmodel", path, role_override, outputs)


def _keyed_call(loaded, sig):
    """The object's own call, traced over the signature's inputs, where the signature's outputs
    carry layer names and the call's dict carries roles: a Keras 2 functional model saved with
    `model.save` (TF Hub's BERT encoders, `hub.KerasLayer` wrapped in a model) names its
    signature's outputs after their layers (`bert_encoder_1`, `keras_layer_1`, ...), and only
    its call keeps the dict's keys (`sequence_output`, `pooled_output`, ...). None otherwise."""
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    keys = list(sig.structured_outputs)
    if len(keys) < 2 or any(canonical_output_name(k, None, set()) in OUTPUT_ROLES
                            for k in keys) or not callable(loaded):
        return None
    specs = sig.structured_input_signature[1]
    concrete = None
    # A dict of inputs, or the one input itself (a model taking text: one string tensor).
    for alone in (False, True) if len(specs) == 1 else (False,):
        try:
            concrete = _call(loaded, alone).get_concrete_function(**specs)
            break
        except Exception:  # not callable that way: keep the signature (and its names)
            continue
    if concrete is None:
        return None
    out = concrete.structured_outputs
    if not isinstance(out, dict) or not any(
            canonical_output_name(str(k), None, set()) in OUTPUT_ROLES for k in out):
        return None
    return concrete


def _call(loaded, alone: bool):
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    @tf.function
    def call(**kwargs):
        return loaded(next(iter(kwargs.values())) if alone else kwargs, training=False)

    return call


def load_keras(path: str, role_override: dict[str, str], outputs: list[str] | None,
               trust: bool = False) -> TFSource:
    """A .keras file, loaded in Keras' safe mode unless `trust` (--trust-model)."""
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    try:
        keras = optional("keras", why="Keras loads a .keras model (tf extra)")

        model = keras.saving.load_model(path, compile=False, safe_mode=not trust)
    except Exception as exc:
        if "safe_mode" in str(exc):  # code the scan did not name: Keras' first sentence
            raise BertfuseError(f"{path}: Keras' safe mode refuses to load it ("
                                f"{str(exc).split('. ')[0].strip()}); pass --trust-model if "
                                f"you trust its author") from None
        raise BertfuseError(f"{path}: cannot load Keras model ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    try:
        structure = model.input
    except (AttributeError, ValueError):
        structure = None
    if structure is None:
        raise BertfuseError(f"{path}: the Keras model has no defined inputs (a subclassed model "
                            f"that was never built); export it as a SavedModel instead")
    # A functional model is called with its inputs in the structure it was built with: a dict
    # keyed by the dict's keys (not necessarily the Input layers' names), or a list / a tensor.
    if isinstance(structure, dict):
        named = list(structure.items())
    else:
        flat = list(structure) if isinstance(structure, (list, tuple)) else [structure]
        named = [(t.name.split(":")[0], t) for t in flat]
    if len({k for k, _ in named}) != len(named):
        raise BertfuseError(f"{path}: Keras inputs have duplicate names "
                            f"({', '.join(k for k, _ in named)})")
    specs = {}
    for name, t in named:
        # Batch always dynamic; a fixed sequence length the model was built with stays.
        specs[name] = tf.TensorSpec([None, *t.shape[1:]], t.dtype, name=name)

    @tf.function
    def serve(**kwargs):
        if isinstance(structure, dict):
            args = {k: kwargs[k] for k in structure}
        elif isinstance(structure, (list, tuple)):
            args = [kwargs[k] for k, _ in named]
        else:
            args = kwargs[named[0][0]]
        out = model(args, training=False)
        if isinstance(out, dict):
            return out
        if isinstance(out, (list, tuple)):
            names = getattr(model, "output_names", None) or []
            if len(names) != len(out):
                names = [f"output_{i}" for i in range(len(out))]
            return dict(zip(names, out))
        return {"output": out}

    concrete = serve.get_concrete_function(**specs)
    return _source_from_concrete(concrete, "keras", path, role_override, outputs)


def is_savedmodel(path: Path) -> bool:
    return path.is_dir() and (path / "saved_model.pb").exists()
