#!/usr/bin/python3
"""The layering of co2's sources, made executable: every #include "..." must point down the
table below or stay in its own layer (docs/architecture.md, "The layers").

    /usr/bin/python3 scripts/layering.py [SOURCE_ROOT]   # exit 1 and one line per violation
    /usr/bin/python3 scripts/layering.py --self-test [SOURCE_ROOT]

--self-test plants an upward include (and a transport that includes the engine) into the real
tree's text, in memory, and fails unless the checker names each planted one.
"""
import os
import re
import sys

# Lowest first. A file may include files of its own layer and of any layer below it.
LAYERS = [
    ("base", ("runtime/base/",)),             # status, log, types, checksums: no co2 concept
    ("outer", ("runtime/outer/",)),           # the outer update's element math, the wire formats
    ("transports", ("transports/",)),         # point-to-point and collective transports
    ("rendezvous", ("rendezvous/",)),         # stores the ranks meet through
    ("collectives", ("runtime/collectives/",)),  # algorithms over a point-to-point transport
    ("comm", ("runtime/comm/",)),             # the communicator and its executors
    ("group", ("runtime/group/",)),           # communicators made from a launch
    ("backends", ("runtime/backends/",)),     # where the outer state lives, how it travels
    ("engine", ("runtime/engine/",)),         # the round logic, checkpoints, observation
    ("capi", ("capi/",)),                     # the C ABI
    ("launcher", ("launcher/",)),             # co2run
]
# A transport knows nothing of CO2: of the layers below it, it may include base only.
ONLY_BELOW = {"transports": ("base",)}
# Not layered: they may include anything.
UNCHECKED = ("tests/", "bench/", "examples/", "bindings/", "scripts/", "build")

# Known upward includes, each waiting for its fix; an entry that no longer occurs is reported
# so that it is deleted here.
EXCEPTIONS = set()

SOURCE_SUFFIXES = (".h", ".hpp", ".c", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def layer_of(path):
    for rank, (name, prefixes) in enumerate(LAYERS):
        if path.startswith(prefixes):
            return rank, name
    return None


def read_tree(root):
    """{relative path: text} of every C/C++/CUDA source under root outside build folders."""
    tree = {}
    for directory, subdirectories, files in os.walk(root):
        relative_dir = os.path.relpath(directory, root)
        subdirectories[:] = [d for d in subdirectories
                             if not d.startswith((".", "build")) and d not in ("target", "subprojects")]
        for name in files:
            if name.endswith(SOURCE_SUFFIXES):
                path = os.path.normpath(os.path.join(relative_dir, name))
                with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as f:
                    tree[path] = f.read()
    return tree


def resolve(tree, including, target):
    """The tree path an include names: root-relative first, then relative to the includer."""
    if target in tree:
        return target
    public = os.path.join("capi/include", target)
    if public in tree:
        return public
    relative = os.path.normpath(os.path.join(os.path.dirname(including), target))
    return relative if relative in tree else None


def violations(tree, exceptions=frozenset()):
    """(problems, used exceptions): one line per include that runs up, or file outside the table."""
    problems, used = [], set()
    for path in sorted(tree):
        if path.startswith(UNCHECKED):
            continue
        own = layer_of(path)
        if own is None:
            if path.startswith("runtime/"):
                problems.append(f"{path}: in no layer (place it in one of runtime/{{base,...}}/)")
            continue
        for target in INCLUDE.findall(tree[path]):
            included = resolve(tree, path, target)
            if included is None:
                continue
            theirs = layer_of(included)
            if theirs is None or theirs[0] == own[0]:
                continue
            allowed_below = ONLY_BELOW.get(own[1])
            if theirs[0] < own[0] and (allowed_below is None or theirs[1] in allowed_below):
                continue
            if (path, included) in exceptions:
                used.add((path, included))
                continue
            where = "above it" if theirs[0] > own[0] else "(it may include only " + ", ".join(allowed_below) + ")"
            problems.append(f"{path}: includes {included}: layer {own[1]} must not depend on {theirs[1]} {where}")
    return problems, used


def check(root):
    problems, used = violations(read_tree(root), EXCEPTIONS)
    for stale in sorted(EXCEPTIONS - used):
        print(f"note: exception {stale[0]} -> {stale[1]} no longer occurs: delete it from "
              f"scripts/layering.py")
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} include(s) cross the layering (scripts/layering.py, LAYERS)")
        return 1
    print("layering: every include points down")
    return 0


def self_test(root):
    tree = read_tree(root)
    plants = {
        "runtime/base/status.hpp": '#include "runtime/engine/engine.hpp"\n',
        "transports/transport.hpp": '#include "runtime/outer/boundary_pass.hpp"\n',
        "transports/collective.hpp": '#include "runtime/engine/engine.hpp"\n',
        "runtime/collectives/collectives.hpp": '#include "runtime/comm/comm.hpp"\n',
    }
    failures = 0
    for path, include in plants.items():
        if path not in tree:
            print(f"self-test: {path} is not in the tree")
            failures += 1
            continue
        planted = dict(tree)
        planted[path] = include + tree[path]
        problems, _ = violations(planted, EXCEPTIONS)
        target = include.split('"')[1]
        if not any(line.startswith(f"{path}: includes {target}") for line in problems):
            print(f"self-test: planting {include.strip()} in {path} went unnoticed")
            failures += 1
    # A file dropped flat into runtime/ is outside every layer.
    planted = dict(tree)
    planted["runtime/stray.cpp"] = '#include "runtime/base/status.hpp"\n'
    if not any(line.startswith("runtime/stray.cpp: in no layer") for line in violations(planted)[0]):
        print("self-test: a flat runtime/stray.cpp went unnoticed")
        failures += 1
    # An include down the table is fine.
    planted = dict(tree)
    planted["runtime/engine/engine.cpp"] = '#include "runtime/base/status.hpp"\n'
    if any(line.startswith("runtime/engine/engine.cpp:") for line in violations(planted, EXCEPTIONS)[0]):
        print("self-test: a downward include was reported")
        failures += 1
    print("self-test: " + ("failed" if failures else f"all {len(plants) + 2} plants judged right"))
    return 1 if failures else 0


if __name__ == "__main__":
    arguments = sys.argv[1:]
    testing = "--self-test" in arguments
    arguments = [a for a in arguments if a != "--self-test"]
    source_root = arguments[0] if arguments else os.path.join(os.path.dirname(__file__), "..")
    sys.exit(self_test(source_root) if testing else check(source_root))
