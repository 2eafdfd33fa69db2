#!/usr/bin/env bash
# Checks that tests/porting/libtorch_models.h (compiled and run by verbatim_port_test) is the
# libtorch source tests/porting/libtorch_models.torch.h with only the include and the namespace
# changed: the comment header (lines up to #pragma once) may differ, nothing else.
set -euo pipefail
dir=tests/porting
strip_header() { sed -n '/^#pragma once/,$p' "$1"; }
ported=$(mktemp)
trap 'rm -f "$ported"' EXIT
strip_header "$dir/libtorch_models.torch.h" |
  sed -e 's|#include <torch/torch.h>|#include "dbrq.h"|' \
      -e 's/\btorch::/dbrq::/g' \
      -e 's/using namespace torch;/using namespace dbrq;/' \
      -e 's/TORCH_MODULE(/DBRQ_MODULE(/' >"$ported"
# One case, reported like the other sh_tests: Bazel makes its own XML for a test that writes none,
# the CMake stage (tools/cmake/run_cmake_stage.sh) counts only the XML a test writes.
write_xml() {  # $1 = 0 passed, 1 failed
  [ -n "${XML_OUTPUT_FILE:-}" ] || return 0
  local failure=""
  [ "$1" -eq 0 ] || failure='<failure message="the port differs from the libtorch source beyond the include and the namespace"/>'
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites tests="1" failures="%d" errors="0">\n<testsuite name="port_diff" tests="1" failures="%d" errors="0">\n<testcase name="MechanicalPort" classname="port_diff">%s</testcase>\n</testsuite>\n</testsuites>\n' \
    "$1" "$1" "$failure" >"$XML_OUTPUT_FILE"
}
if ! diff -u "$ported" <(strip_header "$dir/libtorch_models.h"); then
  echo "FAIL: libtorch_models.h is not libtorch_models.torch.h with torch:: -> dbrq::, <torch/torch.h> -> \"dbrq.h\"," \
       "TORCH_MODULE -> DBRQ_MODULE (diff above: - the mechanical port, + the file)"
  write_xml 1
  exit 1
fi
echo "PASS: the port differs from the libtorch source only in the include and the namespace"
write_xml 0
