# Sourced by the GPU-host scripts of benchmarks/kernels/ (from the repo root): this checkout's
# bertfuse first on the path, the op library's cache ($BERTFUSE_KERNELS_DIR, default
# /tmp/bertfuse-kernels), nvcc on PATH, and a time budget of $BUDGET s from now:
# `left` prints the seconds left, `cap SECONDS RESERVE` a step's timeout.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's bertfuse
export BERTFUSE_KERNELS_DIR="${BERTFUSE_KERNELS_DIR:-/tmp/bertfuse-kernels}"
export PATH="$PATH:/usr/local/cuda/bin"
start=$(date +%s)
left() { echo $(( start + BUDGET - $(date +%s) )); }
cap() {  # cap SECONDS RESERVE: SECONDS, or what is left after RESERVE if that is less (>= 0)
    local l=$(( $(left) - $2 ))
    l=$(( l < $1 ? l : $1 ))
    echo $(( l > 0 ? l : 0 ))
}
