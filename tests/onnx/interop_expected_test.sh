#!/usr/bin/env bash
# tools/onnx/interop_check.sh --export_only with a stand-in `dbrq` (DBRQ_CLI) whose export fails for
# the models in $FAKE_FAIL with $FAKE_MSG: a model of the expected list that fails is a failure
# naming the model and the error; a model outside the list failing with "has no ONNX form" is listed,
# not counted; one outside the list that exports is noted; a list naming a non-zoo model fails; the
# committed list passes when every export succeeds.
set -uo pipefail
root=$(pwd)
check="$root/tools/onnx/interop_check.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export HOME=${HOME:-$tmp}  # unset in Bazel's test environment; the script reads it
pass=0
fail=0
record() {  # name, failure ("" = passed)
  if [ -z "$2" ]; then echo "PASS $1"; pass=$((pass + 1)); else echo "FAIL $1: $2"; fail=$((fail + 1)); fi
}

cat >"$tmp/dbrq" <<'SH'
#!/usr/bin/env bash
model="" out=""
for a in "$@"; do
  case "$a" in --model=*) model=${a#*=} ;; --out=*) out=${a#*=} ;; esac
done
if [[ " ${FAKE_FAIL:-} " == *" $model "* ]]; then
  echo "exporting $model..."
  echo "dbrq: ValueError: $FAKE_MSG"
  echo "see docs/onnx_export.md"
  exit 1
fi
echo "ir" >"$out"
SH
chmod +x "$tmp/dbrq"
printf '# test list\nalpha\n\nbeta  # a comment\n' >"$tmp/expected.txt"

run() {  # FAKE_FAIL, FAKE_MSG, ZOO, EXPECTED -> $out, $rc
  out=$(FAKE_FAIL="$1" FAKE_MSG="$2" DBRQ_ONNX_ZOO="$3" DBRQ_ONNX_EXPECTED="$4" DBRQ_CLI="$tmp/dbrq" \
    bash "$check" --export_only 2>&1)
  rc=$?
}

run "" "" "alpha beta gamma" "$tmp/expected.txt"
if [ $rc -eq 0 ] && [ "$(echo "$out" | tail -n1)" = "2 passed, 0 failed" ]; then r=""; else r="rc $rc: $out"; fi
record all_expected_export_passes "$r"

run "beta" "export_onnx: where (blk.mask) has no ONNX form in dbrq's exporter" "alpha beta gamma" "$tmp/expected.txt"
if [ $rc -ne 0 ] && [ "$(echo "$out" | tail -n1)" = "1 passed, 1 failed" ] &&
    grep -q "FAIL  beta: expected to export .* but dbrq export failed: dbrq: ValueError: export_onnx: where (blk.mask) has no ONNX form" <<<"$out"; then
  r=""
else
  r="rc $rc: $out"
fi
record expected_model_that_stops_exporting_fails_naming_it_and_the_error "$r"

run "gamma" "export_onnx: copy_ (gru) has no ONNX form in dbrq's exporter" "alpha beta gamma" "$tmp/expected.txt"
if [ $rc -eq 0 ] && grep -q -- "--    gamma: not exported: export_onnx: copy_ (gru) has no ONNX form" <<<"$out" &&
    [ "$(echo "$out" | tail -n1)" = "2 passed, 0 failed" ]; then r=""; else r="rc $rc: $out"; fi
record unlisted_model_without_onnx_form_is_listed_not_counted "$r"

run "gamma" "export_onnx: something else broke" "alpha beta gamma" "$tmp/expected.txt"
if [ $rc -ne 0 ] && grep -q "FAIL  gamma: dbrq export failed: dbrq: ValueError: export_onnx: something else broke" <<<"$out"; then
  r=""
else
  r="rc $rc: $out"
fi
record unlisted_model_failing_otherwise_fails "$r"

run "" "" "alpha beta gamma" "$tmp/expected.txt"
if grep -q "note  gamma exports now: add it to" <<<"$out"; then r=""; else r="$out"; fi
record unlisted_model_that_exports_is_noted "$r"

printf 'alpha\ndelta\n' >"$tmp/typo.txt"
run "" "" "alpha beta gamma" "$tmp/typo.txt"
if [ $rc -ne 0 ] && grep -q "lists delta, which is not a zoo model" <<<"$out"; then r=""; else r="rc $rc: $out"; fi
record list_naming_a_non_zoo_model_fails "$r"

run "" "" "alpha" "$tmp/missing.txt"
if [ $rc -ne 0 ] && grep -q "no list of expected exports at $tmp/missing.txt" <<<"$out"; then r=""; else r="rc $rc: $out"; fi
record missing_list_fails "$r"

# The committed list against the script's own zoo: every listed model is a zoo model, and each one
# that fails is caught (the first listed model fails here).
out=$(DBRQ_CLI="$tmp/dbrq" bash "$check" --export_only 2>&1)
rc=$?
n=$(grep -cv '^\s*\(#\|$\)' "$root/tools/onnx/expected_exports.txt")
if [ $rc -eq 0 ] && [ "$(echo "$out" | tail -n1)" = "$n passed, 0 failed" ]; then r=""; else r="rc $rc: $out"; fi
record committed_list_names_zoo_models "$r"
first=$(grep -v '^\s*\(#\|$\)' "$root/tools/onnx/expected_exports.txt" | head -n1)
out=$(FAKE_FAIL="$first" FAKE_MSG="boom" DBRQ_CLI="$tmp/dbrq" bash "$check" --export_only 2>&1)
rc=$?
if [ $rc -ne 0 ] && grep -q "FAIL  $first: expected to export" <<<"$out"; then r=""; else r="rc $rc: $out"; fi
record committed_list_catches_its_first_model "$r"

echo "$pass passed, $fail failed"
# Counted cases for tools/run_tests.sh and the CMake stage (as the other sh_tests write them).
if [ -n "${XML_OUTPUT_FILE:-}" ]; then
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites tests="%d" failures="%d" errors="0">\n<testsuite name="interop_expected" tests="%d" failures="%d" errors="0">\n</testsuite>\n</testsuites>\n' \
    $((pass + fail)) "$fail" $((pass + fail)) "$fail" >"$XML_OUTPUT_FILE"
fi
[ "$fail" -eq 0 ]
