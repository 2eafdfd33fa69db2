#!/usr/bin/env bash
# dbrq's main demo, on the bundled default: a small CNN trained on scikit-learn's 8x8 handwritten
# digits (weights, calibration split and held-back test split in samples/data/). Installs what it
# needs, builds optimized, then: build the model, load the weights, prepare, calibrate (progress
# bar), save the calibration, convert to int8, compare fp32 vs int8 (accuracy, latency, SQNR) and
# write the op-by-op HTML report. Files go to out/ in the repository.
#
#   tools/run_demo.sh                          # the digits demo
#   tools/run_demo.sh --model=resnet18         # any zoo model (random weights), flags go to the demo
#   tools/run_demo.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh --build-only
bazel build -c opt //samples/demo //tools/cli:dbrq
exec bazel run -c opt //samples/demo -- "$@"
