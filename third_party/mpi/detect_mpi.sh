#!/bin/bash
# Decides whether the MPI compiler wrapper given as $1 is one dbrq can build //distributed with
# (OpenMPI's mpicxx), for third_party/mpi/mpi_configure.bzl; tested by
# //tests/distributed:detect_mpi_test against fake wrappers.
#
#   detect_mpi.sh /usr/bin/mpicxx
#
# Prints either three lines:
#   available
#   <compile flags>      from `mpicxx --showme:compile`
#   <link flags>         from `mpicxx --showme:link`
# or one line, and the build goes on without MPI:
#   unavailable: <why>
# Always exits 0 (the caller decides); a wrapper that is not OpenMPI's (MPICH's mpicxx has no
# --showme: it hands the option to the compiler, which fails), or whose flags do not lead to an
# mpi.h, or that links no -lmpi, is "unavailable", never an error.
mpicxx="$1"
join() { tr '\n' ' ' | sed 's/  */ /g; s/ $//'; }   # flags: whole, on one line
one_line() { join | cut -c1-300; }                    # an error message: at most 300 characters
if [ -z "$mpicxx" ] || [ ! -x "$mpicxx" ]; then
  echo "unavailable: no executable MPI compiler wrapper (\"$mpicxx\")"
  exit 0
fi
if ! compile=$("$mpicxx" --showme:compile 2>&1); then
  echo "unavailable: $mpicxx --showme:compile failed (dbrq needs OpenMPI's mpicxx; MPICH's has no --showme): $(echo "$compile" | one_line)"
  exit 0
fi
if ! link=$("$mpicxx" --showme:link 2>&1); then
  echo "unavailable: $mpicxx --showme:link failed: $(echo "$link" | one_line)"
  exit 0
fi
compile=$(echo "$compile" | join)
link=$(echo "$link" | join)
found=""
for f in $compile; do
  case "$f" in
    -I*) [ -f "${f#-I}/mpi.h" ] && found="${f#-I}" ;;
  esac
done
if [ -z "$found" ]; then
  echo "unavailable: no mpi.h in the include directories of $mpicxx --showme:compile (\"$compile\")"
  exit 0
fi
case " $link " in
  *" -lmpi "*) ;;
  *)
    echo "unavailable: $mpicxx --showme:link has no -lmpi (\"$link\")"
    exit 0
    ;;
esac
echo "available"
echo "$compile"
echo "$link"
