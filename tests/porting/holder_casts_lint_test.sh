#!/usr/bin/env bash
# tools/lint/holder_casts.sh (run over the whole tree by tools/run_tests.sh) against small
# fixtures: it flags casts to a module holder, which compile and are always null, and leaves the
# module classes, local aliases of them, comments and as<X>() alone.
set -uo pipefail
lint=tools/lint/holder_casts.sh
nn_h=runtime/nn.h
pass=0
fail=0
cases=""
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
record() {
  if [ -z "$2" ]; then
    echo "PASS $1"; pass=$((pass + 1))
    cases+="<testcase name=\"$1\"/>"$'\n'
  else
    echo "FAIL $1: $2"; fail=$((fail + 1))
    cases+="<testcase name=\"$1\"><failure message=\"$(echo "$2" | sed 's/[<>&"]/_/g')\"/></testcase>"$'\n'
  fi
}
# check NAME EXPECTED_RC EXPECTED_COUNT SOURCE: lints a tree holding SOURCE as one file.
check() {
  local name=$1 want_rc=$2 want_n=$3 dir="$tmp/$1"
  mkdir -p "$dir"
  printf '%s\n' "$4" >"$dir/model.cc"
  local out rc
  out=$("$lint" "$dir" "$nn_h" 2>&1)
  rc=$?
  echo "$out" | sed 's/^/    /'
  if [ "$rc" -ne "$want_rc" ]; then
    record "$name" "exit $rc, expected $want_rc"
  elif ! echo "$out" | tail -n 1 | grep -qx "holder_casts: $want_n cast(s) to a module holder"; then
    record "$name" "expected $want_n cast(s)"
  elif [ "$want_n" -gt 0 ] && ! grep -q 'always null: write m->as<X>() or dynamic_cast<XImpl\*>' <<<"$out"; then
    record "$name" "no fix in the message"
  else
    record "$name" ""
  fi
}

check builtin_holder_casts_are_flagged 1 4 '
void f(dbrq::nn::Module* m, std::shared_ptr<dbrq::nn::Module> p) {
  auto* a = dynamic_cast<nn::Conv2d*>(m);
  auto* b = dynamic_cast<const dbrq::nn::Linear*>(m);
  auto c = std::dynamic_pointer_cast<nn::BatchNorm2d>(p);
  bool d = typeid(*m) == typeid(nn::ReLU);
}'
check module_classes_aliases_and_comments_pass 0 0 '
using Linear = nn::LinearImpl;
// dynamic_cast<nn::Conv2d*>(m) would always be null
void f(dbrq::nn::Module* m, std::shared_ptr<dbrq::nn::Module> p) {
  auto* a = dynamic_cast<nn::Conv2dImpl*>(m);
  auto b = std::dynamic_pointer_cast<Linear>(p);
  auto* c = m->as<nn::Conv2d>();
  auto* d = dynamic_cast<nn::Conv2dOptions*>(nullptr);
}'
check user_holders_are_flagged 1 2 '
struct FireImpl : dbrq::nn::Module {};
DBRQ_MODULE(Fire);
void f(dbrq::nn::Module* m) {
  auto* a = dynamic_cast<Fire*>(m);
  auto* b = dynamic_cast<const models::Fire*>(m);
  auto* c = dynamic_cast<FireImpl*>(m);
}'
# The repository's own nn.h gives the built-in names: without it the lint refuses to run.
out=$("$lint" "$tmp" "$tmp/missing_nn.h" 2>&1); rc=$?
if [ "$rc" -eq 2 ] && grep -q "no $tmp/missing_nn.h" <<<"$out"; then
  record missing_header_is_an_error ""
else
  record missing_header_is_an_error "exit $rc: $out"
fi

echo "$pass passed, $fail failed"
if [ -n "${XML_OUTPUT_FILE:-}" ]; then
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites tests="%d" failures="%d" errors="0">\n<testsuite name="holder_casts_lint" tests="%d" failures="%d" errors="0">\n%s</testsuite>\n</testsuites>\n' \
    $((pass + fail)) "$fail" $((pass + fail)) "$fail" "$cases" >"$XML_OUTPUT_FILE"
fi
[ $fail -eq 0 ]
