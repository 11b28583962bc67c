"""The output directory: what is done is never written twice, and nothing of the user's is
touched.

    OUT/_bertfuse_score.json       the job (model, input files, columns, parts); complete+counts
    OUT/_bertfuse_score.lock       held (flock) by the job writing OUT
    OUT/scores/part-00000.parquet  key columns (or `row`) + outputs, one file per input part
    OUT/rejects/part-00000.parquet key columns (or `row`) + reason, where the part had rejects

A part is committed by writing each file to a temp name beside it and renaming it into place,
rejects first and scores last: a part is complete exactly when its scores file exists. A
restarted job (same model, input, columns, outputs) skips complete parts and redoes the rest;
a job killed mid-write leaves only `.part-*.tmp` files, removed when the next run starts.
A complete part whose footer cannot be read, or whose row count is not the part's, was
damaged since: named and redone (damage.py).
OUT must be absent, an empty directory, or such a job's output; never an input, never inside
an input directory, never holding the model or vocab.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
import fcntl

import numpy as np

from bertfuse.errors import BertfuseError
from bertfuse.io.safety import replace_file, temp_file, write_text
from bertfuse.score.damage import part_damage
from bertfuse.optional import optional

MANIFEST = "_bertfuse_score.json"
LOCK = "_bertfuse_score.lock"
FORMAT = 1
ROW = "_bf_row"
PART = "_bf_part"
REJECT = "_bf_reject"


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


class OutputDir:
    """OUT checked and opened for a job (`job` is a spec.ScoreJob)."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.root = Path(job.output)
        self.scores, self.rejects = self.root / "scores", self.root / "rejects"
        self.damaged: list[str] = []  # start(): complete parts found damaged, why each
        self._check_paths()

    def _check_paths(self) -> None:
        out = os.path.realpath(self.root)
        if self.root.is_symlink() or (self.root.exists() and not self.root.is_dir()):
            raise BertfuseError(f"{self.root}: not a directory; the output is a directory "
                                "(OUT/scores/*.parquet)")
        parent = os.path.dirname(out)
        if not os.path.isdir(parent):
            raise BertfuseError(f"{self.root}: its parent directory {parent} does not exist")
        job = self.job
        read = [job.model, *job.files] + ([job.spec.vocab] if job.spec.vocab else [])
        for path in [job.input, *read]:
            real = os.path.realpath(path)
            if _within(real, out):
                raise BertfuseError(f"{self.root}: holds the input {path}; write the output "
                                    "to a new directory")
            if os.path.isdir(real) and _within(out, real):
                raise BertfuseError(f"{self.root}: is inside the input directory {path}; "
                                    "write the output elsewhere")

    @contextmanager
    def locked(self) -> Iterator[None]:
        """OUT created if absent, and held (flock on OUT/_bertfuse_score.lock) while the job
        runs: a second job writing to the same OUT at once is refused, not interleaved. A
        killed job's lock goes with its process."""
        manifest = self.root / MANIFEST
        if self.root.exists() and not manifest.is_file() and \
                any(p.name != LOCK for p in self.root.iterdir()):
            raise BertfuseError(f"{self.root}: not empty and not a bertfuse score output; "
                                "refusing to write into it (give a new or empty directory)")
        self.root.mkdir(exist_ok=True)
        lock = self.root / LOCK
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # the lock file is removed on the way out (below): a holder that got the
                # file just before its removal holds a name nobody else can open
                if os.fstat(fd).st_ino != os.stat(lock).st_ino:
                    raise BlockingIOError
            except (BlockingIOError, FileNotFoundError):
                raise BertfuseError(f"{self.root}: another bertfuse score is writing to it; "
                                    "wait for it to end, or give another --output") from None
            try:
                yield
            finally:
                lock.unlink(missing_ok=True)  # still held: no one else locks it meanwhile
        finally:
            os.close(fd)

    def start(self) -> set[int]:
        """Opens OUT (locked) for this job, resuming it; returns the parts already complete."""
        job = self.job
        manifest = self.root / MANIFEST
        if manifest.is_file():
            try:
                old = json.loads(manifest.read_text())
            except (OSError, ValueError):
                raise BertfuseError(f"{manifest}: unreadable; not resuming into it") from None
            if old.get("format") != FORMAT or old.get("job") != job.identity():
                diff = _first_difference(old.get("job") or {}, job.identity())
                raise BertfuseError(f"{self.root}: holds the output of a different job "
                                    f"({diff} differs); give a new --output to score this one")
        for d in (self.scores, self.rejects):
            d.mkdir(exist_ok=True)
        self.clean_temps()
        done = {p.index for p in job.parts if (self.scores / part_name(p.index)).is_file()}
        for index in sorted(done):  # a complete part damaged since (damage.py): redone
            scores = self.scores / part_name(index)
            why = part_damage(scores, self.rejects / part_name(index), job.parts[index].rows)
            if why:
                self.damaged.append(f"{why}; its {job.parts[index].rows} rows are scored again")
                done.discard(index)
                with writing(scores):
                    scores.unlink()
        for p in job.parts:  # a rejects file without its scores file: that part is redone
            if p.index not in done and (self.rejects / part_name(p.index)).exists():
                (self.rejects / part_name(p.index)).unlink()
        if not manifest.is_file():
            self.write_manifest({})
        return done

    def write_manifest(self, summary: dict[str, Any]) -> None:
        body = {"format": FORMAT, "job": self.job.identity(), **summary}
        with writing(self.root / MANIFEST):
            write_text(self.root / MANIFEST, json.dumps(body, indent=1) + "\n")

    def clean_temps(self) -> None:
        """Temp files a killed run left behind (ours by name: `.part-NNNNN.parquet.*.tmp`)."""
        for d in (self.scores, self.rejects, self.root):
            if d.is_dir():
                for p in d.glob(".*.tmp"):
                    if p.name.startswith((".part-", f".{MANIFEST}.")) and p.is_file():
                        p.unlink(missing_ok=True)

    def commit(self, index: int, pieces: list, stages: Any = None) -> tuple[int, int]:
        """Writes one complete part from its pieces (Arrow tables): (rows scored, rows
        rejected). Its rows are checked to be exactly the part's rows, once each (a bug
        otherwise: never a silent loss). `stages` (stages.Stages) gets the time it took."""
        pa = optional("pyarrow", why="Parquet (ray extra)")
        pc = optional("pyarrow.compute", why="Parquet (ray extra)")

        t0 = time.perf_counter()
        part = self.job.parts[index]
        # Pieces are runs of consecutive rows: in order of their first row, no row sort.
        table = pa.concat_tables(sorted(pieces, key=lambda t: t.column(ROW)[0].as_py()))
        rows = table.column(ROW).to_numpy()
        expect = np.arange(part.first_row, part.first_row + part.rows)
        if not np.array_equal(rows, expect):
            table = table.sort_by(ROW)
            rows = table.column(ROW).to_numpy()
            if not np.array_equal(rows, expect):
                raise RuntimeError(f"part {index}: got {len(rows)} rows "
                                   f"({len(np.unique(rows))} distinct) for its {part.rows}")
        rejected = table.column(REJECT).is_valid()
        keys = self.job.key_columns or [ROW]
        named = {ROW: "row"}
        any_rejected = pc.any(rejected).as_py()
        scored = (table.filter(pc.invert(rejected)) if any_rejected else table) \
            .select(keys + self.job.outputs)
        scored = scored.rename_columns([named.get(n, n) for n in scored.column_names])
        t1 = time.perf_counter()
        if any_rejected:
            bad = table.filter(rejected)
            bad = pa.table({**{named.get(k, k): bad.column(k) for k in keys},
                            "reason": bad.column(REJECT)})
            _write(self.rejects / part_name(index), bad)
        _write(self.scores / part_name(index), scored, plain=self.job.outputs)
        if stages is not None:
            stages.add("commit_gather", t1 - t0)
            stages.add("commit_write", time.perf_counter() - t1)
        return scored.num_rows, table.num_rows - scored.num_rows

    def counts(self) -> tuple[int, int]:
        """(rows scored, rows rejected) over every part file in OUT (the footers only)."""
        pq = optional("pyarrow.parquet", why="Parquet (ray extra)")

        def rows(d: Path) -> int:
            return sum(pq.ParquetFile(p).metadata.num_rows for p in d.glob("part-*.parquet"))
        return rows(self.scores), rows(self.rejects)


def write_options(table: Any, plain: list[str] = ()) -> dict[str, Any]:
    """pyarrow.parquet.write_table's options for `table`. `plain` columns (float outputs) get
    no statistics (min/max of embeddings serve no reader and cost the writer) and a dictionary
    only where their values are float16 ones (an fp16 model's outputs: a few thousand distinct
    values, the file half the size of plain floats); on full float32 values a dictionary never
    pays and slows the writer."""
    others = [n for n in table.column_names if n not in plain]
    fp16 = [_leaf(table.schema.field(n)) for n in plain
            if n in table.column_names and _float16_values(table.column(n))]
    return {"use_dictionary": others + fp16, "write_statistics": others}


def _leaf(field: Any) -> str:
    """The Parquet column path of a (nested) list field's values: `name.list.element...`."""
    pa = optional("pyarrow", why="Parquet (ray extra)")

    path, t = field.name, field.type
    while pa.types.is_list(t) or pa.types.is_large_list(t):
        path, t = path + ".list.element", t.value_type
    return path


def _float16_values(column: Any) -> bool:
    """Whether a list<float> column's values (its first chunk: the encoding is a choice, not a
    result) are float16 ones, i.e. float32 with the 13 low mantissa bits clear."""
    pa = optional("pyarrow", why="Parquet (ray extra)")

    chunk = next((c for c in column.chunks if len(c)), None)
    if chunk is None or not (pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type)):
        return False
    while pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type):
        chunk = chunk.flatten()
    if chunk.type != pa.float32() or chunk.null_count or not len(chunk):
        return False
    return not (chunk.to_numpy().view(np.uint32) & 0x1FFF).any()


def _write(path: Path, table: Any, plain: list[str] = ()) -> None:
    """A Parquet file by temp and rename."""
    pq = optional("pyarrow.parquet", why="Parquet (ray extra)")

    with writing(path), temp_file(path) as tmp:
        pq.write_table(table, tmp, **write_options(table, plain))
        replace_file(tmp, path)


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """A failed write (a full disk, a quota) is one line naming the file it was writing."""
    try:
        yield
    except OSError as exc:
        raise BertfuseError(f"{path}: cannot write it ({exc.strerror or exc}); the complete "
                            "parts are kept: free space and run the same command to resume") \
            from None


def _within(path: str, directory: str) -> bool:
    try:
        return os.path.commonpath([path, directory]) == directory
    except ValueError:
        return False


def _first_difference(old: dict, new: dict) -> str:
    for key in new:
        if old.get(key) != new[key]:
            return {"inputs": "the input", "parts": "the parts (--part-rows)"}.get(key, key)
    return "the output format"
