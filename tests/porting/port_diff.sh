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
if ! diff -u "$ported" <(strip_header "$dir/libtorch_models.h"); then
  echo "FAIL: libtorch_models.h is not libtorch_models.torch.h with torch:: -> dbrq::, <torch/torch.h> -> \"dbrq.h\"," \
       "TORCH_MODULE -> DBRQ_MODULE (diff above: - the mechanical port, + the file)"
  exit 1
fi
echo "PASS: the port differs from the libtorch source only in the include and the namespace"
