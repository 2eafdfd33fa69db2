#!/usr/bin/env bash
# Checks the one-way layering of dbrq's library folders: core <- kernels <- runtime <-
# quant_state <- tracer (see docs/architecture.md). A file may include headers of its own folder
# and of the folders it depends on:
#
#   core         core
#   kernels      core, kernels                      (the only folder that includes dnnl.hpp)
#   runtime      core, kernels, runtime
#   quant_state  core, runtime, quant_state         (data only: no kernels)
#   tracer       core, kernels, runtime, quant_state, tracer
#   distributed  core, runtime, quant_state, tracer, distributed   (optional MPI layer, issue 15:
#                                                    the only folder that includes <mpi.h>)
#
# and samples/ and bench/ use the public API only ("dbrq.h", samples' own headers and, in bench/,
# bench's; the overhead benchmark, which times kernels directly, may include kernels/). Prints every
# violation as file:line: include, and exits 1 when there is one.
#
#   tools/check_layers.sh [root]     # root defaults to the repository
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2

declare -A allowed=(
  [core]="core"
  [kernels]="core kernels"
  [runtime]="core kernels runtime"
  [quant_state]="core runtime quant_state"
  [tracer]="core kernels runtime quant_state tracer"
  [distributed]="core runtime quant_state tracer distributed"
)
project_dirs="core kernels runtime quant_state tracer distributed samples bench tools tests"
violations=0

report() {
  echo "$1"
  violations=$((violations + 1))
}

check_file() {  # file, allowed folders (space separated), extra allowed exact includes
  local file=$1 ok=$2 extra=${3:-}
  while IFS= read -r hit; do
    local line=${hit%%:*}
    local inc
    inc=$(echo "$hit" | sed -n 's/^[0-9]*:[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p')
    [ -z "$inc" ] && continue
    local top=${inc%%/*}
    [ "$top" = "$inc" ] && top=""
    if [ "$inc" = "dnnl.hpp" ] || [[ "$inc" == oneapi/dnnl/* ]]; then
      [ "${file%%/*}" = "kernels" ] || report "$file:$line: includes $inc (only kernels/ may use oneDNN)"
      continue
    fi
    case " $project_dirs " in *" $top "*) ;; *) [ "$inc" = "dbrq.h" ] || continue ;; esac
    [ -n "$extra" ] && [[ " $extra " == *" $inc "* ]] && continue
    [[ " $ok " == *" $top "* ]] && continue
    [ "$inc" = "dbrq.h" ] && [[ " $ok " == *" dbrq.h "* ]] && continue
    report "$file:$line: includes \"$inc\": ${file%%/*}/ may include only from: $ok"
  done < <(grep -n '#[[:space:]]*include' "$file")
}

for folder in "${!allowed[@]}"; do
  [ -d "$folder" ] || continue
  while IFS= read -r f; do check_file "$f" "${allowed[$folder]}"; done < <(find "$folder" -name '*.h' -o -name '*.cc' | sort)
done
# Everything <angle-bracketed> from oneDNN, anywhere outside kernels/.
while IFS= read -r hit; do
  case "$hit" in kernels/*) ;; *) report "$hit (only kernels/ may use oneDNN)" ;; esac
done < <(grep -rn --include='*.h' --include='*.cc' -E '#[[:space:]]*include[[:space:]]*<(dnnl|oneapi/dnnl)' \
           core runtime quant_state tracer samples bench tools 2>/dev/null)

# MPI only in distributed/: the core library and the plain CLI never link it.
while IFS= read -r hit; do
  case "$hit" in distributed/*) ;; *) report "$hit (only distributed/ may use MPI)" ;; esac
done < <(grep -rn --include='*.h' --include='*.cc' -E '#[[:space:]]*include[[:space:]]*[<"]mpi\.h[>"]' \
           core kernels runtime quant_state tracer samples bench tools 2>/dev/null)

# Users of the public API.
for dir in samples bench; do
  [ -d "$dir" ] || continue
  while IFS= read -r f; do
    case "$f" in
      bench/overhead_bench.cc) check_file "$f" "dbrq.h samples bench kernels" ;;
      bench/*) check_file "$f" "dbrq.h samples bench" ;;
      *) check_file "$f" "dbrq.h samples" ;;
    esac
  done < <(find "$dir" -name '*.h' -o -name '*.cc' | sort)
done
# The public header re-exports public headers only.
if [ -f dbrq.h ]; then
  while IFS= read -r inc; do
    case "$inc" in
      quant_state/auto_quant_state.h | quant_state/serialization.h | runtime/op_registry.h | tracer/internal.h | \
        tracer/interceptor.h | tracer/executors.h | tracer/convert.h | kernels/*)
        report "dbrq.h: includes internal header \"$inc\"" ;;
    esac
  done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' dbrq.h)
fi

if [ "$violations" -eq 0 ]; then
  echo "layers: ok"
  exit 0
fi
echo "layers: $violations violation(s)"
exit 1
