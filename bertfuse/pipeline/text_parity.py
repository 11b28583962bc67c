"""A text-in SavedModel's own path on text, beside the parity on random ids.

    sample texts (seeded, from the vocab's words) ─► the SavedModel's tokenizer ─► its ids
        ├─► the ONNX model ───────────────────────────────┐
        │                                                 ├─► "on text: OUTPUT" rows
        ├─► the SavedModel's own outputs on the texts ────┘   (its serving signature; the cut
        │                                                     graph on its ids where TF runs
        │                                                     with oneDNN on in this process)
        └─► bertfuse.text's WordPiece on the vocab asset ─► "on text: token ids" row: equal
            to the SavedModel's ids, mask and segment ids, or the vocab written beside the
            model would tokenize otherwise than the SavedModel did

After the write, the vocab goes beside the model (text.vocab_beside: MODEL.vocab.txt), where
serve, score and verify --text-file find it.
"""

from __future__ import annotations

import numpy as np

from bertfuse.pipeline.parity import OutputParity, Tolerance, compare_output
from bertfuse.converter import reference
from bertfuse.converter.text_front import sample_texts, vocab_text
from bertfuse.io.safety import check_output
from bertfuse.io.sidecars import vocab_beside, write_vocab as write
from bertfuse.pipeline.parity import ort_session, run_onnx
from bertfuse.text import WordPiece

N_TEXTS = 8


def text_rows(model, source, tol: Tolerance, seed: int | None) -> list[OutputParity]:
    """The "on text" parity rows for a source cut off its tokenizer (source.text)."""
    front = source.text
    texts = sample_texts(front.vocab_file, N_TEXTS, seed or 0)
    packed = front.packed(texts)
    feeds = {role: packed[t.split(":")[0]] for role, t in source.inputs.items()}
    zeros = np.zeros_like(feeds["input_ids"])
    feeds = {r: feeds.get(r, zeros) for r in ("input_ids", "input_mask", "segment_ids")}
    ours = run_onnx(ort_session(model), feeds)
    if reference.in_process():
        own = front.outputs(texts)
        theirs = {name: own.get(source.original_names.get(name, name)) for name in source.outputs}
    else:
        theirs = source.run(feeds)
    rows = [compare_output(f"on text: {name}", theirs[name], ours.get(name), tol)
            for name in source.outputs]
    return [_token_row(front, texts, feeds), *rows]


def _token_row(front, texts: list[str], feeds: dict[str, np.ndarray]) -> OutputParity:
    """bertfuse.text on the vocab asset against the SavedModel's own packing."""
    tok = WordPiece(front.vocab_file, lower_case=front.lower_case,
                    max_length=front.seq or None)
    batch = tok(texts, pad_to=front.seq).feeds()
    name = "on text: token ids (the vocab vs the SavedModel's tokenizer)"
    if any(batch[r].shape != feeds[r].shape for r in batch):
        return OutputParity(name, np.inf, np.inf, False,
                            note=f"rows of {batch['input_ids'].shape[1]} tokens against the "
                                 f"SavedModel's {feeds['input_ids'].shape[1]}")
    diff = np.concatenate([np.abs(batch[r].astype(np.int64) - feeds[r]).ravel() for r in batch])
    wrong = int(np.count_nonzero(diff))
    return OutputParity(name, float(diff.max()), float(wrong / diff.size), wrong == 0,
                        note=f"{wrong} of {diff.size} ids differ" if wrong else "")


def write_vocab(front, out_path: str) -> str:
    """The vocab asset's bytes beside the written model (MODEL.vocab.txt); its path."""
    return write(out_path, vocab_text(front.vocab_file))


def begin(front, stage, out_path: str | None, inputs: tuple[list[str], list[str]]) -> dict:
    """At the load: the stage's detail, the vocab's target checked like the model's (none of
    the source's files), and the report's `text` entry."""
    stage.detail += ", tokenizer cut off"
    if out_path is not None:
        check_output(str(vocab_beside(out_path)), *inputs, model=False)
    return describe(front)


def describe(front) -> dict:
    """The report's `text` entry: what was cut off and where the encoder starts."""
    return {"tokenizer": "tensorflow-text (" + ", ".join(front.ops) + ")",
            "lower_case": front.lower_case, "seq": front.seq,
            "cut_at": dict(front.replaced), "vocab_asset": str(front.vocab_file), "vocab": None}
