#!/usr/bin/env bash
# Text in, embeddings out, and the same model as a Triton model repository.
#   examples/text_and_triton.sh            # tiny: seconds on a laptop
# With a Google checkpoint: its vocab.txt (uncased_L-12_H-768_A-12/vocab.txt) instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${BIN:-$( [ -x .venv/bin/bertfuse ] && echo .venv/bin || dirname "$(command -v bertfuse)" )}
OUT=${OUT:-out/examples}
mkdir -p "$OUT"

# 1. The example checkpoint comes with a vocab.txt of its vocab size; convert it.
"$BIN/bertfuse" example --config tiny -o "$OUT/tiny"
"$BIN/bertfuse" convert "$OUT/tiny" -o "$OUT/tiny.onnx" --json > /dev/null

# 2. Text -> word pieces and ids ([CLS] A [SEP] B [SEP], segment ids 0 then 1).
"$BIN/bertfuse" tokenize --vocab "$OUT/tiny/vocab.txt" --model "$OUT/tiny.onnx" \
    "What is BERT?" --pair "A language model for search."

# 3. Text -> embeddings in Python: the tokenizer's int32 arrays go straight to a Session.
OUT="$OUT" "$BIN/python" - <<'PY'
import os
import numpy as np
from bertfuse import Session
from bertfuse.text import WordPiece

out = os.environ["OUT"]
tok = WordPiece(f"{out}/tiny/vocab.txt", model=f"{out}/tiny.onnx")  # lower-casing, max length
batch = tok(["the quick brown fox", "a lazy dog sleeps", "what is machine learning?"])
with Session(f"{out}/tiny.onnx", max_batch=4, max_seq=32, device="cpu") as sess:
    seq = sess.run(**batch.feeds(), outputs=["sequence_output"])["sequence_output"]
mask = batch.input_mask[..., None]
emb = (seq * mask).sum(1) / mask.sum(1)  # mean over each text's own tokens
emb /= np.linalg.norm(emb, axis=1, keepdims=True)
print("embeddings", emb.shape, "cosine similarities:\n", np.round(emb @ emb.T, 3))
PY

# 4. A Triton model repository for the onnxruntime backend (NVIDIA's Triton container):
#    docker run --gpus all -v $PWD/$OUT/model_repository:/models nvcr.io/nvidia/tritonserver:<ver>-py3 \
#        tritonserver --model-repository=/models
"$BIN/bertfuse" export-triton "$OUT/tiny.onnx" -o "$OUT/model_repository" --name bert \
    --max-batch 32 --force
cat "$OUT/model_repository/bert/config.pbtxt"
