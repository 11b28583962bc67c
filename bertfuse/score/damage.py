"""A complete part that is no longer whole: found when a job resumes, named, and redone.

A part is complete when its scores file exists (output.py). A file damaged after its job
wrote it (truncated by a full disk elsewhere, a copy cut short, its footer overwritten) still
exists: without this check a rerun skipped the part and then failed reading its footer
(`ArrowInvalid: Parquet magic bytes not found`, naming no file), on every rerun.

    scores/part-N.parquet (+ rejects/part-N.parquet) ─► footer readable (magic bytes at both
        ends, metadata parses) ─► scored + rejected rows == the part's rows in the job plan
        ─► else: both files removed, the part scored again (one line naming the file)

Only footers are read (a few KB a file): a part whose data pages alone are damaged is not
detected here; reading every column back on each resume would cost as much as writing it.
"""

from __future__ import annotations

from pathlib import Path

from bertfuse.optional import optional


def part_damage(scores: Path, rejects: Path, rows: int) -> str | None:
    """Why the complete part (`scores`, and `rejects` where it exists) is not whole, or None:
    a footer that cannot be read, or a row count other than the part's `rows`."""
    pa = optional("pyarrow", why="Parquet (ray extra)")
    pq = optional("pyarrow.parquet", why="Parquet (ray extra)")

    found = 0
    for path in (scores, rejects):
        if path is not scores and not path.exists():
            continue
        try:
            found += pq.ParquetFile(path).metadata.num_rows
        except (pa.ArrowException, OSError) as exc:
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            return f"{path}: unreadable ({why})"
    if found != rows:
        return f"{scores}: holds {found} rows (scores and rejects) for the part's {rows}"
    return None
