#!/usr/bin/env python3
"""kvcomm endpoints beside NIXL (UCX backend), like with like: the same READs of scattered KV blocks of host memory
from a server process into a client process, through kvcomm (Endpoint.read) and through NIXL (prepped descriptor
lists, make_prepped_xfer + transfer, polled to DONE), one library per server/client pair (NIXL's progress threads
spin: sharing the machine's cores with them would slow whichever library ran beside them), back to back in one
compare.sh run, then one table. Two set-ups (compare.sh makes them):
  --transport peer  two processes on one host: kvcomm maps the server's arena (memfd) and copies; UCX uses its
                    shared-memory transports (UCX_TLS unset);
  --transport tcp   two network namespaces (a veth pair standing for two hosts): kvcomm over TCP, UCX with
                    UCX_TLS=tcp.
Rows: block sizes 4 KiB, 64 KiB, 2 MiB x batches 1 .. 16384 (each pool 64 MiB): scattered ids (a random permutation
on each side). Every row's first transfer of each library is checked byte for byte against the server's pattern.
Per row: warm-up, then repeated transfers for about --seconds each; the median time gives GB/s; the ratio is
kvcomm / NIXL throughput (>= 1.0: met). A table on stdout, JSON lines with --json.

  compare.py --role server --library kvcomm|nixl --dir DIR --transport peer|tcp
  compare.py --role client --library kvcomm|nixl --dir DIR --transport peer|tcp --json FILE [--seconds S] [--quick]
  compare.py --table FILE   (the rows of both libraries side by side, with the ratio)
Needs the kvcomm Python package and `nixl` (pip install nixl: a benchmark-only dependency)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

POOL_BYTES = 64 << 20
BLOCK_SIZES = [4 << 10, 64 << 10, 2 << 20]
BATCHES = [1, 16, 256, 4096, 16384]


def pattern(bs: int, blocks: int) -> np.ndarray:
    """The server's pool for block size bs: every byte known to the client."""
    return np.random.default_rng(bs).integers(0, 256, bs * blocks, dtype=np.uint8)


def pools():
    for bs in BLOCK_SIZES:
        yield bs, POOL_BYTES // bs


def batches(blocks: int, quick: bool):
    out = [b for b in BATCHES if b <= blocks] + ([blocks] if blocks < BATCHES[-1] and blocks not in BATCHES else [])
    return [b for b in out if not quick or b in (1, 256, blocks)]


def wait_file(path: Path, seconds: float = 120) -> bytes:
    end = time.time() + seconds
    while not path.exists():
        if time.time() > end:
            sys.exit(f"compare.py: no {path} after {seconds} s")
        time.sleep(0.02)
    return path.read_bytes()


def publish(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)


def median_seconds(run, seconds: float, least: int = 5, most: int = 200) -> float:
    for _ in range(2):
        run()
    times = []
    start = time.perf_counter()
    while len(times) < least or (time.perf_counter() - start < seconds and len(times) < most):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def check(dst_mem: np.ndarray, want: np.ndarray, src, dst, bs: int, who: str) -> None:
    for s_, d_ in zip(src.tolist(), dst.tolist()):
        if not np.array_equal(dst_mem[d_ * bs:(d_ + 1) * bs], want[s_ * bs:(s_ + 1) * bs]):
            sys.exit(f"{who}: block {s_} -> {d_} ({bs} B): bytes differ")


# ---- kvcomm -------------------------------------------------------------------------------------------------------


def kvcomm_server(d: Path, transport: str) -> None:
    import kvcomm
    ep = kvcomm.Endpoint("bench-server", tcp_address="" if transport == "tcp" else "127.0.0.1:0")
    keep = []
    for bs, blocks in pools():
        arena = kvcomm.Arena([kvcomm.KvRegion(0, bs, 0, blocks)], kind="host")  # memfd: a same-host peer maps it
        arena.view()[:] = pattern(bs, blocks)
        reg = ep.register_arena(arena)
        publish(d / f"kvcomm.{bs}", reg.metadata())
        keep += [arena, reg]
    print(f"kvcomm server at {ep.address}", flush=True)
    wait_file(d / "done", 3600)
    ep.close()


def kvcomm_client(d: Path, transport: str, a) -> list:
    import kvcomm
    via = "peer" if transport == "peer" else "tcp"
    ep = kvcomm.Endpoint("bench-client", tcp_address="" if transport == "tcp" else "127.0.0.1:0")
    rng = np.random.default_rng(7)
    rows = []
    for bs, blocks in pools():
        want = pattern(bs, blocks)
        arena = kvcomm.Arena([kvcomm.KvRegion(0, bs, 0, blocks)], kind="host")
        mine = ep.register_arena(arena)
        remote = ep.connect(wait_file(d / f"kvcomm.{bs}"))
        local = arena.view()
        for batch in batches(blocks, a.quick):
            src = rng.permutation(blocks)[:batch].astype(np.int64)
            dst = rng.permutation(blocks)[:batch].astype(np.int64)

            def read() -> None:
                st = ep.read(mine, remote, src, dst, via=via).wait()
                if not st.done:
                    sys.exit(f"kvcomm read failed: {st.error}")

            local[:] = 0xEE  # poisoned, then every block checked
            read()
            check(local, want, src, dst, bs, "kvcomm")
            rows.append((bs, batch, median_seconds(read, a.seconds)))
        ep.disconnect(remote)
        ep.unregister(mine)
        arena.free()
    ep.close()
    return rows


# ---- NIXL ---------------------------------------------------------------------------------------------------------


def nixl_agent(name: str):
    from nixl._api import nixl_agent, nixl_agent_config
    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def nixl_server(d: Path) -> None:
    agent = nixl_agent("server")
    keep, addresses = [], {}
    for bs, blocks in pools():
        mem = pattern(bs, blocks)
        agent.register_memory([(mem.ctypes.data, mem.nbytes, 0, "")], "DRAM")
        addresses[bs] = mem.ctypes.data
        keep.append(mem)
    publish(d / "nixl.addresses", json.dumps(addresses).encode())
    publish(d / "nixl.metadata", agent.get_agent_metadata())
    print("NIXL server ready", flush=True)
    wait_file(d / "done", 3600)


def nixl_client(d: Path, a) -> list:
    agent = nixl_agent("client")
    server = agent.add_remote_agent(wait_file(d / "nixl.metadata"))
    addresses = {int(k): v for k, v in json.loads(wait_file(d / "nixl.addresses")).items()}
    rng = np.random.default_rng(7)
    rows = []
    for bs, blocks in pools():
        want = pattern(bs, blocks)
        mem = np.zeros(bs * blocks, np.uint8)
        agent.register_memory([(mem.ctypes.data, mem.nbytes, 0, "")], "DRAM")
        # Both sides' per-block descriptor lists prepped once: NIXL's fastest path for repeated block transfers.
        lh = agent.prep_xfer_dlist("NIXL_INIT_AGENT", np.array([(mem.ctypes.data + i * bs, bs, 0) for i in
                                                                  range(blocks)], dtype=np.uint64), "DRAM")
        rh = agent.prep_xfer_dlist(server, np.array([(addresses[bs] + i * bs, bs, 0) for i in range(blocks)],
                                                    dtype=np.uint64), "DRAM")
        for batch in batches(blocks, a.quick):
            src = rng.permutation(blocks)[:batch].astype(np.int64)
            dst = rng.permutation(blocks)[:batch].astype(np.int64)
            ldx, rdx = dst.astype(np.int32), src.astype(np.int32)

            def read() -> None:
                h = agent.make_prepped_xfer("READ", lh, ldx, rh, rdx)
                s = agent.transfer(h)
                while s == "PROC":
                    s = agent.check_xfer_state(h)
                if s != "DONE":
                    sys.exit(f"NIXL READ failed: {s}")
                h.release()

            mem[:] = 0xEE
            read()
            check(mem, want, src, dst, bs, "NIXL")
            rows.append((bs, batch, median_seconds(read, a.seconds)))
        agent.release_dlist_handle(lh)
        agent.release_dlist_handle(rh)
    return rows


# ---- the table ----------------------------------------------------------------------------------------------------


def table(path: str) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    for transport in ("peer", "tcp"):
        got = {(r["block_bytes"], r["batch"], r["library"]): r["us"] for r in rows if r["transport"] == transport}
        keys = sorted({(b, n) for b, n, _ in got})
        if not keys:
            continue
        print(f"\nkvcomm Endpoint.read vs NIXL READ (UCX{', UCX_TLS=tcp' if transport == 'tcp' else ''}), host memory, "
              f"{'two processes on one host' if transport == 'peer' else 'two network namespaces over TCP'}")
        print(f"{'block':>8} {'batch':>6} {'MiB':>8} {'kvcomm us':>11} {'NIXL us':>11} {'kvcomm GB/s':>12} "
              f"{'NIXL GB/s':>10} {'ratio':>6}  target >= 1.0")
        for bs, n in keys:
            kv, nx = got.get((bs, n, "kvcomm")), got.get((bs, n, "nixl"))
            if kv is None or nx is None:
                continue
            ratio = nx / kv
            print(f"{bs >> 10:>6}Ki {n:>6} {bs * n / 2**20:>8.2f} {kv:>11.1f} {nx:>11.1f} {bs * n / kv / 1e3:>12.2f} "
                  f"{bs * n / nx / 1e3:>10.2f} {ratio:>6.2f}  {'met' if ratio >= 1.0 else f'missed by x{1 / ratio:.2f}'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=["server", "client"])
    ap.add_argument("--library", choices=["kvcomm", "nixl"])
    ap.add_argument("--dir")
    ap.add_argument("--transport", choices=["peer", "tcp"])
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--table")
    a = ap.parse_args()
    if a.table:
        return table(a.table)
    os.environ.setdefault("UCX_LOG_LEVEL", "error")
    d = Path(a.dir)
    if a.role == "server":
        if a.library == "kvcomm":
            return kvcomm_server(d, a.transport)
        nixl_server(d)
        os._exit(0)  # NIXL 1.5.1's teardown crashes in a network namespace (UCX over TCP): nothing left to do
    rows = kvcomm_client(d, a.transport, a) if a.library == "kvcomm" else nixl_client(d, a)
    publish(d / "done", b"1")
    with open(a.json, "a") as fh:
        for bs, n, sec in rows:
            fh.write(json.dumps({"bench": "nixl_compare", "library": a.library, "transport": a.transport,
                                 "block_bytes": bs, "batch": n, "us": sec * 1e6,
                                 "gbps": bs * n / sec / 1e9}) + "\n")
    print(f"{a.library}: {len(rows)} rows, every one checked byte for byte", flush=True)
    if a.library == "nixl":
        os._exit(0)  # as the server's


if __name__ == "__main__":
    main()
