"""kvcomm's Python package on CUDA memory with torch tensors, one process per GPU under torchrun:

    torchrun --standalone --nproc-per-node 2 -m pytest tests/python/test_cuda.py -q -rs

bootstrap over torch.distributed, zero-copy torch views of every replica, publish byte for byte against the same
numpy oracle as the host tests (barrier, fused and split signal/wait), publish + barrier captured in torch.cuda.graph
and replayed with new inputs, and bad input refused with nothing written; the Barrier object ordering stores into
peers; fetch over every path byte for byte against the host tests' per-block oracle (guard bytes included), with
host ids from numpy and torch CPU tensors, and fetch_device with torch CUDA id tensors captured in torch.cuda.graph
and replayed 50 times with new ids, each replay verified; and the array properties of test_properties.py for CUDA arrays
(torch CUDA tensors of every dtype and layout, DLPack from torch, __cuda_array_interface__, also spelled big-endian or
misaligned): each accepted or refused as documented, byte for byte over the buffer. Without torch, CUDA or torchrun the
module is skipped (and says why)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)
if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
    pytest.skip("not launched by torchrun (RANK/WORLD_SIZE unset)", allow_module_level=True)

import numpy as np  # noqa: E402
import torch.distributed as dist  # noqa: E402

import kvcomm  # noqa: E402
import test_fetch as tf  # noqa: E402
from test_host import POISON, TOKENS, _assert_replicas, _oracle, _rank_data, _tensors  # noqa: E402


@pytest.fixture(scope="module")
def world():
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local % torch.cuda.device_count())
    torch.zeros(1, device="cuda")  # the primary context is current before kvcomm records this rank's GPU
    if not dist.is_initialized():
        dist.init_process_group("nccl")
    comm = kvcomm.init_torch()
    assert (comm.rank, comm.size) == (dist.get_rank(), dist.get_world_size())
    yield comm
    dist.barrier()


def _cuda(a: np.ndarray) -> "torch.Tensor":
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def _poisoned_buffer(comm, capacity=1 << 26, initial=1 << 21):
    buf = kvcomm.SymmetricBuffer.create(comm, capacity, initial, kind="cuda")
    buf.local().fill_(POISON)
    torch.cuda.synchronize()
    comm.barrier()
    return buf


def test_views_are_torch_tensors(world):
    buf = kvcomm.SymmetricBuffer.create(world, 1 << 24, 1 << 21, kind="cuda")
    assert buf.kind == kvcomm.MemoryKind.Cuda and buf.device == torch.cuda.current_device()
    mine = buf.local(torch.int32)
    assert isinstance(mine, torch.Tensor) and mine.is_cuda and mine.data_ptr() == buf.local_ptr()
    mine.copy_(world.rank * 1000 + torch.arange(mine.numel(), dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    world.barrier()
    for r in range(world.size):
        view = buf.peer(r, torch.int32, offset=64, nbytes=64)
        assert view.data_ptr() == buf.peer_ptr(r) + 64
        expected = r * 1000 + torch.arange(16, 32, dtype=torch.int32)
        assert torch.equal(view.cpu(), expected)
    table = buf.peer_table()
    assert table.is_cuda and table.cpu().tolist() == [buf.peer_ptr(r) for r in range(world.size)]
    dl = buf.local(framework="dlpack")
    assert torch.from_dlpack(dl).data_ptr() == buf.local_ptr()
    world.barrier()


def test_publish_byte_exact_torch(world):
    buf = _poisoned_buffer(world)
    pub = kvcomm.Publisher(buf, barrier_timeout_ms=60000)
    image = np.full(buf.mapped_bytes, POISON, np.uint8)
    for rnd, slot_dtype in ((0, torch.int64), (1, torch.int32), (2, torch.int64), (3, torch.int32)):
        main, keys, scales, slots = _rank_data(rnd, world.rank)
        tensors = _tensors(_cuda(main), _cuda(keys), _cuda(scales))
        slot_t = _cuda(slots).to(slot_dtype)
        if rnd == 0:
            pub.publish(tensors, slot_t)
            pub.barrier.sync()
        elif rnd == 1:
            pub.publish(tensors, slot_t, then="barrier", lane=1)
        elif rnd == 2:  # the split barrier: signal right after the stores, wait just before the reads
            pub.publish(tensors, slot_t)
            pub.barrier.signal(lane=1)
            pub.barrier.wait(lane=1)
        else:  # the same split, with the signal fused into the publish kernel
            pub.publish(tensors, slot_t, then="signal", lane=0)
            pub.barrier.wait(lane=0)
        torch.cuda.synchronize()
        pub.check_errors()
        _oracle(image, rnd, world.size)
        _assert_replicas(buf, image, f"round {rnd}")
        world.barrier()


def test_publish_captured_in_cuda_graph(world):
    buf = _poisoned_buffer(world)
    pub = kvcomm.Publisher(buf, barrier_timeout_ms=60000)
    main, keys, scales, slots = _rank_data(0, world.rank)
    s_main, s_keys, s_scales, s_slots = _cuda(main), _cuda(keys), _cuda(scales), _cuda(slots)
    tensors = _tensors(s_main, s_keys, s_scales)
    # Eager first (loads the kernels), then capture publish + barrier on torch's capture stream.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pub.publish(tensors, s_slots)
        pub.barrier.sync()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    world.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pub.publish(tensors, s_slots)
        pub.barrier.sync()
    image = np.full(buf.mapped_bytes, POISON, np.uint8)
    _oracle(image, 0, world.size)
    for rnd in range(3):  # replays with new rows and new slots copied into the captured inputs
        main, keys, scales, slots = _rank_data(10 + rnd, world.rank)
        main = np.ascontiguousarray(main[:TOKENS])
        s_main.copy_(_cuda(main))
        s_keys.copy_(_cuda(keys))
        s_scales.copy_(_cuda(scales))
        s_slots.copy_(_cuda(slots))
        graph.replay()
        torch.cuda.synchronize()
        pub.check_errors()
        _oracle(image, 10 + rnd, world.size)
        _assert_replicas(buf, image, f"replay {rnd}")
        world.barrier()


def test_bad_input_cuda_writes_nothing(world):
    buf = _poisoned_buffer(world, 1 << 22, 1 << 20)
    pub = kvcomm.Publisher(buf)
    rows = torch.arange(8 * 64, dtype=torch.uint8, device="cuda").reshape(8, 64)
    slots = torch.arange(8, dtype=torch.int64, device="cuda") * 3
    good = kvcomm.CacheTensor(rows, offset=4096)
    cases = [
        ("device 'cpu'", kvcomm.CacheTensor(rows.cpu()), slots),
        ("device 'cpu'", good, slots.cpu()),
        ("int64 or int32", good, slots.float()),
        ("not contiguous", kvcomm.CacheTensor(torch.zeros(8, 128, dtype=torch.uint8, device="cuda")[:, ::2]), slots),
        ("contiguous", good, torch.arange(16, dtype=torch.int64, device="cuda")[::2]),
        ("read past", kvcomm.CacheTensor(rows[:5]), slots),
        ("backed", kvcomm.CacheTensor(rows, offset=buf.mapped_bytes), slots),
        ("a Python list lives in host memory", good, slots.tolist()),  # lists are for host buffers only
    ]
    if torch.cuda.device_count() > 1:
        other = (torch.cuda.current_device() + 1) % torch.cuda.device_count()
        cases.append(("cuda:", kvcomm.CacheTensor(rows.to(f"cuda:{other}")), slots))
    for match, tensor, slot_mapping in cases:
        with pytest.raises(kvcomm.InvalidArgumentError, match=match):
            pub.publish(tensor, slot_mapping)
    torch.cuda.synchronize()
    world.barrier()
    for r in range(world.size):
        assert bool((buf.peer(r) == POISON).all()), f"replica {r} changed after refused calls"
    world.barrier()
    # A slot beyond the backed memory is only seen on the device: that row is not written and check_errors says so.
    bad = slots.clone()
    bad[-1] = 1 << 40
    pub.publish(good, bad)
    pub.barrier.sync()
    torch.cuda.synchronize()
    with pytest.raises(kvcomm.InvalidArgumentError, match="slot"):
        pub.check_errors()
    world.barrier()


def test_store_bootstrap(world):
    c10d = dist.distributed_c10d
    if not hasattr(c10d, "_get_default_store"):
        pytest.skip("this torch has no default-store accessor")
    store = dist.PrefixStore("kvcomm-test", c10d._get_default_store())
    comm = kvcomm.init_store(store, world.rank, world.size)
    assert comm.allgather(bytes([world.rank])) == bytes(range(world.size))



# ---- Barrier ------------------------------------------------------------------------------------------------------


def test_barrier_orders_peer_stores(world):
    buf = kvcomm.SymmetricBuffer.create(world, 1 << 22, 1 << 21, kind="cuda")
    bar = kvcomm.Barrier(world, lanes=2, timeout_ms=60000)
    assert bar.kind == kvcomm.MemoryKind.Cuda and bar.lanes == 2
    n = world.size
    for rnd in range(1, 4):
        for r in range(n):  # a stamp in every peer's memory, through the peer mappings, on the current stream
            buf.peer(r, torch.int64, offset=0, nbytes=8 * n)[world.rank].fill_(rnd * 1000 + world.rank)
        if rnd == 2:
            bar.sync(lane=1)
        else:
            bar.signal(lane=1)
            bar.wait(lane=1)
        got = buf.local(torch.int64, offset=0, nbytes=8 * n).clone()
        bar.sync(lane=0)  # everyone read before the next round overwrites
        torch.cuda.synchronize()
        assert got.cpu().tolist() == [rnd * 1000 + r for r in range(n)], f"round {rnd}"
    bar.check_errors()
    world.barrier()


# ---- fetch ----------------------------------------------------------------------------------------------------------


def _fetch_setup(world):
    buf = kvcomm.SymmetricBuffer.create(world, tf.CAPACITY, tf.INITIAL, kind="cuda")
    image = tf._initial(world.rank, buf.mapped_bytes)
    buf.local().copy_(torch.from_numpy(image).cuda())
    torch.cuda.synchronize()
    f = kvcomm.Fetcher(buf, tf._layout(world.rank), barrier_timeout_ms=60000)
    world.barrier()  # every source is filled
    return buf, image, f


def test_fetch_byte_exact_every_path(world):
    buf, image, f = _fetch_setup(world)
    n, rank = world.size, world.rank
    for rnd, path in enumerate(("kernel", "copy", "auto")):
        reqs = tf._batch(rank, rnd, size=n)
        if rnd == 1:  # host ids as torch CPU tensors
            reqs = [(q[0], torch.from_numpy(q[1]), torch.from_numpy(q[2])) for q in reqs]
        info = f.fetch(reqs, path=path, copy_engine_min_run_bytes=3 * max(tf.BLOCK_BYTES))
        if path != "auto":
            assert info.path == {"kernel": kvcomm.FetchPath.Kernel, "copy": kvcomm.FetchPath.CopyEngine}[path], info
        torch.cuda.synchronize()
        tf._oracle(image, rank, [(q[0], np.asarray(q[1]), np.asarray(q[2])) for q in reqs])
        tf._check(buf, image, f"fetch, path {path}")
    # Polled on the fetcher's own stream, then the collective form.
    reqs = tf._batch(rank, 3, size=n)
    status = f.start(reqs).wait(30000)
    assert status.done and status.bytes_done == status.bytes_total and status.failed_blocks.size == 0, status
    tf._oracle(image, rank, reqs)
    tf._check(buf, image, "polled fetch")
    reqs = tf._batch(rank, 4, size=n)
    f.fetch_all(reqs)
    torch.cuda.synchronize()
    tf._oracle(image, rank, reqs)
    tf._check(buf, image, "fetch_all")
    f.check_errors()
    # Bad input: wrong devices, refused before anything moves.
    src = torch.arange(4, dtype=torch.int64)
    dst = torch.arange(20, 24, dtype=torch.int64)
    with pytest.raises(kvcomm.InvalidArgumentError, match="on the CPU"):
        f.fetch([((rank + 1) % n, src.cuda(), dst)])
    with pytest.raises(kvcomm.InvalidArgumentError, match="device 'cpu'"):
        f.fetch_device(src, dst.cuda(), (rank + 1) % n)
    with pytest.raises(kvcomm.UnsupportedError, match="path"):
        f.fetch([((rank + 1) % n, src, dst)], path="host")
    torch.cuda.synchronize()
    tf._check(buf, image, "after refused calls")
    world.barrier()


def test_fetch_device_captured_in_cuda_graph(world):
    buf, image, f = _fetch_setup(world)
    n, rank = world.size, world.rank
    peer = (rank + 1) % n
    pairs = 12
    s_ids = torch.zeros(pairs, dtype=torch.int64, device="cuda")
    d_ids = torch.full((pairs,), -1, dtype=torch.int64, device="cuda")  # eager warm-up: every pair skipped
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        f.fetch_device(s_ids, d_ids, peer)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        f.fetch_device(s_ids, d_ids, peer)
    rng = np.random.default_rng(99 + rank)
    for replay in range(50):  # new ids each replay: sources from [0, 16), distinct destinations, some padding
        src = rng.integers(0, tf.SRC_BLOCKS, pairs).astype(np.int64)
        dst = (tf.SRC_BLOCKS + rng.permutation(tf.DST_END - tf.SRC_BLOCKS)[:pairs]).astype(np.int64)
        src[rng.integers(0, pairs)] = -1
        s_ids.copy_(torch.from_numpy(src))
        d_ids.copy_(torch.from_numpy(dst))
        graph.replay()
        torch.cuda.synchronize()
        f.check_errors()
        tf._oracle(image, rank, [(peer, src, dst)])
        tf._check(buf, image, f"replay {replay}")
    # A bad id in a replay: that pair is skipped and reported, the others land.
    src = np.arange(pairs, dtype=np.int64)
    dst = np.arange(tf.SRC_BLOCKS, tf.SRC_BLOCKS + pairs, dtype=np.int64)
    src[5] = 999
    s_ids.copy_(torch.from_numpy(src))
    d_ids.copy_(torch.from_numpy(dst))
    graph.replay()
    torch.cuda.synchronize()
    with pytest.raises(kvcomm.InvalidArgumentError, match="999"):
        f.check_errors()
    keep = src != 999
    tf._oracle(image, rank, [(peer, src[keep], dst[keep])])
    tf._check(buf, image, "replay with a bad id")
    world.barrier()


# ---- kvcomm.torch's custom ops: compiled with torch.compile(fullgraph=True), then captured in torch.cuda.graph ------

OP_ROW, OP_SLOTS, OP_BLOCK, OP_FETCH = 64, 64, 4096, 64 * 1024  # publish rows land in [0, 4 KiB); 32 fetch blocks


def _op_inputs(seed: int, rank: int, size: int):
    """Rank `rank`'s rows and slots (disjoint from every other rank's, one padding) and its fetch ids for `seed`."""
    g = np.random.default_rng([seed, rank])
    per = OP_SLOTS // size
    rows = g.integers(0, 256, (8, OP_ROW), dtype=np.uint8)
    slots = (rank * per + g.choice(per, 8, replace=False)).astype(np.int64)
    slots[g.integers(0, 8)] = -1
    src = g.choice(16, 4, replace=False).astype(np.int64)
    dst = (16 + g.choice(16, 4, replace=False)).astype(np.int64)
    return rows, slots, src, dst


def _op_initial(rank: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng([7, rank]).integers(0, 256, nbytes, dtype=np.uint8)


def _op_oracle(image: np.ndarray, seed: int, rank: int, size: int) -> None:
    for r in range(size):  # every rank's rows land in every replica
        rows, slots, _, _ = _op_inputs(seed, r, size)
        for i, s in enumerate(slots.tolist()):
            if s >= 0:
                image[s * OP_ROW:(s + 1) * OP_ROW] = rows[i]
    _, _, src, dst = _op_inputs(seed, rank, size)
    peer = _op_initial((rank + 1) % size, image.size)  # the peer's source blocks: nobody writes them
    for s, d in zip(src.tolist(), dst.tolist()):
        image[OP_FETCH + d * OP_BLOCK:OP_FETCH + (d + 1) * OP_BLOCK] = peer[OP_FETCH + s * OP_BLOCK:
                                                                              OP_FETCH + (s + 1) * OP_BLOCK]


def test_torch_ops_compiled_and_captured_in_cuda_graph(world):
    """torch.ops.kvcomm.publish (then=barrier) and torch.ops.kvcomm.fetch from the next rank, in one function compiled
    with torch.compile(fullgraph=True) (no graph break), run eagerly, then captured in torch.cuda.graph and replayed
    with fresh rows, slots and ids copied into the captured inputs: every replica byte for byte against the oracle,
    the compiled reader of the cache (its sum) sees both ops' writes."""
    import kvcomm.torch as kt

    n, rank, peer = world.size, world.rank, (world.rank + 1) % world.size
    buf = kvcomm.SymmetricBuffer.create(world, 1 << 22, 1 << 21, kind="cuda")
    cache = buf.local()
    cache.copy_(torch.from_numpy(_op_initial(rank, cache.numel())))
    torch.cuda.synchronize()
    world.barrier()
    pub = kvcomm.Publisher(buf, barrier_timeout_ms=60000)
    fetcher = kvcomm.Fetcher(buf, [kvcomm.KvRegion(OP_FETCH, OP_BLOCK, 0, 32)])
    ph, fh = kt.register(pub), kt.register(fetcher)

    def step(cache, rows, slots, src, dst):
        torch.ops.kvcomm.publish(ph, cache, rows, slots, 0, 1, 1, 0)
        torch.ops.kvcomm.fetch(fh, cache, src, dst, peer)
        return cache.sum(dtype=torch.int64)

    image = _op_initial(rank, cache.numel())
    try:
        static = [_cuda(a) for a in _op_inputs(1, rank, n)]
        explain = torch._dynamo.explain(step)(cache, *static)  # runs the ops once
        assert explain.graph_break_count == 0, explain.break_reasons
        torch.cuda.synchronize()
        _op_oracle(image, 1, rank, n)
        np.testing.assert_array_equal(cache.cpu().numpy(), image)
        world.barrier()
        compiled = torch.compile(step, fullgraph=True)
        for a, b in zip(static, _op_inputs(2, rank, n)):
            a.copy_(_cuda(b))
        side = torch.cuda.Stream()  # eager (compiles, loads the kernels) on a side stream, as torch.cuda.graph wants
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            compiled(cache, *static)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        _op_oracle(image, 2, rank, n)
        np.testing.assert_array_equal(cache.cpu().numpy(), image)
        world.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            total = compiled(cache, *static)
        torch.cuda.synchronize()
        np.testing.assert_array_equal(cache.cpu().numpy(), image)  # capture ran nothing
        world.barrier()
        for seed in range(10, 16):
            for a, b in zip(static, _op_inputs(seed, rank, n)):
                a.copy_(_cuda(b))
            graph.replay()
            torch.cuda.synchronize()
            pub.check_errors()
            fetcher.check_errors()
            _op_oracle(image, seed, rank, n)
            np.testing.assert_array_equal(cache.cpu().numpy(), image, err_msg=f"replay of seed {seed}")
            assert int(total) == int(image.astype(np.int64).sum())
            world.barrier()
    finally:
        kt.unregister(ph)
        kt.unregister(fh)


def _endpoint_server(seed: int, nb: int, bb: int, out, stop) -> None:
    """A server process: a torch CUDA tensor registered with its endpoint, its metadata sent back, served until
    `stop` is set (the peer path maps memory of another process: CUDA IPC does not open a process's own handles)."""
    import traceback

    try:
        torch.cuda.set_device(0)
        ep = kvcomm.Endpoint("server", tcp_address="127.0.0.1:0")
        t = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, nb * bb, dtype=np.uint8)).cuda()
        reg = ep.register(t, [kvcomm.KvRegion(0, bb, 0, nb)])
        out.put(reg.metadata())
        stop.wait(300)
        ep.close()
    except BaseException:  # noqa: BLE001 - back to the test
        out.put(traceback.format_exc())


def test_torch_endpoint_read_compiled_and_captured_in_cuda_graph(world):
    """torch.ops.kvcomm.endpoint_read from a server process's CUDA memory (a same-host peer: the device-id path), in
    a function compiled with torch.compile(fullgraph=True) and captured in torch.cuda.graph (FULL graph capture of
    endpoint reads), replayed with new ids each time: the client's cache byte for byte against the oracle (untouched
    blocks keep their poison), the compiled reader sees the copies; a bad id is recorded and copies nothing."""
    import multiprocessing as mp

    import kvcomm.torch as kt

    nb, bb, seed = 32, 4096, 11 + world.rank
    served_bytes = np.random.default_rng(seed).integers(0, 256, nb * bb, dtype=np.uint8)
    ctx = mp.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_endpoint_server, args=(seed, nb, bb, out, stop), daemon=True)
    server.start()
    client = kvcomm.Endpoint("client", tcp_address="127.0.0.1:0")
    try:
        metadata = out.get(timeout=120)
        assert isinstance(metadata, bytes), metadata
        client_t = torch.full((nb * bb,), POISON, dtype=torch.uint8, device="cuda")
        mine = client.register(client_t, [kvcomm.KvRegion(0, bb, 0, nb)])
        remote = client.connect(metadata)
        h = kt.register((client, mine, remote))
        r_ids = torch.zeros(8, dtype=torch.int64, device="cuda")
        l_ids = torch.full((8,), -1, dtype=torch.int64, device="cuda")

        def step(cache, r, l_):
            torch.ops.kvcomm.endpoint_read(h, cache, r, l_)
            return cache.sum(dtype=torch.int64)

        explain = torch._dynamo.explain(step)(client_t, r_ids, l_ids)  # every pair skipped: the pair's first call
        assert explain.graph_break_count == 0, explain.break_reasons
        compiled = torch.compile(step, fullgraph=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            compiled(client_t, r_ids, l_ids)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            total = compiled(client_t, r_ids, l_ids)
        want = np.full(nb * bb, POISON, np.uint8)
        g = np.random.default_rng(seed + 100)
        for replay in range(6):
            src = g.integers(0, nb, 8).astype(np.int64)
            dst = g.permutation(nb)[:8].astype(np.int64)
            src[g.integers(0, 8)] = -1
            r_ids.copy_(torch.from_numpy(src))
            l_ids.copy_(torch.from_numpy(dst))
            graph.replay()
            torch.cuda.synchronize()
            assert client.poll_error(mine, remote) is None
            for s_, d in zip(src.tolist(), dst.tolist()):
                if s_ >= 0:
                    want[d * bb:(d + 1) * bb] = served_bytes[s_ * bb:(s_ + 1) * bb]
            np.testing.assert_array_equal(client_t.cpu().numpy(), want, err_msg=f"replay {replay}")
            assert int(total) == int(want.astype(np.int64).sum())
        r_ids.copy_(torch.tensor([1, 2, 999, 3, -1, -1, -1, -1]))  # a bad id: recorded, nothing copied for it
        l_ids.copy_(torch.tensor([0, 1, 2, 3, -1, -1, -1, -1]))
        graph.replay()
        torch.cuda.synchronize()
        err = client.poll_error(mine, remote)
        assert err is not None and "999" in str(err), err
        np.testing.assert_array_equal(client_t.cpu().numpy()[2 * bb:3 * bb], want[2 * bb:3 * bb])
        del graph
        kt.unregister(h)
    finally:
        client.close()
        stop.set()
        server.join(60)


# ---- array properties on CUDA memory (test_properties.py's host properties, for CUDA arrays) ---------------------
# Every array argument over torch CUDA tensors of every dtype (contiguous, strided, 2-d, 0-d, expanded, conjugate),
# delivered as torch tensors, DLPack capsules and DLPack objects from torch, and __cuda_array_interface__ objects (also
# one spelling the same memory big-endian, and one a byte past an aligned address): each call succeeds as documented
# (checked byte for byte over the whole buffer) or raises InvalidArgumentError with nothing written.

import torch.utils.dlpack  # noqa: E402
from test_properties import DLPackObject, Lazy, _value  # noqa: E402

_TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128] + \
    [getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)]


class _Cai:
    """Another tensor's CUDA memory through __cuda_array_interface__ only (typestr and pointer as given)."""

    def __init__(self, t: "torch.Tensor", typestr: str = "", shift: int = 0) -> None:
        self._t = t
        iface = dict(t.__cuda_array_interface__)
        if typestr:
            iface["typestr"] = typestr
        if shift:
            iface["data"] = (iface["data"][0] + shift, False)
        self.__cuda_array_interface__ = iface


def _cuda_cases(values: np.ndarray, accepted: set, row_layouts: bool = False) -> list:
    """(label, object, accepted, the values an accepted one holds) for `values` (1-D ids, or 2-D rows) as CUDA
    arrays of every torch dtype, layout and protocol; `accepted`: the torch dtypes the argument takes."""
    out = []
    base = torch.from_numpy(np.ascontiguousarray(values))
    for dt in _TORCH_DTYPES:
        try:
            t = base.to(dt).cuda()
        except (RuntimeError, TypeError):  # a dtype this torch cannot convert into on the GPU
            continue
        dtype_ok = dt in accepted
        n = t.shape[0]
        big = torch.zeros((2 * n,) + tuple(t.shape[1:]), dtype=dt, device="cuda")
        big[::2] = t
        layouts = {"contiguous": (t, True), "strided": (big[::2], row_layouts), "0d": (t.reshape(-1)[0], False),
                   "expanded": (t[:1].expand(t.shape), False)}
        if t.dim() == 1 and n % 2 == 0:
            layouts["2d"] = (t.reshape(2, n // 2), False)
        if t.dim() == 2:
            layouts["columns"] = (t[:, ::2], False)  # rows of src not contiguous
        if dt.is_complex:
            layouts["conj"] = (t.conj(), False)  # memory holds the unconjugated values
        for layout, (x, layout_ok) in layouts.items():
            ok = dtype_ok and layout_ok
            keep = x
            out.append((f"{dt} {layout} torch", x, ok, keep))
            out.append((f"{dt} {layout} dlpack object", DLPackObject(x), ok, keep))
            if layout == "conj":  # neither a capsule nor __cuda_array_interface__ can say "conjugate"
                continue
            out.append((f"{dt} {layout} dlpack capsule", Lazy(lambda x=x: torch.utils.dlpack.to_dlpack(x), "capsule"),
                        ok, keep))
            try:
                iface = x.__cuda_array_interface__
            except (TypeError, RuntimeError, ValueError):  # bfloat16, conjugate views: torch offers no CAI
                continue
            out.append((f"{dt} {layout} __cuda_array_interface__", _Cai(x), ok, keep))
            ts = iface["typestr"]
            if x.element_size() > 1 and ts[0] in "<>" and ts[1] not in "Vb":  # the same bytes, other byte order
                # (an opaque 'V2', torch's bfloat16, has no byte order: '>V2' is the same type)
                other = (">" if ts[0] == "<" else "<") + ts[1:]
                out.append((f"{dt} {layout} __cuda_array_interface__ '{other}'", _Cai(x, other), False, None))
            if layout == "contiguous" and x.element_size() > 1 and not row_layouts:  # one byte past an aligned address
                out.append((f"{dt} misaligned __cuda_array_interface__", _Cai(big, shift=1), False, None))
    out.append(("a CPU tensor", base.clone(), False, None))
    out.append(("a numpy array", values.copy(), False, None))
    return out


def _as_ids(keep: "torch.Tensor") -> np.ndarray:
    return keep.cpu().numpy().astype(np.int64)


def test_cuda_array_properties(world):
    rank = world.rank
    buf = kvcomm.SymmetricBuffer.create(world, 1 << 22, 1 << 20, kind="cuda")
    rng = np.random.default_rng(5 + rank)
    pattern = torch.from_numpy(rng.integers(0, 256, buf.mapped_bytes, dtype=np.uint8)).cuda()
    buf.local().copy_(pattern)
    torch.cuda.synchronize()
    region = (4096, 48, 64, 40)
    f = kvcomm.Fetcher(buf, [region], barrier_timeout_ms=60000)
    world.barrier()
    failures = []

    def fetch_image(src, dst):
        img = pattern.clone()
        off, nbytes, stride, _ = region
        for s, d in zip(np.asarray(src).tolist(), np.asarray(dst).tolist()):
            if s != -1 and d != -1:
                img[off + d * stride:off + d * stride + nbytes] = pattern[off + s * stride:off + s * stride + nbytes]
        return img

    objects = [f]

    def check(label, thunk, ok, want=None):
        accepted = False
        try:
            thunk()
            accepted = True
            torch.cuda.synchronize()
            for o in objects:
                o.check_errors()
            if not ok:
                failures.append(f"{label}: accepted, expected InvalidArgumentError")
                want = None  # and compared with the pattern: what it wrote is the finding
        except kvcomm.InvalidArgumentError as e:
            torch.cuda.synchronize()
            if ok:
                failures.append(f"{label}: refused ({e}), documented to be accepted")
            want = None
        except BaseException as e:  # noqa: BLE001 - the property: nothing but kvcomm.Error
            failures.append(f"{label}: raised {type(e).__name__}: {e}")
            want = None
        got = buf.local()
        expected = want if want is not None else pattern
        if not torch.equal(got, expected):
            diff = int((got != expected).sum())
            failures.append(f"{label}: {'differs from the oracle in' if accepted else 'refused but wrote'} "
                            f"{diff} bytes")
        buf.local().copy_(pattern)
        torch.cuda.synchronize()

    src, dst = np.array([1, 2, 3, 7], np.int64), np.array([10, 11, 12, 20], np.int64)
    src_t, dst_t = torch.from_numpy(src).cuda(), torch.from_numpy(dst).cuda()
    for label, obj, ok, keep in _cuda_cases(src, {torch.int64}):
        check(f"fetch_device(src_ids={label})", lambda o=obj: f.fetch_device(_value(o), dst_t, rank), ok,
              fetch_image(_as_ids(keep), dst) if ok else None)
        # host ids must be on the CPU: every CUDA array is refused by fetch()
        check(f"fetch(src_ids={label})", lambda o=obj: f.fetch([(rank, _value(o), dst)]),
              label in ("a CPU tensor", "a numpy array"), fetch_image(src, dst))
    for label, obj, ok, keep in _cuda_cases(dst, {torch.int64}):
        check(f"fetch_device(dst_ids={label})", lambda o=obj: f.fetch_device(src_t, _value(o), rank), ok,
              fetch_image(src, _as_ids(keep)) if ok else None)
    for label, obj, ok, keep in _cuda_cases(np.full(4, rank, np.int64), {torch.int32}):
        check(f"fetch_device(src_ranks={label})", lambda o=obj: f.fetch_device(src_t, dst_t, src_ranks=_value(o)), ok,
              fetch_image(src, dst) if ok else None)
    if torch.cuda.device_count() > 1:
        other = (torch.cuda.current_device() + 1) % torch.cuda.device_count()
        check("fetch_device(ids on another GPU)", lambda: f.fetch_device(src_t.to(f"cuda:{other}"), dst_t, rank),
              False)
    world.barrier()

    # Publish writes every replica: one rank at a time (Direct mode: one-sided stores), the others wait.
    pub = kvcomm.Publisher(buf, barrier_timeout_ms=60000)
    objects.append(pub)
    rows = np.random.default_rng(9).integers(0, 256, (4, 32), dtype=np.uint8)
    slots = np.array([0, 3, 5, 6], np.int64)
    row_offset = 1 << 16

    def publish_image(rows_t, slot_values):
        img = pattern.clone()
        flat = rows_t.reshape(rows_t.shape[0], -1).contiguous().view(torch.uint8).reshape(rows_t.shape[0], -1)
        for i, s in enumerate(np.asarray(slot_values).tolist()):
            if s >= 0:
                img[row_offset + s * flat.shape[1]:row_offset + (s + 1) * flat.shape[1]] = flat[i]
        return img

    if pub.mode != kvcomm.PublishMode.Direct:  # Fallback publishing is collective: one rank alone cannot publish
        import warnings

        warnings.warn(f"test_cuda_array_properties: publish cases not run (mode {pub.mode.name}: {pub.mode_reason})")
    elif rank == 0:
        rows_t, slots_t = torch.from_numpy(rows).cuda(), torch.from_numpy(slots).cuda()
        # (this rank's replica is compared; the others are written too, and not used again)
        for label, obj, ok, keep in _cuda_cases(slots, {torch.int64, torch.int32}):
            check(f"publish(slot_mapping={label})",
                  lambda o=obj: pub.publish(kvcomm.CacheTensor(rows_t, offset=row_offset), _value(o)), ok,
                  publish_image(rows_t, _as_ids(keep)) if ok else None)
        for label, obj, ok, keep in _cuda_cases(rows, set(_TORCH_DTYPES), row_layouts=True):
            check(f"publish(src={label})",
                  lambda o=obj: pub.publish(kvcomm.CacheTensor(_value(o), offset=row_offset), slots_t), ok,
                  publish_image(keep, slots) if ok else None)
    torch.cuda.synchronize()
    world.barrier()
    assert not failures, f"{len(failures)} calls broke the property:\n" + "\n".join(failures[:40])


# ---- arenas: CUDA VMM memory shared between the two processes, both directions ---------------------------------------


def _arena_cuda_client(address: str) -> None:
    """The client side of test_arena_cuda_both_directions: another rank's process, or (one rank) a spawned one."""
    import test_arena as ta

    half = ta.BLOCKS * ta.STRIDE
    with kvcomm.ArenaSession.connect(address, timeout_ms=ta.TIMEOUT_MS) as s:
        kv = s.import_(s.receive(ta.TIMEOUT_MS))
        assert kv.kind == kvcomm.MemoryKind.Cuda and kv.bytes >= ta.EXTENT and kv.layout == ta.LAYOUT
        view = kv.view()
        assert isinstance(view, torch.Tensor) and view.is_cuda and view.device.index == torch.cuda.current_device()
        np.testing.assert_array_equal(view[:ta.EXTENT].cpu().numpy(), ta.pattern(1, ta.EXTENT))
        mine = ta.pattern(2, half)
        with pytest.raises(kvcomm.InvalidArgumentError, match="host memory"):
            kv.write(ta.REGION1, _cuda(mine))  # copies are to and from host memory; device memory: views
        kv.write(ta.REGION1, mine[:half // 2])  # host -> device
        view[ta.REGION1 + half // 2:ta.REGION1 + half].copy_(_cuda(mine[half // 2:]))  # device -> device
        torch.cuda.synchronize()
        s.send(b"written")
        ta._tag(s, b"checked")
        del view
        kv.close()
        s.send(b"closed")
        with kvcomm.Arena(ta.LAYOUT, kind="cuda", version=9) as own:
            own.view(nbytes=ta.EXTENT).copy_(_cuda(ta.pattern(4, ta.EXTENT)))
            torch.cuda.synchronize()
            s.send(s.offer(own))
            ta._tag(s, b"released")
            assert own.leases == 0
            own.free()
        s.send(b"bye")


def _arena_cuda_child(address: str) -> None:
    """The client in a process of its own (the test runs alone): its own CUDA context on the last GPU."""
    torch.cuda.set_device(torch.cuda.device_count() - 1)
    torch.zeros(1, device="cuda")
    _arena_cuda_client(address)


def test_arena_cuda_both_directions(world):
    """A server process and a client process (rank 0 and rank 1, or rank 0 and a process it spawns when it runs alone:
    the arenas cross processes either way). Server-owned: the server's CUDA arena (filled from host memory), imported
    by the client on its GPU, read through a torch view and written back from a CUDA tensor; client-owned: the client's
    arena imported by the server. Every byte checked against test_arena's oracle; free is Busy while leased."""
    import test_arena as ta

    address = [f"@kvcomm-cuda-arena-{os.getpid()}" if world.rank == 0 else None]
    dist.broadcast_object_list(address, src=0)
    half = ta.BLOCKS * ta.STRIDE
    alone = world.size == 1
    child = []

    def started() -> None:
        if alone:
            child.extend(ta._run_child(_arena_cuda_child, address[0]))
        else:
            dist.barrier()

    if world.rank == 0:
        with kvcomm.ArenaServer(address[0]) as server:
            started()  # the client connects once the server listens
            arena = kvcomm.Arena(ta.LAYOUT, kind="cuda", capacity=ta.CAPACITY, version=7)
            assert arena.kind == kvcomm.MemoryKind.Cuda and arena.handle_type == "posix_fd"
            assert arena.device == torch.cuda.current_device()
            arena.write(0, ta.pattern(1, ta.EXTENT))  # host -> device
            view = arena.view()
            assert isinstance(view, torch.Tensor) and view.is_cuda and view.data_ptr() == arena.data_ptr
            s = server.accept(ta.TIMEOUT_MS)
            s.send(s.offer(arena))
            ta._tag(s, b"written")
            assert arena.leases == 1
            np.testing.assert_array_equal(view[ta.REGION1:ta.REGION1 + half].cpu().numpy(), ta.pattern(2, half))
            np.testing.assert_array_equal(arena.read(0, ta.REGION1), ta.pattern(1, ta.EXTENT)[:ta.REGION1])
            with pytest.raises(kvcomm.BusyError, match="busy"):
                arena.free()
            s.send(b"checked")
            ta._tag(s, b"closed")
            del view
            arena.free(5000)
            arena.close()
            # Client-owned: rank 1's arena, imported here.
            with s.import_(s.receive(ta.TIMEOUT_MS)) as kv:
                assert kv.kind == kvcomm.MemoryKind.Cuda and kv.owner_pid == s.peer_pid
                got = kv.view(nbytes=ta.EXTENT)
                assert got.is_cuda and got.device.index == torch.cuda.current_device()
                np.testing.assert_array_equal(got.cpu().numpy(), ta.pattern(4, ta.EXTENT))
                del got
            s.send(b"released")
            ta._tag(s, b"bye")
            s.close()
        if child:
            ta._join(*child)
    elif world.rank == 1:
        dist.barrier()
        _arena_cuda_client(address[0])
    dist.barrier()
