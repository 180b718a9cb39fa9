"""Runs a function on N ranks, each a spawned process with a world Communicator over a TCP unique id (rank 0
creates the id and hands it to the others). Every rank's exception is reported with its traceback; a rank that hangs
fails the test after `timeout` seconds instead of hanging the suite."""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from typing import Any, Callable, List, Sequence


def _entry(fn: Callable, rank: int, size: int, ids: Any, results: Any, args: Sequence[Any]) -> None:
    try:
        import kvcomm

        if rank == 0:
            uid = str(kvcomm.create_unique_id())
            for _ in range(size - 1):
                ids.put(uid)
        else:
            uid = ids.get(timeout=60)
        comm = kvcomm.init_tcp(uid, rank, size, timeout_ms=60000)
        results.put((rank, True, fn(comm, *args)))
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        results.put((rank, False, traceback.format_exc()))


def run(fn: Callable, size: int = 4, *args: Any, timeout: float = 120.0) -> List[Any]:
    """fn(comm, *args) on `size` ranks; returns the results by rank, or raises AssertionError naming each failure."""
    ctx = mp.get_context("spawn")
    ids, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, r, size, ids, results, args), daemon=True) for r in range(size)]
    for p in procs:
        p.start()
    got: dict = {}
    try:
        while len(got) < size:
            try:
                rank, ok, value = results.get(timeout=timeout)
            except queue.Empty:
                missing = sorted(set(range(size)) - set(got))
                raise AssertionError(f"ranks {missing} did not finish within {timeout} s") from None
            got[rank] = (ok, value)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    failures = [f"--- rank {r} ---\n{v}" for r, (ok, v) in sorted(got.items()) if not ok]
    if failures:
        raise AssertionError("\n".join(failures))
    return [got[r][1] for r in range(size)]
