#!/usr/bin/env bash
# Guard a converted model in CI: fail the build when a change loses fusion or alters the I/O.
#   examples/ci_fusion_check.sh [MODEL.onnx]
# Commit `bertfuse summarize MODEL -o golden.json` once; CI compares every new model with it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${BIN:-$( [ -x .venv/bin/bertfuse ] && echo .venv/bin || dirname "$(command -v bertfuse)" )}
OUT=${OUT:-out/examples/ci}
mkdir -p "$OUT"
MODEL=${1:-}
if [ -z "$MODEL" ]; then
    "$BIN/bertfuse" example --config tiny -o "$OUT/tiny"
    "$BIN/bertfuse" convert "$OUT/tiny" -o "$OUT/tiny.onnx" --seed 0 --json > /dev/null
    MODEL=$OUT/tiny.onnx
fi
"$BIN/bertfuse" summarize "$MODEL" -o "$OUT/golden.json"   # the file you would commit
"$BIN/bertfuse" inspect "$MODEL"                            # what a person reads
# Exit 0: nothing the policy cares about changed; 1: fusion lost or I/O changed; 2: bad input.
"$BIN/bertfuse" diff "$OUT/golden.json" "$MODEL" --markdown
