#!/usr/bin/env python3
"""Judges a perf_publish run on 2 GPUs against the latency targets (docs/performance.md, "Against the targets").

    python3 perf/targets.py RESULTS.jsonl [--txt RESULTS.txt] [--json OUT.json]

RESULTS.jsonl holds perf_publish's JSON lines (other benchmarks' lines in the same file are ignored); RESULTS.txt
its printed table, for the host CPU time per eager call, which is a note there and not a JSON row. Prints one line
per target: what it asks, what was measured, met / MISSED (by how much) / not measured. Per op in a graph of 20
("in20"), as the targets are stated.

Exit status: 0 every target met; 1 some missed or not measured; 2 no 2-GPU publish rows in the file.
"""
import argparse
import json
import re
import sys

BENCH_PREFIX = "publish (2 x GPU"
# The two forms of publish + barrier: separate calls, and the one-call fused form; the faster one counts.
# Rows recorded before the 0.2 renames (results/ of 2026-11 and 2026-12-01) carry the old names: both are read.
PUBLISH_BARRIER = ("kvcomm publish+barrier", "kvcomm publish then barrier (fused)", "kvcomm publishAndBarrier (fused)")
# The split forms with 20 us of unrelated work between signal and wait; the exchange's added time is the best of
# them minus the work alone.
SPLIT_FORMS = ("publish + signal, 20 us of work, wait", "publish then signal, 20 us of work, wait",
               "publish then signal on a side stream beside 20 us of work, wait",
               "publishAndSignal, 20 us of work, wait", "publishAndSignal on a side stream beside 20 us of work, wait")
WORK_ALONE = "20 us of work alone"
FALLBACK = "kvcomm fallback (pack+nccl+insert)"
CPU_NOTE = re.compile(r"Host CPU time per eager publish\(\) call \((\d+) tokens.*?median ([0-9.]+) us")


def load(path):
    rows = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"targets.py: {path}:{n}: not a JSON line ({e})")
            if str(r.get("bench", "")).startswith(BENCH_PREFIX):
                rows[(r.get("op"), r.get("tokens"))] = r
    return rows


def number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class Judge:
    def __init__(self, rows):
        self.rows = rows
        self.lines = []
        self.missed = 0

    def in20(self, op, tokens):
        r = self.rows.get((op, tokens))
        return number(r.get("in20_us")) if r else None

    def best(self, ops, tokens):
        got = [(self.in20(op, tokens), op) for op in ops]
        got = [g for g in got if g[0] is not None]
        return min(got) if got else (None, None)

    def add(self, target, measured, ok, by=""):
        if ok is None:
            verdict = "not measured"
            self.missed += 1
        elif ok:
            verdict = "met"
        else:
            verdict = "MISSED" + (f" by {by}" if by else "")
            self.missed += 1
        self.lines.append({"target": target, "measured": measured, "verdict": verdict})

    def at_most(self, target, value, bound, what, unit=" us"):
        if value is None:
            self.add(target, "-", None)
        else:
            self.add(target, f"{value:.2f}{unit} ({what})", value <= bound, f"{value - bound:.2f}{unit}")


def tok(n):
    return f"{n} token" + ("" if n == 1 else "s")


def judge(rows, cpu):
    j = Judge(rows)
    for tokens, bound in ((1, 3.0), (256, 3.5), (4096, 11.0), (65536, 126.0)):
        v, op = j.best(PUBLISH_BARRIER, tokens)
        j.at_most(f"publish+barrier <= {bound:g} us at {tok(tokens)}", v, bound, op)
    _, op = j.best(PUBLISH_BARRIER, 65536)
    r = j.rows.get((op, 65536))
    frac = number(r.get("frac_of_memcpy_peer")) if r else None
    if frac is None:
        j.add("publish+barrier >= 0.9 x copy engine at 65536 shuffled slots", "-", None)
    else:
        j.add("publish+barrier >= 0.9 x copy engine at 65536 shuffled slots", f"{frac:.3f}", frac >= 0.9,
              f"{0.9 - frac:.3f}")
    j.at_most("barrier alone <= 2.0 us", j.in20("kvcomm barrier", None), 2.0, "kvcomm barrier")
    for tokens in (1, 16, 256):
        v, op = j.best(SPLIT_FORMS, tokens)
        work = j.in20(WORK_ALONE, tokens)
        added = v - work if v is not None and work is not None else None
        j.at_most(f"signal/wait beside 20 us of work adds <= 1.5 us at {tok(tokens)}", added, 1.5,
                  f"{op}: {v} - {work}" if added is not None else "")
    sizes = sorted(t for (op, t) in rows if op == FALLBACK and t is not None)
    if not sizes:
        j.add("fallback >= 1.0 x NCCL AllGather + insert at every size", "-", None)
    for tokens in sizes:
        ratio = number(rows[(FALLBACK, tokens)].get("nccl_over_op_in20"))
        if ratio is None:
            j.add(f"fallback >= 1.0 x NCCL AllGather + insert at {tok(tokens)}", "-", None)
        else:
            j.add(f"fallback >= 1.0 x NCCL AllGather + insert at {tok(tokens)}", f"{ratio:.2f} x", ratio >= 1.0,
                  f"{1.0 - ratio:.2f}")
    if cpu is None:
        j.add("host CPU per eager publish() call <= 5 us (median)", "-", None)
    else:
        j.at_most("host CPU per eager publish() call <= 5 us (median)", cpu[1], 5.0, tok(cpu[0]))
    return j


def cpu_from(txt):
    if not txt:
        return None
    with open(txt) as f:
        for line in f:
            m = CPU_NOTE.search(line)
            if m:
                return int(m.group(1)), float(m.group(2))
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="perf_publish's JSON lines (--json)")
    ap.add_argument("--txt", help="perf_publish's printed table (for the host CPU time per call)")
    ap.add_argument("--json", help="also write the verdicts here as a JSON list")
    a = ap.parse_args()
    rows = load(a.results)
    if not rows:
        print(f"targets.py: {a.results} has no 2-GPU publish rows (bench \"{BENCH_PREFIX}...\"): nothing to judge")
        return 2
    j = judge(rows, cpu_from(a.txt))
    width = max(len(x["target"]) for x in j.lines)
    for x in j.lines:
        print(f"{x['target']:<{width}}  {x['verdict']:<18}  {x['measured']}")
    print(f"{len(j.lines) - j.missed} of {len(j.lines)} targets met")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(j.lines, f, indent=1)
    return 0 if j.missed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
