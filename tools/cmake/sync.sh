#!/usr/bin/env bash
# One source of truth for the file lists: Bazel's BUILD files. CMake reads its targets from
# cmake/bazel_targets.cmake, generated from them (docs/cmake.md).
#
#   tools/cmake/sync.sh                      # regenerate cmake/bazel_targets.cmake (commit it)
#   tools/cmake/sync.sh --check [BUILD_DIR]  # fail when the two builds list different sources
#
# --check fails (exit 1, naming each difference) when
#   1. cmake/bazel_targets.cmake is not what the BUILD files generate now (a BUILD edit without
#      regenerating, or a hand edit of the generated file), or
#   2. the targets CMake really configures compile other sources than Bazel's targets: a .cc added
#      to one build only, e.g. through target_sources() or add_executable() in CMakeLists.txt.
#      CMake writes what it configured to BUILD_DIR/dbrq_cmake_sources.txt; without BUILD_DIR, a
#      fresh configure in a temporary directory (a few seconds) provides it.
# Needs bazel, cmake and python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! bazel query //... --output=xml >"$tmp/query.xml" 2>"$tmp/query.log"; then
  cat "$tmp/query.log" >&2
  echo "sync: bazel query failed" >&2
  exit 2
fi
python3 tools/cmake/bazel_to_cmake.py generate <"$tmp/query.xml" >"$tmp/bazel_targets.cmake"

if [ "${1:-}" != "--check" ]; then
  if cmp -s "$tmp/bazel_targets.cmake" cmake/bazel_targets.cmake; then
    echo "cmake/bazel_targets.cmake is up to date"
  else
    cp "$tmp/bazel_targets.cmake" cmake/bazel_targets.cmake
    echo "cmake/bazel_targets.cmake regenerated"
  fi
  exit 0
fi

fail=0
if ! diff -u cmake/bazel_targets.cmake "$tmp/bazel_targets.cmake" >"$tmp/diff"; then
  echo "cmake/bazel_targets.cmake differs from what the BUILD files generate (run tools/cmake/sync.sh):"
  sed -n '3,$p' "$tmp/diff" | grep '^[-+]' | head -n 40
  fail=1
fi

build_dir=${2:-}
if [ -z "$build_dir" ]; then
  build_dir=$tmp/cmake
  if ! cmake -S "$root" -B "$build_dir" -DDBRQ_BUILD_TESTS=ON -DDBRQ_BUILD_TOOLS=ON >"$tmp/configure.log" 2>&1; then
    tail -n 30 "$tmp/configure.log"
    echo "sync: cmake configure failed"
    exit 1
  fi
fi
if ! grep -qx "DBRQ_BUILD_TESTS=ON" "$build_dir/dbrq_cmake_options.txt" ||
   ! grep -qx "DBRQ_BUILD_TOOLS=ON" "$build_dir/dbrq_cmake_options.txt"; then
  echo "sync: $build_dir was configured without the tests or the tools; it cannot be compared"
  exit 2
fi
python3 tools/cmake/bazel_to_cmake.py bazel-sources <"$tmp/query.xml" >"$tmp/bazel_sources.txt"
python3 tools/cmake/bazel_to_cmake.py compare "$tmp/bazel_sources.txt" "$build_dir/dbrq_cmake_sources.txt" || fail=1
exit $fail
