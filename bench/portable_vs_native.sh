#!/usr/bin/env bash
# The default build (x86-64-v2 baseline, AVX-512 loops chosen at run time) vs --config=native
# (-march=native), side by side.
#   bench/portable_vs_native.sh [--rounds=N] [--iters=N] [--threads=N] [--control]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${TMPDIR:-/tmp}/dbrq_portable_vs_native"
mkdir -p "$OUT"
echo "building //bench:dbrq_bench -c opt (the default: x86-64-v2 baseline)..." >&2
bazel build -c opt //bench:dbrq_bench >&2
cp -f "$(bazel info -c opt bazel-bin 2>/dev/null)/bench/dbrq_bench" "$OUT/dbrq_bench_portable"
echo "building //bench:dbrq_bench -c opt --config=native..." >&2
bazel build -c opt --config=native //bench:dbrq_bench >&2
cp -f "$(bazel info -c opt --config=native bazel-bin 2>/dev/null)/bench/dbrq_bench" "$OUT/dbrq_bench_native"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) vCPUs" >&2
exec /usr/bin/python3 bench/portable_vs_native.py --portable "$OUT/dbrq_bench_portable" \
  --native "$OUT/dbrq_bench_native" "$@"
