"""What callers hand the runtime, checked before anything reaches a kernel: requests (dtypes,
shapes, id ranges, the all-masked row), sizes and warm-up arguments, output selection.

Read before the model runs: the model's input/output names, embedding table sizes and
declared output shapes (`model_facts`, `declared_output_dims`), which bound the ids and the
sequence length. The bottom room of runtime/: it imports nothing else of it.
"""

from __future__ import annotations

import bisect
import numbers
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from bertfuse.errors import BertfuseError
from bertfuse.ops.bertfuse.embed_layernorm import EMBEDDING_OPS
from bertfuse.io.onnx_in import check_stranger


class RequestError(BertfuseError, ValueError):
    """A request that would reach a kernel with bad data: refused before it runs."""


class ConfigError(BertfuseError, ValueError):
    """A session built or warmed with arguments it cannot serve: refused before any work."""


class ClosedError(BertfuseError, RuntimeError):
    """A session used after close()."""


ROLES = ("input_ids", "input_mask", "segment_ids")
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
DEFAULT_SEQ_BUCKETS = (32, 64, 128, 256, 512)


@dataclass
class ModelFacts:
    inputs: list[str]
    outputs: list[str]
    vocab_size: int | None
    type_vocab_size: int | None
    max_positions: int | None


STRIPPED_KEY = "bertfuse_stripped"  # weights.META_KEY: a skeleton has no weights to serve


def load_model(model: Any) -> onnx.ModelProto:
    """A ModelProto as given, or read from a path (weights stay external where they are)."""
    if isinstance(model, onnx.ModelProto):
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise ConfigError(f"model must be a path or an onnx.ModelProto, not {type(model).__name__}")
    path = os.fspath(model)
    if not os.path.isfile(path):
        raise ConfigError(f"no model file at {path}")
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError, JSON parse errors, ...
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:100]
        raise ConfigError(f"{path} is not an ONNX model ({why})") from None
    if not proto.graph.node:  # an empty file parses as an empty model
        raise ConfigError(f"{path} is not an ONNX model (no graph)")

    try:  # limits, external data inside the model's folder, the graph
        check_stranger(proto, path)
    except BertfuseError as exc:
        raise ConfigError(str(exc)) from None
    if any(p.key == STRIPPED_KEY for p in proto.metadata_props):
        raise ConfigError(f"{path} is a weight-stripped skeleton: refill it first "
                          "(bertfuse strip-weights MODEL -o OUT --fill SEED)")
    return proto


def model_facts(model: onnx.ModelProto) -> ModelFacts:
    """Input/output names and embedding table sizes, read without running the model."""
    inits = {i.name: i for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in inits]
    vocab = types = positions = None
    for node in model.graph.node:
        if node.op_type in EMBEDDING_OPS:
            dims = [list(inits[n].dims) if n in inits else None for n in node.input[2:5]]
            vocab = dims[0][0] if dims[0] else None
            positions = dims[1][0] if len(dims) > 1 and dims[1] else None
            types = dims[2][0] if len(dims) > 2 and dims[2] else None
            break
    if vocab is None:  # raw graph: read the embedding tables off the ops that use them
        tables = [list(inits[n.input[0]].dims) for n in model.graph.node
                  if n.op_type == "Gather" and n.input[0] in inits and len(inits[n.input[0]].dims) == 2]
        if tables:
            vocab = max(t[0] for t in tables)
            small = [t[0] for t in tables if t[0] < 16]
            types = min(small) if small else None
        for n in model.graph.node:
            if n.op_type == "OneHot" and n.input[1] in inits:
                types = int(numpy_helper.to_array(inits[n.input[1]]).reshape(-1)[0])
            if n.op_type == "Slice" and n.input[0] in inits and len(inits[n.input[0]].dims) == 2:
                positions = inits[n.input[0]].dims[0]
    return ModelFacts(inputs, [o.name for o in model.graph.output], vocab, types, positions)


def check_canonical(facts: ModelFacts) -> None:
    unknown = [n for n in facts.inputs if n not in ROLES]
    if unknown:
        raise BertfuseError(f"model inputs {unknown} are not bertfuse's canonical "
                            f"{list(ROLES)}; convert or optimize it with bertfuse first")


def declared_output_dims(model: onnx.ModelProto) -> dict[str, tuple] | None:
    """('B', 'S', 768)-style templates from the declared output shapes, if all are known."""
    dims = {}
    for out in model.graph.output:
        shape = out.type.tensor_type.shape.dim
        template: list = []
        for i, d in enumerate(shape):
            if d.dim_value > 0:
                template.append(d.dim_value)
            elif d.dim_param and i == 0:
                template.append("B")
            elif d.dim_param and i == 1 and len(shape) == 3:
                template.append("S")
            else:
                return None
        if not template:
            return None
        dims[out.name] = tuple(template)
    return dims


# -- requests ---------------------------------------------------------------------------


def check_request(given: dict[str, Any], facts: ModelFacts, max_batch: int, max_seq: int,
                  validate: bool = True, staged_ranges: bool = False) -> dict[str, Any]:
    """The request's arrays, int32, or a RequestError naming what is wrong. staged_ranges:
    the caller checks the value ranges of host arrays of 4 bytes or less once they are
    staged as int32 (wider ones could wrap there, so they are checked here). A host mask's
    all-masked rows come back unmasked (`unmask_empty_rows`)."""
    arrays: dict[str, Any] = {}
    shape = None
    for role, value in given.items():
        if value is None:
            continue
        if role not in facts.inputs:
            raise RequestError(f"this model takes no {role}")
        if isinstance(value, np.ndarray):
            arr, kind = value, value.dtype.kind  # the hot path: no dtype parsing
        elif hasattr(value, "__dlpack__"):  # device arrays; torch spells dtypes torch.int32
            arr, kind = value, np.dtype(str(value.dtype).rsplit(".", 1)[-1]).kind
        else:
            try:
                arr = np.asarray(value)
            except (ValueError, TypeError) as exc:  # ragged lists
                raise RequestError(f"{role} must be a [batch, seq] integer array "
                                   f"({str(exc).splitlines()[0][:80]})") from None
            kind = arr.dtype.kind
        if kind not in "iu":
            raise RequestError(f"{role} must be an integer array, got {arr.dtype}")
        if len(arr.shape) != 2:
            raise RequestError(f"{role} must be [batch, seq], got shape {tuple(arr.shape)}")
        if shape is not None and tuple(arr.shape) != shape:
            raise RequestError(f"{role} has shape {tuple(arr.shape)}, input_ids {shape}")
        shape = tuple(arr.shape)
        arrays[role] = arr
    if "input_ids" not in arrays:
        raise RequestError("input_ids is required")
    batch, seq = shape
    if not 1 <= batch <= max_batch:
        raise RequestError(f"batch {batch} outside 1..{max_batch}")
    if not 1 <= seq <= max_seq:
        raise RequestError(f"sequence length {seq} outside 1..{max_seq}")
    if validate:
        check_ranges(arrays, facts, staged=False if staged_ranges else None)
    out = {k: (v.astype(np.int32, copy=False) if isinstance(v, np.ndarray) else v)
           for k, v in arrays.items()}
    if isinstance(out.get("input_mask"), np.ndarray):
        out["input_mask"] = unmask_empty_rows(out["input_mask"])
    return out


def unmask_empty_rows(mask: np.ndarray) -> np.ndarray:
    """The mask with every all-zero row made all ones (a copy only when there is one).

    Why: attention adds the same -10000 to every key of an all-masked row, which softmax
    cancels, so plain ONNX Runtime (and TF) compute such a row as if it kept all of its own
    positions. Staged as zeros in a longer bucket, it would also attend to the bucket's
    padding keys (its answer would depend on the bucket), and as a key length it would be 0,
    which no kernel reads the same way. Unmasked, every bucket and mask form gives it what
    the padded model gives for the request as sent. On the hot path: one column read when
    every row keeps its first token."""
    if mask[:, 0].all():  # every row keeps a token
        return mask
    empty = ~mask.any(axis=1)
    if not empty.any():
        return mask
    mask = mask.copy()
    mask[empty] = 1
    return mask


def check_ranges(arrays: dict[str, Any], facts: ModelFacts, staged: bool | None = None) -> None:
    """Refuses values outside each role's table. staged=True/False: only the arrays that are
    / are not checked once staged as int32 (host arrays of 4 bytes or less: wider ones
    could wrap there)."""
    for role, arr in arrays.items():
        is_staged = isinstance(arr, np.ndarray) and arr.dtype.itemsize <= 4
        if staged is None or is_staged == staged:
            check_range(arr, role, upper_bound(facts, role))


def upper_bound(facts: ModelFacts, role: str) -> int | None:
    return {"input_ids": facts.vocab_size, "segment_ids": facts.type_vocab_size,
            "input_mask": 2}.get(role)


def check_range(arr: Any, role: str, upper: int | None) -> None:
    if isinstance(arr, np.ndarray):
        # One reduction on the hot path: as unsigned, negatives become huge (at least
        # 2**(bits-1): for narrow types that may stay under the bound, so check both ends).
        bits = 8 * arr.dtype.itemsize
        signed = arr.dtype.kind == "i"
        flat = arr.view(f"u{arr.dtype.itemsize}") if signed else arr
        if upper is not None and (not signed or 2 ** (bits - 1) >= upper) \
                and int(flat.max()) < upper:
            return
        lo, hi = int(arr.min()), int(arr.max())
    else:
        lo, hi = int(arr.min().item()), int(arr.max().item())
    if lo < 0 or (upper is not None and hi >= upper):
        bound = f"[0, {upper})" if upper is not None else ">= 0"
        raise RequestError(f"{role} values must be in {bound}, got {lo}..{hi}")


def select_outputs(available: Sequence[str], outputs: Sequence[str] | str | None) -> list[str]:
    """The output names a request asks for (default all), or a RequestError."""
    if outputs is None:
        return list(available)
    names = [outputs] if isinstance(outputs, str) else list(outputs)
    unknown = [n for n in names if n not in available]
    if unknown or not names:
        what = f"no output {unknown[0]!r} in this model" if unknown else "outputs is empty"
        raise RequestError(f"{what}; it has {list(available)}")
    return names


# -- constructor and warm-up arguments ----------------------------------------------------


def check_int(name: str, value: Any, lo: int, hi: int | None = None,
              why_hi: str = "") -> int:
    """`value` as an int in lo..hi, or a ConfigError (bools and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        span = f"{lo}..{hi}" if hi is not None else f"at least {lo}"
        raise ConfigError(f"{name} must be {span}{why_hi if hi is not None else ''}, "
                          f"not {value}")
    return value


def check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name} must be True or False, not {value!r}")
    return bool(value)


def check_sizes(facts: ModelFacts, max_batch: Any, max_seq: Any, batch_buckets: Any,
                seq_buckets: Any) -> tuple[int, int]:
    """(max_batch, max_seq), checked; max_seq None is the model's position table (or 512
    where the model does not show it). Bucket values must be positive integers; those past
    the limits are dropped (the defaults reach 512)."""
    max_batch = check_int("max_batch", max_batch, 1)
    positions = facts.max_positions
    if max_seq is None:
        max_seq = positions or 512
    why = f" (the model's position table has {positions} rows)" if positions else ""
    max_seq = check_int("max_seq", max_seq, 1, positions, why)
    for name, values in (("batch_buckets", batch_buckets), ("seq_buckets", seq_buckets)):
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ConfigError(f"{name} must be a sequence of integers, not {values!r}")
        for v in values:
            check_int(f"each of {name}", v, 1)
    return max_batch, max_seq


def bucket_list(values: Sequence[int], limit: int) -> list[int]:
    """The bucket sizes up to `limit`, sorted, with `limit` itself as the last."""
    return sorted({v for v in values if 0 < v <= limit} | {limit})


def smallest(buckets: Sequence[int], value: int) -> int:
    """The smallest bucket that holds `value` (buckets sorted, value within the last)."""
    return buckets[bisect.bisect_left(buckets, value)]


def check_warmup(buckets: Any, max_batch: int, max_seq: int) -> list[tuple[int, int]]:
    """warm-up's [(batch, seq), ...]: each a request shape the session serves."""
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence):
        raise ConfigError(f"warmup buckets must be a list of (batch, seq) pairs, not {buckets!r}")
    out = []
    for pair in buckets:
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ConfigError(f"each warmup bucket must be a (batch, seq) pair, not {pair!r}")
        out.append((check_int("warmup batch", pair[0], 1, max_batch, " (max_batch)"),
                    check_int("warmup seq", pair[1], 1, max_seq, " (max_seq)")))
    return out
