#!/usr/bin/env bash
# Holder casts: `dynamic_cast<nn::Conv2d*>(module)` compiles (the source type is polymorphic) and is
# always null, because nn::Conv2d is the holder and the module is an nn::Conv2dImpl. Same for
# dynamic_pointer_cast and typeid. This lint finds such casts to a built-in holder (every
# `class XImpl` in runtime/nn.h) or to a holder declared with DBRQ_MODULE(X) anywhere in the tree.
#
#   tools/lint/holder_casts.sh [ROOT [NN_HEADER]]   # ROOT: tree to scan (default: the repo)
# Prints each offending line with the fix, and exits 1 if there is any; prints one summary line.
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
nn_h=${2:-$root/runtime/nn.h}
[ -f "$nn_h" ] || { echo "holder_casts: no $nn_h" >&2; exit 2; }

files=$(find "$root" \( -name 'bazel-*' -o -name '.git' -o -name build -o -name node_modules \) -prune \
          -o \( -name '*.h' -o -name '*.cc' -o -name '*.cpp' -o -name '*.hpp' \) -type f -print)
# Built-in holders must be spelled nn::X here (files alias `using Linear = nn::LinearImpl;`);
# holders declared with DBRQ_MODULE(X) match with any qualification.
builtin=$(grep -oE '^class [A-Za-z0-9_]+Impl\b' "$nn_h" | awk '{print $2}' | sed 's/Impl$//' | sort -u | paste -sd'|')
[ -n "$builtin" ] || { echo "holder_casts: no holder names found in $nn_h" >&2; exit 2; }
user=""
[ -z "$files" ] || user=$(echo "$files" | xargs grep -hoE 'DBRQ_MODULE\([A-Za-z0-9_]+\)' |
  sed -E 's/DBRQ_MODULE\((.*)\)/\1/' | grep -vxE "X|Name|$builtin" | sort -u | paste -sd'|')
# A holder type: [const] [dbrq::]nn::Builtin, or [const] [qualifier::]User (XImpl does not match:
# the name must be followed by [*&>)]).
holder="(const\s+)?((dbrq::)?nn::($builtin)${user:+|([A-Za-z0-9_]+::)*($user)})\s*(const\s*)?"
pattern="(dynamic_cast<\s*$holder[*&]|dynamic_pointer_cast<\s*$holder>|typeid\(\s*$holder\))"
bad=0
if [ -n "$files" ]; then
  while IFS= read -r hit; do
    [ -n "$hit" ] || continue
    # Comments and string literals that explain the pitfall are fine.
    code=${hit#*:*:}
    case "$code" in *'//'*"dynamic"*|*'//'*typeid*|*'`'*) continue ;; esac
    echo "$hit" | sed "s|^$root/||"
    echo "  -> a cast to a holder is always null: write m->as<X>() or dynamic_cast<XImpl*>" 
    bad=$((bad + 1))
  done < <(echo "$files" | xargs grep -nHE "$pattern" 2>/dev/null)
fi
echo "holder_casts: $bad cast(s) to a module holder"
[ "$bad" -eq 0 ]
