#!/usr/bin/env bash
# You already export with tf2onnx yourself: keep doing that, then run bertfuse's passes on it.
#   examples/optimize_own_export.sh                 # builds a tiny TF2 SavedModel to start from
#   examples/optimize_own_export.sh MY_SAVED_MODEL   # or a frozen graph: MY_GRAPH.pb
# (`bertfuse convert` does all of this in one step, with weights kept out of tf2onnx, which
# needs far less memory on big models; this path is for pipelines that own their export.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${BIN:-$( [ -x .venv/bin/bertfuse ] && echo .venv/bin || dirname "$(command -v bertfuse)" )}
OUT=${OUT:-out/examples/own}
mkdir -p "$OUT"
export TF_CPP_MIN_LOG_LEVEL=3

MODEL=${1:-}
if [ -z "$MODEL" ]; then
    # A stand-in for "your model": a TF2 SavedModel of a tiny BERT, TF-Hub-style input names.
    MODEL=$OUT/saved_model
    "$BIN/bertfuse" example --config tiny -o "$OUT/tiny_ckpt"
    "$BIN/python" - "$OUT/tiny_ckpt" "$MODEL" <<'PY'
import sys

import tensorflow as tf

tf.get_logger().setLevel("ERROR")  # AutoGraph cannot see the source of a heredoc

from bertfuse.converter.config import BertConfig
from bertfuse.converter.modeling import build_bert_graph, expected_shapes

ckpt, out = sys.argv[1], sys.argv[2]
cfg = BertConfig.from_json(f"{ckpt}/bert_config.json")
reader = tf.train.load_checkpoint(f"{ckpt}/bert_model.ckpt")
spec = lambda name: tf.TensorSpec([None, None], tf.int32, name=name)


class Bert(tf.Module):
    def __init__(self):
        super().__init__()
        self.weights = {n: tf.Variable(reader.get_tensor(n), name=n.replace("/", "__"))
                        for n in expected_shapes(cfg)}

    @tf.function(input_signature=[spec("input_word_ids"), spec("input_mask"),
                                  spec("input_type_ids")])
    def serve(self, input_word_ids, input_mask, input_type_ids):
        return build_bert_graph(tf, cfg, self.weights.__getitem__, input_word_ids, input_mask,
                                input_type_ids)


bert = Bert()
tf.saved_model.save(bert, out, signatures={"serving_default": bert.serve})
print("wrote SavedModel", out)
PY
fi

# 1. Your own export, as you run it today. A frozen graph needs its tensor names:
#    INPUTS=ids:0,mask:0,types:0 OUTPUTS=seq:0,pooled:0 examples/optimize_own_export.sh G.pb
if [ -d "$MODEL" ]; then
    SRC=(--saved-model "$MODEL")
else
    SRC=(--graphdef "$MODEL" --inputs "${INPUTS:?set INPUTS=name:0,... for a frozen graph}"
         --outputs "${OUTPUTS:?set OUTPUTS=name:0,... for a frozen graph}")
fi
"$BIN/python" -m tf2onnx.convert "${SRC[@]}" --opset 17 --output "$OUT/raw.onnx" 2>"$OUT/tf2onnx.log" \
    || { tail -20 "$OUT/tf2onnx.log" >&2; exit 1; }
echo "tf2onnx wrote $OUT/raw.onnx (log: $OUT/tf2onnx.log)"

# 2. bertfuse's fusion passes on it: the report shows what each pass rewrote. --inputs
#    renames the export's inputs to input_ids / input_mask / segment_ids (int32), the names
#    bertfuse's Session takes; names it recognises (input_mask here) need no entry.
"$BIN/bertfuse" optimize "$OUT/raw.onnx" -o "$OUT/fused.onnx" \
    --inputs "${OPT_INPUTS:-input_ids=input_word_ids,segment_ids=input_type_ids}"

# 3. Check the fused model against the TF model it came from (TF names are matched to roles;
#    VERIFY_ARGS="--inputs input_ids=NAME,input_mask=NAME" where they can't be).
# shellcheck disable=SC2086
"$BIN/bertfuse" verify "$OUT/fused.onnx" --against "$MODEL" ${VERIFY_ARGS:-}

# 4. Serve it with bertfuse's runtime (device="cuda" with onnxruntime-gpu).
"$BIN/python" - "$OUT/fused.onnx" <<'PY'
import sys

import numpy as np

import bertfuse

with bertfuse.Session(sys.argv[1], max_batch=4, max_seq=32, device="cpu") as sess:
    ids = np.random.default_rng(0).integers(1, sess.facts.vocab_size, (2, 16), dtype=np.int32)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    out = sess.run(ids, mask)
    print("Session:", {name: value.shape for name, value in out.items()})
PY
