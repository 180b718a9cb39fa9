"""A vLLM-style PCP step without model weights: three ways of replicating each rank's new KV rows into every rank's
cache, verified against each other byte for byte and timed in one run, eager and inside CUDA graphs.

    torchrun --standalone --nproc-per-node 2 examples/vllm_pcp/vllm_pcp.py [--json out.jsonl]

More ranks than GPUs (e.g. 2 on one GPU) runs the ranks on shared GPUs: torch.distributed over gloo (NCCL refuses two
ranks on one GPU), path A gathers through host memory and is not captured (the reference after graph replays runs it
eagerly), path B is left out; C and D run as always (kvcomm maps the peers' memory on the same GPU). It checks the
bytes and the capture; its timings are not those of a GPU per rank.

Each PCP rank produces the final quantized rows of its share of the step's tokens: Main-KV rows (656 bytes) and
Indexer-K rows (128 key bytes + a 4-byte scale), plus a slot mapping padded with -1 to a common length. The cache is
block-major (block size 64): Main-KV blocks of 64 x 656 bytes; Indexer-K blocks with 64 x 128 key bytes followed by
64 x 4 scale bytes. Every rank must end up with every rank's rows.

  A  what vLLM does today: all_gather_into_tensor of the update tensors (rows, keys, scales, slots), then each rank
     inserts all of them into its own cache (index_put_).
  B  the seed's path: PyTorch SymmetricMemory (rendezvous), each rank stores its rows straight into every peer's cache
     through the peer views (index_put_ per peer), then the SymmetricMemory barrier.
  C  kvcomm: publish (three cache tensors, one kernel) + barrier.
  D  kvcomm at vLLM's call site: kvcomm.pcp.gather_prefill_cache_inputs (vLLM's inputs: the rank's rows and the
     expanded slot mapping of every rank, PCP-only mode) compiled with torch.compile(fullgraph=True): its custom op
     torch.ops.kvcomm.publish_tensors publishes and runs the barrier; nothing is left for a local insert.

Padded tokens (slot -1) go to a trash block in A and B (index_put_ cannot skip rows without a host sync); kvcomm skips
them. The trash block is excluded from the comparison. Multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import warnings

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import kvcomm  # noqa: E402

MAIN_ROW = 656
KEY_ROW = 128
SCALE_ROW = 4
BLOCK = 64


class CacheLayout:
    """Byte layout shared by the three paths: [Main-KV blocks | Indexer-K blocks], one extra trash block each."""

    def __init__(self, num_slots: int) -> None:
        self.blocks = (num_slots + BLOCK - 1) // BLOCK
        self.trash = self.blocks  # block index padded tokens go to in paths A and B
        self.main_bytes = (self.blocks + 1) * BLOCK * MAIN_ROW
        self.idx_off = self.main_bytes
        self.idx_block = BLOCK * (KEY_ROW + SCALE_ROW)
        self.total = self.idx_off + (self.blocks + 1) * self.idx_block

    def views(self, cache: torch.Tensor):
        """(main [B+1, 64, 656], keys [B+1, 64, 128], scales [B+1, 64, 4]) views of a uint8 cache tensor."""
        main = cache[: self.main_bytes].view(self.blocks + 1, BLOCK, MAIN_ROW)
        idx = cache[self.idx_off : self.total].view(self.blocks + 1, self.idx_block)
        keys = idx[:, : BLOCK * KEY_ROW].unflatten(1, (BLOCK, KEY_ROW))
        scales = idx[:, BLOCK * KEY_ROW :].unflatten(1, (BLOCK, SCALE_ROW))
        return main, keys, scales

    def compared(self, cache: torch.Tensor) -> torch.Tensor:
        """The bytes the paths must agree on: everything but the two trash blocks."""
        main = cache[: self.blocks * BLOCK * MAIN_ROW]
        idx = cache[self.idx_off : self.idx_off + self.blocks * self.idx_block]
        return torch.cat([main, idx])

    def kvcomm_tensors(self, rows, keys, scales):
        return [
            kvcomm.CacheTensor(rows, offset=0, block_size=BLOCK),
            kvcomm.CacheTensor(keys, offset=self.idx_off, block_size=BLOCK, block_stride=self.idx_block),
            kvcomm.CacheTensor(scales, offset=self.idx_off + BLOCK * KEY_ROW, block_size=BLOCK,
                               block_stride=self.idx_block),
        ]


def block_index(slots: torch.Tensor, layout: CacheLayout):
    """(block, offset) index tensors for index_put_, padded tokens sent to the trash block."""
    valid = slots >= 0
    blk = torch.where(valid, slots // BLOCK, torch.full_like(slots, layout.trash))
    off = torch.where(valid, slots % BLOCK, torch.zeros_like(slots))
    return blk, off


class Step:
    """One step's inputs on this rank (static tensors: CUDA graphs capture their addresses)."""

    def __init__(self, tokens_total: int, rank: int, world: int, layout: CacheLayout, device) -> None:
        self.per_rank = max(1, (tokens_total + world - 1) // world)
        self.tokens_total = tokens_total
        self.rows = torch.empty(self.per_rank, MAIN_ROW, dtype=torch.uint8, device=device)
        self.keys = torch.empty(self.per_rank, KEY_ROW, dtype=torch.uint8, device=device)
        self.scales = torch.empty(self.per_rank, SCALE_ROW, dtype=torch.uint8, device=device)
        self.slots = torch.empty(self.per_rank, dtype=torch.int64, device=device)
        self.rank, self.world, self.layout = rank, world, layout

        self.expanded = torch.empty(world * self.per_rank, dtype=torch.int64, device=device)  # vLLM's, every rank

    def fill(self, seed: int) -> None:
        """New rows and a new slot mapping (a permutation shared by all ranks; this rank's tokens, padded with -1)."""
        gen = torch.Generator(device="cpu").manual_seed(seed * 7919 + self.rank)
        self.rows.copy_(torch.randint(0, 256, self.rows.shape, dtype=torch.uint8, generator=gen))
        self.keys.copy_(torch.randint(0, 256, self.keys.shape, dtype=torch.uint8, generator=gen))
        self.scales.copy_(torch.randint(0, 256, self.scales.shape, dtype=torch.uint8, generator=gen))
        perm = torch.randperm(self.layout.blocks * BLOCK, generator=torch.Generator().manual_seed(seed))
        shares = []
        for r in range(self.world):
            first = r * self.per_rank
            share = torch.full((self.per_rank,), -1, dtype=torch.int64)
            real = max(0, min(self.per_rank, self.tokens_total - first))
            share[:real] = perm[first : first + real]
            shares.append(share)
        self.slots.copy_(shares[self.rank])
        self.expanded.copy_(torch.cat(shares))


class PathA:
    """all_gather_into_tensor of each update tensor, then a local insert of every rank's rows."""

    name = "A all_gather+index_put_"

    def __init__(self, step: Step, layout: CacheLayout, cache: torch.Tensor, via_host: bool = False) -> None:
        w = step.world
        self.step, self.layout, self.cache, self.via_host = step, layout, cache, via_host
        self.g_rows = torch.empty(w * step.per_rank, MAIN_ROW, dtype=torch.uint8, device=cache.device)
        self.g_keys = torch.empty(w * step.per_rank, KEY_ROW, dtype=torch.uint8, device=cache.device)
        self.g_scales = torch.empty(w * step.per_rank, SCALE_ROW, dtype=torch.uint8, device=cache.device)
        self.g_slots = torch.empty(w * step.per_rank, dtype=torch.int64, device=cache.device)
        self.views = layout.views(cache)

    @staticmethod
    def _gather_via_host(out: torch.Tensor, t: torch.Tensor) -> None:
        """all_gather_into_tensor for a gloo group (ranks sharing a GPU): through host copies."""
        parts = [torch.empty_like(t, device="cpu") for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t.cpu())
        out.copy_(torch.cat(parts))

    def __call__(self) -> None:
        s = self.step
        gather = self._gather_via_host if self.via_host else dist.all_gather_into_tensor
        gather(self.g_rows, s.rows)
        gather(self.g_keys, s.keys)
        gather(self.g_scales, s.scales)
        gather(self.g_slots, s.slots)
        blk, off = block_index(self.g_slots, self.layout)
        main, keys, scales = self.views
        main.index_put_((blk, off), self.g_rows)
        keys.index_put_((blk, off), self.g_keys)
        scales.index_put_((blk, off), self.g_scales)


class PathB:
    """PyTorch SymmetricMemory: direct stores into every peer's cache, then its barrier."""

    name = "B torch SymmetricMemory"

    def __init__(self, step: Step, layout: CacheLayout, group_name: str) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.step, self.layout = step, layout
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed before torch 2.8; a deprecated no-op after
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                symm_mem.enable_symm_mem_for_group(group_name)
        device = torch.device("cuda", torch.cuda.current_device())
        if hasattr(symm_mem, "empty"):
            self.cache = symm_mem.empty(layout.total, dtype=torch.uint8, device=device)
        else:
            self.cache = symm_mem._SymmetricMemory.empty_strided_p2p((layout.total,), (1,), torch.uint8, device,
                                                                      group_name)
        self.hdl = symm_mem.rendezvous(self.cache, group_name)
        self.peer_views = [layout.views(self.hdl.get_buffer(r, (layout.total,), torch.uint8))
                           for r in range(self.hdl.world_size)]

    def __call__(self) -> None:
        s = self.step
        blk, off = block_index(s.slots, self.layout)
        for main, keys, scales in self.peer_views:
            main.index_put_((blk, off), s.rows)
            keys.index_put_((blk, off), s.keys)
            scales.index_put_((blk, off), s.scales)
        self.hdl.barrier(channel=0)


class PathC:
    """kvcomm: publish + barrier."""

    name = "C kvcomm publish+barrier"

    def __init__(self, step: Step, layout: CacheLayout, pub: kvcomm.Publisher) -> None:
        self.step, self.pub = step, pub
        self.tensors = layout.kvcomm_tensors(step.rows, step.keys, step.scales)

    def __call__(self) -> None:
        self.pub.publish(self.tensors, self.step.slots)
        self.pub.barrier.sync()


class PathD:
    """kvcomm.pcp's drop-in for vLLM's _gather_prefill_cache_inputs, compiled (fullgraph) around the custom op."""

    name = "D kvcomm.pcp op, compiled"

    def __init__(self, step: Step, layout: CacheLayout, layer) -> None:
        import kvcomm.pcp as kp

        self.step, self.layer = step, layer
        self.fn = torch.compile(lambda rows, keys, scales, expanded: kp.gather_prefill_cache_inputs(
            (rows, keys, scales), expanded, 0, True, layer=layer), fullgraph=True)

    def __call__(self) -> None:
        s = self.step
        self.fn(s.rows, s.keys, s.scales, s.expanded)


def time_eager(fn, comm, warmup: int, iters: int) -> float:
    """Median microseconds of one call (CUDA events), ranks lined up before each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        comm.barrier()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def capture(fn):
    """fn captured in a CUDA graph (after a warm-up on a side stream, as torch recommends)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


REDUCE_ON = "cuda"  # where agree() and all_ranks_true() reduce: "cpu" for a gloo group


def agree(x: float) -> float:
    """The slowest rank's value (a step is as slow as its slowest member)."""
    t = torch.tensor([x], dtype=torch.float64, device=REDUCE_ON)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def all_ranks_true(ok: bool) -> bool:
    t = torch.tensor([0 if ok else 1], dtype=torch.int32, device=REDUCE_ON)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return int(t.item()) == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,16,256,4096,65536", help="tokens per step (all ranks together)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json", default="", help="append one JSON line per measurement to this file")
    args = ap.parse_args()

    global REDUCE_ON
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local % torch.cuda.device_count())
    torch.zeros(1, device="cuda")  # the primary context is current before kvcomm records this rank's GPU
    shared = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > torch.cuda.device_count()  # ranks share a GPU
    if shared:
        dist.init_process_group("gloo")  # NCCL refuses two ranks on one GPU
        REDUCE_ON = "cpu"
    else:
        try:
            dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
        except TypeError:  # torch before 2.3 has no device_id
            dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    comm = kvcomm.init_torch()  # the PCP group: every rank here

    token_counts = [int(t) for t in args.tokens.split(",")]
    layout = CacheLayout(max(token_counts))
    cache_a = torch.full((layout.total,), 0xA5, dtype=torch.uint8, device="cuda")
    capacity = (layout.total + (2 << 20) - 1) // (2 << 20) * (2 << 20)  # whole 2 MiB granules
    buf = kvcomm.SymmetricBuffer.create(comm, capacity, capacity, kind="cuda")
    cache_c = buf.local()
    cache_c.fill_(0xA5)
    pub = kvcomm.Publisher(buf)
    buf_d = kvcomm.SymmetricBuffer.create(comm, capacity, capacity, kind="cuda")
    cache_d = buf_d.local()
    import kvcomm.pcp as kp

    places = [kp.Place(t.offset, t.block_size, t.block_stride, t.row_stride)
              for t in layout.kvcomm_tensors(None, None, None)]
    layer_d = kp.PcpLayer(kvcomm.Publisher(buf_d), places)
    path_b_cache = None
    if rank == 0:
        print(f"kvcomm {kvcomm.__version__}, torch {torch.__version__}, {world} ranks, publisher mode "
              f"{pub.mode.name} ({pub.mode_reason})")
        print(f"cache: {layout.blocks} blocks of {BLOCK} tokens, Main-KV {MAIN_ROW} B + Indexer-K {KEY_ROW}+"
              f"{SCALE_ROW} B per token, {layout.total / 2**20:.1f} MiB per rank")
        if shared:
            print(f"{world} ranks share {torch.cuda.device_count()} GPU(s): gloo group, path A gathers through host "
                  "memory and runs eagerly only, path B left out; the bytes and the capture are checked, the timings "
                  "are not those of a GPU per rank")

    if world == 1 and rank == 0:
        print("path D (kvcomm.pcp) needs 2 or more ranks: vLLM runs no PCP gather for one (nothing to publish)")
    results = []
    failures = 0
    for n in token_counts:
        step = Step(n, rank, world, layout, "cuda")
        paths = [PathA(step, layout, cache_a, via_host=shared)]
        b = None
        try:
            if not shared:  # torch SymmetricMemory needs the NCCL group of a GPU per rank
                b = PathB(step, layout, group_name) if path_b_cache is None else path_b_cache
        except Exception as e:  # noqa: BLE001 - the comparison goes on without B
            if rank == 0:
                print(f"path B unavailable: {type(e).__name__}: {e}")
        if b is not None:
            b.step = step
            path_b_cache = b
            paths.append(b)
        paths.append(PathC(step, layout, pub))
        if world > 1:  # vLLM runs no PCP gather for one rank (its slot mapping is not expanded): nothing to publish
            paths.append(PathD(step, layout, layer_d))
        for cache in [cache_a, cache_c, cache_d] + ([b.cache] if b is not None else []):
            cache.fill_(0xA5)  # every path starts from the same poisoned state

        # Correctness, eager: every path from the same poisoned state, then C == A (and B == A) byte for byte.
        step.fill(seed=n)
        torch.cuda.synchronize()
        comm.barrier()
        for p in paths:
            p()
        torch.cuda.synchronize()
        comm.barrier()
        pub.check_errors()
        layer_d.publisher.check_errors()
        ref = layout.compared(cache_a)
        ok = torch.equal(layout.compared(cache_c), ref) and (world == 1 or torch.equal(layout.compared(cache_d), ref))
        ok_b = b is None or torch.equal(layout.compared(b.cache), ref)
        if not all_ranks_true(ok and ok_b):
            failures += 1
            if rank == 0:
                print(f"MISMATCH at {n} tokens: C == A and D == A {ok}, B == A {ok_b} (rank 0's view)")

        row = {"tokens": n, "tokens_per_rank": step.per_rank, "ranks": world}
        for p in paths:
            row[f"{p.name} eager"] = agree(time_eager(p, comm, args.warmup, args.iters))

        # CUDA graphs: capture each path once, replay with new inputs copied into the captured tensors, verify.
        graphs = {}
        for p in paths:
            if shared and p.name == PathA.name:
                continue  # host copies and gloo cannot be captured: A runs eagerly as the reference below
            try:
                graphs[p.name] = capture(p)
            except Exception as e:  # noqa: BLE001 - report and keep measuring the others
                if p.name in (PathC.name, PathD.name):
                    failures += 1  # kvcomm's paths must capture
                if rank == 0:
                    print(f"{p.name}: CUDA graph capture failed: {type(e).__name__}: {e}")
        comm.barrier()
        step.fill(seed=n + 1)
        torch.cuda.synchronize()
        comm.barrier()
        for p in paths:
            if p.name in graphs:
                graphs[p.name].replay()
            elif p.name == PathA.name:
                p()  # the reference, eagerly, where it could not be captured
        torch.cuda.synchronize()
        comm.barrier()
        pub.check_errors()
        layer_d.publisher.check_errors()
        if PathC.name in graphs and (world == 1 or PathD.name in graphs):
            ref = layout.compared(cache_a)
            ok = torch.equal(layout.compared(cache_c), ref) and (world == 1 or
                                                                 torch.equal(layout.compared(cache_d), ref))
            ok_b = b is None or PathB.name not in graphs or torch.equal(layout.compared(b.cache), ref)
            if not all_ranks_true(ok and ok_b):
                failures += 1
                if rank == 0:
                    print(f"MISMATCH after graph replay at {n} tokens: C == A and D == A {ok}, B == A {ok_b} (rank 0's view)")
        for p in paths:
            g = graphs.get(p.name)
            row[f"{p.name} graph"] = agree(time_eager(g.replay, comm, args.warmup, args.iters)) if g else None
        results.append(row)
        del graphs
        torch.cuda.synchronize()
        comm.barrier()

    if rank == 0:
        cols = [k for k in results[0] if k.endswith(("eager", "graph"))]
        print("\nper-step latency, microseconds (median over iterations, slowest rank)")
        header = f"{'tokens':>8} " + " ".join(f"{c:>34}" for c in cols)
        print(header)
        for row in results:
            cells = " ".join(f"{row[c]:>34.1f}" if row.get(c) is not None else f"{'n/a':>34}" for c in cols)
            print(f"{row['tokens']:>8} {cells}")
        print(f"\nverification: {'C == A' + (' and D == A' if world > 1 else '') + ' byte for byte on every rank' if failures == 0 else f'{failures} FAILED'}")
        if args.json:
            with open(args.json, "a") as f:
                for row in results:
                    for c in cols:
                        path, mode = c.rsplit(" ", 1)
                        f.write(json.dumps({"bench": "vllm_pcp", "path": path, "mode": mode, "tokens": row["tokens"],
                                            "tokens_per_rank": row["tokens_per_rank"], "ranks": world,
                                            "median_us": row[c]}) + "\n")
    layer_d.close()  # its publisher leaves the op registry (kvcomm.torch) and is destroyed with the buffers
    dist.barrier()
    dist.destroy_process_group()
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
