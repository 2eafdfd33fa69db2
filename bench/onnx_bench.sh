#!/usr/bin/env bash
# ONNX Runtime running dbrq's exported int8 model vs dbrq int8 itself: same model, same
# calibration, same input, same thread count (issue 14). For each model, in alternating rounds:
# `dbrq export --iters=N` converts the model, exports it and times dbrq's int8 call (median of N);
# then ONNX Runtime 1.30 (npm onnxruntime-node, tools/onnx/ort_compare.js) times the export (median
# of N, graph optimizations on, intra-op threads = dbrq's threads). Each side's result is the median
# of its rounds; the ratio is ORT / dbrq (lower is better for ORT). --threads takes a list: one row
# per model and thread count, all in the same run (default 1,2: the 2-thread rows run ORT with 2
# intra-op threads against dbrq with 2 threads, right after the 1-thread rows of the same model).
#
#   bench/onnx_bench.sh [--threads=1,2] [--iters=20] [--rounds=3] [--variant=full] [--models=a,b]
# Prints a table on stdout; the last line is one JSON object.
set -uo pipefail
cd "$(dirname "$0")/.."

THREADS=1,2 ITERS=20 ROUNDS=3 VARIANT=full MODELS=resnet18,mobilenet_v2,bert_encoder,small_cnn
for a in "$@"; do
  case "$a" in
    --threads=*) THREADS=${a#*=} ;;
    --iters=*) ITERS=${a#*=} ;;
    --rounds=*) ROUNDS=${a#*=} ;;
    --variant=*) VARIANT=${a#*=} ;;
    --models=*) MODELS=${a#*=} ;;
    *) echo "onnx_bench.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
ORT_DIR=${DBRQ_ORT_DIR:-$HOME/.cache/dbrq-ort}
if [ ! -d "$ORT_DIR/node_modules/onnxruntime-node" ]; then
  mkdir -p "$ORT_DIR"
  (cd "$ORT_DIR" && npm install --ignore-scripts --no-audit --no-fund onnxruntime-node@1.30 >&2) || {
    echo "onnx_bench.sh: onnxruntime-node is not installed and npm could not install it; no ONNX Runtime rows" >&2
    echo "{}"
    exit 0
  }
fi
bazel build -c opt //tools/cli:dbrq >&2 || exit 1
DBRQ="$(bazel info -c opt bazel-bin 2>/dev/null)/tools/cli/dbrq"  # not the bazel-bin symlink: another config moves it
OUT=$(mktemp -d /tmp/dbrq_onnx_bench.XXXXXX)
med() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

printf "%-14s %-6s %7s %14s %14s %10s   load\n" model batch threads "dbrq int8 ms" "ORT ms" "ORT/dbrq"
json="{"
for m in ${MODELS//,/ }; do
  for t in ${THREADS//,/ }; do
    : >"$OUT/$m.t$t.dbrq"
    : >"$OUT/$m.t$t.ort"
    for r in $(seq 1 "$ROUNDS"); do
      "$DBRQ" export --model="$m" --variant="$VARIANT" --batch_size=1 --calib_batches=2 --progress=never \
        --threads="$t" --iters="$ITERS" --out="$OUT/$m.onnx" --reference="$OUT/$m.ref.safetensors" \
        >"$OUT/$m.log" 2>&1 || { echo "$m: dbrq export failed: $(tail -n1 "$OUT/$m.log")" >&2; continue 3; }
      sed -n 's/^dbrq int8: median \([0-9.]*\) ms.*/\1/p' "$OUT/$m.log" >>"$OUT/$m.t$t.dbrq"
      NODE_PATH="$ORT_DIR/node_modules" node tools/onnx/ort_compare.js "$OUT/$m.onnx" "$OUT/$m.ref.safetensors" \
        --threads="$t" --bench_iters="$ITERS" >"$OUT/$m.ortlog" 2>&1
      sed -n 's/.* ort_median_ms \([0-9.]*\)$/\1/p' "$OUT/$m.ortlog" >>"$OUT/$m.t$t.ort"
    done
    d=$(med <"$OUT/$m.t$t.dbrq")
    o=$(med <"$OUT/$m.t$t.ort")
    ratio=$(awk -v o="$o" -v d="$d" 'BEGIN { if (d > 0) printf "%.2f", o / d; else print "nan" }')
    load=$(cut -d' ' -f1 /proc/loadavg)
    printf "%-14s %-6s %7s %14s %14s %10s   %s\n" "$m" 1 "$t" "$d" "$o" "$ratio" "$load"
    json="$json\"ort_vs_dbrq_int8/$m/t$t\": $ratio, "
  done
done
echo "${json%, }}"
