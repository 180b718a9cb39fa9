#!/usr/bin/env python3
"""The house rules of docs/architecture.md, checked: every quoted #include of the library's sources and public headers
names a layer at or below the includer's, and never a sibling feature (publish, fetch, arena stand side by side).

    include_rules.py [SOURCE_DIR]        exit 1 and one line per broken rule; --list prints the layer table

Layers are folders of src/ and groups of public headers (include/kvcomm/). A file may include its own layer and any
layer its layer lists in ALLOWED; nothing else. Front ends (capi) see only public headers, common and themselves.
Programs outside the library (tools/, perf/, examples/) may not include tests/: what they share with the tests lives
in support/.
"""
import os
import re
import sys

# What each layer may include besides itself (lower layers only). The order of the keys is the picture, lowest first.
ALLOWED = {
    "base": [],  # generic public pieces: api, error, stream, limits, version, device error records, device macros
    "common": ["base"],
    "platform": ["base", "common"],
    "comm": ["base", "common", "platform"],
    "symm": ["base", "common", "platform", "comm"],
    "kvlayout": ["base", "common"],
    "device": ["base", "common", "platform", "symm"],
    "kernels": ["base", "common", "platform", "device", "dev-barrier", "dev-publish", "dev-fetch"],
    "barrier": ["base", "common", "platform", "comm", "symm", "device", "kernels", "dev-barrier"],
    # the three features: side by side, never each other
    "publish": ["base", "common", "platform", "comm", "symm", "kvlayout", "device", "kernels", "barrier",
                "dev-barrier", "dev-publish"],
    "fetch": ["base", "common", "platform", "comm", "symm", "kvlayout", "device", "kernels", "barrier",
              "dev-barrier", "dev-fetch"],
    "arena": ["base", "common", "platform", "comm", "symm", "kvlayout", "device"],
    # above the features: peers that meet at run time, carried by fetch's transports, registering arenas too
    "endpoint": ["base", "common", "platform", "comm", "symm", "kvlayout", "device", "kernels", "barrier",
                 "dev-barrier", "dev-fetch", "fetch", "arena"],
    # public device headers (include/kvcomm/device/): header-only device API
    "dev-barrier": ["base"],
    "dev-publish": ["base"],
    "dev-fetch": ["base"],
    # front ends over the public objects
    "capi": ["base", "common", "public"],
    "mpi": ["base", "common", "comm"],
    "umbrella": ["*"],
}

# Public headers by layer (include/kvcomm/<name>); anything not listed is "base".
PUBLIC = {
    "comm.hpp": "comm", "bootstrap.hpp": "comm", "capabilities.hpp": "platform", "symm.hpp": "symm",
    "kv_layout.hpp": "kvlayout", "kv_contents.hpp": "kvlayout", "kv_conversion.hpp": "kvlayout",
    "barrier.hpp": "barrier", "publish.hpp": "publish", "fetch.hpp": "fetch",
    "arena.hpp": "arena", "endpoint.hpp": "endpoint", "converted_read.hpp": "endpoint", "converted_fetch.hpp": "endpoint", "mpi_bootstrap.hpp": "mpi", "kvcomm.hpp": "umbrella",
    "kvcomm.h": "capi",
    "device/barrier.hpp": "dev-barrier", "device/publish.hpp": "dev-publish", "device/fetch.hpp": "dev-fetch",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE = (".hpp", ".cpp", ".cu", ".cuh", ".h", ".c")


def layer_of_public(name):
    return PUBLIC.get(name, "base")


def layer_of_file(rel):
    parts = rel.split("/")
    if parts[0] == "include" and len(parts) >= 3 and parts[1] == "kvcomm":
        return layer_of_public("/".join(parts[2:]))
    if parts[0] == "src" and len(parts) >= 3:
        return parts[1]
    return None


def layer_of_include(target):
    """(layer, public) of an include, or (None, False) for one relative to the includer or outside the library."""
    if target.startswith("kvcomm/"):
        return layer_of_public(target[len("kvcomm/"):]), True
    first = target.split("/")[0]
    if first in ALLOWED and "/" in target:
        return first, False
    return None, False


# Internal headers a front end may use, each for a reason docs/architecture.md gives: the vote a collective C call joins
# when its arguments fail to convert on one rank (so no member waits), and the spec checks the pure C functions share.
FRONT_END_DOORS = {"comm/agreement.hpp", "comm/parallel_spec.hpp"}


def allowed(src_layer, dst_layer, public, target=""):
    if dst_layer is None or dst_layer == src_layer:
        return True
    if src_layer == "capi" and target in FRONT_END_DOORS:
        return True
    ok = ALLOWED.get(src_layer, [])
    return "*" in ok or dst_layer in ok or (public and "public" in ok)


def check_library(root):
    errors = []
    for top in ("src", "include"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SOURCE):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                src_layer = layer_of_file(rel)
                if src_layer is None:
                    continue
                if src_layer not in ALLOWED:
                    errors.append(f"{rel}: folder src/{src_layer}/ is no layer of docs/architecture.md "
                                  "(add it to the picture and to tests/scripts/include_rules.py)")
                    continue
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for m in INCLUDE.finditer(text):
                    target = m.group(1)
                    dst, public = layer_of_include(target)
                    if not allowed(src_layer, dst, public, target):
                        line = text.count("\n", 0, m.start()) + 1
                        kind = "a sibling feature" if {src_layer, dst} <= {"publish", "fetch", "arena"} else \
                            "a layer above it" if dst != "base" else "a layer it may not see"
                        what = "the public header" if public else "the internal header"
                        errors.append(f"{rel}:{line}: layer '{src_layer}' includes {what} \"{target}\" of layer "
                                      f"'{dst}', "
                                      f"{kind} (may include: {', '.join(ALLOWED[src_layer]) or 'nothing'})")
    return errors


def check_programs(root):
    """tools/, perf/ and examples/ include public headers, their own files and support/ (shared with the tests);
    never the tests' own helpers (tests/) and never another program folder's files."""
    errors = []
    for top in ("tools", "perf", "examples"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SOURCE):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for m in INCLUDE.finditer(text):
                    target = m.group(1)
                    if target.startswith("kvcomm/") or os.path.exists(os.path.join(dirpath, target)) or \
                            os.path.exists(os.path.join(root, top, target)) or \
                            os.path.exists(os.path.join(root, "support", target)):
                        continue
                    where = [d for d in ("tests", "tools", "perf", "examples", "src")
                             if d != top and os.path.exists(os.path.join(root, d, target))]
                    if where:
                        line = text.count("\n", 0, m.start()) + 1
                        errors.append(f"{os.path.relpath(path, root)}:{line}: includes \"{target}\" of {where[0]}/; "
                                      "what programs share lives in support/, the library's internals stay in src/")
    return errors


def self_test():
    """The checker must fail on each kind of broken rule (a check that cannot fail proves nothing)."""
    import tempfile
    cases = {
        "src/publish/x.cpp": '#include "fetch/planner.hpp"\n',          # sibling feature, internal
        "src/arena/x.cpp": '#include "kvcomm/publish.hpp"\n',           # sibling feature, public
        "src/common/x.cpp": '#include "comm/wire.hpp"\n',               # a layer above
        "src/capi/x.cpp": '#include "symm/rendezvous.hpp"\n',          # a front end past its doors
        "include/kvcomm/device/fetch.hpp": '#include "kvcomm/device/publish.hpp"\n',
        "src/newlayer/x.cpp": '#include "common/check.hpp"\n',          # a folder the picture lacks
        "tools/x.cpp": '#include "support/memory.hpp"\n',               # a program using the tests' helpers
        "tests/support/memory.hpp": "",
        # allowed: the layer itself, lower layers, the front end's doors, relative includes
        "src/fetch/ok.cpp": '#include "fetch/planner.hpp"\n#include "barrier/x.hpp"\n#include "kvcomm/kv_layout.hpp"\n',
        "src/capi/ok.cpp": '#include "comm/agreement.hpp"\n#include "kvcomm/fetch.hpp"\n',
    }
    with tempfile.TemporaryDirectory() as d:
        for rel, text in cases.items():
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            with open(os.path.join(d, rel), "w") as fh:
                fh.write(text)
        errors = check_library(d) + check_programs(d)
    flagged = sorted({e.split(":")[0] for e in errors})
    want = sorted(k for k in cases if "/ok." not in k and not k.startswith("tests/"))
    if flagged != want or len(errors) != len(want):
        print("include_rules self-test FAILED: flagged", flagged, "wanted", want)
        for e in errors:
            print("  ", e)
        return 1
    print(f"include_rules self-test: all {len(want)} kinds of broken include flagged, the allowed ones not")
    return 0


def main(argv):
    if "--self-test" in argv and self_test():
        return 1
    args = [a for a in argv[1:] if not a.startswith("--")]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), "..", ".."))
    if "--list" in argv:
        for layer, ok in ALLOWED.items():
            print(f"{layer:12} may include {', '.join(ok) or '(only itself)'}")
        return 0
    errors = check_library(root) + check_programs(root)
    for e in errors:
        print(e)
    if errors:
        print(f"include_rules: {len(errors)} include(s) break the layers of docs/architecture.md")
        return 1
    print("include_rules: every include of src/, include/kvcomm/, tools/, perf/ and examples/ keeps the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
