#!/usr/bin/env bash
# Builds a libFuzzer target with clang (ASan + UBSan + libFuzzer) and fuzzes it for a while.
#
#   tools/fuzz/run.sh safetensors 600      # dbrq::parse_safetensors, 10 minutes
#   tools/fuzz/run.sh quant_state 600      # check_quant_state / quant_state_from_json, then convert
#   tools/fuzz/run.sh safetensors 60 -max_len=65536         # extra arguments go to libFuzzer
#
# The committed seeds (tools/fuzz/corpus/<target>) are read but never written: new inputs go to a
# scratch corpus under $DBRQ_FUZZ_BUILD (default ~/.cache/dbrq-fuzz), crashes to
# $DBRQ_FUZZ_BUILD/artifacts/<target>/. A finding is fixed in the library and its input committed
# to tests/reliability/data/fuzz/ (the regression test replays it) and to the seed corpus.
# Prints libFuzzer's final statistics; exits non-zero when the run found something.
set -euo pipefail
cd "$(dirname "$0")/../.."

target=${1:?usage: tools/fuzz/run.sh <safetensors|quant_state> <seconds> [libFuzzer args]}
seconds=${2:?usage: tools/fuzz/run.sh <target> <seconds>}
shift 2
case "$target" in
  safetensors | quant_state) ;;
  *) echo "unknown target \"$target\" (safetensors, quant_state)" >&2; exit 2 ;;
esac

BUILD=${DBRQ_FUZZ_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/dbrq-fuzz}
mkdir -p "$BUILD/corpus/$target" "$BUILD/artifacts/$target" "$BUILD/logs"
command -v clang++ >/dev/null || { echo "clang++ not found (tools/setup.sh installs clang)" >&2; exit 1; }

echo "building ${target}_fuzzer in $BUILD ..." >&2
make -s -j"$(nproc)" -f tools/fuzz/fuzz.mk BUILD="$BUILD" "$BUILD/${target}_fuzzer" >&2

log="$BUILD/logs/${target}-$(date +%Y%m%d-%H%M%S).log"
echo "fuzzing $target for ${seconds}s (log: $log)" >&2
set +e
# One 2 GB RSS budget; any single allocation over 512 MB is a finding (untrusted lengths must be
# capped before allocating). DBRQ_LOG_LEVEL=error keeps expected warnings out of the log.
DBRQ_LOG_LEVEL=error ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 \
  "$BUILD/${target}_fuzzer" \
  -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb=512 \
  -use_value_profile=1 -print_final_stats=1 -dict="tools/fuzz/${target}.dict" \
  -artifact_prefix="$BUILD/artifacts/$target/" "$@" \
  "$BUILD/corpus/$target" "tools/fuzz/corpus/$target" >"$log" 2>&1
rc=$?
set -e
grep -E "^(stat::|#[0-9]+[[:space:]]+(INITED|DONE)|INFO: seed corpus)|==ERROR|SUMMARY|artifact|Test unit written|fuzz invariant" "$log" | tail -n 30
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
echo "$target: ${seconds}s, ${execs:-?} executions, exit code $rc, corpus $(ls "$BUILD/corpus/$target" | wc -l) new inputs"
if [ "$rc" -ne 0 ]; then
  echo "$target: FINDING (see $log and $BUILD/artifacts/$target/)" >&2
fi
exit "$rc"
