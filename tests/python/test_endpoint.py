"""Endpoints from Python on host memory, no MPI and no communicator: two endpoints in this process, and a server in a
spawned process whose metadata reaches this one through a queue. Reads with -1 skips and writes back are checked
byte for byte against a numpy oracle over both whole arrays (guard bytes between and around blocks, untouched
blocks); refusals (truncated metadata, a revoked capability, a read-only registration, bad ids, bad arguments) raise
or fail naming why, with nothing written. torch CPU tensors when torch is installed; a CUDA tensor when torch has a GPU
and the package was built with CUDA. The guide's example (docs/python.md, "Endpoints") runs as written."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, List, Sequence

import numpy as np
import pytest

import kvcomm

SRC = Path(__file__).resolve().parents[2]
TIMEOUT_MS = 30000
BLOCKS = 16
# Server: K and V blocks of 96 bytes at a 128-byte stride (32 guard bytes after each), a gap between the regions.
SERVER_LAYOUT = [kvcomm.KvRegion(64, 96, 128, BLOCKS), kvcomm.KvRegion(64 + BLOCKS * 128 + 256, 40, 48, BLOCKS)]
# Client: the same region count and block sizes, placed differently (packed K blocks, V before K).
CLIENT_LAYOUT = [kvcomm.KvRegion(BLOCKS * 64 + 32, 96, 0, BLOCKS), kvcomm.KvRegion(16, 40, 64, BLOCKS)]


def extent(layout: Sequence[kvcomm.KvRegion]) -> int:
    return max(r.offset + (r.num_blocks - 1) * (r.block_stride or r.block_bytes) + r.block_bytes for r in layout) + 64


SERVER_BYTES, CLIENT_BYTES = extent(SERVER_LAYOUT), extent(CLIENT_LAYOUT)


def pattern(seed: int, n: int) -> np.ndarray:
    """The oracle's starting bytes: n deterministic bytes of `seed`, the same in every process."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def blocks(layout: Sequence[kvcomm.KvRegion], b: int) -> List[slice]:
    """Where block b lies in each region."""
    return [slice(r.offset + b * (r.block_stride or r.block_bytes),
                  r.offset + b * (r.block_stride or r.block_bytes) + r.block_bytes) for r in layout]


def copied(dst: np.ndarray, dst_layout: Any, src: np.ndarray, src_layout: Any, src_ids: Sequence[int],
           dst_ids: Sequence[int]) -> np.ndarray:
    """dst after pair i copied src block src_ids[i] into dst block dst_ids[i] in every region (-1 skips)."""
    out = dst.copy()
    for s, d in zip(src_ids, dst_ids):
        if s < 0 or d < 0:
            continue
        for fr, to in zip(blocks(src_layout, s), blocks(dst_layout, d)):
            out[to] = src[fr]
    return out


def done(t: kvcomm.Transfer) -> kvcomm.FetchStatus:
    st = t.wait(TIMEOUT_MS)
    assert st.done, f"{st.state}: {st.error}"
    assert st.bytes_done == st.bytes_total and st.failed_blocks.size == 0
    return st


def local_endpoint(name: str) -> kvcomm.Endpoint:
    return kvcomm.Endpoint(name, tcp_address="127.0.0.1:0")


# Pairs of the read (remote -> local) and of the write back (local -> remote), with -1 skips on either side.
READ_REMOTE, READ_LOCAL = [3, 0, -1, 15, 7, 8, 2], [10, 11, 12, -1, 4, 5, 0]
WRITE_REMOTE, WRITE_LOCAL = [1, 2, -1, 14], [10, 4, 9, 0]


# ---- two endpoints in one process -----------------------------------------------------------------------------------


def test_read_and_write_between_two_endpoints_in_one_process():
    server_mem = pattern(1, SERVER_BYTES).view(np.uint32)  # any dtype: its bytes are registered
    client_mem = pattern(2, CLIENT_BYTES)
    with local_endpoint("server") as server, local_endpoint("client") as client:
        assert server.name == "server" and server.address.startswith("127.0.0.1:") and server.id != client.id
        served = server.register(server_mem, SERVER_LAYOUT, version=3)
        mine = client.register(client_mem, CLIENT_LAYOUT)
        assert served.registered and served.generation == 1 and served.kind == kvcomm.MemoryKind.Host
        assert served.device == -1 and served.bytes == SERVER_BYTES and served.data_ptr == server_mem.ctypes.data
        assert served.access == kvcomm.Access.ReadWrite and served.layout_version == 3
        assert served.layout == SERVER_LAYOUT
        assert mine.layout[0].block_stride == 96  # normalised: 0 reads back as block_bytes
        assert served.array is server_mem and server.registrations == [served]
        metadata = served.metadata()
        assert isinstance(metadata, bytes)

        remote = client.connect(metadata)
        assert remote.peer_name == "server" and remote.id == served.id and remote.generation == 1
        assert remote.layout == served.layout and remote.layout_version == 3 and remote.address == server.address
        assert remote.kind == kvcomm.MemoryKind.Host and remote.access == kvcomm.Access.ReadWrite
        for same in (bytearray(metadata), memoryview(metadata)):  # idempotent, from any bytes-like
            assert client.connect(same).id == remote.id

        server_before, client_before = pattern(1, SERVER_BYTES), client_mem.copy()
        t = client.read(mine, remote, np.array(READ_REMOTE, np.int64), np.array(READ_LOCAL, np.int64))
        st = done(t)
        assert st.bytes_total == 5 * (96 + 40)
        assert t.transport == kvcomm.FetchTransport.Tcp
        assert t.info.pairs_in == 7 and t.info.pairs_skipped == 2 and t.info.tcp_runs > 0
        want = copied(client_before, CLIENT_LAYOUT, server_before, SERVER_LAYOUT, READ_REMOTE, READ_LOCAL)
        np.testing.assert_array_equal(client_mem, want)  # every byte: blocks, untouched blocks, guards
        np.testing.assert_array_equal(server_mem.view(np.uint8), server_before)

        done(client.write(mine, remote, WRITE_REMOTE, WRITE_LOCAL))  # lists work too
        want_server = copied(server_before, SERVER_LAYOUT, want, CLIENT_LAYOUT, WRITE_LOCAL, WRITE_REMOTE)
        np.testing.assert_array_equal(server_mem.view(np.uint8), want_server)
        np.testing.assert_array_equal(client_mem, want)

        # Nothing to move is a transfer that is done at once.
        assert done(client.read(mine, remote, [], [])).bytes_total == 0

        server.unregister(served)
        assert not served.registered and served.array is None and server.registrations == []
        server.unregister(served)  # idempotent
        st = client.read(mine, remote, [0], [0]).wait(TIMEOUT_MS)
        assert st.failed and list(st.failed_blocks) == [0], st
        np.testing.assert_array_equal(client_mem, want)
    assert not mine.registered and mine.array is None


# ---- a server in another process ------------------------------------------------------------------------------------


def _server_process(metadata: Any, commands: Any, results: Any) -> None:
    try:
        with kvcomm.Endpoint("spawned server", tcp_address="127.0.0.1:0") as ep:
            mem = pattern(11, SERVER_BYTES)
            reg = ep.register(mem, SERVER_LAYOUT)
            metadata.put(reg.metadata())
            assert commands.get(timeout=120) == "written"
            want = copied(pattern(11, SERVER_BYTES), SERVER_LAYOUT, pattern(12, CLIENT_BYTES), CLIENT_LAYOUT,
                          WRITE_LOCAL, WRITE_REMOTE)
            np.testing.assert_array_equal(mem, want)
            ep.unregister(reg)
        results.put((True, ""))
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        results.put((False, traceback.format_exc()))


def test_arenas_on_one_host_are_mapped_and_a_disconnect_forgets_the_peer():
    layout = [kvcomm.KvRegion(0, 4096, 4096, 16)]
    with local_endpoint("server") as server, local_endpoint("client") as client:
        sa, ca = kvcomm.Arena(layout, kind="host"), kvcomm.Arena(layout, kind="host")
        src, dst = sa.view(), ca.view()
        src[:] = pattern(5, src.size)
        dst[:] = 0
        before = dst.copy()
        served, mine = server.register_arena(sa), client.register_arena(ca)
        remote = client.connect(served.metadata())
        t = client.read(mine, remote, [3, 9], [0, 15])
        done(t)
        assert t.transport == kvcomm.FetchTransport.Peer  # memfd memory: mapped, not sent over a socket
        assert t.info.host_runs > 0 and t.info.tcp_runs == 0
        np.testing.assert_array_equal(dst, copied(before, layout, src, layout, [3, 9], [0, 15]))
        # Device-id form on host memory: synchronous; a bad id raises before anything moves.
        now = dst.copy()
        client.read_device(mine, remote, np.array([5, -1], np.int64), np.array([6, 7], np.int64))
        np.testing.assert_array_equal(dst, copied(now, layout, src, layout, [5], [6]))
        with pytest.raises(kvcomm.InvalidArgumentError):
            client.read_device(mine, remote, np.array([16], np.int64), np.array([1], np.int64))
        with pytest.raises(kvcomm.InvalidArgumentError, match="remote_blocks has 2 ids but local_blocks has 1"):
            client.read_device(mine, remote, np.array([1, 2], np.int64), np.array([1], np.int64))
        assert client.poll_error(mine, remote) is None
        np.testing.assert_array_equal(dst, copied(now, layout, src, layout, [5], [6]))
        with pytest.raises(kvcomm.UnsupportedError, match="another host|memfd"):
            plain = np.zeros(16 * 4096, np.uint8)
            other = client.register(plain, layout)
            client.read(other, client.connect(server.register(np.zeros(16 * 4096, np.uint8), layout).metadata()),
                        [0], [0], via="peer")
        client.disconnect(remote)
        client.disconnect(remote)  # idempotent
        with pytest.raises(kvcomm.InvalidArgumentError, match="disconnected"):
            client.read(mine, remote, [0], [1])
        server.unregister(served)
        client.unregister(mine)


def test_a_server_in_another_process():
    ctx = mp.get_context("spawn")
    metadata, commands, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_server_process, args=(metadata, commands, results), daemon=True)
    p.start()
    try:
        with local_endpoint("client") as client:
            mem = pattern(12, CLIENT_BYTES)
            mine = client.register(mem, CLIENT_LAYOUT)
            remote = client.connect(metadata.get(timeout=120))
            assert remote.peer_name == "spawned server" and remote.layout == SERVER_LAYOUT
            done(client.write(mine, remote, WRITE_REMOTE, WRITE_LOCAL))  # before the read changes those blocks
            done(client.read(mine, remote, READ_REMOTE, READ_LOCAL))
            server_now = copied(pattern(11, SERVER_BYTES), SERVER_LAYOUT, pattern(12, CLIENT_BYTES), CLIENT_LAYOUT,
                                WRITE_LOCAL, WRITE_REMOTE)
            want = copied(pattern(12, CLIENT_BYTES), CLIENT_LAYOUT, server_now, SERVER_LAYOUT, READ_REMOTE,
                          READ_LOCAL)
            np.testing.assert_array_equal(mem, want)
            commands.put("written")
            ok, text = results.get(timeout=120)
            assert ok, f"the server process failed:\n{text}"
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()


# ---- notifications --------------------------------------------------------------------------------------------------


def test_notifications_arrive_once_in_issue_order_after_their_blocks(pair):
    """Plain messages and transfer notifications of one sender arrive in the order they were issued, each once, with
    the sender's id and name and the registration used; a transfer's arrives only with its bytes in place."""
    server, client, served, mine, server_mem, client_mem = pair
    remote = client.connect(served.metadata())
    client_mem[:] = pattern(21, CLIENT_BYTES)
    before = server_mem.copy()
    client.notify(remote, b"hello \x00 bytes")
    t = client.write(mine, remote, WRITE_REMOTE, WRITE_LOCAL, notify="written 1,2,14")
    client.notify(remote, "after the write")  # issued after: held back until the write's notification is out
    done(t)
    got = server.notifications(TIMEOUT_MS)
    while len(got) < 3:
        more = server.notifications(TIMEOUT_MS)
        assert more, f"only {got} arrived"
        got += more
    assert [n.message for n in got] == [b"hello \x00 bytes", b"written 1,2,14", b"after the write"]
    for n in got:
        assert isinstance(n, kvcomm.Notification) and n.sender == client.id and n.sender_name == "client"
        assert n.registration == served.id
    # The write's notification came with its bytes: they were in place when it was taken.
    np.testing.assert_array_equal(server_mem, copied(before, SERVER_LAYOUT, client_mem, CLIENT_LAYOUT, WRITE_LOCAL,
                                                     WRITE_REMOTE))
    done(client.read(mine, remote, [5], [6], notify=b"read 5"))
    assert [n.message for n in server.notifications(TIMEOUT_MS)] == [b"read 5"]
    assert server.notifications(0) == []  # each once
    big = b"x" * kvcomm.limits.MAX_NOTIFICATION_BYTES
    client.notify(remote, big)
    assert [n.message for n in server.notifications(TIMEOUT_MS)] == [big]


def test_a_failed_transfer_delivers_no_notification(pair):
    server, client, served, mine, server_mem, client_mem = pair
    old = served.metadata()
    served.revoke()
    st = client.write(mine, client.connect(old), [4], [5], notify="must not arrive").wait(TIMEOUT_MS)
    assert st.failed and ("capability refused" in st.error or "revoked" in st.error), st
    with pytest.raises(kvcomm.InvalidArgumentError, match="capability refused|revoked"):
        client.notify(client.connect(old), "nor this")
    client.notify(client.connect(served.metadata()), "this one")
    assert [n.message for n in server.notifications(TIMEOUT_MS)] == [b"this one"]
    assert (server_mem == 0x5A).all()


def test_notification_arguments_are_checked(pair):
    server, client, served, mine, server_mem, client_mem = pair
    remote = client.connect(served.metadata())
    too_long = b"x" * (kvcomm.limits.MAX_NOTIFICATION_BYTES + 1)
    with pytest.raises(kvcomm.InvalidArgumentError, match="MAX_NOTIFICATION_BYTES"):
        client.notify(remote, too_long)
    with pytest.raises(kvcomm.InvalidArgumentError, match="MAX_NOTIFICATION_BYTES"):
        client.read(mine, remote, [0], [0], notify=too_long)
    for wrong in (3, None, ["x"]):
        with pytest.raises(kvcomm.InvalidArgumentError, match="message must be bytes or a str"):
            client.notify(remote, wrong)
        if wrong is not None:
            with pytest.raises(kvcomm.InvalidArgumentError, match="notify must be bytes or a str"):
                client.write(mine, remote, [0], [0], notify=wrong)
    with pytest.raises(kvcomm.InvalidArgumentError, match="remote must be a kvcomm.RemoteMemory"):
        client.notify(served, "x")
    with pytest.raises(kvcomm.InvalidArgumentError, match="timeout_ms"):
        server.notifications("soon")
    assert server.notifications(0) == []
    assert (server_mem == 0x5A).all() and (client_mem == 0xC3).all()


def test_a_full_inbox_refuses_the_sender_with_busy():
    with kvcomm.Endpoint("small", tcp_address="127.0.0.1:0", max_queued_notifications=2) as server, \
            local_endpoint("client") as client:
        reg = server.register(np.zeros(SERVER_BYTES, np.uint8), SERVER_LAYOUT)
        remote = client.connect(reg.metadata())
        client.notify(remote, "1")
        client.notify(remote, "2")
        with pytest.raises(kvcomm.BusyError):
            client.notify(remote, "3")
        assert [n.message for n in server.notifications(0)] == [b"1", b"2"]
        client.notify(remote, "4")
        assert [n.message for n in server.notifications(TIMEOUT_MS)] == [b"4"]
    with pytest.raises(kvcomm.InvalidArgumentError, match="max_queued_notifications"):
        kvcomm.Endpoint(tcp_address="127.0.0.1:0", max_queued_notifications=0)


# ---- refusals -------------------------------------------------------------------------------------------------------


@pytest.fixture
def pair():
    """A server and a client endpoint with one registration each (the server's memory 0x5a, the client's 0xc3)."""
    server, client = local_endpoint("server"), local_endpoint("client")
    server_mem, client_mem = np.full(SERVER_BYTES, 0x5A, np.uint8), np.full(CLIENT_BYTES, 0xC3, np.uint8)
    served = server.register(server_mem, SERVER_LAYOUT)
    mine = client.register(client_mem, CLIENT_LAYOUT)
    yield server, client, served, mine, server_mem, client_mem
    client.close()
    server.close()


def test_truncated_or_foreign_metadata_is_refused(pair):
    server, client, served, mine, server_mem, client_mem = pair
    metadata = served.metadata()
    for cut in (metadata[:-1], metadata[:7], bytearray(metadata[:-9])):
        with pytest.raises(kvcomm.InvalidArgumentError, match="truncated"):
            client.connect(cut)
    with pytest.raises(kvcomm.InvalidArgumentError, match="not kvcomm endpoint metadata"):
        client.connect(bytes([metadata[0] ^ 0xFF]) + metadata[1:])
    for wrong in (metadata.hex(), None, 7, [1, 2]):
        with pytest.raises(kvcomm.InvalidArgumentError, match="metadata must be bytes"):
            client.connect(wrong)
    assert (server_mem == 0x5A).all() and (client_mem == 0xC3).all()


def test_revoked_metadata_is_refused_and_the_new_one_works(pair):
    server, client, served, mine, server_mem, client_mem = pair
    old = served.metadata()
    served.revoke()
    assert served.generation == 2 and served.metadata() != old
    st = client.read(mine, client.connect(old), [0, 1], [2, 3]).wait(TIMEOUT_MS)
    assert st.failed and "capability refused" in st.error, st
    assert sorted(st.failed_blocks.tolist()) == [2, 3] and st.failed_blocks.dtype == np.int64
    st = client.write(mine, client.connect(old), [4], [5]).wait(TIMEOUT_MS)
    assert st.failed and "capability refused" in st.error, st
    assert (server_mem == 0x5A).all() and (client_mem == 0xC3).all()
    remote = client.connect(served.metadata())
    assert remote.generation == 2
    done(client.read(mine, remote, [0], [0]))
    want = copied(np.full(CLIENT_BYTES, 0xC3, np.uint8), CLIENT_LAYOUT, server_mem, SERVER_LAYOUT, [0], [0])
    np.testing.assert_array_equal(client_mem, want)


def test_a_read_only_registration_refuses_writes(pair):
    server, client, served, mine, server_mem, client_mem = pair
    ro_mem = np.full(SERVER_BYTES, 0x11, np.uint8)
    ro = server.register(ro_mem, SERVER_LAYOUT, access="read_only")
    assert ro.access == kvcomm.Access.ReadOnly
    remote = client.connect(ro.metadata())
    assert remote.access == kvcomm.Access.ReadOnly
    with pytest.raises(kvcomm.InvalidArgumentError, match="read-only"):
        client.write(mine, remote, [0, 1], [0, 1])
    assert (ro_mem == 0x11).all()
    done(client.read(mine, remote, [0], [1]))  # reading is what it allows
    # A read-only array can only be registered read-only, and nothing reads into it.
    frozen = np.full(CLIENT_BYTES, 0x22, np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(kvcomm.InvalidArgumentError, match="read-only"):
        client.register(frozen, CLIENT_LAYOUT)
    for ro_obj in (frozen, bytes(CLIENT_BYTES)):
        reg = client.register(ro_obj, CLIENT_LAYOUT, access=kvcomm.Access.ReadOnly)
        with pytest.raises(kvcomm.InvalidArgumentError, match="read-only"):
            client.read(reg, client.connect(served.metadata()), [0], [0])
        client.unregister(reg)
    assert (frozen == 0x22).all()


def test_bad_ids_raise_before_anything_moves(pair):
    server, client, served, mine, server_mem, client_mem = pair
    remote = client.connect(served.metadata())
    bad = [
        ([0, BLOCKS], [1, 2], "out of range|outside"),  # a remote id past the layout
        ([0, 1], [2, BLOCKS + 5], "out of range|outside"),  # a local one
        ([3, 3], [2, 2], "duplicate"),  # one destination twice (local for a read, remote for a write)
        ([-2], [0], "negative|-2"),
        ([0, 1], [2], "2 ids but local_blocks has 1"),
        ([0.0], [1], "must hold ints"),
        ([1 << 63], [1], "does not fit int64"),
        (np.array([0, 1], np.int32), np.array([2, 3], np.int64), "must be int64"),
        (np.array([[0, 1]], np.int64), np.array([2, 3], np.int64), "must be 1-D"),
        (np.arange(4, dtype=np.int64)[::2], np.array([2, 3], np.int64), "must be contiguous"),
        ("0 1", [2], "not an array"),
    ]
    for remote_ids, local_ids, match in bad:
        for op in (client.read, client.write):
            with pytest.raises(kvcomm.InvalidArgumentError, match=match):
                op(mine, remote, remote_ids, local_ids)
    assert (server_mem == 0x5A).all() and (client_mem == 0xC3).all()


def test_bad_arguments_raise_naming_them(pair):
    server, client, served, mine, server_mem, client_mem = pair
    remote = client.connect(served.metadata())
    mem = np.zeros(CLIENT_BYTES, np.uint8)
    with pytest.raises(kvcomm.InvalidArgumentError, match="must be contiguous"):
        client.register(np.zeros(2 * CLIENT_BYTES, np.uint8)[::2], CLIENT_LAYOUT)
    with pytest.raises(kvcomm.InvalidArgumentError):  # the layout does not fit in the array's bytes
        client.register(mem[:CLIENT_BYTES - 100], CLIENT_LAYOUT)
    with pytest.raises(kvcomm.InvalidArgumentError, match="not an array"):
        client.register([0] * CLIENT_BYTES, CLIENT_LAYOUT)
    with pytest.raises(kvcomm.InvalidArgumentError, match="layout must be a list"):
        client.register(mem, 42)
    with pytest.raises(kvcomm.InvalidArgumentError, match="access 'rw' is not one of"):
        client.register(mem, CLIENT_LAYOUT, access="rw")
    with pytest.raises(kvcomm.InvalidArgumentError, match="access 0 is not one of"):
        client.register(mem, CLIENT_LAYOUT, access=0)
    with pytest.raises(kvcomm.InvalidArgumentError, match="via 'udp' is not one of"):
        client.read(mine, remote, [0], [0], via="udp")
    for via in ("rdma", kvcomm.TransferVia.Peer):
        with pytest.raises(kvcomm.UnsupportedError):
            client.read(mine, remote, [0], [0], via=via)
    done(client.read(mine, remote, [0], [0], via="tcp"))
    with pytest.raises(kvcomm.InvalidArgumentError, match="local must be a kvcomm.Registration"):
        client.read(remote, remote, [0], [0])
    with pytest.raises(kvcomm.InvalidArgumentError, match="remote must be a kvcomm.RemoteMemory"):
        client.read(mine, served, [0], [0])
    with pytest.raises(kvcomm.InvalidArgumentError, match="belongs to another endpoint"):
        client.read(served, remote, [0], [0])
    with pytest.raises(kvcomm.InvalidArgumentError, match="timeout_ms must be an int"):
        client.read(mine, remote, [], []).wait(1.5)
    with pytest.raises(kvcomm.InvalidArgumentError, match="name must be a str"):
        kvcomm.Endpoint(7)
    with pytest.raises(kvcomm.InvalidArgumentError, match="connections_per_peer 0 is outside"):
        kvcomm.Endpoint("x", tcp_address="127.0.0.1:0", connections_per_peer=0)
    for cls in (kvcomm.Registration, kvcomm.RemoteMemory, kvcomm.Transfer):
        with pytest.raises(kvcomm.InvalidArgumentError, match="is made by"):
            cls(object())
    client.unregister(mine)
    with pytest.raises(kvcomm.InvalidArgumentError, match="unregistered"):
        client.read(mine, remote, [0], [0])
    client.close()
    with pytest.raises(kvcomm.InvalidArgumentError, match="closed"):
        client.register(mem, CLIENT_LAYOUT)
    assert (server_mem == 0x5A).all()  # only the one read with via="tcp" moved anything
    want = copied(np.full(CLIENT_BYTES, 0xC3, np.uint8), CLIENT_LAYOUT, server_mem, SERVER_LAYOUT, [0], [0])
    np.testing.assert_array_equal(client_mem, want)


def test_a_registration_keeps_its_array_alive_until_unregistered():
    import gc
    import weakref

    class Owned(np.ndarray):  # a subclass, so that a weak reference can watch the array
        pass

    with local_endpoint("server") as server, local_endpoint("client") as client:
        mem = pattern(5, SERVER_BYTES).view(Owned)
        watch = weakref.ref(mem)
        reg = server.register(mem, SERVER_LAYOUT)
        del mem
        gc.collect()
        assert watch() is not None
        mine = client.register(np.zeros(CLIENT_BYTES, np.uint8), CLIENT_LAYOUT)
        done(client.read(mine, client.connect(reg.metadata()), [4], [4]))
        server.unregister(reg)
        del reg
        gc.collect()
        assert watch() is None


# ---- torch ----------------------------------------------------------------------------------------------------------


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    server_t = torch.from_numpy(pattern(21, SERVER_BYTES).copy()).view(torch.float16)
    client_t = torch.from_numpy(pattern(22, CLIENT_BYTES).copy())
    with local_endpoint("server") as server, local_endpoint("client") as client:
        served = server.register(server_t, SERVER_LAYOUT)
        mine = client.register(client_t, CLIENT_LAYOUT)
        assert served.kind == kvcomm.MemoryKind.Host and served.data_ptr == server_t.data_ptr()
        remote = client.connect(served.metadata())
        done(client.read(mine, remote, torch.tensor(READ_REMOTE), torch.tensor(READ_LOCAL)))
        want = copied(pattern(22, CLIENT_BYTES), CLIENT_LAYOUT, pattern(21, SERVER_BYTES), SERVER_LAYOUT,
                      READ_REMOTE, READ_LOCAL)
        np.testing.assert_array_equal(client_t.numpy(), want)
        done(client.write(mine, remote, torch.tensor(WRITE_REMOTE), torch.tensor(WRITE_LOCAL)))
        want_server = copied(pattern(21, SERVER_BYTES), SERVER_LAYOUT, want, CLIENT_LAYOUT, WRITE_LOCAL, WRITE_REMOTE)
        np.testing.assert_array_equal(server_t.view(torch.uint8).numpy(), want_server)
        with pytest.raises(kvcomm.InvalidArgumentError, match="must be int64"):
            client.read(mine, remote, torch.tensor([0], dtype=torch.int32), torch.tensor([0]))
        with pytest.raises(kvcomm.InvalidArgumentError, match="must be contiguous"):
            client.register(torch.zeros(2 * CLIENT_BYTES, dtype=torch.uint8)[::2], CLIENT_LAYOUT)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and kvcomm._kvcomm.built_with_cuda()


@pytest.mark.skipif(not _cuda_available(), reason="no CUDA device (torch.cuda.is_available() is False) or a host-only "
                    "build of kvcomm")
def test_torch_cuda_tensor_is_registered_on_its_device():
    import torch

    device = torch.cuda.current_device()
    server_t = torch.from_numpy(pattern(31, SERVER_BYTES)).cuda()
    client_mem = pattern(32, CLIENT_BYTES)
    with local_endpoint("gpu server") as server, local_endpoint("client") as client:
        served = server.register(server_t, SERVER_LAYOUT)
        assert served.kind == kvcomm.MemoryKind.Cuda and served.device == device
        mine = client.register(client_mem, CLIENT_LAYOUT)
        remote = client.connect(served.metadata())
        assert remote.kind == kvcomm.MemoryKind.Cuda
        done(client.read(mine, remote, READ_REMOTE, READ_LOCAL))
        want = copied(pattern(32, CLIENT_BYTES), CLIENT_LAYOUT, pattern(31, SERVER_BYTES), SERVER_LAYOUT,
                      READ_REMOTE, READ_LOCAL)
        np.testing.assert_array_equal(client_mem, want)
        done(client.write(mine, remote, WRITE_REMOTE, WRITE_LOCAL))
        want_server = copied(pattern(31, SERVER_BYTES), SERVER_LAYOUT, want, CLIENT_LAYOUT, WRITE_LOCAL, WRITE_REMOTE)
        torch.cuda.synchronize()
        np.testing.assert_array_equal(server_t.cpu().numpy(), want_server)


# ---- docs/python.md: the example, as written ------------------------------------------------------------------------


def test_python_guide_endpoint_example(tmp_path: Path):
    text = (SRC / "docs" / "python.md").read_text()
    at = text.index("## Endpoints")
    start = text.index("```python\n", at) + len("```python\n")
    (tmp_path / "endpoints.py").write_text(text[start:text.index("```", start)])
    out = subprocess.run([sys.executable, "endpoints.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "blocks 3, 4 -> 10, 11: verified; written back: verified" in out.stdout, out.stdout
