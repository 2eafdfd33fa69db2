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
  python3-onnx                            # the test command's ONNX export checks: the ONNX checker (tools/onnx/interop_check.sh)
)
# ONNX Runtime comes from the npm registry (tools/onnx/interop_check.sh), so the checks need node
# and npm of any origin. Many machines carry NodeSource's nodejs, which bundles npm and conflicts
# with Debian's npm package: Debian's nodejs + npm are installed only when no npm is on PATH, and
# failing to install them is a warning, not a setup failure (the interop check then reports it).
NODE_PACKAGES=()
if ! command -v npm >/dev/null 2>&1; then
  command -v node >/dev/null 2>&1 || NODE_PACKAGES+=(nodejs)
  NODE_PACKAGES+=(npm)
fi
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

if [ ${#missing[@]} -eq 0 ] && [ ${#NODE_PACKAGES[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#NODE_PACKAGES[@]} -gt 0 ]; then
  echo "setup: installing ${NODE_PACKAGES[*]} (for ONNX Runtime from npm)" >&2
  $SUDO apt-get install -y -qq --no-install-recommends "${NODE_PACKAGES[@]}" >/dev/null ||
    echo "setup: WARNING: could not install ${NODE_PACKAGES[*]}; the ONNX Runtime interop check will fail" >&2
fi
