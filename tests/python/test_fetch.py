"""kvcomm.Fetcher and kvcomm.Barrier on host memory, 4 ranks (spawned processes, TCP unique id).

Every rank registers its own layout (two regions; offsets, strides and block counts differ per rank, with guard bytes
between blocks) over a buffer whose every byte is known (seeded random). Fetches from three sources (itself
included) through fetch(), a reused plan, fetch_device(), a polled start() (also paced, seen in progress with the GIL
released) and the collective fetch_all() are each compared with an independent numpy per-block oracle over the whole
buffer (guards, untouched blocks, the other region). Bad input raises a clear InvalidArgumentError (or
UnsupportedError) and writes nothing. Sources are blocks [0, SRC_BLOCKS) and destinations [SRC_BLOCKS, DST_END): no
rank ever writes what another reads."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import kvcomm
import multirank

N = 4
SRC_BLOCKS = 16
DST_END = 56
BLOCK_BYTES = (96, 200)
CAPACITY = 1 << 20
INITIAL = 192 * 1024


def _layout(r: int) -> list:
    """Rank r's layout: a KvRegion and a plain tuple (both forms are accepted)."""
    return [kvcomm.KvRegion(offset=4096 + r * 64, block_bytes=96, block_stride=96 + 16 + 16 * r, num_blocks=DST_END + r),
            (64 * 1024 + r * 256, 200, 200 + 24 + 8 * r, DST_END + r)]


def _regions(r: int) -> list:
    return [kvcomm.KvRegion(*x) if isinstance(x, tuple) else x for x in _layout(r)]


def _initial(r: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(4242 + r).integers(0, 256, nbytes, dtype=np.uint8)


def _block(image: np.ndarray, r: int, j: int, b: int) -> np.ndarray:
    reg = _regions(r)[j]
    at = reg.offset + b * (reg.block_stride or reg.block_bytes)
    return image[at:at + reg.block_bytes]


def _oracle(image: np.ndarray, rank: int, requests: list) -> None:
    """Source block s of rank src (as it was at the start) lands in block d of `rank`, in every region."""
    for src, s_ids, d_ids in requests:
        source = _initial(src, image.size)
        for s, d in zip(np.asarray(s_ids).tolist(), np.asarray(d_ids).tolist()):
            if s == -1 or d == -1:
                continue
            for j in range(len(BLOCK_BYTES)):
                _block(image, rank, j, d)[:] = _block(source, src, j, s)


def _check(buf: kvcomm.SymmetricBuffer, image: np.ndarray, what: str) -> None:
    got = buf.local()[:image.size]
    if not isinstance(got, np.ndarray):  # a torch tensor on a CUDA buffer
        got = got.cpu().numpy()
    bad = np.flatnonzero(got != image)
    assert bad.size == 0, (f"rank {buf.rank}, {what}: {bad.size} bytes differ from the oracle, first at {bad[0]} "
                           f"(got {got[bad[0]]:#x}, want {image[bad[0]]:#x})")


def _batch(rank: int, rnd: int, lists: bool = False, size: int = N) -> list:
    """Pairs from three sources (itself, the next rank, the one after): a run of 4 consecutive ids on both sides
    (coalesced), 3 scattered pairs, and -1 padding on either side; destinations unique across the batch."""
    rng = np.random.default_rng(1000 * rnd + rank)
    nxt = SRC_BLOCKS + rnd % 5
    out = []
    for k in range(3):
        first = int(rng.integers(0, 8))
        src = [first + i for i in range(4)] + rng.integers(0, SRC_BLOCKS, 3).tolist() + [-1, 3]
        dst = [nxt + i for i in range(4)] + [nxt + 4, nxt + 6, nxt + 8] + [DST_END - 1, -1]
        nxt += 10
        if lists and k == 1:
            out.append(((rank + k) % size, src, dst))  # Python lists are accepted too
        else:
            out.append(((rank + k) % size, np.array(src, np.int64), np.array(dst, np.int64)))
    return out


def _pairs(requests: list) -> tuple:
    total = sum(len(s) for _, s, _ in requests)
    skipped = sum(int(a == -1 or b == -1) for _, s, d in requests for a, b in zip(list(s), list(d)))
    return total, skipped


PAIR_BYTES = sum(BLOCK_BYTES)


def _setup(comm: kvcomm.Communicator):
    buf = kvcomm.SymmetricBuffer.create(comm, CAPACITY, INITIAL, kind="host")
    image = _initial(comm.rank, buf.mapped_bytes)
    buf.local()[:] = image
    f = kvcomm.Fetcher(buf, _layout(comm.rank), version=7, barrier_timeout_ms=60000)
    comm.barrier()  # every source is filled
    return buf, image, f


# ---- barrier ---------------------------------------------------------------------------------------------------------


def _barrier_orders_peer_stores(comm: kvcomm.Communicator, buf: kvcomm.SymmetricBuffer) -> None:
    bar = kvcomm.Barrier(comm, lanes=3, timeout_ms=60000, kind="host")
    assert (bar.lanes, bar.kind, bar.communicator.size) == (3, kvcomm.MemoryKind.Host, N)
    assert len(bar.device_handle()) > 0
    # Each rank stamps every peer's memory (past the fetch layouts), then signal/wait (round 1, 3) or sync (2).
    at = INITIAL - 4096
    for rnd in (1, 2, 3):
        for r in range(N):
            buf.peer(r, np.int64, offset=at, nbytes=8 * N)[comm.rank] = rnd * 1000 + comm.rank
        if rnd == 2:
            bar.sync(lane=1)
        else:
            bar.signal(lane=2)
            bar.wait(lane=2)
        got = buf.local(np.int64, offset=at, nbytes=8 * N)
        assert got.tolist() == [rnd * 1000 + r for r in range(N)], f"round {rnd}: {got.tolist()}"
        bar.sync(lane=0)  # everyone read before the next round overwrites
    with pytest.raises(kvcomm.InvalidArgumentError, match="lane"):
        bar.signal(lane=3)
    with pytest.raises(kvcomm.InvalidArgumentError, match="lane 1099511627776 is outside"):
        bar.wait(lane=2**40)  # too large for the native int: the library's error, not nanobind's TypeError
    with pytest.raises(kvcomm.InvalidArgumentError, match="Communicator"):
        kvcomm.Barrier(buf)
    assert bar.poll_error() is None
    bar.check_errors()


# ---- fetch, byte-exact -------------------------------------------------------------------------------------------


def _fetch_suite(comm: kvcomm.Communicator) -> None:
    rank = comm.rank
    buf, image, f = _setup(comm)
    for r in range(N):
        assert f.layout(r) == _regions(r)
        assert f.layout_version(r) == 7
        assert f.layout_hash(r) == kvcomm.layout_hash(_layout(r), 7) == kvcomm.layout_hash(_regions(r), 7)
    assert kvcomm.layout_hash(_layout(rank), 8) != f.layout_hash()
    assert f.generation == buf.generation

    # 1. fetch(): plan + submit, numpy ids and a Python list.
    reqs = _batch(rank, 0, lists=True)
    info = f.fetch(reqs)
    total, skipped = _pairs(reqs)
    assert (info.pairs_in, info.pairs_skipped, info.bytes) == (total, skipped, (total - skipped) * PAIR_BYTES)
    assert info.path == kvcomm.FetchPath.Host and info.host_runs == info.runs_out
    assert info.runs_out < (total - skipped) * len(BLOCK_BYTES), f"runs of consecutive blocks coalesce: {info}"
    _oracle(image, rank, reqs)
    _check(buf, image, "fetch")

    # 2. One plan, submitted twice; a FetchRequest with the source's hash.
    reqs = _batch(rank, 1)
    plan = f.plan([kvcomm.FetchRequest(q[0], q[1], q[2], f.layout_hash(q[0])) for q in reqs])
    assert plan.generation == f.generation and plan.info.pairs_in == _pairs(reqs)[0]
    f.submit(plan)
    f.submit(plan)
    _oracle(image, rank, reqs)
    _check(buf, image, "plan submitted twice")

    # 3. fetch_device: ids in "device" memory (host arrays for host buffers), one source per pair, then one for all.
    reqs = _batch(rank, 2)
    src = np.concatenate([q[1] for q in reqs])
    dst = np.concatenate([q[2] for q in reqs])
    ranks = np.concatenate([np.full(len(q[1]), q[0], np.int32) for q in reqs])
    f.fetch_device(src, dst, src_ranks=ranks)
    f.check_errors()
    _oracle(image, rank, reqs)
    one = _batch(rank, 3)[1]
    f.fetch_device(one[1], one[2], one[0])
    _oracle(image, rank, [one])
    _check(buf, image, "fetch_device")

    # 4. Polled: test() until done, then wait(); nothing failed.
    reqs = _batch(rank, 4)
    op = f.start(reqs)
    status = op.test()
    deadline = time.monotonic() + 30
    while status.in_progress and time.monotonic() < deadline:
        time.sleep(0.0005)
        status = op.test()
    assert status.done, status
    # Checked like every integer argument (int() truncated 1.9 and took "5").
    for bad in (1.9, "5"):
        with pytest.raises(kvcomm.InvalidArgumentError, match=rf"\[rank {rank}\] FetchOperation.wait: timeout_ms"):
            op.wait(timeout_ms=bad)
    status = op.wait()
    total, skipped = _pairs(reqs)
    assert status.bytes_done == status.bytes_total == (total - skipped) * PAIR_BYTES
    assert status.failed_blocks.dtype == np.int64 and status.failed_blocks.size == 0 and status.error == ""
    del op
    _oracle(image, rank, reqs)
    _check(buf, image, "polled fetch")

    # 5. Paced: 8 pairs that do not coalesce, 2368 bytes at 2000 B/s (about 1.2 s, room for a loaded machine's
    #    stalls). Seen in progress; wait() blocks without the GIL (a Python thread keeps counting meanwhile).
    paced = [((rank + 1) % N, np.arange(0, 16, 2, dtype=np.int64), np.arange(30, 46, 2, dtype=np.int64))]
    op = f.start(paced, max_bytes_per_second=2000)
    early = op.wait(timeout_ms=20)
    assert early.in_progress and early.bytes_done < early.bytes_total == 8 * PAIR_BYTES, early
    stamps, stop = [], threading.Event()

    def tick():  # a Python thread that needs the GIL every millisecond
        while not stop.is_set():
            stamps.append(time.monotonic())
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    t0 = time.monotonic()
    done = op.wait(timeout_ms=10000)
    t1 = time.monotonic()
    stop.set()
    t.join()
    assert done.done and done.bytes_done == 8 * PAIR_BYTES, done
    inside = sum(1 for x in stamps if t0 + 0.05 < x < t1 - 0.02)
    assert t1 - t0 < 0.1 or inside >= 5, (f"a Python thread ran {inside} times during the {t1 - t0:.3f} s wait(): "
                                          "the GIL was held")
    _oracle(image, rank, paced)
    _check(buf, image, "paced polled fetch")

    # 6. The collective form, twice (sources never change).
    reqs = _batch(rank, 5)
    info = f.fetch_all(reqs)
    f.fetch_all(reqs)
    assert info.pairs_in == _pairs(reqs)[0]
    _oracle(image, rank, reqs)
    _check(buf, image, "fetch_all")
    f.fetch_all()  # a member with nothing to fetch still takes part
    assert f.poll_error() is None
    f.check_errors()

    _barrier_orders_peer_stores(comm, buf)
    comm.barrier()  # nobody unmaps a source a peer still reads


def test_fetch_byte_exact_and_barrier():
    multirank.run(_fetch_suite, N)


# ---- bad input -------------------------------------------------------------------------------------------------------


class FakeCudaArray:
    """An int64 array on a CUDA device, as __cuda_array_interface__ describes it (never dereferenced)."""

    def __init__(self, n: int, typestr: str = "<i8"):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (0xdead0000, False),
                                         "strides": None, "version": 3}


def _fetch_bad_input(comm: kvcomm.Communicator) -> None:
    rank = comm.rank
    buf, image, f = _setup(comm)
    peer = (rank + 1) % N
    src = np.array([0, 1, 2, 3], np.int64)
    dst = np.array([20, 21, 22, 23], np.int64)

    def refused(match, fn, cls=kvcomm.InvalidArgumentError):
        with pytest.raises(cls, match=match) as info:
            fn()
        assert f"[rank {rank}]" in str(info.value), str(info.value)

    def bad_fetch(match, requests, cls=kvcomm.InvalidArgumentError, **kw):
        refused(match, lambda: f.fetch(requests, **kw), cls)

    good = (peer, src, dst)
    more = np.array([24, 25, 26, 27], np.int64)
    bad_fetch("source block 999", [good, (peer, np.array([0, 1, 999, 3], np.int64), more)])
    bad_fetch("request 1, pair 2", [good, (peer, np.array([0, 1, 999, 3], np.int64), more)])
    bad_fetch("destination block -2", [(peer, src, np.array([20, -2, 22, 23], np.int64))])
    bad_fetch("duplicate", [good, (rank, np.array([5], np.int64), np.array([22], np.int64))])
    bad_fetch("must be int64", [(peer, src.astype(np.float64), dst)])  # ids are never converted
    bad_fetch("must be int64", [(peer, src, dst.astype(np.int32))])
    bad_fetch("must be int64", [(peer, src.astype(np.uint64), dst)])
    bad_fetch("1-D", [(peer, src.reshape(2, 2), dst.reshape(2, 2))])
    bad_fetch("contiguous", [(peer, np.arange(8, dtype=np.int64)[::2], dst)])
    bad_fetch("src_ids has 3 ids but dst_ids has 4", [(peer, src[:3], dst)])
    bad_fetch("must hold ints", [(peer, [0.5, 1.5, 2.5, 3.5], dst)])
    # ids at or above 2**63 become uint64 in numpy: refused, never wrapped into other ids or -1 (padding)
    bad_fetch("does not fit int64", [(peer, [1], [2**64 - 1])])
    bad_fetch("does not fit int64", [(peer, [2**63], [20])])
    bad_fetch("not an array", [(peer, src.astype(object), dst)])  # object arrays hold pointers, not ids
    bad_fetch("on the CPU", [(peer, FakeCudaArray(4), dst)])
    bad_fetch("not an array", [(peer, "0123", dst)])
    bad_fetch("source rank", [(N, src, dst)])
    bad_fetch("source rank", [(-1, src, dst)])
    bad_fetch("source rank", [(True, src, dst)])
    bad_fetch("layout hash", [(peer, src, dst, f.layout_hash(peer) ^ 1)])
    bad_fetch("expected", [(peer, src)])
    bad_fetch("requests must be", 5)
    bad_fetch("path", [good], path="teleport")
    bad_fetch("path", [good], kvcomm.UnsupportedError, path="kernel")  # host memory: refused, never substituted
    refused("999", lambda: f.start([(peer, np.array([999], np.int64), np.array([20], np.int64))]))
    refused("999", lambda: f.plan([(peer, np.array([999], np.int64), np.array([20], np.int64))]))
    refused("FetchPlan", lambda: f.submit("plan"))
    refused("exactly one", lambda: f.fetch_device(src, dst))
    # Every integer argument is checked (int() truncated 1.9 and took "5"; a bad rank was nanobind's TypeError).
    refused("rank", lambda: f.layout(2.0))
    refused("rank", lambda: f.layout_hash(N))
    refused("rank", lambda: f.layout_version("0"))
    refused("lanes must be an int", lambda: kvcomm.Fetcher(buf, f.layout(), lanes=1.5))
    refused("exactly one", lambda: f.fetch_device(src, dst, peer, src_ranks=np.full(4, peer, np.int32)))
    refused("int32", lambda: f.fetch_device(src, dst, src_ranks=np.full(4, peer, np.int64)))
    refused("src_ranks has 3", lambda: f.fetch_device(src, dst, src_ranks=np.full(3, peer, np.int32)))
    refused("device 'cuda'", lambda: f.fetch_device(FakeCudaArray(4), dst, peer))
    refused("must be int64", lambda: f.fetch_device(src.astype(np.int32), dst, peer))
    refused("not an array", lambda: f.fetch_device([0, 1, 2, 3], dst, peer))
    refused("pair 2", lambda: f.fetch_device(np.array([0, 1, 999, 3], np.int64), dst, peer))  # before any copy
    refused("src_rank", lambda: f.fetch_device(src, dst, N))
    with pytest.raises(kvcomm.InvalidArgumentError, match="SymmetricBuffer"):
        kvcomm.Fetcher("buffer", _layout(rank))
    comm.barrier()
    _check(buf, image, "after refused calls")

    # The collective form with a bad request on rank 2: rank 2 raises after the barriers, the others' blocks land.
    reqs = _batch(rank, 6)
    if rank == 2:
        reqs[0] = (reqs[0][0], np.array([999], np.int64), np.array([20], np.int64))
        with pytest.raises(kvcomm.InvalidArgumentError, match="999"):
            f.fetch_all(reqs)
    else:
        f.fetch_all(reqs)
        _oracle(image, rank, reqs)
    if rank == 1:  # malformed on the Python side: still takes part, then raises its own message
        with pytest.raises(kvcomm.InvalidArgumentError, match="int64"):
            f.fetch_all([(peer, src.astype(np.int32), dst)])
    else:
        f.fetch_all()
    _check(buf, image, "after the collective form with a bad rank")

    # A malformed layout on rank 1 only: every rank refuses together (rank 1 with its own message).
    layout = _layout(rank)
    if rank == 1:
        layout[1] = (0, 200, 0)
        with pytest.raises(kvcomm.InvalidArgumentError, match="4-tuple"):
            kvcomm.Fetcher(buf, layout)
    else:
        with pytest.raises(kvcomm.InvalidArgumentError, match="rank 1"):
            kvcomm.Fetcher(buf, layout)
    # Incompatible block sizes (rank 3's region 1 holds 208 bytes): refused on every rank, naming rank 3.
    layout = _layout(rank)
    if rank == 3:
        layout[1] = (layout[1][0], 208, layout[1][2], layout[1][3])
    with pytest.raises(kvcomm.InvalidArgumentError, match="rank 3"):
        kvcomm.Fetcher(buf, layout)

    # Growth makes plans stale until refresh(); plans made before stay stale.
    plan = f.plan([good])
    comm.barrier()
    buf.grow(INITIAL + 256 * 1024)
    refused("refresh", lambda: f.fetch([good]))
    refused("stale", lambda: f.submit(plan))
    f.refresh()
    assert f.generation == buf.generation > plan.generation
    refused("stale", lambda: f.submit(plan))
    f.fetch([good])
    _oracle(image, rank, [good])
    _check(buf, image, "after refresh")
    comm.barrier()


def test_fetch_bad_input_writes_nothing():
    multirank.run(_fetch_bad_input, N)


def test_layout_hash_and_regions():
    a = kvcomm.layout_hash([kvcomm.KvRegion(0, 4096, 0, 64), (1 << 20, 4096, 8192, 64)], version=3)
    b = kvcomm.layout_hash([(0, 4096, 0, 64), kvcomm.KvRegion(1 << 20, 4096, 8192, 64)], version=3)
    assert a == b and a != kvcomm.layout_hash([(0, 4096, 0, 64), (1 << 20, 4096, 8192, 64)], version=4)
    assert kvcomm.layout_hash([(0, 4096, 4096, 64)]) == kvcomm.layout_hash([(0, 4096, 0, 64)])  # stride 0 = bytes
    with pytest.raises(kvcomm.InvalidArgumentError, match="region 0: offset"):
        kvcomm.layout_hash([(-1, 4096, 0, 64)])
    with pytest.raises(kvcomm.InvalidArgumentError, match="4-tuple"):
        kvcomm.layout_hash([(0, 4096)])
    with pytest.raises(kvcomm.InvalidArgumentError, match="list of KvRegion"):
        kvcomm.layout_hash(42)
