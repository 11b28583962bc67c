"""The work inside Ray: reading a part of the input, and the scoring actor.

    read_parts (Ray task)  part descriptors ─► the part's row groups (input and key columns),
                                               with _bf_part and _bf_row
    Scorer (Ray actor)     one bertfuse Session per actor (a GPU each where there are GPUs),
                           built, warmed and run on the actor's own session thread;
                           a batch ─► rows.py (rejects) ─► sorted by length, runs of max_batch
                           ─► Session.run ─► outputs back in row order, Arrow list<float>
                           (+ its stage times, stages.py, and its Session's KernelChoice as
                           JSON in the first row of KERNELS: the driver reports the first)

Neither imports Ray: Ray Data calls them. `score_table` is also the single-process loop the
benchmark compares against.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable
import json

import numpy as np

from bertfuse.gpu_plan import GpuPlan, pin_to_gpu
from bertfuse.score.output import PART, REJECT, ROW
from bertfuse.score.rows import InputSpec, Prepared, RowPreparer
from bertfuse.score.stages import Stages, actor_columns
from bertfuse.optional import optional
from bertfuse.runtime import Session, SessionPool

pa = optional("pyarrow", why="Parquet (ray extra)")

CRASH_ENV = "BERTFUSE_TEST_SCORE_CRASH"  # tests: FLAGFILE:N, see Scorer._maybe_crash
HANG_ENV = "BERTFUSE_TEST_SCORE_HANG"  # tests: FLAGFILE:N, the same but the call never returns
KERNELS = "_bf_kernels"  # never written: commit selects the key and output columns


class UnreadableInput(ValueError):
    """The input itself cannot be read (not the cluster): the driver reports it as bad input,
    exit 2, not as a failure worth rerunning."""


def read_parts(batch: dict[str, np.ndarray], files: list[str], columns: list[str]) -> pa.Table:
    """The rows of the parts described in `batch` (part, file, group_start, group_stop,
    offset, rows, first_row), tagged with their part and input row number."""
    tables = []
    for part, fi, g0, g1, offset, rows, first in zip(
            *(batch[k] for k in ("part", "file", "group_start", "group_stop", "offset", "rows",
                                 "first_row"))):
        path = files[int(fi)]
        try:
            t = _read_rows(path, range(int(g0), int(g1)), int(offset), int(rows), columns)
        except (OSError, pa.ArrowException) as exc:  # bad pages, a file changed under the job
            raise UnreadableInput(f"{path}: row groups {int(g0)}..{int(g1) - 1} cannot be read "
                                  f"({str(exc).strip().splitlines()[0][:200]})") from None
        t = t.append_column(PART, pa.array(np.full(t.num_rows, int(part), np.int64)))
        tables.append(t.append_column(ROW, pa.array(np.arange(int(first),
                                                              int(first) + t.num_rows))))
    return pa.concat_tables(tables)


def _read_rows(path: str, groups: range, offset: int, rows: int, columns: list[str]
               ) -> pa.Table:
    """Rows offset..offset+rows of these row groups: whole groups read at once, a slice of a
    large group streamed up to its end."""
    pq = optional("pyarrow.parquet", why="Parquet (ray extra)")

    f = pq.ParquetFile(path)
    if offset == 0 and sum(f.metadata.row_group(g).num_rows for g in groups) == rows:
        return f.read_row_groups(groups, columns=columns, use_threads=False)
    pieces, seen = [], 0
    for rb in f.iter_batches(batch_size=65536, row_groups=list(groups), columns=columns,
                             use_threads=False):
        lo, hi = max(offset - seen, 0), min(offset + rows - seen, rb.num_rows)
        if hi > lo:
            pieces.append(rb.slice(lo, hi - lo))
        seen += rb.num_rows
        if seen >= offset + rows:
            break
    return pa.Table.from_batches(pieces, schema=pieces[0].schema if pieces else None)


def output_type(rank: int) -> pa.DataType:
    """[batch] -> float, [batch, n] -> list<float>, [batch, seq, n] -> list<list<float>>."""
    return {1: pa.float32(), 2: pa.list_(pa.float32()),
            3: pa.list_(pa.list_(pa.float32()))}[rank]


def score_table(session: Any, preparer: RowPreparer, table: pa.Table, outputs: list[str],
                ranks: dict[str, int], max_batch: int, times: Stages | None = None,
                on_session: Callable[[Callable[[Any], Any]], Any] | None = None,
                prepare_lock: AbstractContextManager = nullcontext()) -> dict[str, pa.Array]:
    """Each output for every row of `table` (null where rejected), and REJECT: the reason.
    `times` gets the seconds of each stage (stages.ACTOR) added. The model runs as
    on_session(fn) calls fn(session) (default: here, on `session`; the Scorer: on its session
    thread), rows are prepared under `prepare_lock`, outputs converted on the calling thread."""
    times = Stages() if times is None else times
    with prepare_lock, times.timed("prepare"):
        prep = preparer(table)

    def run(s: Any) -> dict[str, Any]:
        with times.timed("model"):
            return _run(s, prep, outputs, max_batch)
    got = on_session(run) if on_session is not None else run(session)
    with times.timed("convert"):
        return _columns(prep, got, table.num_rows, outputs, ranks)


def _columns(prep: Prepared, got: dict[str, Any], n: int, outputs: list[str],
             ranks: dict[str, int]) -> dict[str, pa.Array]:
    ok = np.zeros(n, bool)
    ok[prep.kept] = True
    cols = {name: _arrow(got[name], ranks[name], ok) for name in outputs}
    cols[REJECT] = pa.array(prep.reasons, pa.string())
    return cols


def _run(session: Any, prep: Prepared, outputs: list[str], max_batch: int
         ) -> dict[str, list[np.ndarray] | np.ndarray]:
    """The kept rows through the session in runs of max_batch, shortest first (runs of
    similar length fill the runtime's seq buckets); results in kept-row order."""
    order = np.argsort(prep.lengths, kind="stable")
    kept = len(order)
    res: dict[str, Any] = {}
    for start in range(0, kept, max_batch):
        idx = order[start:start + max_batch]
        width = int(prep.lengths[idx].max())
        out = session.run(prep.ids[idx, :width], prep.mask[idx, :width],
                          prep.segments[idx, :width], outputs=outputs)
        for name in outputs:
            value = out[name]
            if value.ndim == 3:  # per token: each row to its own length
                rows = res.setdefault(name, [None] * kept)
                for j, i in enumerate(idx):
                    rows[i] = value[j, :prep.lengths[i]]
                continue
            if name not in res:
                res[name] = np.zeros((kept, *value.shape[1:]), np.float32)
            res[name][idx] = value
    return {name: res.get(name, np.zeros((0, 0), np.float32)) for name in outputs}


def _arrow(values: Any, rank: int, ok: np.ndarray) -> pa.Array:
    """Kept rows' values as an Arrow column over every row of the batch, null where rejected."""
    n = len(ok)
    mask = pa.array(~ok)
    if rank == 1:
        full = np.zeros(n, np.float32)
        full[ok] = np.asarray(values, np.float32).reshape(-1)
        return pa.array(full, pa.float32(), mask=~ok)
    if rank == 2:
        width = values.shape[1] if ok.any() else 0
        offsets = np.concatenate([[0], np.cumsum(np.where(ok, width, 0))]).astype(np.int32)
        flat = pa.array(np.ascontiguousarray(values, np.float32).reshape(-1))
        return pa.ListArray.from_arrays(pa.array(offsets), flat, mask=mask)
    rows = [np.asarray(v, np.float32) for v in values]
    width = rows[0].shape[1] if rows else 0
    tokens = np.zeros(n, np.int64)
    tokens[ok] = [len(r) for r in rows]
    inner_off = np.arange(0, int(tokens.sum()) * width + 1, max(width, 1), dtype=np.int64) \
        if width else np.zeros(int(tokens.sum()) + 1, np.int64)
    flat = np.concatenate([r.reshape(-1) for r in rows]) if rows else np.zeros(0, np.float32)
    inner = pa.ListArray.from_arrays(pa.array(inner_off.astype(np.int32)), pa.array(flat))
    outer_off = np.concatenate([[0], np.cumsum(tokens)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(outer_off), inner, mask=mask)


class Scorer:
    """The actor Ray Data's map_batches runs: one Session, built once, for every batch.

    The Session lives on a thread of its own (a one-replica SessionPool): it is built, warmed
    and run there, and closed there. Ray Data builds the actor on one thread and calls it on
    others (CALLS_PER_ACTOR calls at once, job.py), while ONNX Runtime's CUDA EP keeps the
    CUDA graphs a warmup captures per thread. Calls overlap: one batch's rows are prepared
    (one call at a time: the tokenizer is not shared across threads) and another's outputs
    converted on the calling threads while the session thread runs a third's."""

    def __init__(self, model: str, spec: InputSpec, keys: list[str], outputs: list[str],
                 ranks: dict[str, int], max_batch: int, device: str,
                 crash: str | None = None, kernels: str = "auto",
                 hang: str | None = None, gpus: GpuPlan | None = None) -> None:
        self.kernels: str | None = None  # the Session's KernelChoice as JSON, set by make()
        pin_to_gpu(gpus)  # before the session's thread and buffers: on its GPU's NUMA node

        def make() -> Session:
            session = Session(model, max_batch=max_batch, max_seq=spec.max_seq, device=device,
                              kernels=kernels)
            self.kernels = json.dumps(session.kernels.to_json())
            return session

        def prepare(session: Session) -> None:
            if device == "cuda":  # capture every bucket now, not on the first batches
                session.warmup()

        self.pool = SessionPool(make, replicas=1, prepare=prepare)
        self.preparer = RowPreparer(spec)
        self.keys, self.outputs, self.ranks, self.max_batch = keys, outputs, ranks, max_batch
        self.crash, self.hang, self.calls = crash, hang, 0
        self._lock, self._prepare_lock = threading.Lock(), threading.Lock()

    def __call__(self, table: pa.Table) -> pa.Table:
        with self._lock:
            self.calls += 1
            call = self.calls
        self._maybe_crash(call)
        self._maybe_crash(call, hang=True)
        times = Stages()
        cols = score_table(None, self.preparer, table, self.outputs, self.ranks, self.max_batch,
                           times, on_session=self.pool.call, prepare_lock=self._prepare_lock)
        carried = {name: table.column(name) for name in (PART, ROW, *self.keys)}
        n = table.num_rows
        choice = pa.array([self.kernels][:n] + [None] * max(n - 1, 0), pa.string())
        return pa.table({**carried, **cols, **actor_columns(times.seconds, table.num_rows),
                         KERNELS: choice})

    def close(self) -> None:
        """Closes the Session on its own thread and ends that thread."""
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.close()

    def __del__(self) -> None:  # Ray Data drops the UDF when the actor pool shuts down
        if not sys.is_finalizing():  # past that, the session thread may never run again
            self.close()

    def _maybe_crash(self, call: int, hang: bool = False) -> None:
        """Tests: with crash='FLAGFILE:N' the first actor to reach its Nth batch while FLAGFILE
        does not exist creates it and dies at once (os._exit: no cleanup, like a lost node);
        with hang='FLAGFILE:N' that call blocks for ever instead (a stall Ray never reports)."""
        how = self.hang if hang else self.crash
        if not how:
            return
        flag, _, nth = how.rpartition(":")
        if call != int(nth):
            return
        try:
            fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        if hang:
            threading.Event().wait()
        os._exit(1)
