#!/usr/bin/env python3
"""docs/renames.txt is the one list of renamed public names. Checks that it is well formed and that no OLD name is
still used where users see the API: public headers, the library and front-end sources, the Python package, examples,
tools, tests and docs (renames.txt itself and results/ excepted).

    renames_check.py [SOURCE_DIR] [--self-test]
"""
import os
import re
import sys

LANGS = {"cpp", "c", "python", "file"}
# Records of measurements taken under the old names, and the reader of those records (it accepts both spellings).
SKIP_FILES = {"performance.md", "targets.py", "perf_targets.sh"}
SKIP_DIRS = {".git", "results", "__pycache__", "build", "node_modules"}
TEXT = (".hpp", ".cpp", ".cu", ".cuh", ".h", ".c", ".py", ".md", ".sh", ".txt", ".cmake", ".toml")


def parse(path):
    entries, errors = [], []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 3 or parts[0] not in LANGS:
                errors.append(f"{path}:{n}: want 'LANGUAGE OLD NEW' with LANGUAGE one of {sorted(LANGS)}: {line!r}")
                continue
            entries.append((parts[0], parts[1], parts[2], n))
    return entries, errors


def pattern(lang, old):
    if "(" in old:  # a changed signature: documented here, not searched for (the old call may look like the new)
        return None
    if lang == "cpp" and "::" in old:  # a member: its name, wherever it is called or declared
        return re.compile(r"\b" + re.escape(old.split("::")[-1]) + r"\b")
    if lang == "python" and "." in old:
        return re.compile(r"\." + re.escape(old.split(".")[-1]) + r"\b")
    if lang == "c":
        return re.compile(r"\b" + re.escape(old) + r"\b")
    if lang == "cpp":  # the qualified name, or the type used as one (Old:: , Old& , Old x ...) in code
        return re.compile(r"kvcomm::" + re.escape(old) + r"\b|\b" + re.escape(old) + r"::")
    if lang == "python":
        return re.compile(r"kvcomm\." + re.escape(old) + r"\b")
    return re.compile(re.escape(old))


def scan(root, entries):
    found = []
    # A removal ("-") is listed for porting; its old name may live on elsewhere (another struct's field of that name).
    pats = [(lang, old, new, pattern(lang, old)) for lang, old, new, _ in entries if new != "-" and pattern(lang, old)]
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
        for f in files:
            if not f.endswith(TEXT) or f in SKIP_FILES or f == "renames.txt" or f == os.path.basename(__file__):
                continue
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            for lang, old, new, pat in pats:
                if lang == "file" and not (f.endswith(".md") or f.endswith(".txt") or f.endswith(".cmake") or
                                           f == "CMakeLists.txt" or f.endswith(".sh")):
                    continue
                for m in pat.finditer(text):
                    line = text.count("\n", 0, m.start()) + 1
                    found.append(f"{os.path.relpath(path, root)}:{line}: {lang} name '{old}' was renamed '{new}' "
                                 "(docs/renames.txt)")
    return found


def self_test():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "docs"))
        with open(os.path.join(d, "docs", "renames.txt"), "w") as fh:
            fh.write("cpp Layout ParallelGroups\nc kvcommLayoutCreate kvcommParallelGroupsCreate\n"
                     "python Layout ParallelGroups\nfile kvcomm/ops.hpp kvcomm/publish.hpp\nbad line\n")
        with open(os.path.join(d, "a.cpp"), "w") as fh:
            fh.write("auto g = kvcomm::Layout::create(w, s);\nKvLayout fine; // a KV Layout in prose\n")
        with open(os.path.join(d, "b.c"), "w") as fh:
            fh.write("kvcommLayoutCreate(w, &s, &g); kvcommParallelGroupsCreate(w, &s, &g);\n")
        with open(os.path.join(d, "c.py"), "w") as fh:
            fh.write("g = kvcomm.Layout.create(c)\nh = kvcomm.ParallelGroups.create(c)\n")
        with open(os.path.join(d, "d.md"), "w") as fh:
            fh.write("include `kvcomm/ops.hpp`\n")
        entries, errors = parse(os.path.join(d, "docs", "renames.txt"))
        found = scan(d, entries)
    if len(errors) != 1 or len(found) != 4:
        print("renames_check self-test FAILED:", errors, found)
        return 1
    print("renames_check self-test: a malformed line and each kind of stale name flagged, new names not")
    return 0


def main(argv):
    if "--self-test" in argv and self_test():
        return 1
    args = [a for a in argv[1:] if not a.startswith("--")]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), "..", ".."))
    entries, errors = parse(os.path.join(root, "docs", "renames.txt"))
    errors += scan(root, entries)
    for e in errors:
        print(e)
    if errors:
        print(f"renames_check: {len(errors)} problem(s)")
        return 1
    print(f"renames_check: {len(entries)} renames, no old name left in the tree")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
