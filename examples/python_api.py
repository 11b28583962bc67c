"""The Python API: convert a TF BERT with bertfuse.pipeline, then serve it with onnxruntime.

    .venv/bin/python examples/python_api.py [SOURCE]

Without SOURCE, a tiny example checkpoint is written to a temporary directory first. The
batch is padded the way a server pads it: sentences of different lengths, zeros after the
end, input_mask 0 there. Each sentence's outputs must not depend on the padding around it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads

from bertfuse.pipeline import ConvertOptions, convert  # noqa: E402


def pad_batch(sentences: list[list[int]]) -> dict[str, np.ndarray]:
    seq = max(len(s) for s in sentences)
    ids = np.zeros((len(sentences), seq), np.int32)
    mask = np.zeros((len(sentences), seq), np.int32)
    for row, tokens in enumerate(sentences):
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="bertfuse-api-"))
    if len(sys.argv) > 1:
        source = sys.argv[1]
    else:
        from bertfuse.converter.example import write_example

        source = str(write_example("tiny", str(work / "tiny"), seed=0))
    out = work / "model.onnx"

    # 1. Convert: export, fusion passes, checks, parity with TF; written only if it passed.
    report = convert(source, str(out), ConvertOptions(opset=17, seed=0))
    for stage in report.stages:
        print(f"{stage.name:<34} {stage.seconds:6.2f}s  {stage.detail}")
    print("parity ok:", report.parity.ok, "| written:", report.written, out)

    # 2. Serve: onnxruntime on a padded batch (CUDAExecutionProvider with onnxruntime-gpu).
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    print("inputs:", [(i.name, i.type, i.shape) for i in session.get_inputs()])
    print("outputs:", [o.name for o in session.get_outputs()])
    rng = np.random.default_rng(0)
    sentences = [list(rng.integers(1, 1000, n)) for n in (12, 5, 9)]
    names = [o.name for o in session.get_outputs()]
    batch = dict(zip(names, session.run(None, pad_batch(sentences))))

    # 3. Padding must not leak: each sentence alone gives the same vectors as in the batch.
    for row, tokens in enumerate(sentences):
        alone = dict(zip(names, session.run(None, pad_batch([tokens]))))
        n = len(tokens)
        seq_diff = np.abs(batch["sequence_output"][row, :n] - alone["sequence_output"][0]).max()
        pool_diff = np.abs(batch["pooled_output"][row] - alone["pooled_output"][0]).max()
        print(f"sentence {row} ({n:2d} tokens): max |batched - alone| "
              f"sequence {seq_diff:.2e}, pooled {pool_diff:.2e}")
        assert seq_diff < 1e-4 and pool_diff < 1e-4, "padding changed the result"
    print("ok: padded batch == sentences run alone")


if __name__ == "__main__":
    main()
