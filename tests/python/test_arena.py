"""Arenas from Python on host memory: a server (this process) and a client (a spawned process) share arenas in both
directions, every byte written by one process checked in the other against a numpy oracle (through the copies and
the zero-copy views); leases make shrink and free raise BusyError with nothing changed; growth reaches the importer
at the same address; bad input (a forged and a used capability, ranges out of bounds or wrapping, sizes, layouts past
the limit, enums, closed objects, wrong types) raises the documented error naming the argument. The CUDA twin is
test_cuda.py's test_arena_cuda_both_directions."""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from typing import Any

import numpy as np
import pytest

import kvcomm

BLOCKS, BLOCK_BYTES, STRIDE, GAP = 24, 1000, 1024, 8192
REGION1 = BLOCKS * STRIDE + GAP
EXTENT = REGION1 + BLOCKS * STRIDE
LAYOUT = [kvcomm.KvRegion(0, BLOCK_BYTES, STRIDE, BLOCKS), kvcomm.KvRegion(REGION1, BLOCK_BYTES, STRIDE, BLOCKS)]
CAPACITY = 8 << 20
TIMEOUT_MS = 30000


def pattern(seed: int, n: int) -> np.ndarray:
    """The oracle: n deterministic bytes of `seed`, computed the same way in both processes."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _run_child(target: Any, *args: Any) -> Any:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    p = ctx.Process(target=_child_entry, args=(target, results, args), daemon=True)
    p.start()
    return p, results


def _child_entry(target: Any, results: Any, args: Any) -> None:
    try:
        target(*args)
        results.put((True, ""))
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        results.put((False, traceback.format_exc()))


def _join(p: Any, results: Any) -> None:
    ok, text = results.get(timeout=120)
    p.join(30)
    assert ok, f"the client process failed:\n{text}"


def _tag(s: kvcomm.ArenaSession, expected: bytes) -> None:
    got = s.receive(TIMEOUT_MS)
    assert got == expected, (got, expected)


# ---- server-owned: the server allocates, the client imports ---------------------------------------------------------


def _client_imports(address: str) -> None:
    with kvcomm.ArenaSession.connect(address, timeout_ms=TIMEOUT_MS) as s:
        assert s.peer_pid == os.getppid() and s.peer_uid == os.getuid() and s.alive
        cap = kvcomm.ArenaCapability.from_bytes(s.receive(TIMEOUT_MS))
        assert cap.importer_pid == os.getpid() and cap.generation == 1
        forged = kvcomm.ArenaCapability(cap.arena_id, cap.generation, bytes(b ^ 0x11 for b in cap.token),
                                        cap.importer_pid, cap.importer_uid, cap.expires_at_ms)
        with pytest.raises(kvcomm.InvalidArgumentError, match="never issued"):
            s.import_(forged)
        with pytest.raises(kvcomm.InvalidArgumentError, match="on_owner_loss 'later' is not one of"):
            s.import_(cap, on_owner_loss="later")
        kv = s.import_(cap)
        with pytest.raises(kvcomm.InvalidArgumentError, match="already used"):
            s.import_(cap.to_bytes())
        assert kv.bytes >= EXTENT and kv.generation == 1 and kv.owner_pid == os.getppid() and kv.owner_alive
        assert kv.layout == LAYOUT and kv.layout_version == 7 and kv.handle_type == "memfd"
        assert kv.kind == kvcomm.MemoryKind.Host
        expected = pattern(1, EXTENT)
        np.testing.assert_array_equal(kv.read(0, EXTENT), expected)  # a copy
        view = kv.view(nbytes=EXTENT)  # the mapping itself
        assert view.ctypes.data == kv.data_ptr
        np.testing.assert_array_equal(view, expected)
        # Out of range: refused, nothing read or written.
        for offset, n in ((kv.bytes - 8, 16), ((1 << 64) - 4, 16), (kv.bytes, 1)):
            with pytest.raises(kvcomm.InvalidArgumentError, match="is not inside"):
                kv.read(offset, n)
        with pytest.raises(kvcomm.InvalidArgumentError, match="is not inside"):
            kv.write(kv.bytes - 2, np.zeros(4, np.uint8))
        with pytest.raises(kvcomm.InvalidArgumentError, match="offset -1 is outside"):
            kv.read(-1, 4)
        with pytest.raises(kvcomm.InvalidArgumentError, match="is not inside"):
            kv.pin(0, kv.bytes + 1)
        # The client writes region 1 (as int32 words, through a view and a copy).
        mine = pattern(2, BLOCKS * STRIDE)
        kv.write(REGION1, mine[: BLOCKS * STRIDE // 2])
        kv.view(np.int32, REGION1 + BLOCKS * STRIDE // 2, BLOCKS * STRIDE // 2)[:] = mine[BLOCKS * STRIDE // 2:].view(
            np.int32)
        s.send(b"written")
        _tag(s, b"grown")
        assert kv.bytes >= 2 * EXTENT and kv.data_ptr == view.ctypes.data and kv.generation == 2
        np.testing.assert_array_equal(kv.read(EXTENT, EXTENT), pattern(3, EXTENT))
        kv.check()
        with kv.pin(4096, 4096) as p:
            assert (p.offset, p.bytes, p.data_ptr) == (4096, 4096, kv.data_ptr + 4096) and kv.operations == 1
        assert kv.operations == 0 and (p.offset, p.bytes, p.data_ptr) == (0, 0, 0)
        del view
        kv.close(5000)
        assert kv.closed and kv.data_ptr == 0
        with pytest.raises(kvcomm.InvalidArgumentError):
            kv.read(0, 1)
        s.send(b"closed")
        _tag(s, b"bye")


def test_server_owned_byte_exact_and_busy():
    with kvcomm.ArenaServer("") as server:
        assert server.address.startswith("@")
        arena = kvcomm.Arena(LAYOUT, kind="host", capacity=CAPACITY, version=7)
        assert arena.kind == kvcomm.MemoryKind.Host and arena.device == -1 and arena.generation == 1
        assert arena.bytes >= EXTENT and arena.bytes % arena.granularity == 0 and arena.capacity >= CAPACITY
        assert arena.layout == LAYOUT and arena.layout_version == 7 and arena.handle_type == "memfd"
        expected = pattern(1, EXTENT)
        arena.write(0, expected[: EXTENT // 2])
        arena.view(offset=EXTENT // 2, nbytes=EXTENT - EXTENT // 2)[:] = expected[EXTENT // 2:]
        p, results = _run_child(_client_imports, server.address)
        try:
            s = server.accept(TIMEOUT_MS)
            assert s.peer_pid == p.pid
            cap = s.offer(arena)
            assert cap.importer_pid == p.pid and arena.live_capabilities == 1
            s.send(cap)
            _tag(s, b"written")
            assert arena.leases == 1 and arena.importers == [p.pid]
            np.testing.assert_array_equal(arena.read(REGION1, BLOCKS * STRIDE), pattern(2, BLOCKS * STRIDE))
            np.testing.assert_array_equal(arena.read(0, REGION1), expected[:REGION1])  # region 0 untouched
            # Leased: Busy, nothing changed.
            before = (arena.bytes, arena.generation, arena.freed)
            with pytest.raises(kvcomm.BusyError, match="busy: 1 lease"):
                arena.shrink(arena.granularity)
            with pytest.raises(kvcomm.BusyError, match="busy"):
                arena.shrink_layout(LAYOUT[:1], 7)
            with pytest.raises(kvcomm.BusyError, match="busy"):
                arena.free()
            with pytest.raises(kvcomm.BusyError, match="busy"):
                arena.free(wait_ms=50)
            assert (arena.bytes, arena.generation, arena.freed) == before
            # Growth reaches the importer.
            g = arena.grow(2 * EXTENT, timeout_ms=10000)
            assert g == kvcomm.ArenaGrowth(2, 1, ())
            arena.write(EXTENT, pattern(3, EXTENT))
            s.send(b"grown")
            with arena.pin(arena.granularity, 100) as pin:
                _tag(s, b"closed")
                assert arena.leases == 0 and arena.operations == 1
                with pytest.raises(kvcomm.BusyError, match="1 operation"):
                    arena.free()
            arena.shrink(EXTENT)
            arena.free()
            assert arena.freed and arena.data_ptr == 0 and pin.bytes == 0
            with pytest.raises(kvcomm.InvalidArgumentError, match="freed"):
                arena.write(0, b"x")
            arena.free()  # a second free does nothing
            s.send(b"bye")
            _join(p, results)
        finally:
            p.join(5)
        arena.close()


# ---- client-owned: the client allocates, the server imports ---------------------------------------------------------


def _client_offers(address: str) -> None:
    with kvcomm.ArenaSession.connect(address, timeout_ms=TIMEOUT_MS) as s:
        with kvcomm.Arena.create(LAYOUT, kind="host", version=9) as mine:
            mine.write(0, pattern(4, EXTENT))
            s.send(s.offer(mine, ttl_ms=30000).to_bytes())
            _tag(s, b"checked")
            np.testing.assert_array_equal(mine.read(0, BLOCKS * STRIDE), pattern(5, BLOCKS * STRIDE))
            _tag(s, b"released")
            assert mine.leases == 0
            mine.free()
        s.send(b"bye")


def test_client_owned_byte_exact():
    with kvcomm.ArenaServer.listen("") as server:
        p, results = _run_child(_client_offers, server.address)
        try:
            with server.accept(TIMEOUT_MS) as s:
                with s.import_(s.receive(TIMEOUT_MS), on_owner_loss=kvcomm.OwnerLoss.Release) as kv:
                    assert kv.owner_pid == p.pid and kv.layout_version == 9
                    np.testing.assert_array_equal(kv.view(nbytes=EXTENT), pattern(4, EXTENT))
                    kv.write(0, pattern(5, BLOCKS * STRIDE))
                    s.send(b"checked")
                s.send(b"released")
                _tag(s, b"bye")
            _join(p, results)
        finally:
            p.join(5)


# ---- bad input, one process (it imports its own arena over a session to its own server) -----------------------------


@pytest.fixture
def own():
    with kvcomm.ArenaServer() as server, kvcomm.ArenaSession.connect(server.address) as s:
        arena = kvcomm.Arena(LAYOUT, kind="host", capacity=CAPACITY)
        kv = s.import_(s.offer(arena))
        yield server, s, arena, kv
        kv.close()
        arena.free(5000)
        arena.close()


def test_arena_arguments():
    call = "kvcomm \\[rank -1\\] Arena: "
    with pytest.raises(kvcomm.InvalidArgumentError, match=call + "kind 'gpu' is not one of"):
        kvcomm.Arena(LAYOUT, kind="gpu")
    with pytest.raises(kvcomm.InvalidArgumentError, match=call + "capacity -1 is outside"):
        kvcomm.Arena(LAYOUT, capacity=-1)
    with pytest.raises(kvcomm.InvalidArgumentError, match=call + "legacy_ipc must be a bool"):
        kvcomm.Arena(LAYOUT, legacy_ipc=1)
    with pytest.raises(kvcomm.InvalidArgumentError, match="legacyIpc"):
        kvcomm.Arena(LAYOUT, kind="host", legacy_ipc=True)
    with pytest.raises(kvcomm.InvalidArgumentError, match="capacity"):
        kvcomm.Arena(LAYOUT, kind="host", capacity=4096)
    n = kvcomm.limits.MAX_ARENA_REGIONS
    many = [(i * 8192, 4096, 0, 1) for i in range(n + 1)]
    with pytest.raises(kvcomm.InvalidArgumentError, match=f"{n + 1} regions, more than kvcomm.limits.MAX_ARENA_REG"):
        kvcomm.Arena(many, kind="host")
    with pytest.raises(kvcomm.InvalidArgumentError, match="overlap"):
        kvcomm.Arena([(0, 4096, 0, 4), (4096, 4096, 0, 4)], kind="host")
    with pytest.raises(kvcomm.InvalidArgumentError, match="region 0: block_bytes must be a non-negative int"):
        kvcomm.Arena([(0, "4096", 0, 4)], kind="host")
    a = kvcomm.Arena([kvcomm.KvRegion(0, 4096, 0, 4)], kind="host")  # one region
    assert a.layout in ([kvcomm.KvRegion(0, 4096, 4096, 4)], [kvcomm.KvRegion(0, 4096, 0, 4)])
    with pytest.raises(kvcomm.InvalidArgumentError, match="legacyIpc"):
        a.ipc_handle()
    with pytest.raises(kvcomm.InvalidArgumentError, match="pid"):
        a.offer(0)
    with pytest.raises(kvcomm.InvalidArgumentError, match="time to live"):
        a.offer(os.getpid(), ttl_ms=0)
    with pytest.raises(kvcomm.InvalidArgumentError, match="capacity"):
        a.grow(1 << 40)
    with pytest.raises(kvcomm.InvalidArgumentError, match="nbytes -5 is outside"):
        a.read(0, -5)
    with pytest.raises(kvcomm.InvalidArgumentError, match="data: str is not an array"):
        a.write(0, "text")
    with pytest.raises(kvcomm.InvalidArgumentError, match="out is a read-only"):
        a.read_into(0, _readonly(np.zeros(4, np.uint8)))
    with pytest.raises(kvcomm.InvalidArgumentError, match="must be contiguous"):
        a.write(0, np.zeros(16, np.uint8)[::2])
    with pytest.raises(kvcomm.InvalidArgumentError, match="framework 'cupy' is not one of"):
        a.view(framework="cupy")
    with pytest.raises(kvcomm.InvalidArgumentError, match="is not inside"):
        a.view(offset=0, nbytes=a.bytes + 1)
    buf = np.zeros(8, np.uint8)
    a.write(8, np.arange(8, dtype=np.uint8))
    a.read_into(8, buf)
    assert buf.tolist() == list(range(8)) and a.view(np.uint64, 8, 8)[0] == int.from_bytes(bytes(range(8)), "little")
    a.close()
    a.close()  # idempotent
    assert repr(a) == "kvcomm.Arena(closed)"
    with pytest.raises(kvcomm.InvalidArgumentError, match="empty"):
        a.write(0, b"x")
    with pytest.raises(kvcomm.InvalidArgumentError, match="ArenaSession\\(...\\) wraps a native session"):
        kvcomm.ArenaSession("@x")
    with pytest.raises(kvcomm.InvalidArgumentError, match="ArenaImport\\(...\\) is made by"):
        kvcomm.ArenaImport(object())
    with pytest.raises(kvcomm.InvalidArgumentError, match="ArenaPin\\(...\\) is made by"):
        kvcomm.ArenaPin(None)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def test_capabilities_and_sessions(own):
    server, s, arena, kv = own
    assert arena.leases == 1 and arena.importers == [os.getpid()] and kv.owner_pid == os.getpid()
    cap = s.offer(arena)
    raw = cap.to_bytes()
    assert len(raw) == 48 and bytes(cap) == raw and kvcomm.ArenaCapability.from_bytes(raw) == cap
    with pytest.raises(kvcomm.InvalidArgumentError, match="data has 47 bytes, a capability has 48"):
        kvcomm.ArenaCapability.from_bytes(raw[:47])
    with pytest.raises(kvcomm.InvalidArgumentError, match="capability has 49 bytes"):
        s.import_(raw + b"x")
    with pytest.raises(kvcomm.InvalidArgumentError, match="capability must be a kvcomm.ArenaCapability"):
        s.import_("token")
    with pytest.raises(kvcomm.InvalidArgumentError, match="generation"):
        s.import_(kvcomm.ArenaCapability(cap.arena_id, cap.generation + 1, cap.token, cap.importer_pid,
                                         cap.importer_uid, cap.expires_at_ms))
    other = arena.offer(os.getpid() + 1)
    with pytest.raises(kvcomm.InvalidArgumentError, match="issued to pid"):
        s.import_(other)
    arena.revoke_capabilities()
    with pytest.raises(kvcomm.InvalidArgumentError, match="revoked"):
        s.import_(cap)
    with pytest.raises(kvcomm.InvalidArgumentError, match="arena must be a kvcomm.Arena"):
        s.offer(kv)
    # Messages: sizes up to the limit, a timeout, the peer's end.
    peer = server.accept(5000)
    for n in (0, 1, kvcomm.ArenaSession.MAX_MESSAGE_BYTES):
        s.send(bytes(range(256)) * (n // 256) + bytes(n % 256))
        assert len(peer.receive(5000)) == n
    with pytest.raises(kvcomm.InvalidArgumentError, match="more than kvcomm.ArenaSession.MAX_MESSAGE_BYTES"):
        s.send(bytes(kvcomm.ArenaSession.MAX_MESSAGE_BYTES + 1))
    with pytest.raises(kvcomm.InvalidArgumentError, match="data must be bytes"):
        s.send("text")
    with pytest.raises(kvcomm.TimeoutError, match="no message"):
        s.receive(0)
    with pytest.raises(kvcomm.TimeoutError):
        server.accept(0)
    with pytest.raises(kvcomm.InvalidArgumentError, match="timeout_ms must be an int, got float 1.5"):
        server.accept(1.5)
    with pytest.raises(kvcomm.InvalidArgumentError, match="address must be a non-empty str"):
        kvcomm.ArenaSession.connect("")
    with pytest.raises(kvcomm.NetworkError):
        kvcomm.ArenaSession.connect("@kvcomm-nobody-%d" % os.getpid(), timeout_ms=50)
    peer.close()


def test_busy_pins_and_closed_objects(own):
    server, s, arena, kv = own
    with pytest.raises(kvcomm.BusyError, match="busy"):
        arena.shrink(arena.bytes)
    with pytest.raises(kvcomm.BusyError, match="busy"):
        arena.free()
    with kv.pin(0, 16):
        with pytest.raises(kvcomm.TimeoutError):
            kv.close(10)  # a pin held: the import stays closing
        with pytest.raises(kvcomm.AbortedError):
            kv.pin(0, 1)
    kv.close()
    assert kv.closed and arena.leases == 0
    with pytest.raises(kvcomm.InvalidArgumentError, match="closed"):
        kv.check()
    arena.free()
    s.close()
    assert not s.alive and s.lost_reason
    with pytest.raises(kvcomm.NetworkError):
        s.send(b"x")
    server.close()
    with pytest.raises(kvcomm.AbortedError):
        server.accept(0)
