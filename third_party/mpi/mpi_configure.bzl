"""System OpenMPI for the optional //distributed targets (issue 15).

A repository rule rather than a plain new_local_repository: MPI is optional. When `mpicxx` is on
PATH (Debian's libopenmpi-dev), the generated @system_mpi//:mpi library takes its include
directories and link options from `mpicxx --showme:compile` / `--showme:link`, and
@system_mpi//:defs.bzl says MPI_AVAILABLE = True. Without it the library is empty and
MPI_AVAILABLE = False, so //distributed/BUILD.bazel defines none of its targets and
`bazel build //...` still works. The core library (//:dbrq) never depends on it.
"""

def _flags(ctx, mpicxx, what):
    r = ctx.execute([mpicxx, "--showme:" + what])
    if r.return_code != 0:
        fail("%s --showme:%s failed: %s" % (mpicxx, what, r.stderr))
    return r.stdout.strip().split(" ")

def _mpi_configure_impl(ctx):
    mpicxx = ctx.which("mpicxx")
    if mpicxx == None:
        ctx.file("BUILD.bazel", "package(default_visibility = [\"//visibility:public\"])\n" +
                                "cc_library(name = \"mpi\")\n")
        ctx.file("defs.bzl", "MPI_AVAILABLE = False\nMPIRUN = \"\"\n")
        return
    includes = []
    defines = []
    for f in _flags(ctx, mpicxx, "compile"):
        if f.startswith("-I"):
            includes.append(f[2:])
        elif f.startswith("-D"):
            defines.append(f[2:])

    # The C API only: drop the deprecated C++ bindings (-lmpi_cxx).
    linkopts = [f for f in _flags(ctx, mpicxx, "link") if f and f != "-lmpi_cxx"]

    # Bazel wants headers inside the repository: link each include directory in.
    hdr_dirs = []
    for i, d in enumerate(includes):
        name = "include%d" % i
        ctx.symlink(d, name)
        hdr_dirs.append(name)
    ctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])

# Generated from `mpicxx --showme` (third_party/mpi/mpi_configure.bzl).
cc_library(
    name = "mpi",
    hdrs = glob([{globs}]),
    includes = {includes},
    defines = {defines},
    linkopts = {linkopts},
)
""".format(
        globs = ", ".join(['"%s/**/*.h"' % d for d in hdr_dirs]),
        includes = repr(hdr_dirs),
        defines = repr(defines + ["OMPI_SKIP_MPICXX=1"]),
        linkopts = repr(linkopts),
    ))
    ctx.file("defs.bzl", "MPI_AVAILABLE = True\nMPIRUN = %r\n" % str(ctx.which("mpirun") or "mpirun"))

mpi_configure = repository_rule(
    implementation = _mpi_configure_impl,
    environ = ["PATH"],
    local = True,
)
