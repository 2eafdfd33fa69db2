#!/usr/bin/env python3
"""Bazel's BUILD files are the one source of truth for the file lists; this writes CMake's from them.

    bazel query //... --output=xml | tools/cmake/bazel_to_cmake.py generate > cmake/bazel_targets.cmake
    tools/cmake/bazel_to_cmake.py bazel-sources < query.xml     # "label file" lines (what Bazel builds)
    tools/cmake/bazel_to_cmake.py compare BAZEL_LIST CMAKE_LIST  # exit 1 and name every difference

tools/cmake/sync.sh wraps these (regenerate, check); docs/cmake.md explains the scheme.

`generate` turns every cc_library, cc_binary, cc_test and sh_test of the workspace into one
dbrq_bazel_target(...) call (CMakeLists.txt defines it): sources, headers, internal deps (as CMake
target names), system deps (@system_libs//:x as SYSTEM x), data files (filegroups expanded) and
data binaries, link options, tags. Anything the translation does not understand (an unknown rule
kind among deps or data, an attribute such as copts, an external repository other than
system_libs) is an error, so a BUILD change can never be dropped silently on the CMake side.
"""
import sys
import xml.etree.ElementTree as ET

MULTI = {"SRCS", "HDRS", "DEPS", "SYSTEM", "DATA", "DATA_BINARIES", "LINKOPTS", "TAGS", "COPTS", "DEFINES",
         "LOCAL_DEFINES", "ENV"}
BUILT_KINDS = ("cc_library", "cc_binary", "cc_test", "sh_test")
# Attributes whose meaning the CMake side reproduces, or that do not matter to it (size: ctest has
# no sizes; visibility: CMake has no visibility, check_layers.sh enforces the layering on sources).
KNOWN_ATTRS = {
    "name", "srcs", "hdrs", "deps", "data", "linkopts", "tags", "testonly", "alwayslink",
    "linkstatic", "size", "visibility", "timeout", "copts", "defines", "local_defines", "env",
}


def label_to_path(label):
    """//pkg:sub/file.cc -> pkg/sub/file.cc; //:dbrq.h -> dbrq.h."""
    if not label.startswith("//"):
        raise SystemExit(f"bazel_to_cmake: cannot map the label {label} to a file of this repository")
    pkg, _, name = label[2:].partition(":")
    return f"{pkg}/{name}" if pkg else name


def cmake_name(label):
    """//core:core -> dbrq_core; //kernels:int8 -> dbrq_kernels_int8; //:dbrq -> dbrq."""
    pkg, _, name = label[2:].partition(":")
    if not pkg:
        return "dbrq" if name == "dbrq" else f"dbrq_{name}"
    parts = pkg.split("/")
    if parts[-1] != name:
        parts.append(name)
    return "dbrq_" + "_".join(parts)


def runfile(label):
    """Where Bazel puts a target's output, relative to bazel-bin and to a runfiles root."""
    pkg, _, name = label[2:].partition(":")
    return f"{pkg}/{name}" if pkg else name


def parse(xml_text):
    rules = {}
    for rule in ET.fromstring(xml_text).iter("rule"):
        attrs = {}
        for child in rule:
            kind, name = child.tag, child.get("name")
            if kind in ("rule-input", "rule-output") or name is None:
                continue
            if kind == "list":
                attrs[name] = [v.get("value") for v in child]
            elif kind in ("string", "boolean", "int"):
                attrs[name] = child.get("value")
            elif kind == "dict":  # env: NAME=VALUE strings
                attrs[name] = [f"{p[0].get('value')}={p[1].get('value')}" for p in child.iter("pair")]
            else:
                attrs[name] = ET.tostring(child, encoding="unicode")
        rules[rule.get("name")] = (rule.get("class"), attrs)
    return rules


def expand_files(label, rules, seen=()):
    """A data or srcs label -> the files it stands for (filegroups expanded, recursively)."""
    if label in rules:
        kind, attrs = rules[label]
        if kind != "filegroup":
            raise SystemExit(f"bazel_to_cmake: {label} ({kind}) is not a file or a filegroup")
        if label in seen:
            raise SystemExit(f"bazel_to_cmake: filegroup cycle through {label}")
        out = []
        for src in attrs.get("srcs", []):
            out += expand_files(src, rules, seen + (label,))
        return out
    return [label_to_path(label)]


# Bazel's optional MPI layer (//distributed:mpi, issue 15) exists only where OpenMPI is installed;
# the CMake build leaves it and everything using it out (docs/cmake.md).
OPTIONAL_REPOS = ("@system_mpi//",)


def uses_optional(label, rules, seen=None):
    """Whether `label` needs an optional repository: through its deps, or through a rule it
    runs from its data (a test driving an MPI binary)."""
    seen = set() if seen is None else seen
    attrs = rules[label][1]
    for dep in attrs.get("deps", []) + [d for d in attrs.get("data", []) if d in rules]:
        if dep.startswith(OPTIONAL_REPOS):
            return True
        if dep.startswith("//") and dep in rules and dep not in seen:
            seen.add(dep)
            if uses_optional(dep, rules, seen):
                return True
    return False


def built_rules(rules):
    for label in sorted(rules):
        kind, attrs = rules[label]
        if kind not in BUILT_KINDS or uses_optional(label, rules):
            continue
        unknown = sorted(set(attrs) - KNOWN_ATTRS)
        if unknown:
            raise SystemExit(f"bazel_to_cmake: {label} sets {', '.join(unknown)}, which the CMake translation "
                             "does not handle; teach tools/cmake/bazel_to_cmake.py and CMakeLists.txt about it")
        yield label, kind, attrs


def transitive_deps(label, rules, out):
    for dep in rules[label][1].get("deps", []):
        if dep.startswith("//") and dep not in out:
            out.add(dep)
            transitive_deps(dep, rules, out)
    return out


def generate(rules):
    lines = [
        "# GENERATED by tools/cmake/sync.sh from Bazel's BUILD files (bazel query //... --output=xml).",
        "# Do not edit: change the BUILD files, then run tools/cmake/sync.sh; tools/cmake/sync.sh --check",
        "# (run by tools/run_tests.sh) fails when this file and the BUILD files disagree.",
        "",
    ]
    for label, kind, attrs in built_rules(rules):
        args = [f"KIND {kind}", f"LABEL {label}", f"NAME {cmake_name(label)}"]
        args.append(f"RUNFILE {runfile(label)}")
        srcs = []
        for s in attrs.get("srcs", []):
            srcs += expand_files(s, rules)
        if srcs:
            args.append("SRCS " + " ".join(srcs))
        hdrs = []
        for h in attrs.get("hdrs", []):
            hdrs += expand_files(h, rules)
        if hdrs:
            args.append("HDRS " + " ".join(hdrs))
        deps, system = [], []
        for d in attrs.get("deps", []):
            if d.startswith("@system_libs//:"):
                system.append(d.split(":", 1)[1])
            elif d.startswith("//"):
                if d not in rules or rules[d][0] != "cc_library":
                    raise SystemExit(f"bazel_to_cmake: {label} depends on {d}, which is not a cc_library")
                deps.append(cmake_name(d))
            else:
                raise SystemExit(f"bazel_to_cmake: {label} depends on {d}: only @system_libs is mapped")
        if deps:
            args.append("DEPS " + " ".join(deps))
        if system:
            args.append("SYSTEM " + " ".join(system))
        data_files, data_bins = [], []
        # A test's runfiles hold its own data and its libraries' (//tests/rnn:rnn_cases has goldens).
        data = list(attrs.get("data", []))
        if kind != "cc_library":
            for dep in sorted(transitive_deps(label, rules, set())):
                data += [d for d in rules[dep][1].get("data", []) if d not in data]
        for d in data:
            if d in rules and rules[d][0] == "cc_binary":
                data_bins.append(f"{cmake_name(d)}={runfile(d)}")
            else:
                data_files += expand_files(d, rules)
        if data_files:
            args.append("DATA " + " ".join(data_files))
        if data_bins:
            args.append("DATA_BINARIES " + " ".join(data_bins))
        if attrs.get("linkopts"):
            args.append("LINKOPTS " + " ".join(attrs["linkopts"]))
        for attr in ("copts", "defines", "local_defines"):
            if attrs.get(attr):
                args.append(attr.upper() + " " + " ".join(attrs[attr]))
        if attrs.get("tags"):
            args.append("TAGS " + " ".join(attrs["tags"]))
        if attrs.get("env"):
            if any(" " in e or ";" in e for e in attrs["env"]):
                raise SystemExit(f"bazel_to_cmake: {label} sets an env value with a space or ';', which CMake's "
                                 "test ENVIRONMENT cannot hold")
            args.append("ENV " + " ".join(attrs["env"]))
        if attrs.get("alwayslink") == "true":
            args.append("ALWAYSLINK")
        if attrs.get("testonly") == "true":
            args.append("TESTONLY")
        # One value a line, so a BUILD change shows as a one-line diff here.
        body = []
        for a in args:
            key, *values = a.split(" ")
            if key in MULTI:
                body.append("  " + key)
                body += ["    " + v for v in values]
            else:
                body.append("  " + a)
        body = "\n".join(body)
        lines.append("dbrq_bazel_target(\n" + body + "\n)")
    # What `make install` ships: the public target and everything it links.
    installed = sorted(cmake_name(d) for d in transitive_deps("//:dbrq", rules, set()))
    lines.append("")
    lines.append("set(DBRQ_INSTALLED_TARGETS dbrq " + " ".join(installed) + ")")
    return "\n".join(lines) + "\n"


def bazel_sources(rules):
    """One "cmake-name file" line per source or header of every built target, sorted."""
    out = set()
    for label, kind, attrs in built_rules(rules):
        for attr in ("srcs", "hdrs"):
            for s in attrs.get(attr, []):
                for f in expand_files(s, rules):
                    out.add(f"{cmake_name(label)} {f}")
    return sorted(out)


def compare(bazel_lines, cmake_lines):
    """Names every (target, file) pair only one build has; returns the number of differences."""
    b, c = set(bazel_lines) - {""}, set(cmake_lines) - {""}
    for line in sorted(b - c):
        print(f"only in Bazel: {line}  (BUILD files changed: run tools/cmake/sync.sh)")
    for line in sorted(c - b):
        print(f"only in CMake: {line}  (list it in the BUILD file, not in CMakeLists.txt)")
    return len(b ^ c)


def main(argv):
    if len(argv) >= 2 and argv[1] == "generate":
        sys.stdout.write(generate(parse(sys.stdin.read())))
    elif len(argv) >= 2 and argv[1] == "bazel-sources":
        sys.stdout.write("".join(line + "\n" for line in bazel_sources(parse(sys.stdin.read()))))
    elif len(argv) == 4 and argv[1] == "compare":
        with open(argv[2]) as f:
            b = f.read().splitlines()
        with open(argv[3]) as f:
            c = f.read().splitlines()
        n = compare(b, c)
        if n:
            print(f"{n} difference(s) between the Bazel and the CMake source lists")
            return 1
        print(f"Bazel and CMake list the same {len(set(b) - {''})} sources")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
