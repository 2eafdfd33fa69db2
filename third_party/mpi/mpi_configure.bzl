"""System OpenMPI for the optional //distributed targets (issue 15).

A repository rule rather than a plain new_local_repository: MPI is optional. When `mpicxx` is on
PATH (Debian's libopenmpi-dev), the generated @system_mpi//:mpi library takes its include
directories and link options from `mpicxx --showme:compile` / `--showme:link`, and
@system_mpi//:defs.bzl says MPI_AVAILABLE = True. Without it, or with a wrapper that is not
OpenMPI's (MPICH's mpicxx: no --showme), the library is empty and MPI_AVAILABLE = False (with a
printed reason in the second case: third_party/mpi/detect_mpi.sh decides), so
//distributed/BUILD.bazel defines none of its targets and `bazel build //...` still works. The core library (//:dbrq) never depends on it.
"""

def _unavailable(ctx, reason):
    # buildifier: disable=print
    print("dbrq: building without MPI (//distributed, //tools/cli:dbrq_mpi not defined): " + reason)
    ctx.file("BUILD.bazel", "package(default_visibility = [\"//visibility:public\"])\n" +
                            "cc_library(name = \"mpi\")\n")
    ctx.file("defs.bzl", "MPI_AVAILABLE = False\nMPIRUN = \"\"\n")

def _mpi_configure_impl(ctx):
    mpicxx = ctx.which("mpicxx")
    if mpicxx == None:
        # No wrapper at all: the usual case without OpenMPI, said nothing about.
        ctx.file("BUILD.bazel", "package(default_visibility = [\"//visibility:public\"])\n" +
                                "cc_library(name = \"mpi\")\n")
        ctx.file("defs.bzl", "MPI_AVAILABLE = False\nMPIRUN = \"\"\n")
        return

    # The decision is a script (tested against fake wrappers: //tests/distributed:detect_mpi_test):
    # a wrapper that is not OpenMPI's (MPICH's mpicxx has no --showme) falls back to no MPI.
    script = ctx.path(Label("//third_party/mpi:detect_mpi.sh"))
    r = ctx.execute(["bash", str(script), str(mpicxx)])
    lines = r.stdout.strip().split("\n")
    if r.return_code != 0 or not lines or lines[0] != "available" or len(lines) < 3:
        reason = lines[0] if lines and lines[0].startswith("unavailable: ") else "detect_mpi.sh failed: " + r.stderr
        _unavailable(ctx, reason[len("unavailable: "):] if reason.startswith("unavailable: ") else reason)
        return
    compile_flags = lines[1].split(" ")
    link_flags = lines[2].split(" ")
    includes = []
    defines = []
    for f in compile_flags:
        if f.startswith("-I"):
            includes.append(f[2:])
        elif f.startswith("-D"):
            defines.append(f[2:])

    # The C API only: drop the deprecated C++ bindings (-lmpi_cxx).
    linkopts = [f for f in link_flags if f and f != "-lmpi_cxx"]

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
