"""The Python API: bertfuse.convert, then serve the model with bertfuse.Session.

    .venv/bin/python examples/python_api.py [SOURCE]

Without SOURCE, a tiny example checkpoint is written to a temporary directory first. The
batch is padded the way a server pads it: sentences of different lengths, zeros after the
end, input_mask 0 there. Each sentence's outputs must not depend on the padding around it,
and bertfuse's Session must give what plain ONNX Runtime gives.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads
# What bertfuse sets itself before it imports TensorFlow (docs/convert.md, verify): here the example
# writer below imports TensorFlow first.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import bertfuse  # noqa: E402  (fast: TensorFlow and ONNX Runtime load on first use)


def pad_batch(sentences: list[list[int]]) -> dict[str, np.ndarray]:
    seq = max(len(s) for s in sentences)
    ids = np.zeros((len(sentences), seq), np.int32)
    mask = np.zeros((len(sentences), seq), np.int32)
    for row, tokens in enumerate(sentences):
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}


def main() -> None:
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="bertfuse-api-") as tmp:
        work = Path(tmp)
        if len(sys.argv) > 1:
            source = sys.argv[1]
        else:
            from bertfuse.converter.example import write_example

            source = str(write_example("tiny", str(work / "tiny"), seed=0))
        out = work / "model.onnx"

        # 1. Convert: export, fusion passes, checks, parity with TF. The model is written only
        #    if it passed (a drift raises bertfuse.ParityError, with .report); without an
        #    output it is returned and not written. Bad arguments raise BertfuseError.
        try:
            bertfuse.convert(source, precision="int8")
        except bertfuse.BertfuseError as exc:
            print("refused:", exc)
        model, report = bertfuse.convert(source, out, seed=0, progress=lambda s: None)
        for stage in report.stages:
            print(f"{stage.name:<34} {stage.seconds:6.2f}s  {stage.detail}")
        print("parity ok:", report.parity.ok, "| written:", report.written, out)
        print("fused ops:", sorted({n.op_type for n in model.graph.node}))
        data = report.to_json()  # what `bertfuse convert --json` prints
        print("report schema", data["schema_version"], json.dumps(data["tools"]))

        # 2. Serve with bertfuse's runtime (device="cuda" with onnxruntime-gpu).
        rng = np.random.default_rng(0)
        sentences = [list(rng.integers(1, 1000, n)) for n in (12, 5, 9)]
        feeds = pad_batch(sentences)
        with bertfuse.Session(str(out), max_batch=8, max_seq=64, device="cpu") as sess:
            batch = sess.run(feeds["input_ids"], feeds["input_mask"], feeds["segment_ids"])
            # 3. Padding must not leak: each sentence alone gives the same vectors.
            for row, tokens in enumerate(sentences):
                alone = sess.run(*pad_batch([tokens]).values())
                n = len(tokens)
                seq_diff = np.abs(batch["sequence_output"][row, :n]
                                  - alone["sequence_output"][0]).max()
                pool_diff = np.abs(batch["pooled_output"][row] - alone["pooled_output"][0]).max()
                print(f"sentence {row} ({n:2d} tokens): max |batched - alone| "
                      f"sequence {seq_diff:.2e}, pooled {pool_diff:.2e}")
                assert seq_diff < 1e-4 and pool_diff < 1e-4, "padding changed the result"

        # 4. The same file in plain ONNX Runtime: the interface is input_ids, input_mask,
        #    segment_ids (int32 [batch, seq]) -> sequence_output, pooled_output.
        plain = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        names = [o.name for o in plain.get_outputs()]
        want = dict(zip(names, plain.run(None, feeds)))
        keep = feeds["input_mask"].astype(bool)
        diff = np.abs(batch["sequence_output"][keep] - want["sequence_output"][keep]).max()
        print(f"Session vs plain ORT: max |diff| {diff:.2e}")
        assert diff < 1e-4
    print("ok: padded batch == sentences run alone == plain ONNX Runtime")


if __name__ == "__main__":
    main()
