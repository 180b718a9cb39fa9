#!/usr/bin/env python3
"""Turns the JSON lines of kvcomm's benchmarks (perf_publish, perf_symm_rendezvous --json FILE) into PNG plots.

    python3 perf/plot.py RESULTS.jsonl [--out DIR] [--prefix NAME]

Writes, for each benchmark found in the file (rows are grouped by their "bench" field):
  <prefix>-publish-latency.png    per-operation time against bytes per rank, one line per operation, both timings
                                  (standalone and in a 20-op graph on GPUs), p10-p90 as a band where recorded
  <prefix>-publish-ratio.png      baseline time / kvcomm time against bytes per rank (above 1: kvcomm is faster)
  <prefix>-barrier.png            the rows without data (barrier, launch floor, probes) as bars
  <prefix>-rendezvous.png         SymmetricBuffer::create against its baseline per size, and grow
(host-memory publish tables get "<prefix>-host-publish-..." names)
and prints each path. Needs matplotlib (pip install matplotlib); CI does not run it.

Older result files wrote "-" where newer ones write null; both are read.
"""
import argparse
import json
import os
import sys
from collections import OrderedDict


def load(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not a JSON line: {e}")
            rows.append({k: (None if v == "-" else v) for k, v in row.items()})
    return rows


def by_bench(rows):
    groups = OrderedDict()
    for r in rows:
        groups.setdefault(r.get("bench", "?"), []).append(r)
    return groups


def series(rows, y, x="bytes_per_rank"):
    """op -> sorted [(x, y, p10, p90)] over the rows that carry both x and y."""
    out = OrderedDict()
    for r in rows:
        if r.get(x) in (None, 0) or r.get(y) is None:
            continue
        stem = y[:-3] if y.endswith("_us") else y
        p10, p90 = r.get(stem + "_p10_us"), r.get(stem + "_p90_us")
        if y == "us":  # host rows: p10_us / p90_us
            p10, p90 = r.get("p10_us"), r.get("p90_us")
        out.setdefault(r["op"], []).append((r[x], r[y], p10, p90))
    for op in out:
        out[op].sort()
    return out


def human_bytes(b, _pos=None):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale:
            v = b / scale
            return f"{v:.0f}{unit}" if v >= 10 or v == int(v) else f"{v:.1f}{unit}"
    return f"{b:.0f}"


def plot_lines(ax, data, title, ylabel, logy=True):
    from matplotlib.ticker import FuncFormatter

    for op, pts in data.items():
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        (line,) = ax.plot(xs, ys, marker="o", markersize=3, label=op)
        if all(p[2] is not None and p[3] is not None for p in pts):
            ax.fill_between(xs, [p[2] for p in pts], [p[3] for p in pts], color=line.get_color(), alpha=0.15)
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(human_bytes))
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)


def short(bench):
    """The bench name without the explanation older files appended after ';'."""
    b = bench.split(";")[0]
    return b + ")" if b.count("(") > b.count(")") else b


def publish_plots(bench, rows, out, prefix, plt):
    paths = []
    gpu = any("in20_us" in r for r in rows)
    if not gpu:
        prefix += "-host"  # a file may hold both backends' tables
    timings = [("standalone_us", "one operation per graph replay"), ("in20_us", "per operation in a 20-op graph")] \
        if gpu else [("us", "wall clock per operation")]
    fig, axes = plt.subplots(1, len(timings), figsize=(7 * len(timings), 5.5), squeeze=False)
    for ax, (col, what) in zip(axes[0], timings):
        data = OrderedDict((op, pts) for op, pts in series(rows, col).items() if not op.startswith("probe"))
        plot_lines(ax, data, f"{short(bench)}\n{what} (median; band: p10-p90 where recorded)", "µs")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    paths.append(save(fig, out, f"{prefix}-publish-latency.png", plt))

    ratios = [("nccl_over_op_standalone", "standalone"), ("nccl_over_op_in20", "in a 20-op graph")] if gpu else \
        [("mpi_over_op", "MPI_Allgather + insert / op"), ("fallback_over_op", "kvcomm fallback / op")]
    fig, axes = plt.subplots(1, len(ratios), figsize=(7 * len(ratios), 5.5), squeeze=False)
    for ax, (col, what) in zip(axes[0], ratios):
        data = OrderedDict((op, pts) for op, pts in series(rows, col).items()
                           if op.startswith("kvcomm") and "baseline" not in op)
        label = "NCCL AllGather + insert time / op time" if gpu else what
        plot_lines(ax, data, f"{short(bench)}\nbaseline / kvcomm, {what} (above 1: kvcomm is faster)", label,
                   logy=False)
        ax.axhline(1.0, color="black", linewidth=0.8)
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    paths.append(save(fig, out, f"{prefix}-publish-ratio.png", plt))

    fixed = [r for r in rows if r.get("tokens") is None]
    if fixed:
        cols = ["standalone_us", "in20_us"] if gpu else ["us"]
        fig, ax = plt.subplots(figsize=(9, 0.6 * len(fixed) + 1.8))
        height = 0.8 / len(cols)
        for i, col in enumerate(cols):
            ys = [k + i * height for k in range(len(fixed))]
            vals = [r.get(col) or 0 for r in fixed]
            ax.barh(ys, vals, height=height, label=col)
            for y, v in zip(ys, vals):
                ax.text(v, y, f" {v:.2f}", va="center", fontsize=7)
        ax.set_yticks([k + height * (len(cols) - 1) / 2 for k in range(len(fixed))])
        ax.set_yticklabels([r["op"] for r in fixed], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("µs per operation (median)")
        ax.set_title(f"{short(bench)}: barrier, launch floor and probes", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(save(fig, out, f"{prefix}-barrier.png", plt))
    return paths


def rendezvous_plot(groups, out, prefix, plt):
    benches = [(b, rows) for b, rows in groups.items() if b.startswith("symm_rendezvous")]
    if not benches:
        return []
    fig, axes = plt.subplots(1, len(benches), figsize=(6 * len(benches), 4.5), squeeze=False)
    for ax, (bench, rows) in zip(axes[0], benches):
        create = [r for r in rows if r.get("op") == "create"]
        labels = [f"{r.get('GiB_per_rank'):g} GiB" for r in create]
        xs = range(len(create))
        ax.bar([x - 0.2 for x in xs], [r["kvcomm_ms"] for r in create], width=0.4, label="kvcomm create")
        base = create[0].get("baseline") if create else "baseline"
        ax.bar([x + 0.2 for x in xs], [r.get("baseline_ms") or 0 for r in create], width=0.4, label=f"{base}")
        grow = [r for r in rows if r.get("op") == "grow"]
        if grow:
            ax.axhline(grow[0]["kvcomm_ms"], color="gray", linestyle="--", linewidth=0.8,
                       label=f"grow, per GiB step ({grow[0]['kvcomm_ms']:.2f} ms)")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels)
        ax.set_ylabel("ms (median, slowest rank)")
        ax.set_title(bench, fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return [save(fig, out, f"{prefix}-rendezvous.png", plt)]


def save(fig, out, name, plt):
    path = os.path.join(out, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", help="JSON lines written by --json")
    p.add_argument("--out", default=".", help="directory for the PNG files (default: .)")
    p.add_argument("--prefix", default=None, help="file name prefix (default: the results file's base name)")
    a = p.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py needs matplotlib: pip install matplotlib")
    prefix = a.prefix or os.path.splitext(os.path.basename(a.results))[0]
    os.makedirs(a.out, exist_ok=True)
    groups = by_bench(load(a.results))
    paths = []
    for bench, rows in groups.items():
        if bench.startswith("publish"):
            paths += publish_plots(bench, rows, a.out, prefix, plt)
    paths += rendezvous_plot(groups, a.out, prefix, plt)
    if not paths:
        sys.exit(f"{a.results}: no publish or symm_rendezvous rows")
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()
