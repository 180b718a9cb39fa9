#!/usr/bin/env python3
"""The end of test.sh's ctest job: one line of counts (passed / failed / skipped, as CTest counted them) and, by name,
every test that failed and every test that did not run, each skipped one with the reason its output gives.
  ctest_summary.py JUNIT_XML     (ctest --output-junit JUNIT_XML)
Exits 0; the counts line is the last line: "ctest: N passed, N failed, N skipped"."""
import re
import sys
import xml.etree.ElementTree as ET

# Lines a skipping test prints about why (GoogleTest's GTEST_SKIP, our scripts' "SKIPPED:" / "not run", the MPI test
# main's count line), most specific first.
REASON = [
    re.compile(r"^(?:SKIPPED|SKIP)\s*:\s*(.+)$", re.I),
    re.compile(r"\bnot run\b.*$", re.I),
    re.compile(r"^kvcomm-tests: .*skipped.*$"),
    re.compile(r"^\s*\[\s+SKIPPED\s+\]\s*(\S.*)$"),
    re.compile(r"(?:skipped|skipping)\b.*$", re.I),
]


def reason(output):
    lines = [l.strip() for l in output.splitlines() if l.strip()]
    # GoogleTest's GTEST_SKIP() << "why": "file.cpp:12: Skipped" then the message on the next line.
    for i, line in enumerate(lines[:-1]):
        if line.endswith(": Skipped") and not lines[i + 1].startswith("["):
            return lines[i + 1][:200]
    for pat in REASON:
        for line in lines:
            m = pat.search(line)
            if m:
                text = m.group(1) if m.groups() else m.group(0)
                return text.strip()[:200]
    return lines[-1][:200] if lines else "(no output)"


def main():
    try:
        root = ET.parse(sys.argv[1]).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"ctest summary: cannot read {sys.argv[1]}: {e}")
        return 0
    passed, failed, skipped = [], [], []
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        out = "".join(t.text or "" for t in case.iter("system-out"))
        status = case.get("status", "")
        if case.find("failure") is not None or status == "fail":
            failed.append(name)
        elif case.find("skipped") is not None or status in ("notrun", "disabled", "skipped"):
            msg = case.find("skipped")
            text = msg.get("message", "") if msg is not None else ""
            # CTest reports a test it could not start (no executable, a failed fixture) as "not run" too: that is a
            # failure (CTest fails the run), not a skip. A skip is the test's own word (SKIP_RETURN_CODE,
            # SKIP_REGULAR_EXPRESSION) or a disabled test.
            if status != "disabled" and not text.startswith("SKIP_"):
                failed.append(f"{name} (not run: {text or reason(out)})")
                continue
            skipped.append((name, reason(out)))
        else:
            passed.append(name)
    if failed:
        print(f"failed ({len(failed)}):")
        for n in failed:
            print(f"  {n}")
    if skipped:
        print(f"skipped ({len(skipped)}), not passed:")
        width = max(len(n) for n, _ in skipped)
        for n, why in skipped:
            print(f"  {n:<{width}}  {why}")
    print(f"ctest: {len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
