"""kvcomm.torch's custom ops on the CPU (the torch that vLLM's venv carries): a function publishing rows into a
replicated cache and fetching blocks between its own slots, compiled with torch.compile(fullgraph=True), traces with
no graph break (torch._dynamo.explain) and leaves the cache byte for byte as the eager calls do, with fresh inputs
on every call (the compiled graph reads them, it does not bake them in). Bad handles are refused naming the op. (CUDA
graphs and the CUDA backend: the GPU machine.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcomm
import kvcomm.torch as kt

ROW, BLOCK, SLOTS = 64, 4096, 64
PUB = 0                      # rows land in [0, SLOTS * ROW)
FETCH = 64 * 1024            # the fetch layout: 32 blocks of BLOCK bytes
LAYOUT = [kvcomm.KvRegion(FETCH, BLOCK, 0, 32)]


@pytest.fixture(scope="module")
def world():
    comm = kvcomm.init_tcp(kvcomm.create_unique_id("lo"), 0, 1)
    buf = kvcomm.SymmetricBuffer.create(comm, 1 << 20, 256 << 10, kind="host")
    pub, fetcher = kvcomm.Publisher(buf), kvcomm.Fetcher(buf, LAYOUT)
    handles = (kt.register(pub), kt.register(fetcher))
    yield buf, handles
    for h in handles:
        kt.unregister(h)


def step(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
         ph: int, fh: int) -> torch.Tensor:
    torch.ops.kvcomm.publish(ph, cache, rows, slots, PUB, 1, 1, 0)  # then=barrier
    torch.ops.kvcomm.fetch(fh, cache, src, dst, 0)
    return cache.sum(dtype=torch.int64)  # a reader of the cache after both ops


def oracle(before: np.ndarray, rows: np.ndarray, slots: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    out = before.copy()
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            out[PUB + s * ROW:PUB + (s + 1) * ROW] = rows[i].view(np.uint8)
    for s, d in zip(src.tolist(), dst.tolist()):
        if s >= 0 and d >= 0:
            out[FETCH + d * BLOCK:FETCH + (d + 1) * BLOCK] = out[FETCH + s * BLOCK:FETCH + (s + 1) * BLOCK]
    return out


def inputs(seed: int):
    g = np.random.default_rng(seed)
    rows = torch.from_numpy(g.integers(0, 256, (8, ROW), dtype=np.uint8))
    slots = torch.from_numpy(np.array(g.choice(SLOTS, 8, replace=False), np.int64))
    slots[3] = -1  # padding
    src = torch.tensor(g.choice(16, 4, replace=False), dtype=torch.int64)
    dst = torch.tensor(16 + g.choice(16, 4, replace=False), dtype=torch.int64)
    return rows, slots, src, dst


def test_compiled_with_no_graph_break_and_byte_exact(world):
    buf, (ph, fh) = world
    local = buf.local()
    local[:] = np.random.default_rng(0).integers(0, 256, local.size, dtype=np.uint8)
    cache = torch.from_numpy(local)  # the buffer's bytes, shared
    explain = torch._dynamo.explain(step)(cache, *inputs(1), ph, fh)
    assert explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    for seed in range(2, 6):  # fresh inputs every call
        rows, slots, src, dst = inputs(seed)
        want = oracle(local.copy(), rows.numpy(), slots.numpy(), src.numpy(), dst.numpy())
        total = compiled(cache, rows, slots, src, dst, ph, fh)
        assert np.array_equal(local, want), f"seed {seed}"
        assert int(total) == int(want.astype(np.int64).sum())
    # inductor too (a C++ compiler is on the machine)
    compiled = torch.compile(step, fullgraph=True)
    rows, slots, src, dst = inputs(9)
    want = oracle(local.copy(), rows.numpy(), slots.numpy(), src.numpy(), dst.numpy())
    compiled(cache, rows, slots, src, dst, ph, fh)
    assert np.array_equal(local, want)


def test_bad_handles_and_objects_are_refused(world):
    buf, (ph, fh) = world
    cache = torch.from_numpy(buf.local())
    rows, slots, src, dst = inputs(3)
    with pytest.raises(kvcomm.InvalidArgumentError, match="not a registered Fetcher"):
        torch.ops.kvcomm.fetch(ph, cache, src, dst, 0)  # a Publisher's handle
    with pytest.raises(kvcomm.InvalidArgumentError, match="not a registered Publisher"):
        torch.ops.kvcomm.publish(12345, cache, rows, slots, PUB, 1, 0, 0)
    with pytest.raises(kvcomm.InvalidArgumentError, match="expected a Publisher"):
        kt.register("a string")


def test_the_ops_registered_through_vllms_helper(world):
    from vllm.utils.torch_utils import direct_register_custom_op
    buf, (ph, fh) = world
    kt.register_vllm_ops(direct_register_custom_op, namespace="kvcomm_vllm_test")
    local = buf.local()
    cache = torch.from_numpy(local)
    rows, slots, src, dst = inputs(11)
    want = oracle(local.copy(), rows.numpy(), slots.numpy(), src.numpy(), dst.numpy())

    def vllm_step(cache, rows, slots, src, dst):
        torch.ops.kvcomm_vllm_test.publish(ph, cache, rows, slots, PUB, 1, 0, 0)
        torch.ops.kvcomm_vllm_test.fetch(fh, cache, src, dst, 0)
        return cache.sum(dtype=torch.int64)

    assert torch._dynamo.explain(vllm_step)(cache, rows, slots, src, dst).graph_break_count == 0
    assert np.array_equal(local, want)  # explain ran the ops once, eagerly
    rows, slots, src, dst = inputs(12)  # the compiled call: fresh inputs
    want = oracle(local.copy(), rows.numpy(), slots.numpy(), src.numpy(), dst.numpy())
    torch.compile(vllm_step, fullgraph=True, backend="eager")(cache, rows, slots, src, dst)
    assert np.array_equal(local, want)
