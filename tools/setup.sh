#!/usr/bin/env bash
# Installs every Debian 12 package dbrq's build, tests, demo and benchmarks need. Idempotent:
# packages already present are not touched, and nothing is downloaded when all are installed.
#
#   tools/setup.sh            # everything (as root, or with sudo available)
#   tools/setup.sh --build-only   # only what building, the tests and the demo need: they never need
#                               # PyTorch (golden data and demo data are committed) nor clang; plain
#                               # python3 runs the CMake source-list check (tools/cmake/sync.sh)
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java        # Bazel 4.2.3, offline
  cmake python3                           # the CMake build beside Bazel (docs/cmake.md); python3 generates its lists
  g++                                     # the compiler of every Bazel build
  libdnnl-dev                             # oneDNN 2.6
  libabsl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin              # optional MPI layer (//distributed, dbrq_mpi, tests/distributed)
  python3-onnx nodejs npm                 # the test command's ONNX export checks: the ONNX checker, ONNX Runtime from npm (tools/onnx/interop_check.sh)
)
if [ "${1:-}" != "--build-only" ]; then
  PACKAGES+=(
    clang libclang-rt-14-dev              # libFuzzer (tools/fuzz/run.sh)
    python3 python3-torch python3-torchvision python3-numpy python3-sklearn   # goldens, training data, the PyTorch side of benchmarks
  )
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
