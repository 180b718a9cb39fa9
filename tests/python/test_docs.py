"""The guides as a user reads them: docs/python.md's first program run with the guide's own launcher (and a second
run at the same time, which must not collide with it), and docs/api/fetch.md's reference block against
include/kvcomm/fetch.hpp, declaration by declaration."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

SRC = Path(__file__).resolve().parents[2]


def _block(doc: Path, heading: str, lang: str) -> str:
    """The first ```lang block after `heading` in `doc`."""
    text = doc.read_text()
    at = text.index(heading)
    start = text.index(f"```{lang}\n", at) + len(lang) + 4
    return text[start:text.index("```", start)]


# ---- docs/python.md: the first program, as written ----------------------------------------------------------------


def test_python_guide_first_program(tmp_path: Path):
    doc = SRC / "docs" / "python.md"
    launcher = _block(doc, "## A first program", "bash")
    program = _block(doc, "## A first program", "python")
    assert "mktemp -d" in launcher and 'rm -rf "$d"' in launcher, launcher
    (tmp_path / "first.py").write_text(program)
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # python3: this interpreter
    env["TMPDIR"] = str(tmp_path / "tmp")  # where the launcher's mktemp -d makes its directory
    (tmp_path / "tmp").mkdir()
    # Run A: the guide's launcher, as written. Run B, at the same time: the program started by hand with an id file
    # of its own. Neither may read the other's id.
    run_a = subprocess.Popen(["bash", "-c", launcher], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    (tmp_path / "b").mkdir()
    id_b = tmp_path / "b" / "kvcomm.id"
    run_b = [subprocess.Popen([sys.executable, "first.py", str(r), "4", str(id_b)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(4)]
    out_a, _ = run_a.communicate(timeout=150)
    outs_b = [p.communicate(timeout=150)[0] for p in run_b]
    for name, out in [("the guide's launcher", out_a)] + [(f"rank {r} by hand", o) for r, o in enumerate(outs_b)]:
        print(f"--- {name}\n{out}")
    for r in range(4):
        line = (f"rank {r}: 16 rows from 4 ranks in this replica: verified (kvcomm.Communicator(rank={r}, size=4, "
                f"hosts=1, bootstrap='tcp'))")
        assert line in out_a, f"the guide's launcher: no line '{line}'"  # the ranks share one pipe: lines may mix
        assert line in outs_b[r].splitlines() and run_b[r].returncode == 0, f"rank {r} by hand: {outs_b[r]}"
    assert run_a.returncode == 0
    # Nothing is left behind: the launcher removed its directory, rank 0 the id file (and its .tmp).
    assert list((tmp_path / "tmp").iterdir()) == [], list((tmp_path / "tmp").iterdir())
    assert list((tmp_path / "b").iterdir()) == [], list((tmp_path / "b").iterdir())


# ---- docs/api/fetch.md's reference block against include/kvcomm/fetch.hpp -----------------------------------------


def _code(text: str) -> str:
    """C++ without comments, KVCOMM_API, or blank lines."""
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"\bKVCOMM_API\s+", "", text)


def _statements(body: str) -> List[str]:
    """Declarations of a class or struct body, whitespace-normalised; an inline body ends its declaration (an empty
    `{}`, a default argument, does not)."""
    out, cur, depth, opened = [], "", 0, 0
    for ch in body:
        cur += ch
        if ch == "{":
            depth += 1
            opened = len(cur) if depth == 1 else opened
        elif ch == "}":
            depth -= 1
            if depth == 0 and cur[opened:-1].strip():
                out.append(cur)
                cur = ""
        elif ch == ";" and depth == 0:
            out.append(cur)
            cur = ""
    return [s for s in (" ".join(x.split()) for x in out) if s and s != ";"]


def _types(code: str) -> Dict[str, List[str]]:
    """struct/class/enum name -> its declarations (public ones for a class), from comment-free code."""
    found: Dict[str, List[str]] = {}
    for m in re.finditer(r"\b(struct|class|enum class)\s+(\w+)\s*\{", code):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        body = code[m.end():i - 1]
        if m.group(1) == "enum class":
            found[m.group(2)] = [" ".join(v.split()) for v in body.split(",") if v.strip()]
            continue
        if m.group(1) == "class":
            body = body.split("public:", 1)[1].split("private:", 1)[0]
        found[m.group(2)] = [s for s in _statements(body.replace("public:", "")) if s != "struct Impl;"]
    return found


def test_fetch_reference_matches_header():
    header = _code((SRC / "include" / "kvcomm" / "fetch.hpp").read_text())
    doc = _code(_block(SRC / "docs" / "api" / "fetch.md", "## Reference", "cpp"))
    want, got = _types(header), _types(doc)
    public = [n for n in want if n not in ("FetcherInternals",)]
    assert sorted(public) == sorted(got), f"types in the header {sorted(public)}, in the doc {sorted(got)}"
    for name in public:
        assert got[name] == want[name], f"{name}:\n  header {want[name]}\n  doc    {got[name]}"
    for fn in re.findall(r"^(?:uint64_t|const char\*) \w+\([^)]*\);", header, re.M):
        assert fn in " ".join(doc.split()), f"free function {fn} is not in the reference"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
