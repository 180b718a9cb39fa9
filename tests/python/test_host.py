"""kvcomm's Python package on host memory, 4 ranks (spawned processes, TCP unique id): communicator and layout
against the groups engines expect, publish byte for byte against an independent numpy oracle (poisoned replicas,
every byte of every replica compared, so guard bytes count; barrier, fused and split signal/wait), and bad input
refused with nothing written. Fetch and the Barrier object: test_fetch.py."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import kvcomm
import multirank

N = 4

# ---- communicator and layout -------------------------------------------------------------------------------------


def _comm_and_layout(comm: kvcomm.Communicator) -> None:
    r = comm.rank
    assert (comm.rank, comm.size) == (r, N)
    assert repr(comm) == f"kvcomm.Communicator(rank={r}, size={N}, hosts=1, bootstrap='tcp')"  # multirank: init_tcp
    gathered = comm.allgather(bytes([r, 2 * r]))
    assert gathered == bytes(b for k in range(N) for b in (k, 2 * k))
    comm.barrier()
    assert comm.num_hosts() == 1 and comm.same_host(0, N - 1)
    for a, b in ((N, 0), (0, N), (-1, 0), (0, -1)):  # checked, not indexed past the member table
        for query in (comm.same_host, comm.can_access_peer):
            with pytest.raises(kvcomm.InvalidArgumentError, match=f"\\[rank {r}\\] Communicator.* outside \\[0, {N}\\)"):
                query(a, b)
    members = comm.members()
    assert [m["rank"] for m in members] == list(range(N)) and all(m["local_size"] == N for m in members)

    # split: even/odd, ordered by descending world rank
    half = comm.split(r % 2, -r)
    expected = [k for k in (3, 2, 1, 0) if k % 2 == r % 2]
    assert half.size == 2 and [half.world_rank(i) for i in range(2)] == expected
    assert half.rank == expected.index(r)
    assert repr(half) == f"kvcomm.Communicator(rank={half.rank}, size=2, hosts=1, world_rank={r})"
    others = comm.split(-1 if r == 0 else 1, 0)  # a negative color takes part and gets None
    assert (others is None) == (r == 0)
    assert others is None or (others.size == N - 1 and others.rank == r - 1)

    for tp, pcp in ((2, 2), (1, 4), (4, 1)):
        layout = kvcomm.ParallelGroups.create(comm, tp=tp, pcp=pcp)
        assert layout.spec == (tp, pcp, 1, 1)
        assert layout.coord == (r % tp, r // tp, 0, 0)
        tp_group = [(r // tp) * tp + t for t in range(tp)]  # TP fastest, as engines number ranks
        pcp_group = [p * tp + r % tp for p in range(pcp)]
        for group, want, coord in ((layout.tp, tp_group, r % tp), (layout.pcp, pcp_group, r // tp)):
            assert group.size == len(want) and group.rank == coord
            assert [group.world_rank(i) for i in range(group.size)] == want
        for single in (layout.pp, layout.dp):
            assert single.size == 1 and single.world_rank(0) == r
        assert kvcomm.ParallelGroups.group_of(tp, pcp, 1, 1, r, kvcomm.Axis.PCP) == pcp_group
        assert kvcomm.ParallelGroups.group_of(tp, pcp, 1, 1, r, kvcomm.Axis.TP) == tp_group
    with pytest.raises(kvcomm.InvalidArgumentError):
        kvcomm.ParallelGroups.create(comm, tp=3)


def test_communicator_and_layout():
    multirank.run(_comm_and_layout, N)


def _callback_bootstraps(comm: kvcomm.Communicator, store_dict) -> None:
    # An engine's own process group: here the TCP world stands in for it.
    second = kvcomm.init_allgather(comm.rank, comm.size, lambda data: comm.allgather(data))
    assert (second.rank, second.size) == (comm.rank, comm.size)
    assert repr(second).endswith(", bootstrap='allgather')") and repr(comm).endswith(", bootstrap='tcp')")
    assert second.allgather(bytes([comm.rank])) == bytes(range(N))

    class DictStore:  # the torch.distributed.Store calls kvcomm uses: set, and a get that waits
        def set(self, key, value):
            store_dict[key] = bytes(value)

        def get(self, key):
            for _ in range(6000):
                if key in store_dict:
                    return store_dict[key]
                time.sleep(0.01)
            raise TimeoutError(key)

    third = kvcomm.init_store(DictStore(), comm.rank, comm.size, prefix="test")
    assert third.allgather(bytes([7 + comm.rank])) == bytes(7 + k for k in range(N))
    assert repr(third).endswith(", bootstrap='store')")

    # A callback that fails, on every rank: a RemoteError carrying the Python exception, no hang.
    def broken(data):
        raise KeyError("no such group")

    with pytest.raises(kvcomm.RemoteError, match="KeyError"):
        kvcomm.init_allgather(comm.rank, comm.size, broken)


def test_callback_bootstraps():
    import multiprocessing as mp

    with mp.get_context("spawn").Manager() as manager:
        multirank.run(_callback_bootstraps, N, manager.dict())


def _mpi4py(comm: kvcomm.Communicator) -> None:
    from mpi4py import MPI  # noqa: F401

    world = kvcomm.init_mpi4py()
    assert world.size >= 1


def test_mpi4py_bootstrap_single_rank():
    pytest.importorskip("mpi4py")
    multirank.run(_mpi4py, 1)


# ---- publish: byte-exact against an independent oracle ----------------------------------------------------------

BLOCK = 16
SLOTS = 160  # 10 blocks
MAIN_ROW = 656  # Main-KV row: 656 bytes
IDX = 128 * 1024  # Indexer-K region: per block 16 x 128-byte keys, then 16 x 4-byte scales
IDX_BLOCK = BLOCK * (128 + 4)
TOKENS = 24
POISON = 0xA5


def _rank_data(rnd: int, r: int):
    """Rank r's rows and slots in round `rnd` (every rank can regenerate every rank's data)."""
    rng = np.random.default_rng(1000 * rnd + r)
    main = rng.integers(0, 256, (2 * TOKENS, MAIN_ROW), dtype=np.uint8)  # round 1 publishes every other row
    keys = rng.integers(0, 256, (TOKENS, 128), dtype=np.uint8).view(np.float16)  # [T, 64] fp16
    scales = rng.integers(0, 256, (TOKENS, 4), dtype=np.uint8).view(np.float32)  # [T, 1] fp32
    perm = np.random.default_rng(77 + rnd).permutation(SLOTS)
    slots = perm[r * TOKENS:(r + 1) * TOKENS].astype(np.int64)
    slots[::5] = -1  # padded tokens
    main_rows = main[::2] if rnd == 1 else main[:TOKENS]
    return main_rows, keys, scales, slots


def _oracle(image: np.ndarray, rnd: int, nranks: int = N) -> None:
    for r in range(nranks):
        main, keys, scales, slots = _rank_data(rnd, r)
        for i, s in enumerate(slots.tolist()):
            if s < 0:
                continue
            blk, off = divmod(s, BLOCK)
            at = blk * BLOCK * MAIN_ROW + off * MAIN_ROW
            image[at:at + MAIN_ROW] = np.frombuffer(main[i].tobytes(), np.uint8)
            at = IDX + blk * IDX_BLOCK + off * 128
            image[at:at + 128] = np.frombuffer(keys[i].tobytes(), np.uint8)
            at = IDX + blk * IDX_BLOCK + BLOCK * 128 + off * 4
            image[at:at + 4] = np.frombuffer(scales[i].tobytes(), np.uint8)


def _tensors(main, keys, scales):
    return [
        kvcomm.CacheTensor(main, offset=0, block_size=BLOCK, row_bytes=MAIN_ROW),
        kvcomm.CacheTensor(keys, offset=IDX, block_size=BLOCK, block_stride=IDX_BLOCK),
        kvcomm.CacheTensor(scales, offset=IDX + BLOCK * 128, block_size=BLOCK, block_stride=IDX_BLOCK),
    ]


def _assert_replicas(buf: kvcomm.SymmetricBuffer, image: np.ndarray, what: str) -> None:
    for r in range(buf.size):
        got = buf.peer(r) if r != buf.rank else buf.local()
        if not isinstance(got, np.ndarray):  # a torch tensor on a CUDA buffer
            got = got.cpu().numpy()
        assert got.shape == image.shape
        bad = np.flatnonzero(got != image)
        assert bad.size == 0, (f"{what}: replica {r} differs in {bad.size} bytes, first at {bad[0]} "
                               f"(got {got[bad[0]]:#x}, want {image[bad[0]]:#x})")


def _publish(comm: kvcomm.Communicator) -> str:
    buf = kvcomm.SymmetricBuffer.create(comm, 1 << 20, 256 * 1024, kind="host")
    assert buf.kind == kvcomm.MemoryKind.Host and buf.handle_type == "memfd"
    buf.local()[:] = POISON
    comm.barrier()
    pub = kvcomm.Publisher(buf, barrier_timeout_ms=60000)
    image = np.full(buf.mapped_bytes, POISON, np.uint8)

    # Round 0: int64 slots, publish then barrier.
    main, keys, scales, slots = _rank_data(0, comm.rank)
    pub.publish(_tensors(main, keys, scales), slots)
    pub.barrier.sync()
    _oracle(image, 0)
    _assert_replicas(buf, image, "round 0")
    comm.barrier()

    # Round 1: int32 slots, publish then barrier (fused) on lane 1; Main-KV rows strided (every other row of a bigger array), scales from a
    # read-only array.
    main, keys, scales, slots = _rank_data(1, comm.rank)
    assert main.strides[0] == 2 * MAIN_ROW
    scales = np.frombuffer(scales.tobytes(), np.float32).reshape(TOKENS, 1)
    assert not scales.flags.writeable
    pub.publish(_tensors(main, keys, scales), slots.astype(np.int32), then="barrier", lane=1)
    _oracle(image, 1)
    _assert_replicas(buf, image, "round 1")
    comm.barrier()

    # Round 2: the split barrier, signal right after the stores and wait just before the reads.
    main, keys, scales, slots = _rank_data(2, comm.rank)
    pub.publish(_tensors(main, keys, scales), slots)
    pub.barrier.signal(lane=1)
    pub.barrier.wait(lane=1)
    _oracle(image, 2)
    _assert_replicas(buf, image, "round 2 (signal/wait)")
    with pytest.raises(kvcomm.InvalidArgumentError, match="lane"):
        pub.barrier.signal(lane=2)
    comm.barrier()

    # Round 3: publish and signal in one call (int32 slots), then the wait.
    main, keys, scales, slots = _rank_data(3, comm.rank)
    pub.publish(_tensors(main, keys, scales), slots.astype(np.int32), then="signal", lane=1)
    pub.barrier.wait(lane=1)
    _oracle(image, 3)
    _assert_replicas(buf, image, "round 3 (publish then signal, wait)")
    with pytest.raises(kvcomm.InvalidArgumentError, match="lane"):
        pub.publish(_tensors(main, keys, scales), slots, then="signal", lane=5)
    comm.barrier()

    # Round 4: the slot mapping as a Python list (converted to int64, like fetch's list ids).
    main, keys, scales, slots = _rank_data(4, comm.rank)
    pub.publish(_tensors(main, keys, scales), slots.tolist())
    pub.barrier.sync()
    _oracle(image, 4)
    _assert_replicas(buf, image, "round 4 (list slot mapping)")
    assert pub.poll_error() is None
    pub.check_errors()
    return pub.mode.name


@pytest.mark.parametrize("direct", ["auto", "0"])
def test_publish_byte_exact(direct, monkeypatch):
    monkeypatch.setenv("KVCOMM_DIRECT", direct)  # spawned ranks inherit it
    modes = multirank.run(_publish, N)
    assert modes == [("Direct" if direct == "auto" else "Fallback")] * N


def _publish_pcp(comm: kvcomm.Communicator) -> None:
    layout = kvcomm.ParallelGroups.create(comm, tp=2, pcp=2)
    pcp = layout.pcp
    buf = kvcomm.SymmetricBuffer.create(pcp, 64 * 1024, 64 * 1024, kind="host")
    buf.local()[:] = POISON
    pcp.barrier()
    pub = kvcomm.Publisher(buf)
    rows = np.full((8, 64), comm.rank + 1, np.uint8)  # rows tagged with the world rank
    pub.publish(kvcomm.CacheTensor(rows), np.arange(8, dtype=np.int64) + 8 * pcp.rank)
    pub.barrier.sync()
    image = np.full(buf.mapped_bytes, POISON, np.uint8)
    for p, world in enumerate([p * 2 + comm.rank % 2 for p in range(2)]):  # PCP groups {0,2} and {1,3}
        image[p * 8 * 64:(p + 1) * 8 * 64] = world + 1
    _assert_replicas(buf, image, "PCP group")


def test_publish_within_pcp_groups():
    multirank.run(_publish_pcp, N)


# ---- views ---------------------------------------------------------------------------------------------------------


def _views(comm: kvcomm.Communicator) -> None:
    buf = kvcomm.SymmetricBuffer.create(comm, 1 << 20, 64 * 1024, kind="host")
    base = buf.local_ptr()
    mine = buf.local(np.int32)
    assert mine.dtype == np.int32 and mine.size == buf.mapped_bytes // 4
    assert mine.__array_interface__["data"][0] == base  # zero-copy
    mine[:] = comm.rank * 1000 + np.arange(mine.size, dtype=np.int32)
    comm.barrier()
    for r in range(N):
        view = buf.peer(r, np.int32, offset=16, nbytes=64)
        assert view.__array_interface__["data"][0] == buf.peer_ptr(r) + 16
        np.testing.assert_array_equal(view, r * 1000 + np.arange(4, 20, dtype=np.int32))
    np.testing.assert_array_equal(buf.peer_table(), [buf.peer_ptr(r) for r in range(N)])
    granules = buf.mapped_bytes // buf.granularity
    bits = np.unpackbits(buf.backed_bitmap().view(np.uint8), bitorder="little")
    assert bits[:granules].all() and not bits[granules:].any()
    gen = buf.generation
    comm.barrier()
    buf.grow(192 * 1024)
    assert buf.local_ptr() == base and buf.generation > gen and buf.mapped_bytes >= 192 * 1024
    assert buf.local().size == buf.mapped_bytes
    np.testing.assert_array_equal(buf.peer((comm.rank + 1) % N, np.int32, nbytes=8),
                                  ((comm.rank + 1) % N) * 1000 + np.arange(2, dtype=np.int32))
    with pytest.raises(kvcomm.InvalidArgumentError, match="not backed"):
        buf.local(offset=buf.mapped_bytes - 8, nbytes=16)
    # offset + nbytes past 2**64 must not wrap round to a small, backed end
    assert not buf.is_backed(4096, 2**64 - 100) and buf.is_backed(4096, 4096)
    with pytest.raises(kvcomm.InvalidArgumentError, match="not backed"):
        buf.local(offset=4096, nbytes=2**64 - 100)
    with pytest.raises(kvcomm.InvalidArgumentError, match="outside"):
        buf.peer(N)
    with pytest.raises(kvcomm.InvalidArgumentError, match="only adopted"):
        buf.commit([(0, 4096)])
    comm.barrier()
    buf.close()
    # the tables are freed: no view of a null pointer
    for view in (buf.peer_table, buf.backed_bitmap, buf.local, lambda: buf.peer((comm.rank + 1) % N)):
        with pytest.raises(kvcomm.InvalidArgumentError, match=f"\\[rank {comm.rank}\\] .*the buffer is closed"):
            view()
    # and the queries describe no memory, never the unmapped addresses
    assert buf.local_ptr() == 0 and buf.peer_ptr((comm.rank + 1) % N) == 0
    assert buf.backed_ranges() == [] and buf.mapped_bytes == 0 and not buf.is_mapped(comm.rank)


def test_views_are_zero_copy():
    multirank.run(_views, N)


# ---- bad input -------------------------------------------------------------------------------------------------------


class FakeCudaArray:
    """An array on a CUDA device, as __cuda_array_interface__ describes it (never dereferenced)."""

    def __init__(self, shape, typestr):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0xdead0000, False),
                                         "strides": None, "version": 3}


def _bad_input(comm: kvcomm.Communicator) -> None:
    buf = kvcomm.SymmetricBuffer.create(comm, 1 << 20, 128 * 1024, kind="host")
    rng = np.random.default_rng(comm.rank)
    buf.local()[:] = rng.integers(0, 256, buf.mapped_bytes, dtype=np.uint8)
    comm.barrier()
    before = [buf.peer(r).copy() for r in range(N)]
    pub = kvcomm.Publisher(buf)
    rows = np.arange(8 * 64, dtype=np.uint8).reshape(8, 64)
    slots = np.arange(8, dtype=np.int64) * 3
    good = kvcomm.CacheTensor(rows, offset=4096)

    def refused(match, tensors, slot_mapping, **kw):
        with pytest.raises(kvcomm.InvalidArgumentError, match=match) as info:
            pub.publish(tensors, slot_mapping, **kw)
        assert isinstance(info.value, ValueError) and f"[rank {comm.rank}]" in str(info.value)

    refused("int64 or int32", good, slots.astype(np.float32))  # wrong dtype
    refused("int64 or int32", good, slots.astype(np.uint64))
    refused("1-D", good, slots.reshape(2, 4))
    refused("contiguous", good, np.arange(16, dtype=np.int64)[::2])  # non-contiguous slots
    refused("not contiguous", kvcomm.CacheTensor(np.zeros((8, 128), np.uint8)[:, ::2]), slots)  # rows not contiguous
    refused("read past", kvcomm.CacheTensor(rows[:5]), slots)  # fewer rows than tokens
    refused("num_tokens", good, slots, num_tokens=9)
    refused("device 'cuda'", kvcomm.CacheTensor(FakeCudaArray((8, 64), "|u1")), slots)  # wrong device
    refused("device 'cuda'", good, FakeCudaArray((8,), "<i8"))
    refused("not an array", kvcomm.CacheTensor([[1, 2], [3, 4]]), slots)
    refused("row_bytes", kvcomm.CacheTensor(rows, row_bytes=65), slots)
    refused("non-negative", kvcomm.CacheTensor(rows, offset=-64), slots)
    refused("block_size", kvcomm.CacheTensor(rows, block_size=0), slots)
    refused("no tensors", [], slots)
    refused("tensors must be", None, slots)
    refused("num_tokens must be an int", good, slots, num_tokens=2.7)  # never truncated
    refused("num_tokens must be an int", good, slots, num_tokens="3")
    refused("offset 18446744073709551616 is outside", kvcomm.CacheTensor(rows, offset=2**64), slots)
    refused("slot_mapping", good, slots.astype(object))  # object arrays hold pointers: not an array kvcomm reads
    # Python lists are converted to int64 with the checks fetch's list ids get: ints that fit int64 only.
    refused("slot_mapping: a list of slots must hold ints, got float 1.5", good, [0, 1.5, 2, 3])
    refused("slot_mapping: a list of slots must hold ints, got str '2'", good, [0, 1, "2", 3])
    refused("slot_mapping: a list of slots must hold ints, got NoneType None", good, [0, None])
    refused("slot_mapping: a list of slots must hold ints, got bool True", good, [True, False])
    refused("slot_mapping: slot 9223372036854775808 does not fit int64", good, [0, 2**63])
    refused("slot_mapping: slot 18446744073709551615 does not fit int64", good, [2**64 - 1])
    refused("slot_mapping: slot 36893488147419103232 does not fit int64", good, [1, 2**65])
    refused("slot_mapping: slot -9223372036854775809 does not fit int64", good, [-(2**63) - 1, 0])
    refused("1-D", good, [[0, 1], [2, 3]])
    refused("num_tokens", good, [0, 1, 2], num_tokens=4)
    refused("slot", good, [0, 1, 2, 3, 4, 5, 6, 1 << 40])  # converted, then refused by the library as out of range
    refused("backed", kvcomm.CacheTensor(rows, offset=buf.mapped_bytes), slots)  # destination beyond the memory
    bad_slots = slots.copy()
    bad_slots[-1] = 1 << 40  # out-of-range slot: the library refuses the whole call
    refused("slot", good, bad_slots)
    refused("slot", good, np.array([0, 1, 2, 3, 4, 5, 6, 200000], np.int32))
    with pytest.raises(kvcomm.InvalidArgumentError, match="lane"):
        pub.barrier.sync(lane=7)
    with pytest.raises(kvcomm.InvalidArgumentError, match="lane"):
        pub.publish(good, slots, then="barrier", lane=-1)
    with pytest.raises(kvcomm.InvalidArgumentError, match="lane 1099511627776 is outside"):
        pub.barrier.sync(lane=2**40)
    with pytest.raises(kvcomm.InvalidArgumentError, match="SymmetricBuffer"):
        kvcomm.Publisher("not a buffer")
    # Sizes a native signature cannot hold are the library's errors on every rank (before any collective step).
    with pytest.raises(kvcomm.InvalidArgumentError, match="capacity 18446744073709551616 is outside"):
        kvcomm.SymmetricBuffer.create(comm, 2**64, kind="host")
    with pytest.raises(kvcomm.InvalidArgumentError, match="new_bytes -1 is outside"):
        buf.grow(-1)
    with pytest.raises(kvcomm.InvalidArgumentError, match=rf"\[rank {comm.rank}\] SymmetricBuffer.create: kind 'gpu'"):
        kvcomm.SymmetricBuffer.create(comm, 4096, 4096, kind="gpu")
    with pytest.raises(kvcomm.InvalidArgumentError, match=rf"\[rank {comm.rank}\] Barrier: kind 'bogus'"):
        kvcomm.Barrier(comm, kind="bogus")
    comm.barrier()
    for r in range(N):
        assert np.array_equal(buf.peer(r), before[r]), f"replica {r} changed after refused calls"
    comm.barrier()  # everyone compared before anyone publishes again
    # The publisher still works afterwards.
    pub.publish(good, slots)
    pub.barrier.sync()
    pub.check_errors()


def test_bad_input_writes_nothing():
    multirank.run(_bad_input, N)


# ---- the GIL is released while kvcomm blocks --------------------------------------------------------------------


def _gil(comm: kvcomm.Communicator) -> int:
    buf = kvcomm.SymmetricBuffer.create(comm, 64 * 1024, 64 * 1024, kind="host")
    pub = kvcomm.Publisher(buf)
    comm.barrier()
    counter = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=count)
    t.start()
    if comm.rank == 0:
        time.sleep(1.0)  # the others wait in the barrier meanwhile
    start = counter[0]
    pub.barrier.sync()
    progressed = counter[0] - start
    stop.set()
    t.join()
    return progressed


def test_gil_released_in_barrier():
    progressed = multirank.run(_gil, N)
    # Ranks 1..3 blocked about a second in the barrier; a thread holding no GIL would have counted nothing.
    assert min(progressed[1:]) > 1000, progressed


# ---- package basics ---------------------------------------------------------------------------------------------------


def test_version_and_error_classes():
    import importlib.metadata

    code = kvcomm._kvcomm.version()
    assert kvcomm.__version__ == f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    try:
        assert importlib.metadata.version("kvcomm") == kvcomm.__version__
    except importlib.metadata.PackageNotFoundError:
        pass  # imported from a build tree
    assert issubclass(kvcomm.InvalidArgumentError, (kvcomm.Error, ValueError))
    assert issubclass(kvcomm.TimeoutError, TimeoutError) and issubclass(kvcomm.NetworkError, ConnectionError)
    for name in ("InvalidArgument", "Unsupported", "SystemError", "CudaError", "NetworkError", "RemoteError",
                 "Timeout", "Aborted", "InternalError", "Busy"):
        code = getattr(kvcomm.ErrorCode, name)
        cls = kvcomm._errors.ERROR_CLASSES[code]
        assert cls.code == code and issubclass(cls, kvcomm.Error)
    with pytest.raises(kvcomm.InvalidArgumentError, match="hex"):
        kvcomm.UniqueId.from_string("zz")
    with pytest.raises(kvcomm.InvalidArgumentError, match="rank"):
        kvcomm.init_tcp(kvcomm.create_unique_id(), 5, 2)
