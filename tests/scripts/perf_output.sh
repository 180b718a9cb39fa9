#!/usr/bin/env bash
# The benchmarks' output on host memory, with a small nccl-tests-style sweep: a legend line for every column, the
# repetitions and the spread (p10 <= median <= p90) of every measurement, a warning exactly when ranks outnumber
# cores, the -b/-e/-f sweep, and JSON lines whose every key has one type (or null) across all rows.
# With PLOT=1 it then turns the JSON into PNG plots with perf/plot.py (exit 77, skipped, without matplotlib).
#   perf_output.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(--oversubscribe --bind-to none); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none
np=4
if [ "${PLOT:-0}" = 1 ]; then
  python3 -c "import matplotlib" 2>/dev/null || { echo "SKIPPED: matplotlib is not installed (pip install matplotlib)"; exit 77; }
fi
timeout 300 mpirun "${flags[@]}" -np $np "$build/perf/perf_publish" --kind host -b 656 -e 100K -f 4 -n 4 -w 1 \
  --json "$work/out.jsonl" >"$work/publish.txt" 2>&1 || { cat "$work/publish.txt"; echo "FAIL: perf_publish"; exit 1; }
timeout 300 mpirun "${flags[@]}" -np 2 "$build/perf/perf_symm_rendezvous" --kind host -b 2M -e 8M -f 2 -n 3 \
  --json "$work/out.jsonl" >"$work/rendezvous.txt" 2>&1 ||
  { cat "$work/rendezvous.txt"; echo "FAIL: perf_symm_rendezvous"; exit 1; }
cat "$work/publish.txt"
if [ "${PLOT:-0}" = 1 ]; then
  python3 "$src/perf/plot.py" "$work/out.jsonl" --out "$work/plots" --prefix test || exit 1
  python3 "$src/perf/plot.py" "$src/results/h200x2-2026-11-30.jsonl" --out "$work/plots" || exit 1
  for f in "$work"/plots/*.png; do [ -s "$f" ] || { echo "FAIL: empty $f"; exit 1; }; done
  echo "ok: $(ls "$work/plots" | wc -l) plots"
  exit 0
fi
python3 - "$work" "$np" "$(nproc)" <<'PY'
import json, sys
work, np_, cores = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fail = []
rows = [json.loads(l) for l in open(f"{work}/out.jsonl") if l.strip()]
types = {}
for r in rows:
    for k, v in r.items():
        if v is None:
            continue
        t = "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__
        if types.setdefault((r["bench"].split(" ")[0], k), t) != t:
            fail.append(f"key {k} is a {t} in one row and a {types[(r['bench'].split(' ')[0], k)]} in another")
pub = [r for r in rows if r["bench"].startswith("publish")]
ren = [r for r in rows if r["bench"].startswith("symm_rendezvous")]
tokens = sorted({r["tokens"] for r in pub if r["tokens"] is not None})
if tokens != [1, 4, 16, 64, 156]:  # bytes 656, 2624, 10496, 41984, 102400 (the -e size) over 656-byte rows
    fail.append(f"-b 656 -e 100K -f 4 swept tokens {tokens}")
if not any(r["tokens"] is None and "barrier" in r["op"] for r in pub):
    fail.append("the barrier row has a tokens value instead of null")
for r in pub:
    if r["reps"] < 4 or not (r["p10_us"] <= r["us"] <= r["p90_us"]):
        fail.append(f"publish row {r['op']} @ {r['tokens']}: reps {r['reps']}, p10/median/p90 {r['p10_us']}/{r['us']}/{r['p90_us']}")
for r in ren:
    if r["reps"] < 3 or not (r["kvcomm_p10_ms"] <= r["kvcomm_ms"] <= r["kvcomm_p90_ms"]):
        fail.append(f"rendezvous row {r['op']}: reps {r['reps']}, spread {r['kvcomm_p10_ms']}/{r['kvcomm_ms']}/{r['kvcomm_p90_ms']}")
if [r["bytes_per_rank"] for r in ren if r["op"] == "create"] != [2 << 20, 4 << 20, 8 << 20]:
    fail.append("-b 2M -e 8M -f 2 did not sweep 2, 4, 8 MiB in perf_symm_rendezvous")
for r in rows:
    if r["ranks_per_host"] != r["ranks"] or r["host_cores"] < 1:  # one host here
        fail.append(f"ranks {r['ranks']}, ranks_per_host {r['ranks_per_host']}, host_cores {r['host_cores']}")
for name in ("publish", "rendezvous"):
    text = open(f"{work}/{name}.txt").read()
    header = text[text.index("Columns:"):text.index("\n|")]
    cols = [c.strip() for c in text[text.index("\n|") + 2:].split("\n")[0].split("|") if c.strip()]
    for c in cols:
        if f"\n  {c}: " not in header:
            fail.append(f"{name}: column {c} has no legend line")
    warned = text.count("ranks share")  # once, never twice (stderr and the table's note both printed it)
    ranks = np_ if name == "publish" else 2
    if warned != (1 if ranks > cores else 0):
        fail.append(f"{name}: {ranks} ranks on {cores} cores, warning printed {warned} times")
print("\n".join("FAIL " + f for f in fail) or f"ok: {len(rows)} JSON lines, legends, spread, sweep and the warning")
sys.exit(1 if fail else 0)
PY
