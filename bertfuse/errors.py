"""Errors the CLI turns into one clear line and an exit code (never a traceback)."""

import importlib.util
import json
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse


class BertfuseError(Exception):
    """Bad input from the user: missing/corrupt files, mismatched config, unknown names."""

    exit_code = 2


class UsageError(BertfuseError):
    """Bad command-line arguments (argparse's errors, reported as one line)."""


class ParityError(BertfuseError):
    """The converted model drifts from the source model past tolerance."""

    exit_code = 1

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report  # the run so far, so the CLI can show the parity table


class FusionIncomplete(BertfuseError):
    """--strict and at least one layer was left unfused."""

    exit_code = 1

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report  # the run so far: --json prints it with the refusal


class CudaUnavailableError(BertfuseError):
    """A session was asked for on CUDA, and ONNX Runtime's CUDA execution provider did not
    start (onnxruntime without CUDA, no GPU or driver, a CUDA/cuDNN library not found)."""


class MissingDependency(BertfuseError, ImportError):
    """An optional package the command needs is not installed (exit 2, with the pip line)."""


# Optional packages -> the extra that installs them (pyproject.toml), what needs them, and
# another extra that would do.
_EXTRAS = {"tensorflow": "tf", "tf2onnx": "tf", "tf_keras": "tf", "onnxruntime": "cpu",
           "ray": "ray", "pyarrow": "ray", "tokenizers": "text"}
_NEEDS = {"tf": ("converting and verifying need TensorFlow and tf2onnx", "tf-cpu"),
          "cpu": ("running a model needs ONNX Runtime", "gpu"),
          "ray": ("serving and offline scoring need Ray Serve and Ray Data", ""),
          "text": ("text input needs tokenizers", "")}


def install_hint(extra: str) -> str:
    """`pip install ...` of bertfuse with `extra`, in the form that works for how this bertfuse
    was installed (pip's record of it, PEP 610's direct_url.json): from a clone, the folder
    (`-e` where it was editable); from a wheel or sdist file, that file; from a VCS URL, that
    URL; from a package index (no record), the name. bertfuse run from a source tree that pip
    never installed names the tree."""
    return "pip install " + pip_target(_direct_url(), extra)


def pip_target(direct_url: dict | None, extra: str) -> str:
    """pip's argument for bertfuse with `extra`, given its direct_url.json (None: an index)."""
    url = str((direct_url or {}).get("url", ""))
    if not url:
        return f"'bertfuse[{extra}]'"
    if not url.startswith("file://"):  # a VCS or remote archive URL
        vcs = (direct_url or {}).get("vcs_info", {}).get("vcs")
        return f"'bertfuse[{extra}] @ {vcs + '+' if vcs and not url.startswith(vcs) else ''}{url}'"

    path = unquote(urlparse(url).path)
    editable = bool((direct_url or {}).get("dir_info", {}).get("editable"))
    return f"{'-e ' if editable else ''}'{path}[{extra}]'"


def _direct_url() -> dict | None:
    recorded = None
    # Every bertfuse metadata on the path: a clone's own egg-info (no record) may come first.
    for dist in metadata.distributions(name="bertfuse"):
        try:
            recorded = json.loads(dist.read_text("direct_url.json") or "null")
        except ValueError:
            recorded = None
        if recorded:
            break
    if recorded is None:  # run from a clone pip never installed
        root = Path(__file__).resolve().parents[1]
        if (root / "pyproject.toml").is_file():
            return {"url": root.as_uri(), "dir_info": {}}
    return recorded


def missing_dependency_message(exc: BaseException) -> str | None:
    """A ModuleNotFoundError for an optional package as one line with the install hint."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    extra = _EXTRAS.get(top)
    if extra is None:
        return None
    needs, alt = _NEEDS[extra]
    alt = f" (or {pip_target(_direct_url(), alt)}{' on CUDA' if alt == 'gpu' else ''})" if alt else ""
    return f"{top} is not installed: {needs}; {install_hint(extra)}{alt}"


def require(*modules: str) -> None:
    """Raises MissingDependency (with the pip line) unless each module can be imported. Where
    the missing ones belong to several extras, the one line names them all and one pip line
    for all of them (`all-cpu`), so that a user installs once, not once per error."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or None in sys.modules
            found = False
        if not found:
            missing.append(name)
    if not missing:
        return
    extras = list(dict.fromkeys(_EXTRAS.get(name.split(".")[0], "") for name in missing))
    if len(extras) == 1 or "" in extras:
        exc = ModuleNotFoundError(f"No module named {missing[0]!r}", name=missing[0])
        raise MissingDependency(missing_dependency_message(exc) or str(exc))
    raise MissingDependency(f"{', '.join(missing)} are not installed: "
                            f"{'; '.join(_NEEDS[e][0] for e in extras)}; {_install_all(extras)}")


def _install_all(extras: list[str]) -> str:
    """One pip line for several extras: `all-cpu` (or `all-gpu` on CUDA), which hold
    tensorflow-cpu; `all-gpu` where onnxruntime-gpu is here; beside the full tensorflow
    package, the extras themselves (either `all` would add tensorflow-cpu beside it)."""
    def installed(dist: str) -> bool:
        try:
            return bool(metadata.version(dist))
        except metadata.PackageNotFoundError:
            return False

    if installed("tensorflow"):
        return install_hint(",".join(extras))
    if installed("onnxruntime-gpu"):
        return install_hint("all-gpu")
    return f"{install_hint('all-cpu')} (or {pip_target(_direct_url(), 'all-gpu')} on CUDA)"


def library_error_message(exc: BaseException) -> str | None:
    """Bad input that surfaces as a library error, as one line; None for anything else.

    Memory exhausted (a huge --batch), or TensorFlow's InvalidArgumentError /
    ResourceExhaustedError from running the user's model, whose first line ("Graph execution
    error:") says nothing: the line that does, and the node."""
    if isinstance(exc, MemoryError):
        return f"out of memory ({str(exc) or 'MemoryError'}); try a smaller --batch/--seq"
    name = type(exc).__name__
    if not type(exc).__module__.startswith("tensorflow") or \
            name not in ("InvalidArgumentError", "ResourceExhaustedError"):
        return None
    lines = [ln.strip() for ln in str(getattr(exc, "message", None) or exc).splitlines()]
    node = next((ln[len("Node:"):].strip(" '") for ln in lines if ln.startswith("Node:")), "")
    skip = ("Graph execution error", "Detected at node", "Node:", "[[", "Original stack trace",
            "File ", "Traceback")
    body = next((ln for ln in lines if ln and not ln.startswith(skip)), name)
    hint = "; try a smaller --batch/--seq" if name == "ResourceExhaustedError" else ""
    return (f"TensorFlow failed running the source model ({name}"
            f"{' at node ' + node if node else ''}): {body[:300]}{hint}")
