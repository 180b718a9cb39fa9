"""kvcomm.pcp, the drop-ins for vLLM's PCP gather (vllm/v1/attention/ops/pcp.py), against vLLM's own functions: 3
PCP ranks (spawned processes, host memory), each step's inputs fresh; the oracle is vLLM's real
``_gather_prefill_cache_inputs`` / ``maybe_gather_mla_latent_cache_inputs`` / ``maybe_gather_indexer_k`` (its PCP
group's all_gather answered with the other ranks' inputs) followed by the insert vLLM's cache op does. After the
drop-in (publish, or insert then replicate) and the caller's local insert of what it returns, every byte of every
rank's cache equals the oracle's (poisoned, untouched bytes and gaps between blocks included). Every mode vLLM has:
PCP-only (decode requests sharded), DCP (decode tokens replicated: none, some, all of them), replicated draft
decodes (slot mapping not expanded); the MLA variant in mode "publish", the indexer variant in mode "replicate"
with a quantizing cache op; the publish compiled with torch.compile(fullgraph=True) with 0 graph breaks. Refusals."""

from __future__ import annotations

import os
import sys
from typing import Any, List, Sequence

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import multirank  # noqa: E402

import kvcomm  # noqa: E402
import kvcomm.pcp as kp  # noqa: E402

P, L, SLOTS, BS = 3, 8, 64, 4  # ranks, tokens per rank, cache slots, tokens per block
POISON = 0xEE
# The generic layer: a 24-byte row (12 bf16) per slot at 0, and an 8-byte row (2 float32) per slot in blocks of 4
# with a 64-byte block stride (32 bytes of gap after each block) at 4096.
GENERIC = [kp.Place(0, BS), kp.Place(4096, BS, 64, 8)]
MLA_AT, RANK, ROPE = 8192, 16, 8  # MLA: kv_c 16 bf16 + k_pe 8 bf16 per token
IDX_AT = 16384  # indexer: per block 4 x 32 key bytes, then 4 x 4 scale bytes
INDEXER = [kp.Place(IDX_AT, BS, BS * 36, 32, 32), kp.Place(IDX_AT + BS * 32, BS, BS * 36, 4, 4)]


def _slots(seed: int, nd: int, shard: bool) -> torch.Tensor:
    """vLLM's expanded slot mapping (P x L, each rank's share padded with -1 at its end). DCP (not shard): the
    first nd tokens of every rank are the same replicated decode tokens, at the same slots."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(SLOTS, generator=g)
    out = torch.full((P, L), -1, dtype=torch.int64)
    used = 0
    for r in range(P):
        real = L - 1 - r % 2  # padding at the end of some shares
        if shard or nd == 0:
            out[r, :real] = perm[used:used + real]
            used += real
        else:
            out[r, :nd] = perm[:nd]
            out[r, nd:real] = perm[nd + used:nd + used + real - nd]
            used += real - nd
    return out.flatten()


def _inputs(seed: int, rank: int, nd: int, shard: bool, shapes: Sequence[tuple], dtypes: Sequence[Any]) -> List[Any]:
    """Rank `rank`'s tensors (decode tokens shared by every rank unless shard)."""
    out = []
    for k, (shape, dt) in enumerate(zip(shapes, dtypes)):
        t = torch.randn((L, *shape), generator=torch.Generator().manual_seed(seed * 100 + k * 10 + rank)).to(dt)
        if not shard and nd:
            t[:nd] = torch.randn((nd, *shape), generator=torch.Generator().manual_seed(seed * 100 + k * 10 + 9)).to(dt)
        out.append(t)
    return out


def _insert(cache: torch.Tensor, places: Sequence[kp.Place], rows: Sequence[torch.Tensor], slots: torch.Tensor) -> None:
    """What vLLM's cache op does with the (gathered) inputs: row i of each tensor at slot i's place (< 0 skipped)."""
    for p, r in zip(places, rows):
        b = r.flatten(1).contiguous().view(torch.uint8)
        rstride = p.row_stride or b.shape[1]
        bstride = p.block_stride or p.block_size * rstride
        for i, s in enumerate(slots.tolist()):
            if s >= 0:
                at = p.offset + (s // p.block_size) * bstride + (s % p.block_size) * rstride
                cache[at:at + b.shape[1]] = b[i]


def _quant_insert(cache: torch.Tensor, k: torch.Tensor, slots: torch.Tensor) -> None:
    """A quantizing cache op in the indexer's shape (as indexer_k_quant_and_cache: int8 keys and a float32 scale)."""
    q = (k * 16).round().clamp(-127, 127).to(torch.int8)
    scale = k.abs().amax(1, keepdim=True).to(torch.float32)
    _insert(cache, INDEXER, [q, scale], slots)


class _Group:
    """vLLM's PCP group for its own function, answering all_gather with every rank's inputs (checked against ours)."""

    def __init__(self, me: int, per_rank: List[List[torch.Tensor]]) -> None:
        self.world_size, self.me, self.per_rank, self.calls = P, me, per_rank, 0

    def all_gather(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        assert dim == 0
        k = self.calls % len(self.per_rank[0])
        self.calls += 1
        start = L - t.shape[0]
        assert torch.equal(t, self.per_rank[self.me][k][start:])
        return torch.cat([self.per_rank[r][k][start:] for r in range(P)])


def _vllm(fn: str, me: int, per_rank: List[List[torch.Tensor]], *args: Any) -> Any:
    import vllm.v1.attention.ops.pcp as vp

    saved = vp.get_pcp_group
    vp.get_pcp_group = lambda: _Group(me, per_rank)
    try:
        return getattr(vp, fn)(*args)
    finally:
        vp.get_pcp_group = saved


def _check(comm: kvcomm.Communicator, cache: torch.Tensor, want: torch.Tensor, what: str) -> None:
    bad = (cache != want).nonzero().flatten()
    assert bad.numel() == 0, f"rank {comm.rank}, {what}: {bad.numel()} bytes differ, first at {bad[:8].tolist()}"
    comm.barrier()  # nobody publishes the next case's rows before everyone compared


def _cases(comm: kvcomm.Communicator) -> int:
    me = comm.rank
    buf = kvcomm.SymmetricBuffer.create(comm, 1 << 16, 1 << 16, kind="host")
    cache = torch.from_numpy(buf.local())
    cache.fill_(POISON)
    comm.barrier()
    want = cache.clone()
    pub = kvcomm.Publisher(buf)
    generic = kp.PcpLayer(pub, GENERIC)
    mla = kp.PcpLayer.mla(pub, MLA_AT, BS, RANK, ROPE, 2)
    indexer = kp.PcpLayer(pub, INDEXER, mode="replicate")
    ran = 0
    seed = 1
    # Generic tensors, every mode: (shard, num_decode_tokens, expanded slot mapping)
    for shard, nd, expanded in ((True, 2, True), (True, 0, True), (False, 0, True), (False, 3, True),
                                (False, L, True), (False, 2, False)):
        seed += 1
        per_rank = [_inputs(seed, r, nd, shard, [(12,), (2,)], [torch.bfloat16, torch.float32]) for r in range(P)]
        slots = _slots(seed, nd, shard) if expanded else _slots(seed, nd, False)[me * L:(me + 1) * L]
        (g_rows, g_slots) = _vllm("_gather_prefill_cache_inputs", me, per_rank, tuple(per_rank[me]), slots, nd, shard)
        _insert(want, GENERIC, g_rows, g_slots)
        rows, left = kp.gather_prefill_cache_inputs(tuple(per_rank[me]), slots, nd, shard, layer=generic)
        _insert(cache, GENERIC, rows, left)
        _check(comm, cache, want, f"generic shard={shard} nd={nd} expanded={expanded}")
        ran += 1
    # MLA, publish mode (k_pe as vLLM shapes it: [tokens, 1, rope])
    for shard, nd in ((True, 1), (False, 4)):
        seed += 1
        per_rank = [_inputs(seed, r, nd, shard, [(RANK,), (1, ROPE)], [torch.bfloat16] * 2) for r in range(P)]
        flat = [[c, pe.reshape(L, -1)] for c, pe in per_rank]
        slots = _slots(seed, nd, shard)
        c, pe, s = _vllm("maybe_gather_mla_latent_cache_inputs", me, flat, *per_rank[me], slots, nd, True, shard)
        _insert(want, mla.places, [c, pe], s)
        c, pe, s = kp.maybe_gather_mla_latent_cache_inputs(*per_rank[me], slots, nd, True, shard, layer=mla)
        assert pe.shape[1:] == (1, ROPE)
        _insert(cache, mla.places, [c, pe], s)
        _check(comm, cache, want, f"mla shard={shard} nd={nd}")
        ran += 1
    # The indexer, insert then replicate, with a quantizing cache op
    for shard, nd in ((True, 2), (False, 3), (False, 0)):
        seed += 1
        per_rank = [_inputs(seed, r, nd, shard, [(32,)], [torch.float32]) for r in range(P)]
        slots = _slots(seed, nd, shard)
        k, s = _vllm("maybe_gather_indexer_k", me, per_rank, per_rank[me][0], slots, nd, True, shard)
        _quant_insert(want, k, s)
        k, s = kp.maybe_gather_indexer_k(per_rank[me][0], slots, nd, True, shard, layer=indexer)
        _quant_insert(cache, k, s)
        kp.replicate_cache_rows(slots, L, nd, shard, layer=indexer)
        _check(comm, cache, want, f"indexer shard={shard} nd={nd}")
        ran += 1

    # Compiled: the publish mode under torch.compile(fullgraph=True), no graph break, fresh inputs per call.
    def step(a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor):
        return kp.gather_prefill_cache_inputs((a, b), slots, 2, False, layer=generic)

    shapes, dtypes = [(12,), (2,)], [torch.bfloat16, torch.float32]
    for rnd in range(4):  # round 0: torch._dynamo.explain (it runs the function once); then the compiled function
        seed += 1
        per_rank = [_inputs(seed, r, 2, False, shapes, dtypes) for r in range(P)]
        slots = _slots(seed, 2, False)
        g_rows, g_slots = _vllm("_gather_prefill_cache_inputs", me, per_rank, tuple(per_rank[me]), slots, 2, False)
        _insert(want, GENERIC, g_rows, g_slots)
        if rnd == 0:
            explain = torch._dynamo.explain(step)(*per_rank[me], slots)  # collective: every rank runs it
            assert explain.graph_break_count == 0, explain.break_reasons
            rows, left = [t[:2] for t in per_rank[me]], slots[:2]  # what it returned: the local decode rows
            compiled = torch.compile(step, fullgraph=True, backend="eager")
        else:
            rows, left = compiled(*per_rank[me], slots)
        _insert(cache, GENERIC, rows, left)
        _check(comm, cache, want, f"compiled round {rnd}")
        ran += 1
    # Refusals, naming what is wrong, before anything is published (no collective call is reached).
    before = cache.clone()
    a, b = _inputs(99, me, 0, True, shapes, dtypes)
    refused = [
        (lambda: kp.PcpLayer(pub, GENERIC, mode="gather"), "mode 'gather'"),
        (lambda: kp.PcpLayer(pub, GENERIC, mode="replicate"), "needs row_bytes"),
        (lambda: kp.PcpLayer(pub, [], then="barrier"), "places"),
        (lambda: kp.PcpLayer(pub, GENERIC, then="later"), "then 'later'"),
        (lambda: kp.PcpLayer("not a publisher", GENERIC), "expected a kvcomm.Publisher"),
        (lambda: kp.gather_prefill_cache_inputs((a, b), _slots(1, 0, True)[:2 * L], 0, True, layer=generic),
         "needs 24"),
        (lambda: kp.gather_prefill_cache_inputs((a, b), _slots(1, 0, True), L + 1, True, layer=generic),
         "num_decode_tokens 9"),
        (lambda: kp.gather_prefill_cache_inputs((a,), _slots(1, 0, True), 0, True, layer=generic), "1 tensors"),
        (lambda: kp.gather_prefill_cache_inputs((a, b[:3]), _slots(1, 0, True), 0, True, layer=generic),
         "token counts differ"),
        (lambda: kp.replicate_cache_rows(_slots(1, 0, True), L, 0, True, layer=generic), "mode is 'publish'"),
        (lambda: torch.ops.kvcomm.publish_tensors(generic.handle, cache, [a, b], _slots(1, 0, True)[:L], [0], [1, 1],
                                                  [0, 0], [0, 0], 1, 0), "one of each per tensor"),
    ]
    for fn, match in refused:
        with pytest.raises(kvcomm.InvalidArgumentError, match=match):
            fn()
    assert torch.equal(cache, before)
    for layer in (generic, mla, indexer):
        layer.close()
    return ran


def test_drop_ins_match_vllms_gather_then_insert_byte_for_byte():
    assert multirank.run(_cases, P, timeout=300) == [15] * P
