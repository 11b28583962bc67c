"""A scoring job, checked before Ray starts: the options, the model, the input Parquet files and
their columns, and the plan of parts (the unit of output and of restart).

    score(model=..., input=..., ...) ─► check options ─► model facts ─► input files, schema
                                     ─► parts: whole row groups, about part_rows rows each

A bad option, model, vocab, input file or column is a BertfuseError (one line, exit 2).
No Ray here.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from bertfuse.checks import check_int, check_path
from bertfuse.errors import BertfuseError, require
from bertfuse.gpu_plan import GpuPlan, host_plan
from bertfuse.runtime.kernel_choice import check_kernels_option
from bertfuse.score.rows import InputSpec
from bertfuse.io.sidecars import find_vocab
from bertfuse.optional import optional
from bertfuse.runtime.request_checks import check_canonical, model_facts, servable_model
from bertfuse.text import WordPiece

DEFAULT_PART_ROWS = 8192
DEFAULT_BATCH = 32
DEVICES = ("auto", "cuda", "cpu")


@dataclass(frozen=True)
class Part:
    """Rows `offset`.. (`rows` of them) of the whole row groups [groups[0], groups[1]) of input
    file `file`; `first_row` numbers them in the whole input (files in sorted order)."""

    index: int
    file: int
    groups: tuple[int, int]
    offset: int
    first_row: int
    rows: int


@dataclass
class ScoreJob:
    model: str
    input: str
    output: str
    files: list[str]
    spec: InputSpec
    key_columns: list[str]
    outputs: list[str]
    output_ranks: dict[str, int]
    parts: list[Part]
    rows: int
    batch_size: int = DEFAULT_BATCH
    actors: int | None = None
    device: str = "auto"
    address: str | None = None
    max_retries: int = 3
    part_rows: int = DEFAULT_PART_ROWS
    fingerprint: dict = field(default_factory=dict)
    kernels: str = "auto"  # the actors' Sessions' (runtime/kernel_choice.py)
    # The longest wait for rows before a run is cancelled and rerun (watch.py); None: derived
    # from the job's own waits
    stall_s: float | None = None
    gpus: GpuPlan | None = None  # gpus' plan (gpu_plan.py): an actor on each of its GPUs

    def identity(self) -> dict[str, Any]:
        """What a restarted job must share with the run that wrote the output so far: the
        model, the input files, the columns, the outputs, the parts. Actors, batch size,
        device, kernels and cluster may differ: they change a row's result only within the
        runtime's tolerances."""
        s = self.spec
        return {"model": self.fingerprint["model"], "inputs": self.fingerprint["inputs"],
                "columns": {"text": s.text_column, "text_pair": s.text_pair_column,
                            "ids": s.ids_column, "mask": s.mask_column,
                            "segment": s.segment_column, "keys": self.key_columns},
                "vocab": self.fingerprint.get("vocab"), "lower_case": s.lower_case,
                "max_seq": s.max_seq, "truncate": s.truncate, "outputs": self.outputs,
                "parts": [[p.file, *p.groups, p.offset, p.first_row, p.rows]
                          for p in self.parts]}


def _maybe_int(name: str, value: Any, low: int) -> int | None:
    return None if value is None else check_int(name, value, low)


def _names(name: str, value: Any) -> list[str]:
    """A comma-separated str or a sequence of str, as a list (no empty names, no repeats)."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not all(isinstance(v, str) and v.strip()
                                                  for v in items):
        raise BertfuseError(f"{name} must be column names (a list or 'a,b'), not {value!r}")
    items = [v.strip() for v in items]
    if len(set(items)) != len(items):
        raise BertfuseError(f"{name} names a column twice: {items}")
    return items


def _column(name: str, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise BertfuseError(f"{name} must be a column name, not {value!r}")
    return value


def _stamp(path: str) -> dict[str, Any]:
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def build_job(model: Any, input: Any, output: Any, *, text_column: Any = None,
              text_pair_column: Any = None, vocab: Any = None, lower_case: Any = None,
              truncate: Any = False, ids_column: Any = None, mask_column: Any = None,
              segment_column: Any = None, key_columns: Any = None, outputs: Any = None,
              max_seq: Any = None, batch_size: Any = DEFAULT_BATCH, actors: Any = None,
              device: Any = "auto", address: Any = None, max_retries: Any = 3,
              part_rows: Any = DEFAULT_PART_ROWS, kernels: Any = "auto",
              stall_s: Any = None, gpus: Any = None) -> ScoreJob:
    """The job for score(...)'s arguments, every one checked (see score/__init__.py)."""
    model, input, output = (check_path(n, v) for n, v in (("model", model), ("input", input),
                                                             ("output", output)))
    vocab = check_path("vocab", vocab, optional=True)
    text_column, text_pair_column, ids_column, mask_column, segment_column = (
        _column(n, v) for n, v in (("text_column", text_column),
                                   ("text_pair_column", text_pair_column),
                                   ("ids_column", ids_column), ("mask_column", mask_column),
                                   ("segment_column", segment_column)))
    if (text_column is None) == (ids_column is None):
        raise BertfuseError("give either a text column (with its vocab) or an ids column")
    if text_column and (mask_column or segment_column):
        raise BertfuseError("mask and segment columns go with an ids column, not text")
    if ids_column and (text_pair_column or vocab):
        raise BertfuseError("a text pair column and a vocab go with a text column, not ids")
    if text_column and vocab is None:  # a text-in model's vocab, written beside it

        vocab = find_vocab(model)
    if text_column and vocab is None:
        raise BertfuseError("a text column needs the checkpoint's vocab.txt (vocab)")
    for flag, value in (("truncate", truncate),):
        if not isinstance(value, bool):
            raise BertfuseError(f"{flag} must be True or False, not {value!r}")
    if lower_case is not None and not isinstance(lower_case, bool):
        raise BertfuseError(f"lower_case must be True, False or None, not {lower_case!r}")
    batch_size = check_int("batch_size", batch_size, 1)
    actors = _maybe_int("actors", actors, 1)
    max_retries = check_int("max_retries", max_retries, 0)
    part_rows = check_int("part_rows", part_rows, 1)
    max_seq = _maybe_int("max_seq", max_seq, 1)
    if stall_s is not None and (isinstance(stall_s, bool) or not isinstance(stall_s, (int, float))
                                or not math.isfinite(stall_s) or stall_s <= 0):
        raise BertfuseError(f"stall_s must be a number of seconds > 0, or None (derived from "
                            f"the job's own waits), not {stall_s!r}")
    if device not in DEVICES:
        raise BertfuseError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    check_kernels_option(kernels)  # ConfigError: one line, before the model is read
    if address is not None and (not isinstance(address, str) or not address):
        raise BertfuseError(f"address must be a Ray address ('auto', 'ray://host:10001'), "
                            f"not {address!r}")
    if gpus is not None and actors is not None:
        raise BertfuseError("give gpus or actors, not both: gpus N runs an actor on each of "
                            "N GPUs")
    plan = host_plan(gpus, device, address)  # before the model is read: one line, exit 2
    keys = _names("key_columns", key_columns)
    facts, names, ranks = _model(model, _names("outputs", outputs))
    positions = facts.max_positions or 512
    if max_seq is None:
        max_seq = positions
    elif max_seq > positions:
        raise BertfuseError(f"max_seq {max_seq} is longer than the model's {positions} positions")
    fingerprint = {"model": _stamp(model)}
    # Every package the job needs, in one line where several are missing (run_job: ray).
    require("ray", "onnxruntime", *(("tokenizers",) * bool(text_column)))
    if text_column:
        lower_case, fingerprint["vocab"] = _vocab(vocab, model, lower_case, max_seq)
    spec = InputSpec(max_seq, text_column, text_pair_column, vocab and os.path.abspath(vocab),
                     lower_case, truncate, ids_column, mask_column, segment_column,
                     facts.vocab_size, facts.type_vocab_size)
    files = input_files(input)
    _check_columns(files, spec, keys, names)
    parts, rows = plan_parts(files, part_rows)
    fingerprint["inputs"] = [{**_stamp(f), "rows": n} for f, n in _file_rows(files)]
    return ScoreJob(model, input, output, files, spec, keys, names, ranks, parts, rows,
                    batch_size, actors, device, address, max_retries, part_rows, fingerprint,
                    kernels, None if stall_s is None else float(stall_s), plan)


def _model(model: str, wanted: list[str]):
    """The model's facts, the outputs written (default pooled_output where the model has it,
    else every per-row output) and their ranks."""
    if os.path.exists(model) and not os.path.isfile(model):
        raise BertfuseError(f"{model}: not a regular file")
    proto = servable_model(model)  # ConfigError (a BertfuseError) names what is wrong
    facts = model_facts(proto)
    check_canonical(facts)
    ranks = {o.name: len(o.type.tensor_type.shape.dim) for o in proto.graph.output}
    if wanted:
        unknown = [n for n in wanted if n not in ranks]
        if unknown:
            raise BertfuseError(f"{model} has no output {unknown[0]!r} (it has "
                                f"{', '.join(ranks)})")
    elif "pooled_output" in ranks:
        wanted = ["pooled_output"]
    else:
        wanted = [n for n, r in ranks.items() if r <= 2] or list(ranks)
    bad = [n for n in wanted if not 1 <= ranks[n] <= 3]
    if bad:
        raise BertfuseError(f"output {bad[0]!r} has rank {ranks[bad[0]]}: score writes "
                            "[batch], [batch, n] or [batch, seq, n] outputs")
    return facts, wanted, {n: ranks[n] for n in wanted}


def _vocab(vocab: str, model: str, lower_case: bool | None, max_seq: int):
    """The vocab checked against the model (WordPiece raises one line), and the lower-casing
    it resolves to, so every actor tokenizes alike."""
    tok = WordPiece(vocab, lower_case=lower_case, max_length=max_seq, model=model)
    return tok.lower_case, _stamp(vocab)


def input_files(input: str) -> list[str]:
    """A Parquet file, or a directory's *.parquet files (recursively, sorted; names starting
    with '.' or '_' skipped, as Arrow's datasets do)."""
    path = Path(input)
    if not path.exists():
        raise BertfuseError(f"{input}: no such file or directory")
    if path.is_dir():
        files = sorted(str(p) for p in path.rglob("*.parquet")
                       if not any(part.startswith((".", "_"))
                                  for part in p.relative_to(path).parts) and p.is_file())
        if not files:
            raise BertfuseError(f"{input}: no .parquet files in this directory")
        return files
    if not path.is_file():
        raise BertfuseError(f"{input}: not a regular file or a directory")
    return [str(path)]


def _metadata(path: str):
    pq = optional("pyarrow.parquet", why="Parquet (ray extra)")

    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # ArrowInvalid, OSError: not Parquet, truncated, unreadable
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise BertfuseError(f"{path}: not a readable Parquet file ({why})") from None


def _file_rows(files: list[str]) -> list[tuple[str, int]]:
    return [(f, _metadata(f).metadata.num_rows) for f in files]


def _check_columns(files: list[str], spec: InputSpec, keys: list[str], outputs: list[str]) -> None:
    """Every file has the columns, of types that can be scored."""
    pa = optional("pyarrow", why="Parquet (ray extra)")

    kinds = {spec.text_column: "text", spec.text_pair_column: "text", spec.ids_column: "ids",
             spec.mask_column: "ids", spec.segment_column: "ids"}
    kinds.pop(None, None)
    clash = set(outputs) & set(keys or ["row"])
    if clash:
        raise BertfuseError(f"key column {sorted(clash)[0]!r} has an output's name")
    for f in files:
        schema = _metadata(f).schema_arrow
        for name in [*kinds, *keys]:
            if schema.get_field_index(name) < 0:
                raise BertfuseError(f"{f}: no column {name!r} (it has "
                                    f"{', '.join(schema.names[:20])})")
        for name, kind in kinds.items():
            t = schema.field(name).type
            if kind == "text" and not (pa.types.is_string(t) or pa.types.is_large_string(t)):
                raise BertfuseError(f"{f}: column {name!r} is {t}, text columns are strings")
            if kind == "ids" and not ((pa.types.is_list(t) or pa.types.is_large_list(t)
                                       or pa.types.is_fixed_size_list(t))
                                      and pa.types.is_integer(t.value_type)):
                raise BertfuseError(f"{f}: column {name!r} is {t}, id columns are lists of "
                                    "integers")


def plan_parts(files: list[str], part_rows: int) -> tuple[list[Part], int]:
    """Consecutive whole row groups of each file, about `part_rows` rows a part; a row group
    larger than that is cut into parts of `part_rows` rows. Deterministic: the same files give
    the same parts."""
    parts: list[Part] = []
    total = 0

    def add(fi: int, g0: int, g1: int, offset: int, rows: int) -> None:
        nonlocal total
        if rows:
            parts.append(Part(len(parts), fi, (g0, g1), offset, total, rows))
            total += rows

    for fi, path in enumerate(files):
        meta = _metadata(path).metadata
        start, rows = 0, 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            if n > part_rows:
                add(fi, start, g, 0, rows)
                for offset in range(0, n, part_rows):
                    add(fi, g, g + 1, offset, min(part_rows, n - offset))
                start, rows = g + 1, 0
                continue
            rows += n
            if rows >= part_rows:
                add(fi, start, g + 1, 0, rows)
                start, rows = g + 1, 0
        add(fi, start, meta.num_row_groups, 0, rows)
    return parts, total
