#!/usr/bin/env bash
# A Hugging Face transformers classifier, from its SavedModel to an HTTP endpoint, on a CPU:
#   TFBertForSequenceClassification.save_pretrained(DIR, saved_model=True)
#   -> bertfuse convert --precision fp16 (fused, checked against TensorFlow)
#   -> bertfuse serve --device cpu -> a client, its logits checked against the model in-process
#   examples/hf_classifier_serve.sh      # 1-2 minutes on 2 cores, Ray's start-up the most
# The SavedModel is made with transformers where it is installed (docs/transformers.md has the
# environment: transformers<5, tf-keras at TensorFlow's minor version); otherwise the tests' own one is used, made by the same recipe
# (tests/fixtures/thirdparty/build_transformers.py: 2 layers, hidden 32, random weights).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${BIN:-$( [ -x .venv/bin/bertfuse ] && echo .venv/bin || dirname "$(command -v bertfuse)" )}
OUT=${OUT:-out/examples}
mkdir -p "$OUT"
rm -rf "$OUT/hf_cls"

# 1. The classifier as a SavedModel (save_pretrained writes it to DIR/saved_model/1; bertfuse
#    converts DIR itself).
"$BIN/python" - "$OUT/hf_cls" <<'PY'
import os, shutil, sys
out = sys.argv[1]
try:
    from transformers import BertConfig, TFBertForSequenceClassification
except ImportError:
    shutil.copytree("tests/fixtures/thirdparty/hf_bert_cls/model",
                    os.path.join(out, "saved_model", "1"))
    print("transformers is not installed: using tests/fixtures/thirdparty/hf_bert_cls/model")
else:
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, num_labels=3)
    model = TFBertForSequenceClassification(cfg)
    model(model.dummy_inputs)
    model.save_pretrained(out, saved_model=True)
    print(f"transformers SavedModel in {out}")
PY

# 2. Fused fp16 ONNX; the parity gate compares it with TensorFlow before it is written.
"$BIN/bertfuse" convert "$OUT/hf_cls" -o "$OUT/hf_cls_fp16.onnx" --precision fp16

# 3. Serve it on the CPU, in the background; its --json line comes once the replica is warm.
PORT=${PORT:-$("$BIN/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
"$BIN/bertfuse" serve "$OUT/hf_cls_fp16.onnx" --device cpu --port "$PORT" --max-batch 4 \
    --max-seq 32 --json > "$OUT/serve.json" 2> "$OUT/serve.log" &
SERVE=$!
trap 'kill -INT $SERVE 2>/dev/null || true; wait $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 600); do
    [ -s "$OUT/serve.json" ] && break
    kill -0 $SERVE 2>/dev/null || { echo "bertfuse serve stopped:"; cat "$OUT/serve.log"; exit 1; }
    sleep 0.5
done
[ -s "$OUT/serve.json" ] || { echo "bertfuse serve never became ready"; exit 1; }

# 4. A client: two requests' logits over HTTP, and the same rows through bertfuse.Session.
OUT="$OUT" "$BIN/python" - <<'PY'
import json, os, urllib.request
import numpy as np
from bertfuse import Session

out = os.environ["OUT"]
served = json.loads(open(f"{out}/serve.json").read().splitlines()[0])
ids = np.array([[2, 17, 42, 9, 3, 0, 0], [2, 55, 61, 70, 12, 8, 3]], np.int32)
mask = (ids > 0).astype(np.int32)

def post(path, body):
    req = urllib.request.Request(served["url"] + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())

got = np.array(post("v1/infer", {"input_ids": ids.tolist(), "input_mask": mask.tolist(),
                                 "outputs": ["logits"]})["outputs"]["logits"])
with Session(f"{out}/hf_cls_fp16.onnx", max_batch=4, max_seq=32, device="cpu") as sess:
    want = sess.run(ids, mask, np.zeros_like(ids), outputs=["logits"])["logits"]
print("POST /v1/infer logits:\n", np.round(got, 4))
assert np.allclose(got, want, atol=1e-5), (got, want)
print("classes", got.argmax(1).tolist(), "- the same as bertfuse.Session in-process")
PY
