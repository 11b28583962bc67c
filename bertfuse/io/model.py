"""Loading and writing ONNX models: validated, atomic, external data past 2 GB."""

from __future__ import annotations

import math
import os
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import onnx
from onnx.external_data_helper import load_external_data_for_model

from bertfuse.errors import BertfuseError
from bertfuse.io.safety import (check_replaceable, held, mode_of, pause_point, replace_file,
                             scratch_dir, temp_dir, temp_file)
from bertfuse.io.stale import scratch_folder
from bertfuse.io.write_errors import naming_the_path
from bertfuse.io.onnx_in import check_stranger
from bertfuse.io.ort import make_session
from bertfuse.kernels.model_ops import uses_library

# Protobuf cannot serialise a message over 2 GB; keep a margin.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


# Files that look like a model but that no TF reader takes: what each is, and what to do.
_HF = ("for a Hugging Face model, save a SavedModel with transformers: "
       "TFAutoModel.from_pretrained(DIR{pt}).save_pretrained(OUT, saved_model=True), then "
       "bertfuse convert OUT")
_FOREIGN = {
    ".bin": ("a PyTorch checkpoint (pytorch_model.bin)", _HF.format(pt=", from_pt=True")),
    ".pt": ("a PyTorch checkpoint", _HF.format(pt=", from_pt=True")),
    ".pth": ("a PyTorch checkpoint", _HF.format(pt=", from_pt=True")),
    ".safetensors": ("safetensors weights", _HF.format(pt="")),
    ".h5": ("a Keras 2 HDF5 file (tf_model.h5)", "load it in Keras and write a SavedModel "
            "with model.export(OUT); " + _HF.format(pt="")),
    ".hdf5": ("a Keras 2 HDF5 file", "load it in Keras and write a SavedModel with "
              "model.export(OUT)"),
    ".onnx": ("an ONNX model already", "bertfuse optimize runs the fusion passes on it"),
}
_HF_FILES = ("config.json", "pytorch_model.bin", "model.safetensors", "tf_model.h5")


def check_source_form(path: str, kind: str = "auto") -> None:
    """A source no bertfuse --format reads (PyTorch, Keras 2 HDF5, a Hugging Face folder
    without a SavedModel) is refused before TensorFlow loads, saying what to do instead."""
    p = Path(path)
    what = _FOREIGN.get(p.suffix.lower())
    if what and p.is_file():
        raise BertfuseError(f"{path}: {what[0]}, which no bertfuse --format reads; {what[1]}")
    if kind != "auto" or not p.is_dir() or (p / "saved_model.pb").exists() or \
            (p / "bert_config.json").exists() or any(p.glob("*.index")):
        return
    if versioned_savedmodel(p) is not None:
        return
    found = [n for n in _HF_FILES if (p / n).exists()]
    if found:
        pt = ", from_pt=True" if any(n.endswith((".bin", ".safetensors")) for n in found) else ""
        raise BertfuseError(f"{path}: a Hugging Face model folder ({', '.join(found)}) without a "
                            f"SavedModel; {_HF.format(pt=pt)}")


def versioned_savedmodel(folder: Path) -> Path | None:
    """The SavedModel inside a folder that holds one by version: transformers'
    `save_pretrained(DIR, saved_model=True)` writes `DIR/saved_model/1/`, TF Serving reads
    `DIR/1/`, `DIR/2/` ... The highest version is taken; None where there is none. A version
    folder that leads outside `folder` (a symbolic link) is not taken."""
    if not folder.is_dir() or (folder / "saved_model.pb").exists():
        return None
    root = folder.resolve()
    for base in (folder / "saved_model", folder):
        if not base.is_dir():
            continue
        versions = []
        for child in base.iterdir():
            if child.name.isdigit() and (child / "saved_model.pb").is_file() and \
                    (child / "saved_model.pb").resolve().is_relative_to(root):
                versions.append((int(child.name), child))
        if versions:
            return max(versions)[1]
    return None


def model_bytes(model: onnx.ModelProto) -> int:
    return sum(t.ByteSize() for t in model.graph.initializer) + sum(
        n.ByteSize() for n in model.graph.node)


def load_model(model: str | os.PathLike | onnx.ModelProto, load_weights: bool = True, *,
               error: type[BertfuseError] = BertfuseError) -> onnx.ModelProto:
    """A ModelProto as given, or read from a path and checked as a stranger's file (limits,
    external data inside its folder, the graph: io/onnx_in.py), its external weights loaded
    when `load_weights`. A refusal is one `error` (the caller's BertfuseError subclass)."""
    if isinstance(model, onnx.ModelProto):
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise error(f"model must be a path or an onnx.ModelProto, not {type(model).__name__}")
    path = Path(model)
    if not path.exists():
        raise error(f"{path}: no such file")
    if path.is_dir():
        raise error(f"{path}: is a directory, expected an .onnx file")
    if not path.is_file():  # a fifo would block (the CLI refuses these before: cli/__init__.py)
        raise error(f"{path}: not a regular file (an ONNX model is read from one)")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise error(f"{path}: not a readable ONNX model ({type(exc).__name__})") from None
    # Protobuf parses some non-ONNX bytes (an empty file, say) into an empty message.
    if not model.opset_import or not model.graph.node:
        raise error(f"{path}: not an ONNX model (no graph or no opset)")

    try:  # limits, external data inside the model's folder, the graph
        external = check_stranger(model, path)
    except BertfuseError as exc:
        if isinstance(exc, error):
            raise
        raise error(str(exc)) from None
    if external and load_weights:
        load_external_data_for_model(model, str(path.parent))
    return model


def check_input_model(model: onnx.ModelProto, path: str | Path, changed: bool = False) -> None:
    """A model to be rewritten must be sound first: a cycle, or an initializer whose bytes do
    not fill its dims, is bad input (the passes would fail on it as if bertfuse had a bug).
    changed: the checker reads `model` as loading changed it (passes/erfc.py), not the file."""
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL or not t.HasField("raw_data"):
            continue
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        need = math.prod(t.dims) * itemsize
        if len(t.raw_data) != need:
            raise BertfuseError(f"{path}: initializer {t.name!r} has {len(t.raw_data)} bytes, "
                                f"its dims {list(t.dims)} need {need}")
    try:
        if changed:
            with scratch_file(model, prefix="bertfuse-check-") as copy:
                onnx.checker.check_model(str(copy))
        else:
            onnx.checker.check_model(str(path))
    except Exception as exc:
        raise BertfuseError(f"{path}: fails onnx's checker: "
                            f"{str(exc).splitlines()[0][:300]}") from None


def check_model(model: onnx.ModelProto, device: str = "cpu", load: bool = True) -> None:
    """onnx's checker, then an ORT session on `device`: a model that fails either is never
    written. load=False skips the session (packed models: their kernels exist on CUDA only).
    The copy they read is written beside the output (io/stale.py's scratch_beside)."""
    with scratch_file(model, prefix="bertfuse-check-") as path:
        pause_point("check-tmp")
        try:
            onnx.checker.check_model(str(path))
        except Exception as exc:
            raise BertfuseError(f"the ONNX model fails onnx's checker: "
                                f"{str(exc).splitlines()[0][:300]}") from None
        if not load:
            return

        # Asked of the proto in memory, not by scanning the file just written.
        kernels = uses_library(model)
        try:
            make_session(path, device=device, register_kernels=kernels)
        except BertfuseError:  # the op library's own error (KernelLibraryError), as it is
            raise
        except Exception as exc:
            raise BertfuseError(f"ONNX Runtime cannot load the model: "
                                f"{str(exc).splitlines()[0][:300]}") from None


@contextmanager
def scratch_file(model: onnx.ModelProto, prefix: str = "bertfuse-") -> Iterator[Path]:
    """`model` saved in a temporary directory for the block (ONNX Runtime opens a model past
    protobuf's 2 GB limit from a file only), removed after it on every exit path. The
    directory is hidden in the output's folder during a run that writes one, else in the
    system temp folder (io/stale.py's scratch_folder)."""
    folder = scratch_folder()
    with ExitStack() as stack:
        with naming_the_path(folder or tempfile.gettempdir(), "the model's scratch copy there"):
            tmp = stack.enter_context(scratch_dir(prefix))
            path = tmp / "model.onnx"
            saved_external = _save(model, path)
        if saved_external:
            # Saving with external data moved the weights out of `model`: take them back
            # now (the data file stays for the block).

            load_external_data_for_model(model, str(tmp))
        yield path


def _save(model: onnx.ModelProto, path: Path) -> bool:
    """Saves; returns True when the weights went to an external data file."""
    if model_bytes(model) > EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
        return True
    onnx.save_model(model, str(path))
    return False


def save_model(model: onnx.ModelProto, path: str | Path, external_data: bool = False) -> Path:
    """Writes to temporaries beside the target, then renames: never a half-written file, and
    never over anything but a regular file. A replaced file keeps its permission bits. The
    weights go to PATH.data beside it past 2 GB, or always with `external_data`."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise BertfuseError(f"{path.parent}: output directory does not exist")
    check_replaceable(path)
    mode = mode_of(path)
    with naming_the_path(path, "the model"):
        _write_model(model, path, mode, external_data)
    return path


def _write_model(model: onnx.ModelProto, path: Path, mode: int, external_data: bool) -> None:
    if not external_data and model_bytes(model) <= EXTERNAL_DATA_THRESHOLD:
        with temp_file(path) as tmp:
            onnx.save_model(model, str(tmp))
            os.chmod(tmp, mode)
            pause_point("save-tmp")
            replace_file(tmp, path)
        return
    # The data file's name is recorded inside the model: write both under their final names
    # in a private directory beside the target, then rename the data file, then the model.
    data = path.with_name(path.name + ".data")
    check_replaceable(data)
    with temp_dir(path.parent, prefix=f".{path.name}.") as tmp:
        onnx.save_model(model, str(tmp / path.name), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=data.name, size_threshold=1024)
        for p in (tmp / path.name, tmp / data.name):
            os.chmod(p, mode)
        pause_point("save-tmp")
        with held():
            replace_file(tmp / data.name, data)
            replace_file(tmp / path.name, path)
