#!/usr/bin/env python3
"""Compare two benchmark runs row by row (the JSON lines perf_fetch / perf_publish append with --json).

    compare.py BEFORE.jsonl AFTER.jsonl [--tolerance 0.03] [--json OUT]

Rows are matched by (bench, case, tokens, op); a file may hold several runs of the same row (interleaved repeats):
each side's time is the median of its repeats. Prints before/after/ratio per row and exits 1 when a kvcomm row
(not a baseline) is slower than before by more than the tolerance.
"""
import argparse
import json
import statistics
import sys

TIME_KEYS = ("us", "in20_us", "standalone_us")
# Rows that time something other than kvcomm (what it is compared with, or the work beside it): never a regression.
NOT_KVCOMM = ("baseline", "ceiling", "bound", "probe", "NCCL", "cudaMemcpy", "compute kernel")


def load(path):
    rows = {}
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            key = (r.get("bench", ""), str(r.get("case", "")), str(r.get("tokens", "")), r.get("op", ""))
            t = next((r[k] for k in TIME_KEYS if r.get(k) is not None), None)
            if t is not None:
                rows.setdefault(key, []).append(float(t))
    return {k: statistics.median(v) for k, v in rows.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--json")
    a = ap.parse_args()
    before, after = load(a.before), load(a.after)
    common = [k for k in before if k in after]
    if not common:
        print("compare: no row in common")
        return 1
    out, slower = [], 0
    print(f"| case | op | before us | after us | after/before | |")
    print("|---|---|---|---|---|---|")
    for k in common:
        b, t = before[k], after[k]
        ratio = t / b if b > 0 else float("nan")
        kvcomm_row = not k[3].startswith(NOT_KVCOMM)
        bad = kvcomm_row and ratio > 1 + a.tolerance
        slower += bad
        case = k[1] if k[1] not in ("", "None") else k[2]
        print(f"| {case} | {k[3]} | {b:.2f} | {t:.2f} | {ratio:.3f} | {'SLOWER' if bad else ''} |")
        out.append({"bench": k[0], "case": k[1], "tokens": k[2], "op": k[3], "before_us": b, "after_us": t,
                    "ratio": ratio, "slower": bad})
    if a.json:
        with open(a.json, "w") as fh:
            for r in out:
                fh.write(json.dumps(r) + "\n")
    print(f"compare: {len(common)} rows, {slower} kvcomm row(s) slower by more than {a.tolerance:.0%}")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
