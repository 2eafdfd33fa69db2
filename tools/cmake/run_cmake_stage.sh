#!/usr/bin/env bash
# The CMake stage of tools/run_tests.sh (docs/cmake.md): checks that Bazel and CMake list the same
# sources (and, tools/cmake/sync_test.sh, that the check catches a source planted in one build
# only), configures and builds everything with CMake, runs ctest, installs into a temporary prefix,
# then configures, builds and runs samples/cmake_client against the installed package.
# Counts like the Bazel passes: GoogleTest cases (from each test's XML), plus one per extra check
# (the source-list check, the install, the client's build), plus the cases of sync_test.sh and the
# client's own checks. The last
# line is "cmake: N passed, M failed". Progress and logs go to stderr.
#
#   tools/cmake/run_cmake_stage.sh [BUILD_DIR]     # default build/cmake (kept between runs)
#
# It builds the installed library targets, the CLI and the tests in DBRQ_CMAKE_TESTS (default: a
# set covering golden data in runfiles, a test that runs the CLI, int8 end to end (and a test env
# from BUILD: no_vnni_test), quant-state
# files, the zoo and a shell test), and ctest runs those. The Bazel passes run every test; here the
# question is whether the CMake build compiles, links and finds its data the same way (building
# all 100 test binaries once more pushed CI past its time limit). DBRQ_CMAKE_TESTS=all builds and
# runs every test.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=${1:-$root/build/cmake}
tmp=$(mktemp -d /tmp/dbrq_cmake.XXXXXX)
log=$tmp/log
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "cmake: $1" >&2; }
bad() { failed=$((failed + 1)); echo "cmake: FAILED $1" >&2; [ -f "$log" ] && tail -n 30 "$log" >&2; }
finish() { echo "cmake: $passed passed, $failed failed"; rm -rf "$tmp"; exit $(( failed > 0 )); }

# 1. One source of truth: the generated lists match the BUILD files and nothing else was added.
if tools/cmake/sync.sh --check >"$log" 2>&1; then ok "$(tail -n 1 "$log")"; else bad "sync check (tools/cmake/sync.sh --check)"; fi

# The check's own test: a .cc planted in one build only makes it fail (on a copy of the tree).
tools/cmake/sync_test.sh >"$log" 2>&1
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
if [ -n "$line" ]; then
  p=${line%% passed*}; f=${line#*, }; f=${f%% failed}
  passed=$((passed + p)); failed=$((failed + f))
  echo "cmake: sync_test: $line" >&2
  [ "$f" -eq 0 ] || tail -n 30 "$log" >&2
else
  bad "tools/cmake/sync_test.sh (no summary line)"
fi

# 2. Configure, then build the installed library, the CLI and the chosen tests (or everything).
tests=${DBRQ_CMAKE_TESTS:-//tests/ops:ops_golden_test //tests/int8:int8_e2e_test //tests/int8:no_vnni_test //tests/deploy:state_io_test //tests/cli:cli_test //tests/models:zoo_int8_test //tests/kernels:qconv2d_test //tests/layers:check_layers_test}
if ! cmake -S "$root" -B "$build" -DDBRQ_BUILD_TESTS=ON -DDBRQ_BUILD_TOOLS=ON >"$log" 2>&1; then
  bad "configure (see above)"; finish
fi
if [ "$tests" = all ]; then
  build_args=()
else
  # A label's CMake target is its path with / and : as _ (//tests/cli:cli_test: dbrq_tests_cli_cli_test).
  build_args=(--target dbrq_installed dbrq_tools_cli_dbrq)
  for t in $tests; do
    grep -q "^$t " "$build/dbrq_tests.txt" || { bad "DBRQ_CMAKE_TESTS names $t, which is no test"; finish; }
    name=dbrq_$(echo "${t#//}" | tr '/:' '__')
    build_args+=("$name")
  done
fi
if ! cmake --build "$build" -j "$(nproc)" "${build_args[@]}" >"$log" 2>&1; then
  bad "build (see above)"; finish
fi

# 3. ctest. Each test writes <build>/<pkg>/<name>.test.xml; only those newer than the stamp count.
stamp=$tmp/stamp
touch "$stamp"
sleep 1
ctest_args=()
if [ "$tests" != all ]; then
  regex=$(for t in $tests; do printf '%s|' "$t"; done)
  ctest_args=(-R "^(${regex%|})\$")
fi
(cd "$build" && ctest -j "$(nproc)" --output-on-failure --output-junit "$tmp/ctest.xml" "${ctest_args[@]}" >"$log" 2>&1)
grep -E "tests passed|tests failed|\*\*\*Failed|Timeout|Not Run|Exception" "$log" >&2
while read -r label xml; do
  [ -n "$label" ] || continue
  if [ "$tests" != all ] && [[ " $tests " != *" $label "* ]]; then continue; fi
  status=$(grep -o "<testcase name=\"$label\"[^>]*status=\"[a-z]*\"" "$tmp/ctest.xml" | sed 's/.*status="\([a-z]*\)"/\1/')
  if [ -f "$xml" ] && [ "$xml" -nt "$stamp" ]; then
    line=$(grep -m1 -o '<testsuites[^>]*>' "$xml" || grep -m1 -o '<testsuite [^>]*>' "$xml")
    t=$(echo "$line" | sed -n 's/.* tests="\([0-9]*\)".*/\1/p'); t=${t:-0}
    fl=$(echo "$line" | sed -n 's/.* failures="\([0-9]*\)".*/\1/p'); fl=${fl:-0}
    er=$(echo "$line" | sed -n 's/.* errors="\([0-9]*\)".*/\1/p'); er=${er:-0}
    if [ "$t" -eq 0 ]; then t=1; fl=1; fi  # a test that wrote no cases did not run properly
    # A test whose cases all passed but which ctest failed (crash at exit, leak, timeout): one more.
    if [ "$status" != "run" ] && [ $((fl + er)) -eq 0 ]; then fl=1; t=$((t + 1)); fi
    passed=$((passed + t - fl - er)); failed=$((failed + fl + er))
  else
    failed=$((failed + 1)); echo "cmake: $label wrote no results (status ${status:-unknown})" >&2
  fi
done <"$build/dbrq_tests.txt"
echo "cmake: ctest done ($passed passed, $failed failed so far)" >&2

# 4. Install into a temporary prefix.
prefix=$tmp/prefix
if cmake --install "$build" --prefix "$prefix" >"$log" 2>&1 && [ -f "$prefix/lib/cmake/dbrq/dbrqConfig.cmake" ]; then
  ok "installed into a temporary prefix"
else
  bad "install"; finish
fi

# 5. The client: its own CMake project, find_package(dbrq) from the prefix, dbrq::dbrq.
client=$tmp/client
if cmake -S samples/cmake_client -B "$client" -DCMAKE_PREFIX_PATH="$prefix" >"$log" 2>&1 &&
   cmake --build "$client" >>"$log" 2>&1; then
  ok "samples/cmake_client built against the installed package"
else
  bad "samples/cmake_client build"; finish
fi
"$client/cmake_client" >"$log" 2>&1
rc=$?
cat "$log" >&2
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
if [ -z "$line" ]; then
  bad "samples/cmake_client run (exit $rc, no summary line)"
else
  p=${line%% passed*}; f=${line#*, }; f=${f%% failed}
  passed=$((passed + p)); failed=$((failed + f))
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then bad "samples/cmake_client exited with $rc"; fi
fi
finish
