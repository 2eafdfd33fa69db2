#!/usr/bin/env bash
# dbrq now vs dbrq at another revision, side by side with PyTorch in ONE run: builds the other
# revision's benchmark binaries in a git worktree, then runs bench/compare.sh with them as the
# baseline. Every fp32 / int8 / BERT row gains a *_vs_before ratio (now / before, lower is better),
# measured in the same interleaved chunks as the PyTorch rows.
#
#   bench/before_after.sh a83fd15 --quick            # a revision, then compare.sh's own flags
#   bench/before_after.sh HEAD~5 --quick --only=int8 --threads=1
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: bench/before_after.sh <git revision> [compare.sh flags]}
shift
dir="${DBRQ_BASELINE_DIR:-/tmp/dbrq_baseline}"
if [ ! -d "$dir" ]; then
  git worktree add --detach "$dir" "$rev" >&2
else
  git -C "$dir" checkout --detach -q "$rev"
fi
echo "building the baseline ($rev) in $dir ..." >&2
(cd "$dir" && bazel build -c opt //bench:dbrq_bench //bench:overhead_bench >&2)
base_bin="$(cd "$dir" && bazel info -c opt bazel-bin 2>/dev/null)/bench"
# Copies: the worktree's bazel-bin is replaced by the next build there.
mkdir -p "$dir.bin"
cp -f "$base_bin/dbrq_bench" "$base_bin/overhead_bench" "$dir.bin/"
exec bench/compare.sh --baseline-bench "$dir.bin/dbrq_bench" --baseline-overhead-bench "$dir.bin/overhead_bench" "$@"
