#!/usr/bin/env bash
# ONNX export interop (issue 14): exports zoo models with `dbrq export` (tiny variants, random
# weights calibrated on random batches), checks every export with Debian's python3-onnx checker
# (full_check: types and shapes inferred), and runs ResNet-18, MobileNetV2, the BERT encoder, the
# small CNN, the DCGAN generator, the U-Net and the decoder LM in ONNX Runtime 1.30 (npm onnxruntime-node, installed with --ignore-scripts into
# $DBRQ_ORT_DIR, default ~/.cache/dbrq-ort), requiring >= 99% of output elements within one
# quantization step of dbrq's int8 outputs (tools/onnx/ort_compare.js).
#
#   tools/onnx/interop_check.sh     # last line: "N passed, M failed" (tools/run_tests.sh adds it up)
#
# Every model in tools/onnx/expected_exports.txt must export: one that fails is a failure naming the
# model and the export's error. A zoo model not in that list that the exporter cannot write (an op
# with no ONNX form, docs/onnx_export.md) is listed, not counted; one that exports anyway is noted
# (add it to the list). ONNX Runtime's part is skipped, with a message saying so, only when npm cannot
# reach its registry and the package is not installed already.
#
# For tests/onnx:interop_expected_test: DBRQ_CLI=BIN uses BIN instead of building the CLI,
# DBRQ_ONNX_EXPECTED=FILE replaces the list, DBRQ_ONNX_ZOO="a b" the zoo models, and --export_only
# stops after the exports (no checker, no ONNX Runtime).
set -uo pipefail
cd "$(dirname "$0")/../.."
EXPORT_ONLY=0
for a in "$@"; do
  case "$a" in
    --export_only) EXPORT_ONLY=1 ;;
    *) echo "interop_check.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
EXPECTED_FILE=${DBRQ_ONNX_EXPECTED:-tools/onnx/expected_exports.txt}
ZOO=${DBRQ_ONNX_ZOO:-"small_cnn resnet18 mobilenet_v2 bert_encoder vit decoder_lm densenet kws_conv1d dcgan_generator unet gru_classifier"}

ORT_DIR=${DBRQ_ORT_DIR:-$HOME/.cache/dbrq-ort}
OUT=$(mktemp -d /tmp/dbrq_onnx.XXXXXX)
THREADS=${DBRQ_ONNX_THREADS:-2}
passed=0
failed=0
pass() { passed=$((passed + 1)); echo "  ok    $*"; }
fail() { failed=$((failed + 1)); echo "  FAIL  $*"; }

# Debian's ONNX (checker) for Python.
if [ "$EXPORT_ONLY" -eq 0 ] && ! /usr/bin/python3 -c "import onnx" 2>/dev/null; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-onnx >/dev/null 2>&1 || true
fi

if [ -n "${DBRQ_CLI:-}" ]; then
  DBRQ=$DBRQ_CLI
elif ! bazel build -c opt //tools/cli:dbrq >"$OUT/build.log" 2>&1; then
  fail "bazel build //tools/cli:dbrq (see $OUT/build.log)"
  echo "$passed passed, $failed failed"
  exit 1
else
  DBRQ="$(bazel info -c opt bazel-bin 2>/dev/null)/tools/cli/dbrq"  # not the bazel-bin symlink: another config moves it
fi

# The models expected to export (comments and blank lines aside); each must be a zoo model.
expected=()
if [ ! -f "$EXPECTED_FILE" ]; then
  fail "no list of expected exports at $EXPECTED_FILE"
else
  while read -r line; do
    line=${line%%#*}
    line=$(echo "$line" | tr -d '[:space:]')
    [ -z "$line" ] && continue
    if [[ " $ZOO " != *" $line "* ]]; then
      fail "$EXPECTED_FILE lists $line, which is not a zoo model here ($ZOO)"
    fi
    expected+=("$line")
  done <"$EXPECTED_FILE"
fi
is_expected() { [[ " ${expected[*]} " == *" $1 "* ]]; }
# The export's own error line (dbrq's message) rather than a usage hint after it.
export_error() { grep -m1 -E "export_onnx:|[Ee]rror" "$1" || tail -n1 "$1"; }

echo "onnx export: zoo models (tiny, batch 2) -> $OUT"
exported=()
for m in $ZOO; do
  if "$DBRQ" export --model="$m" --variant=tiny --batch_size=2 --calib_batches=2 --progress=never \
      --threads="$THREADS" --out="$OUT/$m.onnx" --reference="$OUT/$m.ref.safetensors" >"$OUT/$m.log" 2>&1; then
    exported+=("$m")
    if is_expected "$m"; then
      pass "export $m"
    else
      echo "  note  $m exports now: add it to $EXPECTED_FILE so that the check keeps it exporting"
    fi
  elif is_expected "$m"; then
    fail "$m: expected to export ($EXPECTED_FILE) but dbrq export failed: $(export_error "$OUT/$m.log")"
  elif grep -q "has no ONNX form" "$OUT/$m.log"; then
    echo "  --    $m: not exported: $(grep -o 'export_onnx: .*has no ONNX form[^(]*' "$OUT/$m.log" | head -n1)"
  else
    fail "$m: dbrq export failed: $(export_error "$OUT/$m.log")"
  fi
done
if [ "$EXPORT_ONLY" -eq 1 ]; then
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
fi

if /usr/bin/python3 -c "import onnx" 2>/dev/null; then
  for m in "${exported[@]}"; do
    if msg=$(/usr/bin/python3 - "$OUT/$m.onnx" 2>&1 <<'PY'
import sys, onnx
model = onnx.load(sys.argv[1])
onnx.checker.check_model(model, full_check=True)
print(f"opset {model.opset_import[0].version}, {len(model.graph.node)} nodes")
PY
    ); then
      pass "onnx.checker $m ($msg)"
    else
      fail "onnx.checker $m: $(echo "$msg" | tail -n1)"
    fi
  done
else
  fail "python3-onnx is not installed (tools/setup.sh installs it)"
fi

# ONNX Runtime from npm.
if [ ! -d "$ORT_DIR/node_modules/onnxruntime-node" ]; then
  mkdir -p "$ORT_DIR"
  (cd "$ORT_DIR" && npm install --ignore-scripts --no-audit --no-fund onnxruntime-node@1.30 >"$OUT/npm.log" 2>&1)
fi
if [ ! -d "$ORT_DIR/node_modules/onnxruntime-node" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    fail "npm is not installed (tools/setup.sh --build-only installs Debian's nodejs and npm when no npm is on PATH)"
  elif npm ping >/dev/null 2>&1; then
    fail "npm install onnxruntime-node@1.30 failed (see $OUT/npm.log)"
  else
    echo "  SKIPPED ONNX Runtime interop: the npm registry is unreachable and onnxruntime-node is not installed in $ORT_DIR"
  fi
else
  echo "onnx runtime: $(node -e "console.log(require('$ORT_DIR/node_modules/onnxruntime-node/package.json').version)"), $THREADS threads"
  for m in resnet18 mobilenet_v2 bert_encoder small_cnn dcgan_generator unet decoder_lm; do
    if [ ! -f "$OUT/$m.onnx" ]; then
      fail "$m: no export to run in ONNX Runtime"
      continue
    fi
    if r=$(NODE_PATH="$ORT_DIR/node_modules" node tools/onnx/ort_compare.js "$OUT/$m.onnx" "$OUT/$m.ref.safetensors" \
        --threads="$THREADS" 2>&1); then
      pass "onnxruntime $r"
    else
      fail "onnxruntime $m: $r"
    fi
  done
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
