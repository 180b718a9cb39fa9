"""kvcomm's Python package on CUDA memory with torch tensors, one process per GPU under torchrun:

    torchrun --standalone --nproc-per-node 2 -m pytest tests/python/test_cuda.py -q -rs

bootstrap over torch.distributed, zero-copy torch views of every replica, publish byte for byte against the same
numpy oracle as the host tests (barrier, fused and split signal/wait), publish + barrier captured in torch.cuda.graph
and replayed with new inputs, and bad input refused with nothing written; the Barrier object ordering stores into
peers; fetch over every path byte for byte against the host tests' per-block oracle (guard bytes included), with
host ids from numpy and torch CPU tensors, and fetch_device with torch CUDA id tensors captured in torch.cuda.graph
and replayed 50 times with new ids, each replay verified. Without torch, CUDA or torchrun the module is skipped (and
says why)."""

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
            pub.barrier()
        elif rnd == 1:
            pub.publish_and_barrier(tensors, slot_t, lane=1)
        elif rnd == 2:  # the split barrier: signal right after the stores, wait just before the reads
            pub.publish(tensors, slot_t)
            pub.signal(lane=1)
            pub.wait(lane=1)
        else:  # the same split, with the signal fused into the publish kernel
            pub.publish_and_signal(tensors, slot_t, lane=0)
            pub.wait(lane=0)
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
        pub.barrier()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    world.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pub.publish(tensors, s_slots)
        pub.barrier()
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
    pub.barrier()
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
            bar.barrier(lane=1)
        else:
            bar.signal(lane=1)
            bar.wait(lane=1)
        got = buf.local(torch.int64, offset=0, nbytes=8 * n).clone()
        bar.barrier(lane=0)  # everyone read before the next round overwrites
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
