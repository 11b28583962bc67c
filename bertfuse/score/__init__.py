"""Offline scoring on Ray Data: a Parquet input through bertfuse Sessions in an actor pool
(one Session per actor, a GPU each where there are GPUs), Parquet out.

    from bertfuse.score import score
    summary = score(model="model.onnx", input="docs.parquet", output="scored/",
                    text_column="text", vocab="vocab.txt", key_columns=["doc_id"])

Rooms, importing only downwards: rows (rows -> model inputs, rejects) -> output (the output
directory, commits, restart) -> spec (options, model, input, parts) -> actor (read task,
scoring actor) -> placement (the device, the actors) -> job (Ray, the pipeline, the summary) -> command (the CLI). Importing this
package imports neither Ray nor ONNX Runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from bertfuse.errors import BertfuseError

if TYPE_CHECKING:
    from bertfuse.score.job import ScoreSummary


def score(model: Any, input: Any, output: Any, *, text_column: str | None = None,
          text_pair_column: str | None = None, vocab: Any = None, lower_case: bool | None = None,
          truncate: bool = False, ids_column: str | None = None, mask_column: str | None = None,
          segment_column: str | None = None, key_columns: Any = None, outputs: Any = None,
          max_seq: int | None = None, batch_size: int = 32, actors: int | None = None,
          device: str = "auto", address: str | None = None, max_retries: int = 3,
          part_rows: int = 8192, kernels: str = "auto", stall_s: float | None = None,
          gpus: int | str | None = None, progress: bool = True,
          status: Callable[[str], None] | None = None) -> "ScoreSummary":
    """Scores every row of `input` (a Parquet file or a directory of them) into `output`
    (a directory: scores/, rejects/, a manifest); returns a ScoreSummary.

    Input: `text_column` (+ `text_pair_column`) tokenized with `vocab`, or `ids_column`
    (+ `mask_column`, `segment_column`: lists of integers). `key_columns` are carried beside
    the outputs (default: a `row` column, the input row number). `outputs`: model outputs
    written (default pooled_output). `max_seq`: longer rows are rejected (text: cut to fit
    with truncate=True). `batch_size`: rows per Session run (the runtime's largest batch
    bucket). `actors`: default one per GPU, else half the CPUs. `address`: join a Ray
    cluster ('auto'); default a local Ray, or the one this process already initialized.
    `part_rows`: rows per output file (whole Parquet row groups), the unit of restart.
    `kernels`: each actor's Session's ('auto', 'ort', 'bertfuse': runtime/kernel_choice.py); the
    summary's `kernels` says what the first actor chose. `stall_s`: the longest wait between
    two blocks of scored rows before the run on Ray is cancelled and the parts not yet
    written run again, as after a lost node (default None: 10x the longest such wait so far,
    at least 120 s); a run's first rows may take 3x the longest start-up so far, 600 s
    before any came back (score/watch.py). `gpus`: whole GPUs of this host (N, or 'all'),
    an actor on each (the first N that CUDA sees; the local Ray only, not with `actors`;
    bertfuse/gpu_plan.py); the summary's `gpus` gives the plan. `progress`: Ray Data's progress
    bars. `status`: called with each stage's name as it starts ('plan', 'ray cluster',
    'score'; the CLI's progress lines).
    Bad arguments or input raise BertfuseError before Ray starts."""
    from bertfuse.score.job import run_job  # lazy: loads pyarrow at import
    from bertfuse.score.spec import build_job  # lazy: loads pyarrow at import

    if not isinstance(progress, bool):
        raise BertfuseError(f"progress must be True or False, not {progress!r}")
    if status is not None:
        status("plan")
    job = build_job(model, input, output, text_column=text_column,
                    text_pair_column=text_pair_column, vocab=vocab, lower_case=lower_case,
                    truncate=truncate, ids_column=ids_column, mask_column=mask_column,
                    segment_column=segment_column, key_columns=key_columns, outputs=outputs,
                    max_seq=max_seq, batch_size=batch_size, actors=actors, device=device,
                    address=address, max_retries=max_retries, part_rows=part_rows,
                    kernels=kernels, stall_s=stall_s, gpus=gpus)
    return run_job(job, progress, status)


__all__ = ["score"]
