#!/usr/bin/env bash
# Compile-failure tests: each snippet here must fail to compile with the message in its
# "// expect-error: <text>" line, and each ok_*.cc snippet must compile (a control: the harness
# itself works). Bazel runs this from the runfiles root, where the library headers are.
#
#   tests/compile_fail/run.sh [snippet.cc ...]
set -uo pipefail
CXX=${CXX:-g++}
export LC_ALL=C  # plain quotes in diagnostics
root=$(pwd)
pass=0
fail=0
cases=""  # JUnit <testcase> elements, for Bazel's test.xml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# record NAME FAILURE: counts one case (FAILURE empty: passed).
record() {
  if [ -z "$2" ]; then
    echo "PASS $1"; pass=$((pass + 1))
    cases+="<testcase name=\"$1\"/>"$'\n'
  else
    echo "FAIL $1: $2"; fail=$((fail + 1))
    cases+="<testcase name=\"$1\"><failure message=\"$(echo "$2" | sed 's/[<>&"]/_/g')\"/></testcase>"$'\n'
  fi
}
snippets=("$@")
[ ${#snippets[@]} -eq 0 ] && snippets=(tests/compile_fail/*.cc)
for f in "${snippets[@]}"; do
  name=$(basename "$f")
  out="$tmp/$name.log"
  "$CXX" -std=c++17 -fsyntax-only -I"$root" "$f" >"$out" 2>&1
  rc=$?
  if [[ "$name" == ok_* ]]; then
    if [ $rc -eq 0 ]; then
      record "$name" ""
    else
      record "$name" "expected to compile"; head -n 20 "$out"
    fi
    continue
  fi
  expect=$(sed -n 's,^// expect-error: ,,p' "$f")
  if [ -z "$expect" ]; then
    record "$name" "no '// expect-error:' line"
  elif [ $rc -eq 0 ]; then
    record "$name" "compiled; expected an error containing: $expect"
  elif grep -qF -- "$expect" "$out"; then
    record "$name" ""
  else
    record "$name" "the error does not contain: $expect"; grep -m5 "error" "$out"
  fi
done
echo "$pass passed, $fail failed"
if [ -n "${XML_OUTPUT_FILE:-}" ]; then
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites tests="%d" failures="%d" errors="0">\n<testsuite name="compile_fail" tests="%d" failures="%d" errors="0">\n%s</testsuite>\n</testsuites>\n' \
    $((pass + fail)) "$fail" $((pass + fail)) "$fail" "$cases" >"$XML_OUTPUT_FILE"
fi
[ $fail -eq 0 ]
