#!/usr/bin/env bash
# dbrq's whole test suite, as CI runs it: installs what it needs, then runs every test target in
# the normal build and under AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer on), the
# concurrency tests (tagged "tsan") under ThreadSanitizer, builds the external-client sample (a
# separate Bazel workspace using dbrq through local_repository), runs the CMake stage
# (tools/cmake/run_cmake_stage.sh: CMake build, ctest, install, samples/cmake_client), and prints one summary line
# "N passed, M failed" (GoogleTest cases, plus one per extra check). Each pass reports its own
# count and wall time on stderr.
#
#   tools/run_tests.sh            # everything
#   tools/run_tests.sh --quick    # normal build only (no sanitizers)
set -uo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh --build-only || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }

QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1

passed=0
failed=0

# Adds up the <testsuites tests=.. failures=.. errors=..> counts of every test.xml the last run
# wrote (newer than $2: the sanitizer configs keep their own, older test logs, see .bazelrc).
count_results() {
  local label=$1 since=$2 p=0 f=0
  while IFS= read -r xml; do
    local line t fl er
    # The <testsuites> totals (GoogleTest writes them), else the first <testsuite> (Bazel's own XML
    # for a test that writes none, e.g. an sh_test, has a bare <testsuites>).
    line=$(grep -m1 -o '<testsuites [^>]*tests="[0-9]*"[^>]*>' "$xml" || grep -m1 -o '<testsuite [^>]*>' "$xml")
    t=$(echo "$line" | sed -n 's/.* tests="\([0-9]*\)".*/\1/p')
    fl=$(echo "$line" | sed -n 's/.* failures="\([0-9]*\)".*/\1/p')
    er=$(echo "$line" | sed -n 's/.* errors="\([0-9]*\)".*/\1/p')
    t=${t:-0}; fl=${fl:-0}; er=${er:-0}
    if [ "$t" -eq 0 ]; then t=1; fl=1; fi  # a target that wrote no cases did not run properly
    f=$((f + fl + er))
    p=$((p + t - fl - er))
  done < <(find -L bazel-testlogs/ -name test.xml -newer "$since" 2>/dev/null)
  echo "$label: $p passed, $f failed" >&2
  passed=$((passed + p))
  failed=$((failed + f))
}

run_suite() {
  local label=$1; shift
  local since start
  since=$(mktemp)
  start=$(date +%s)
  sleep 1  # test.xml files written from now on are -newer than $since
  bazel test --nocache_test_results "$@" //... 2>&1 | tail -n 40
  local rc=${PIPESTATUS[0]}
  # Exit code 3: some tests failed (counted from their XML); 1 or others: the build broke (or, 4,
  # no test matched).
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
    echo "$label: bazel exited with $rc (build failure)" >&2
    failed=$((failed + 1))
  fi
  count_results "$label" "$since"
  echo "$label: $(($(date +%s) - start)) s" >&2
  rm -f "$since"
}

run_suite "normal" -c opt
if [ "$QUICK" -eq 0 ]; then
  # Tests linking MPI into the test process (tag "mpi_in_process", tests/distributed) skip it:
  # LeakSanitizer reports allocations of OpenMPI plugins unloaded at MPI_Finalize, unsuppressible.
  run_suite "asan+ubsan" --config=asan --test_tag_filters=-mpi_in_process
  # The concurrency tests under ThreadSanitizer (only they are built in that configuration).
  run_suite "tsan" --config=tsan --test_tag_filters=tsan --build_tests_only
fi

# The external client: a user's own workspace depending on dbrq.
if (cd samples/external_client && bazel build //... >/tmp/dbrq_external_client.log 2>&1); then
  passed=$((passed + 1))
  echo "external client: built" >&2
else
  failed=$((failed + 1))
  echo "external client: FAILED (see /tmp/dbrq_external_client.log)" >&2
  tail -n 20 /tmp/dbrq_external_client.log >&2
fi

# Source lints over the whole tree (tools/lint; their own tests run in the suites above).
if lint_out=$(tools/lint/holder_casts.sh 2>&1); then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
fi
echo "$lint_out" >&2

# ONNX export interop (issue 14): the ONNX checker on every exported zoo model, ONNX Runtime (npm
# onnxruntime-node) against dbrq's int8 outputs; its own "N passed, M failed" line adds up here.
onnx_out=$(tools/onnx/interop_check.sh 2>&1)
echo "$onnx_out" | tail -n 25 >&2
onnx_line=$(echo "$onnx_out" | tail -n 1)
onnx_p=$(echo "$onnx_line" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1/p')
onnx_f=$(echo "$onnx_line" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\2/p')
if [ -z "$onnx_p" ]; then onnx_p=0; onnx_f=1; fi
echo "onnx interop: $onnx_p passed, $onnx_f failed" >&2
passed=$((passed + onnx_p))
failed=$((failed + onnx_f))
# The CMake build beside Bazel (docs/cmake.md): Bazel and CMake list the same sources, CMake builds
# everything, ctest, install, then samples/cmake_client builds against the installed package and runs.
start=$(date +%s)
cmake_line=$(tools/cmake/run_cmake_stage.sh | tail -n 1)
if [[ "$cmake_line" =~ ^cmake:\ ([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
  passed=$((passed + BASH_REMATCH[1]))
  failed=$((failed + BASH_REMATCH[2]))
else
  failed=$((failed + 1))
fi
echo "${cmake_line:-cmake: no summary (stage crashed)}" >&2
echo "cmake: $(($(date +%s) - start)) s" >&2

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
