#!/usr/bin/env python3
"""scripts/run.sh may only run programs it builds: every program a step runs (a "${bin[NAME]}", or a "$b/DIR/NAME" path
in run.sh or in a script it calls with "$b") must be in run.sh's `targets=(...)` list, which is what its one
build.sh call builds; each target must be an add_executable() of the project, in the folder run.sh looks in.
Checks the class of bug (run.sh running a program only test.sh had built), not one instance.
  run_targets.py SOURCE_DIR"""
import pathlib
import re
import sys

src = pathlib.Path(sys.argv[1])
run = (src / "scripts/run.sh").read_text()
errors = []

m = re.search(r"^targets=\(([^)]*)\)", run, re.M)
if not m:
    sys.exit("FAIL: scripts/run.sh has no targets=(...) list")
targets = m.group(1).split()
where = dict(re.findall(r"\[([\w-]+)\]=(\w+)", run))

# The build call must build exactly that list.
if 'for t in "${targets[@]}"; do args+=(--target "$t"); done' not in run or '"${args[@]}"' not in run:
    errors.append("run.sh's build.sh call does not build its targets list")

# Every add_executable of the project, with its folder.
exes = {}
for cm in src.rglob("CMakeLists.txt"):
    if ".git" in cm.parts or "build" in cm.parts[len(src.parts):][:1]:
        continue
    for name in re.findall(r"add_executable\(\s*([\w${}-]+)", cm.read_text()):
        exes.setdefault(name, set()).add(cm.parent.relative_to(src).as_posix())
for stem in re.findall(r"foreach\(_example\s+([^)]*)\)", (src / "examples/CMakeLists.txt").read_text()):
    for e in stem.split():
        exes.setdefault(f"example_{e}", set()).add("examples")

for t in targets:
    if t not in where:
        errors.append(f"target {t}: run.sh does not say where it is built (the where=(...) map)")
    elif t not in exes:
        errors.append(f"target {t}: no add_executable({t}) in the project")
    elif where[t] not in exes[t]:
        errors.append(f"target {t}: built in {sorted(exes[t])}, run.sh looks in {where[t]}/")

used = set()
for name in re.findall(r"\$\{bin\[([\w-]+)\]\}", run):
    used.add(name)
    if name not in targets:
        errors.append(f"run.sh runs ${{bin[{name}]}}, which it does not build (add it to targets=)")
# Programs run through "$b/..." in run.sh and in the scripts it hands the build directory to.
scripts = [("scripts/run.sh", run)]
for called in re.findall(r"^\s*(?:step [^\n]*\\\n\s*)?([\w/.-]+\.sh) \"\$b\"", run, re.M):
    scripts.append((called, (src / called).read_text()))
for path, text in scripts:
    for d, name in re.findall(r"\$(?:b|\{b\}|1)/(\w+)/([\w-]+)", text):
        if name.endswith((".jsonl", ".log")) or name in ("run-logs",):
            continue
        used.add(name)
        if name not in targets:
            errors.append(f"{path} runs {d}/{name}, which run.sh does not build (add it to targets=)")
unused = [t for t in targets if t not in used]
if unused:
    errors.append(f"run.sh builds {unused} but no step runs them")

if errors:
    print("FAIL:\n  " + "\n  ".join(errors))
    sys.exit(1)
print(f"ok: run.sh builds {len(targets)} targets ({' '.join(targets)}) and every program its steps run is one of them")
