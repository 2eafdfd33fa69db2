#!/bin/bash
# third_party/mpi/detect_mpi.sh (what the @system_mpi repository rule decides from) against fake
# MPI compiler wrappers: OpenMPI's is "available" with its flags; MPICH's (no --showme: its
# compiler fails on the option), one whose include directories hold no mpi.h, one that links no
# -lmpi and a missing one are "unavailable: <why>", never a failure (the build falls back to no
# MPI instead of stopping, as it did with MPICH's mpicxx).
set -u
# The script under test: $1, else from the runfiles (Bazel), else next to this checkout.
here=$(cd "$(dirname "$0")" && pwd)
detect="${1:-${TEST_SRCDIR:-/nonexistent}/${TEST_WORKSPACE:-dbrq}/third_party/mpi/detect_mpi.sh}"
[ -f "$detect" ] || detect="$here/../../third_party/mpi/detect_mpi.sh"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/detect_mpi.XXXXXX")
failures=0
passes=0
expect() {  # expect NAME WRAPPER EXPECTED_FIRST_LINE_PREFIX [EXPECTED_SUBSTRING]
  local out code
  out=$(bash "$detect" "$2")
  code=$?
  if [ "$code" -ne 0 ]; then echo "FAIL $1: exit code $code"; failures=$((failures + 1)); return; fi
  case "$(echo "$out" | head -1)" in
    "$3"*) ;;
    *) echo "FAIL $1: first line \"$(echo "$out" | head -1)\" does not start with \"$3\""; failures=$((failures + 1)); return ;;
  esac
  if [ $# -ge 4 ] && [[ "$out" != *"$4"* ]]; then
    echo "FAIL $1: output does not contain \"$4\":"; echo "$out"; failures=$((failures + 1)); return
  fi
  echo "ok   $1"
  passes=$((passes + 1))
}

mkdir -p "$tmp/include" "$tmp/empty"
touch "$tmp/include/mpi.h"
wrapper() {  # wrapper NAME COMPILE_OUTPUT LINK_OUTPUT
  cat > "$tmp/$1" <<EOS
#!/bin/bash
case "\$1" in
  --showme:compile) echo "$2" ;;
  --showme:link) echo "$3" ;;
  *) exit 1 ;;
esac
EOS
  chmod +x "$tmp/$1"
}
wrapper openmpi "-I$tmp/empty -I$tmp/include -pthread" "-L/opt/x/lib -lmpi_cxx -lmpi"
expect "OpenMPI's wrapper" "$tmp/openmpi" "available" "-I$tmp/include -pthread"
out=$(bash "$detect" "$tmp/openmpi")
if [ "$(echo "$out" | sed -n 3p)" != "-L/opt/x/lib -lmpi_cxx -lmpi" ]; then
  echo "FAIL OpenMPI's link line: $(echo "$out" | sed -n 3p)"; failures=$((failures + 1))
fi

# MPICH's mpicxx passes unknown options to the compiler, which fails on them.
cat > "$tmp/mpich" <<'EOS'
#!/bin/bash
echo "g++: error: unrecognized command-line option '$1'" >&2
echo "g++: fatal error: no input files" >&2
exit 1
EOS
chmod +x "$tmp/mpich"
expect "MPICH's wrapper" "$tmp/mpich" "unavailable: " "MPICH's has no --showme): g++: error: unrecognized command-line option '--showme:compile'"

wrapper noheader "-I$tmp/empty" "-lmpi"
expect "no mpi.h" "$tmp/noheader" "unavailable: no mpi.h in the include directories"

wrapper nolib "-I$tmp/include" "-L/opt/x/lib -lfoo"
expect "no -lmpi" "$tmp/nolib" "unavailable: " "has no -lmpi"

expect "missing wrapper" "$tmp/does_not_exist" "unavailable: no executable MPI compiler wrapper"

if real=$(command -v mpicxx); then
  expect "this machine's mpicxx ($real)" "$real" "available"
fi

rm -rf "$tmp"
# Counted cases for tools/run_tests.sh and the CMake stage (as the other sh_tests write them).
if [ -n "${XML_OUTPUT_FILE:-}" ]; then
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites tests="%d" failures="%d" errors="0">\n<testsuite name="detect_mpi" tests="%d" failures="%d" errors="0">\n</testsuite>\n</testsuites>\n' \
    $((passes + failures)) "$failures" $((passes + failures)) "$failures" >"$XML_OUTPUT_FILE"
fi
if [ "$failures" -ne 0 ]; then echo "$failures failed"; exit 1; fi
echo "all passed"
