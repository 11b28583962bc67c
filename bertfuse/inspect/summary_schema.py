"""The shape of a summary JSON (bertfuse summarize), checked before diff reads it.

A committed summary can be edited by hand; a field of the wrong type must be a one-line
"bad input" error naming the field, not a crash inside diff.
"""

from __future__ import annotations

from bertfuse.errors import BertfuseError


class MapOf:
    """A JSON object with any string keys, each value of `value`'s shape."""

    def __init__(self, value) -> None:
        self.value = value


class ListOf:
    def __init__(self, item) -> None:
        self.item = item


class Optional:
    def __init__(self, shape) -> None:
        self.shape = shape


_IO = {"name": str, "dtype": str, "shape": ListOf((int, str))}
_LAYER = {"attention": (bool, int), "gelu": (bool, int), "skip_layernorm": int,
          "leftovers": Optional(MapOf(int))}
SCHEMA = {
    "format": str,
    "producer": {"name": str, "version": str},
    "ir_version": int,
    "opsets": MapOf(int),
    "inputs": ListOf(_IO),
    "outputs": ListOf(_IO),
    "nodes": int,
    "ops": MapOf(int),
    "weights": {"count": int, "bytes": int, "by_dtype": MapOf({"count": int, "bytes": int})},
    "initializers": MapOf({"dtype": str, "shape": ListOf(int)}),
    "encoder": {"embed_layernorm": (bool, int), "layers": ListOf(_LAYER)},
}


def check_summary(data: object, path: str) -> None:
    """Raises BertfuseError naming the first field that does not fit SCHEMA."""
    where = _mismatch(data, SCHEMA, "")
    if where is not None:
        raise BertfuseError(f"{path}: not a valid bertfuse summary ({where or 'top level'} "
                            f"is missing or of the wrong type; was it edited?)")


def _mismatch(value: object, shape, at: str) -> str | None:
    """The path of the first mismatch, or None."""
    if isinstance(shape, Optional):
        return None if value is None else _mismatch(value, shape.shape, at)
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return at
        for key, sub in shape.items():
            found = _mismatch(value.get(key), sub, f"{at}.{key}" if at else key)
            if found is not None:
                return found
        return None
    if isinstance(shape, MapOf):
        if not isinstance(value, dict):
            return at
        return next((m for k, v in value.items()
                     if (m := _mismatch(v, shape.value, f"{at}[{k!r}]")) is not None), None)
    if isinstance(shape, ListOf):
        if not isinstance(value, list):
            return at
        return next((m for i, v in enumerate(value)
                     if (m := _mismatch(v, shape.item, f"{at}[{i}]")) is not None), None)
    types = shape if isinstance(shape, tuple) else (shape,)
    if bool not in types and isinstance(value, bool):
        return at
    return None if isinstance(value, types) else at
