"""Argument checks for every room's Python API: each takes the argument's name and a value
and returns it normalised, or raises one error naming the argument (BertfuseError by
default, or the room's own subclass: `error=ConfigError`), in one message style."""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Sequence

import numpy as np

from bertfuse.errors import BertfuseError

Error = type[BertfuseError]


def check_int(name: str, value: Any, low: int, high: int | None = None, why_high: str = "",
              *, error: Error = BertfuseError) -> int:
    """`value` as an int in low..high (`why_high` says where high comes from); bools and
    floats are refused, NumPy integers taken."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{name} must be an integer, not {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        span = f"{low}..{high}{why_high}" if high is not None else f"at least {low}"
        raise error(f"{name} must be {span}, not {value}")
    return value


def check_flag(name: str, value: Any, *, error: Error = BertfuseError) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise error(f"{name} must be True or False, not {value!r}")
    return bool(value)


def check_text(name: str, value: Any, *, error: Error = BertfuseError) -> str:
    if not isinstance(value, str) or not value:
        raise error(f"{name} must be a non-empty string, not {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Sequence[str], *,
                 error: Error = BertfuseError) -> str:
    if not isinstance(value, str) or value not in choices:
        raise error(f"{name} {value!r} is not one of {', '.join(choices)}")
    return value


def check_tolerance(name: str, value: Any, *, error: Error = BertfuseError) -> float | None:
    """None (the defaults) or a finite number >= 0: a NaN limit would let every NaN pass."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0:
        raise error(f"{name} must be a finite number >= 0, not {value!r}")
    return float(value)


def check_path(name: str, value: Any, optional: bool = False, *,
               error: Error = BertfuseError) -> str | None:
    if value is None and optional:
        return None
    if isinstance(value, (str, os.PathLike)) and os.fspath(value):
        return str(os.fspath(value))
    raise error(f"{name} must be a path (str or os.PathLike), not {value!r}")


def check_names(name: str, value: Any, *, error: Error = BertfuseError) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
        raise error(f"{name} must be a list of names, not {value!r}")
    return list(value)




def check_fraction(name: str, value: Any, *, error: Error = BertfuseError) -> float:
    """A number in (0, 1], e.g. a gate's limit (a NaN limit would pass every NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise error(f"{name} must be a number in (0, 1], not {value!r}")
    return float(value)
