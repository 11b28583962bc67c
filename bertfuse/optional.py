"""Optional dependencies, imported on first use through one function.

bertfuse's core (pyproject.toml's dependencies) is imported at the top of each module. The
packages of the extras (TensorFlow and tf2onnx, ONNX Runtime, Ray and what it brings,
tokenizers) and the few a host may have (PyTorch, CuPy, tensorflow-text) are not: a command
imports them when it gets to the work that needs them, so that `bertfuse --help`, `inspect`
or `diff` run on a host without them. Each call says why it waits:

    tf = optional("tensorflow", why="TensorFlow reads and runs the source model (tf extra)")
    Tokenizer, models = optional("tokenizers", "Tokenizer", "models", why="...")

the second form is `from tokenizers import Tokenizer, models`. A missing package of an extra
raises MissingDependency, the one line with its pip line (errors.py); any other missing
module raises its own ModuleNotFoundError, as an import statement would.
"""

from __future__ import annotations

import importlib
from typing import Any

from bertfuse.errors import MissingDependency, missing_dependency_message


def optional(module: str, *names: str, why: str) -> Any:
    """The module (no names), or its one attribute, or a tuple of them (several names), as
    `import module` / `from module import name, ...` would give them."""
    if not why.strip():
        raise ValueError(f"optional({module!r}): say why the import waits")
    try:
        mod = importlib.import_module(module)
        found = tuple(_attribute(mod, module, name) for name in names)
    except ModuleNotFoundError as exc:
        message = missing_dependency_message(exc)
        if message is None:
            raise
        raise MissingDependency(message) from None
    if not names:
        return mod
    return found[0] if len(found) == 1 else found


def _attribute(mod: Any, module: str, name: str) -> Any:
    """`from module import name`: the attribute, else the submodule of that name."""
    try:
        return getattr(mod, name)
    except AttributeError:
        pass
    try:
        return importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{module}.{name}":
            raise
        raise ImportError(f"cannot import name {name!r} from {module!r}", name=module) from None
