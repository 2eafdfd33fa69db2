#!/usr/bin/env bash
# Shows that tools/cmake/sync.sh --check catches a source added to one build only. On a copy of
# the repository (git's tracked and new files), with its own Bazel server (its output base expunged at the end):
#   baseline                  the copy passes
#   bazel_only                a .cc added to //core:core's srcs in core/BUILD.bazel only: fails
#   cmake_only                a .cc added with target_sources() in CMakeLists.txt only: fails
#   generated_file_edited     a .cc written into cmake/bazel_targets.cmake by hand: fails
#   regenerated               after tools/cmake/sync.sh, the bazel_only change passes (both builds)
# Prints "PASS name" / "FAIL name" per case and "N passed, M failed"; exits 1 on a failure.
#
#   tools/cmake/sync_test.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
copy=$tmp/repo
mkdir -p "$copy"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$copy" 2>/dev/null
cleanup() {
  (cd "$copy" && bazel clean --expunge >/dev/null 2>&1)  # the copy's output base and server
  rm -rf "$tmp"
}
trap cleanup EXIT
cd "$copy" || exit 1
git init -q . && git add -A && git -c user.email=t@t -c user.name=t commit -qm base  # to undo each case

pass=0
fail=0
# expect NAME WANT_RC PATTERN: runs the check; its exit code must be WANT_RC (0 or non-0) and, for a
# failure, the output must contain PATTERN (the offending file, named).
expect() {
  local name=$1 want=$2 pattern=$3 out rc
  out=$(tools/cmake/sync.sh --check 2>&1); rc=$?
  if [ "$want" = 0 ] && [ $rc -eq 0 ]; then
    echo "PASS $name"; pass=$((pass + 1))
  elif [ "$want" != 0 ] && [ $rc -eq 1 ] && grep -qF -- "$pattern" <<<"$out"; then
    echo "PASS $name: $(grep -F -- "$pattern" <<<"$out" | head -n 1)"; pass=$((pass + 1))
  else
    echo "FAIL $name (exit $rc, wanted $want${pattern:+ and \"$pattern\"}):"; echo "$out" | tail -n 15
    fail=$((fail + 1))
  fi
  git checkout -q -- . && git clean -qfd
}

expect baseline 0 ""

echo '// planted' >core/planted_bazel_only.cc
sed -i 's|"dtype.cc",|"dtype.cc",\n        "planted_bazel_only.cc",|' core/BUILD.bazel
expect bazel_only 1 "only in Bazel: dbrq_core core/planted_bazel_only.cc"

echo '// planted' >core/planted_cmake_only.cc
echo 'target_sources(dbrq_core PRIVATE core/planted_cmake_only.cc)' >>CMakeLists.txt
expect cmake_only 1 "only in CMake: dbrq_core core/planted_cmake_only.cc"

echo '// planted' >core/planted_generated.cc
sed -i '0,/    core\/dtype.cc/s||    core/dtype.cc\n    core/planted_generated.cc|' cmake/bazel_targets.cmake
expect generated_file_edited 1 "only in CMake: dbrq_core core/planted_generated.cc"

echo '// planted' >core/planted_bazel_only.cc
sed -i 's|"dtype.cc",|"dtype.cc",\n        "planted_bazel_only.cc",|' core/BUILD.bazel
tools/cmake/sync.sh >/dev/null
if grep -q "core/planted_bazel_only.cc" cmake/bazel_targets.cmake; then
  expect regenerated 0 ""
else
  echo "FAIL regenerated: tools/cmake/sync.sh did not add core/planted_bazel_only.cc"; fail=$((fail + 1))
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
