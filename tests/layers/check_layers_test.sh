#!/usr/bin/env bash
# tools/check_layers.sh on the repository (must pass) and on small trees with one planted
# violation each (must fail and name it). Writes a JUnit XML for Bazel's test.xml.
set -uo pipefail
root=$(pwd)
check="$root/tools/check_layers.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
cases=""
record() {  # name, failure ("" = passed)
  if [ -z "$2" ]; then
    echo "PASS $1"; pass=$((pass + 1)); cases+="<testcase name=\"$1\"/>"$'\n'
  else
    echo "FAIL $1: $2"; fail=$((fail + 1))
    cases+="<testcase name=\"$1\"><failure message=\"$(echo "$2" | sed 's/[<>&"]/_/g')\"/></testcase>"$'\n'
  fi
}

# The repository itself.
if out=$("$check" "$root" 2>&1); then record repository_is_layered ""; else record repository_is_layered "$out"; fi

# tree NAME: a minimal clean tree in $tmp/NAME.
tree() {
  local d="$tmp/$1"
  mkdir -p "$d"/{core,kernels,runtime,quant_state,tracer,distributed,samples,bench}
  echo '#include "core/tensor.h"' >"$d/core/tensor.h"
  printf '#include <dnnl.hpp>\n#include "core/tensor.h"\n' >"$d/kernels/int8.h"
  printf '#include "kernels/int8.h"\n' >"$d/runtime/ops.h"
  printf '#include "runtime/ops.h"\n' >"$d/quant_state/state.h"
  printf '#include "quant_state/state.h"\n#include "kernels/int8.h"\n' >"$d/tracer/convert.cc"
  printf '#include <mpi.h>\n#include "tracer/convert.h"\n' >"$d/distributed/calibrate.cc"
  printf '#include "dbrq.h"\n' >"$d/samples/demo.cc"
  printf '#include "dbrq.h"\n' >"$d/bench/bench_util.h"
  printf '#include "bench/bench_util.h"\n#include "samples/demo.h"\n' >"$d/bench/bench.cc"
  printf '#include "tracer/quantize.h"\n' >"$d/dbrq.h"
  echo "$d"
}
expect_violation() {  # name, file, line to add, text the report must contain
  local d
  d=$(tree "$1")
  echo "$3" >>"$d/$2"
  local out
  if out=$("$check" "$d" 2>&1); then
    record "$1" "no violation reported for: $3 in $2"
  elif grep -qF -- "$4" <<<"$out"; then
    record "$1" ""
  else
    record "$1" "report does not mention \"$4\": $out"
  fi
}

d=$(tree clean)
if out=$("$check" "$d" 2>&1); then record clean_tree_passes ""; else record clean_tree_passes "$out"; fi
expect_violation core_includes_runtime core/tensor.h '#include "runtime/ops.h"' 'core/tensor.h:2: includes "runtime/ops.h"'
expect_violation kernels_includes_tracer kernels/int8.h '#include "tracer/convert.h"' 'kernels/int8.h:3'
expect_violation runtime_includes_quant_state runtime/ops.h '#include "quant_state/state.h"' 'runtime/ops.h:2'
expect_violation quant_state_includes_kernels quant_state/state.h '#include "kernels/int8.h"' 'quant_state/ may include only from'
expect_violation onednn_outside_kernels runtime/ops.h '#include <dnnl.hpp>' 'only kernels/ may use oneDNN'
expect_violation sample_includes_internals samples/demo.cc '#include "quant_state/state.h"' 'samples/demo.cc:2'
expect_violation sample_includes_bench samples/demo.cc '#include "bench/bench_util.h"' 'samples/ may include only from'
expect_violation bench_includes_internals bench/bench.cc '#include "tracer/internal.h"' 'bench/bench.cc:3'
expect_violation tracer_includes_distributed tracer/convert.cc '#include "distributed/calibrate.h"' 'tracer/ may include only from'
expect_violation distributed_includes_kernels distributed/calibrate.cc '#include "kernels/int8.h"' 'distributed/ may include only from'
expect_violation mpi_outside_distributed tracer/convert.cc '#include <mpi.h>' 'only distributed/ may use MPI'
expect_violation public_header_reexports_internals dbrq.h '#include "tracer/internal.h"' 'dbrq.h: includes internal header'

echo "$pass passed, $fail failed"
if [ -n "${XML_OUTPUT_FILE:-}" ]; then
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites tests="%d" failures="%d" errors="0">\n<testsuite name="check_layers" tests="%d" failures="%d" errors="0">\n%s</testsuite>\n</testsuites>\n' \
    $((pass + fail)) "$fail" $((pass + fail)) "$fail" "$cases" >"$XML_OUTPUT_FILE"
fi
[ "$fail" -eq 0 ]
