"""Options whose spelling changed, each old spelling accepted for one release with one
deprecation line (the CLI, on stderr) or a DeprecationWarning (the Python API).

    convert/optimize  --kernels ort|bertfuse  -> --ops contrib|bertfuse  (kernels= -> ops=)
    bench             --kernels ort|both      -> --forms contrib|both

`--kernels auto|ort|bertfuse` where a Session opens (verify, serve, score, the runtime's
`kernels=`) keeps its name: it is the choice at load. The --json reports keep the names and
values they had before the rename (`"kernels": "ort"` in convert's "options").
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

from bertfuse.errors import BertfuseError

@dataclass(frozen=True)
class Renamed:
    """One option's old spelling: its flag, API keyword and values, and its report key."""

    flag: str  # the new flag, e.g. --ops
    old_flag: str  # e.g. --kernels
    old_values: Mapping[str, str] = field(default_factory=dict)  # old value -> new
    old_keyword: str | None = None  # the API's old keyword (None: CLI only)
    report_key: str | None = None  # the key the --json report keeps (None: the option's)

    def new_value(self, value: Any) -> Any:
        return self.old_values.get(value, value) if isinstance(value, str) else value

    def report_value(self, value: Any) -> Any:
        back = {new: old for old, new in self.old_values.items()}
        return back.get(value, value) if isinstance(value, str) else value

    def line(self, old_flag: str, value: str) -> str:
        """The deprecation line for `old_flag value` (old_flag: this flag with an old value,
        or the old flag)."""
        return (f"{old_flag} {value} is now {self.flag} {self.new_value(value)}; the old "
                f"spelling is accepted until the next release")


OPS = Renamed("--ops", "--kernels", {"ort": "contrib"}, old_keyword="kernels",
              report_key="kernels")
FORMS = Renamed("--forms", "--kernels", {"ort": "contrib"})
# ConvertOptions' renamed options, by the option table's name
OPTIONS: dict[str, Renamed] = {"ops": OPS}


def api_value(function: str, name: str, value: Any, old: Any, default: Any) -> Any:
    """The API keyword `name`'s value, where `old` is what the caller passed as its old
    keyword (None: not passed). Each old spelling warns once (DeprecationWarning, pointing at
    the caller of bertfuse.convert/optimize); both keywords at once is an error."""
    r = OPTIONS[name]
    if old is not None:
        warnings.warn(f"{function}({r.old_keyword}={old!r}) is deprecated, use "
                      f"{function}({name}={r.new_value(old)!r}) (the old keyword is accepted "
                      f"until the next release)", DeprecationWarning, stacklevel=3)
        if value != default:
            raise BertfuseError(f"{function}: pass {name}= only ({r.old_keyword}= is its old "
                                f"name), not both")
        return r.new_value(old)
    if isinstance(value, str) and value in r.old_values:
        warnings.warn(f"{function}({name}={value!r}) is deprecated, use "
                      f"{function}({name}={r.new_value(value)!r}) (the old value is accepted "
                      f"until the next release)", DeprecationWarning, stacklevel=3)
    return r.new_value(value)

