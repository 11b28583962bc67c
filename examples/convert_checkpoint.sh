#!/usr/bin/env bash
# Write a Google-layout BERT checkpoint (random weights), convert it, verify the result.
#   examples/convert_checkpoint.sh            # tiny: seconds on a laptop
#   CONFIG=shenma-3l examples/convert_checkpoint.sh
# With your own checkpoint: bertfuse convert DIR_WITH_bert_config.json -o model.onnx
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${BIN:-$( [ -x .venv/bin/bertfuse ] && echo .venv/bin || dirname "$(command -v bertfuse)" )}
CONFIG=${CONFIG:-tiny}
OUT=${OUT:-out/examples}
mkdir -p "$OUT"

# 1. A checkpoint directory: bert_config.json + bert_model.ckpt.{index,data-*}.
"$BIN/bertfuse" example --config "$CONFIG" -o "$OUT/$CONFIG"

# 2. Convert: export, fusion passes, checks, parity vs TF; the report goes to stdout.
#    Exit 0 = written; 1 = drifted from TF (nothing written); 2 = bad input.
"$BIN/bertfuse" convert "$OUT/$CONFIG" -o "$OUT/$CONFIG.onnx" --seed 0

# 3. The same conversion for CI: JSON report on stdout, no table.
"$BIN/bertfuse" convert "$OUT/$CONFIG" -o "$OUT/$CONFIG.onnx" --seed 0 --json \
    > "$OUT/$CONFIG.report.json"
echo "report: $OUT/$CONFIG.report.json"

# 4. Re-check the written model against its source at another shape.
"$BIN/bertfuse" verify "$OUT/$CONFIG.onnx" --against "$OUT/$CONFIG" --batch 2 --seq 64
