#!/usr/bin/env bash
# dbrq vs PyTorch 1.13 side by side: same weights, same inputs, same thread count.
#
#   bench/compare.sh            # full run (roughly 3x the quick run)
#   bench/compare.sh --quick    # fewer iterations (about 10 minutes on a busy 2-core machine)
#   bench/compare.sh --quick --only=fp32,overhead --threads=1    # a subset (see compare.py --help)
#
# Builds //bench:dbrq_bench and //bench:overhead_bench optimized, then runs bench/compare.py under
# Debian's python3 (PyTorch 1.13 + torchvision 0.14) with glibc malloc tuned the way PyTorch is
# fastest (no mmap for large blocks, no trimming); dbrq's server process gets the default malloc.
# Prints progress on stderr, a table on stdout, and as the last line one JSON object with every
# ratio (dbrq / PyTorch, lower is better for dbrq). See bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=/usr/bin/python3  # Debian's interpreter: the python3 first on PATH may have no torch
if ! "$PY" -c 'import torch, torchvision' 2>/dev/null; then
  echo "compare.sh: $PY cannot import torch/torchvision (apt-get install python3-torch python3-torchvision)" >&2
  exit 1
fi

echo "building //bench:dbrq_bench //bench:overhead_bench (-c opt)..." >&2
bazel build -c opt //bench:dbrq_bench //bench:overhead_bench >&2
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)/bench"

# ONNX Runtime running dbrq's exported int8 model vs dbrq int8, same threads (bench/onnx_bench.sh):
# its rows print first, so the last line stays compare.py's JSON. DBRQ_COMPARE_ONNX=0 skips them.
if [ "${DBRQ_COMPARE_ONNX:-1}" != "0" ]; then
  onnx_threads=1,2  # every thread count in the same run (onnx_bench.sh takes the list)
  for a in "$@"; do
    case "$a" in --threads=*) onnx_threads=${a#*=} ;; esac
  done
  onnx_iters=20
  for a in "$@"; do [ "$a" = "--quick" ] && onnx_iters=10; done
  echo "== ONNX Runtime (dbrq's ONNX export) vs dbrq int8 ==" 
  bench/onnx_bench.sh --threads="$onnx_threads" --iters="$onnx_iters" || echo "onnx_bench.sh failed" >&2
  echo
fi

exec env MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000 PYTHONDONTWRITEBYTECODE=1 \
  "$PY" bench/compare.py --dbrq-bench "$BIN/dbrq_bench" --overhead-bench "$BIN/overhead_bench" "$@"
