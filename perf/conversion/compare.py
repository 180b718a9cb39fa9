"""Converted reads beside plain reads of the same bytes, host memory, one host (kvcomm endpoints in one process: the
sources' caches are arenas, so reads take the same-host peer path; --via tcp for TCP). Per case, in the same run:

  plain        Endpoint.read of the blocks, equal layouts (what a transfer without conversion costs)
  converted    a kvcomm.conversion.ConvertedReader into the destination layout (land + plan + pieces; landing
               areas kept between reads); one-shot: read_converted, which makes them for the call
  engine way   plain reads of every source's blocks into staging, then a separate numpy permute pass into the
               destination layout (what engines do after the transfer; vllm#26759)

Cases: identity (same layout), TP 2 -> 1 tokens-major both sides (1 KiB pieces), TP 2 -> 1 with 64 -> 16 token blocks
and NHD -> HND (256-byte pieces), TP 1 -> 1 with 16 -> 64 token blocks (whole 2 KiB token rows: pieces of 32 KiB).
Prints a table (median of --reps, GB/s of the destination's bytes, ratio against plain, speedup against the engine
way) and, with --json FILE, one JSON line per case.

--kind cuda (the GPU machine, torch): the sources are CUDA arenas (VMM, mapped by the decode endpoint on one host:
the conversion kernel reads them where they lie), the destination a torch CUDA tensor; the engine way is the plain
reads into staging tensors plus torch permute/cat kernels. Cases there have pieces of 16 KiB or more (the issue's
0.9x target) beside one of 256 B for contrast. Times are wall clock of synchronous calls (each waits for its GPU
work), so the host's planning per piece counts.

    python perf/conversion/compare.py [--kind host|cuda] [--tokens N] [--layers 4] [--reps 9] [--via peer|tcp]
                                      [--json out.jsonl] [--profile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import kvcomm
from kvcomm.conversion import ConvertedReader, KvContents, read_converted, split_for_tp

HEADS, DIM, ELT = 8, 128, 2  # 8 KV heads of 128 bf16: 2 KiB per token and region


def layout_for(tp: int, rank: int, tpb: int, order: str, layers: int, blocks: int):
    c = split_for_tp(KvContents(ELT, DIM, tpb, HEADS, order=order), tp, rank)
    held = (c.head_end or c.num_heads) - c.head_begin
    bb = tpb * held * DIM * ELT
    regions = [kvcomm.KvRegion(r * bb * blocks, bb, 0, blocks) for r in range(2 * layers)]  # K, V per layer
    return regions, [c] * (2 * layers), bb * blocks * 2 * layers


def median_s(fn, reps: int) -> float:
    fn()  # warm-up (maps peers, connects); twice: CUDA launch lists alternate between two staging slots, each made
    fn()  # on its first use
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile_gpu(name: str, fns: dict, reps: int) -> None:
    """Where each way's time goes: per call, the GPU time of its kernels and copies (CUPTI, through torch.profiler)
    against its wall time; the rest is the host's work and the waits around it."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for way, fn in fns.items():
        fn()
        fn()  # as median_s: both staging slots made before the profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / reps
        gpu: dict = {}
        api: dict = {}  # the CUDA runtime and driver calls the host made, by name
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                gpu[e.name] = gpu.get(e.name, 0.0) + e.time_range.elapsed_us() / reps
            elif e.name.startswith("cu"):
                api[e.name] = api.get(e.name, 0.0) + e.time_range.elapsed_us() / reps
        busy = sum(gpu.values())
        top = ", ".join(f"{k[:60]} {v:.0f}" for k, v in sorted(gpu.items(), key=lambda kv: -kv[1])[:3])
        calls = ", ".join(f"{k} {v:.0f}" for k, v in sorted(api.items(), key=lambda kv: -kv[1])[:5])
        print(f"  profile {name} / {way}: wall {wall * 1e6:.0f} us, GPU busy {busy:.0f} us ({top}); host CUDA calls "
              f"{sum(api.values()):.0f} us ({calls})", flush=True)


def _zeros(n: int, kind: str):
    if kind == "cuda":
        import torch
        return torch.zeros(n, dtype=torch.uint8, device="cuda")
    return np.zeros(n, np.uint8)


def _sync(kind: str) -> None:
    if kind == "cuda":
        import torch
        torch.cuda.synchronize()


def case(name: str, tp_src: int, bs_src: int, o_src: str, bs_dst: int, o_dst: str, args, rows: list) -> None:
    if args.only and args.only not in name:
        return
    tokens, layers, kind = args.tokens, args.layers, args.kind
    src_blocks = tokens // bs_src
    eps, arenas = [], []
    try:
        srcs = []
        for r in range(tp_src):
            regions, contents, size = layout_for(tp_src, r, bs_src, o_src, layers, src_blocks)
            ep = kvcomm.Endpoint(f"prefill-{r}", tcp_address="127.0.0.1:0")
            eps.append(ep)
            arena = kvcomm.Arena(regions, kind=kind)
            arenas.append(arena)
            arena.write(0, np.random.default_rng(r).integers(0, 256, size, dtype=np.uint8))
            srcs.append((ep.register_arena(arena), regions, contents))
        dst_blocks = tokens // bs_dst
        regions, contents, size = layout_for(1, 0, bs_dst, o_dst, layers, dst_blocks)
        dec = kvcomm.Endpoint("decode", tcp_address="127.0.0.1:0")
        eps.append(dec)
        mem = _zeros(size, kind)
        mine = dec.register(mem, regions)
        remotes = [(dec.connect(reg.metadata()), c) for reg, _, c in srcs]
        table, dtable = np.arange(src_blocks, dtype=np.int64), np.arange(dst_blocks, dtype=np.int64)

        reader = ConvertedReader(dec)

        def converted():  # landing areas kept between reads (a one-shot read_converted also pays their page faults)
            got = reader.read(mine, contents, remotes, table, dtable, tokens, via=args.via)
            assert got.ok, got.status.error

        def one_shot():
            got = read_converted(dec, mine, contents, remotes, table, dtable, tokens, via=args.via)
            assert got.ok, got.status.error

        # plain: the same destination bytes as whole blocks between equal layouts (decode's own layout on both
        # sides: a source laid out as the destination)
        p_regions, p_contents, p_size = layout_for(1, 0, bs_dst, o_dst, layers, dst_blocks)
        pep = kvcomm.Endpoint("plain-source", tcp_address="127.0.0.1:0")
        eps.append(pep)
        parena = kvcomm.Arena(p_regions, kind=kind)
        arenas.append(parena)
        pareg = pep.register_arena(parena)
        premote = dec.connect(pareg.metadata())

        def plain():
            t = dec.read(mine, premote, dtable, dtable, via=args.via)
            assert t.wait().done

        # the engine way: land every source's blocks as they are, then permute with numpy into the destination
        staging = [_zeros(layout_for(tp_src, r, bs_src, o_src, layers, src_blocks)[2], kind) for r in range(tp_src)]
        sregs = [dec.register(staging[r], srcs[r][1]) for r in range(tp_src)]

        def engine_way():
            ts = [dec.read(sregs[r], remotes[r][0], table, table, via=args.via) for r in range(tp_src)]
            for t in ts:
                assert t.wait().done
            held = HEADS // tp_src
            for li in range(2 * layers):
                parts = []
                for r in range(tp_src):
                    blk = staging[r][li * src_blocks * bs_src * held * DIM * ELT:
                                     (li + 1) * src_blocks * bs_src * held * DIM * ELT]
                    shape = (src_blocks, bs_src, held, DIM * ELT) if o_src == "nhd" else \
                        (src_blocks, held, bs_src, DIM * ELT)
                    a = blk.reshape(shape)
                    if o_src == "hnd":
                        a = a.transpose(0, 2, 1, 3) if kind == "host" else a.permute(0, 2, 1, 3)
                    parts.append(a.reshape(tokens, held, DIM * ELT))
                if kind == "host":
                    full = np.concatenate(parts, axis=1)  # tokens x heads x bytes
                else:
                    import torch
                    full = torch.cat(parts, dim=1)
                out = mem[li * dst_blocks * bs_dst * HEADS * DIM * ELT:(li + 1) * dst_blocks * bs_dst * HEADS * DIM * ELT]
                full = full.reshape(dst_blocks, bs_dst, HEADS, DIM * ELT)
                if o_dst == "hnd":
                    full = full.transpose(0, 2, 1, 3) if kind == "host" else full.permute(0, 2, 1, 3)
                if kind == "host":
                    out.reshape(full.shape)[...] = full
                else:
                    out.view(full.shape).copy_(full)
            _sync(kind)

        if args.profile and kind == "cuda":
            profile_gpu(name, {"plain": plain, "converted": converted}, args.reps)
        t_plain = median_s(plain, args.reps)
        t_conv = median_s(converted, args.reps)
        t_once = median_s(one_shot, args.reps)
        t_engine = median_s(engine_way, args.reps)
        got = read_converted(dec, mine, contents, remotes, table, dtable, tokens, via=args.via)
        # The three ways land the same bytes (the converted read last): the engine way's result is the oracle.
        want = mem.clone() if kind == "cuda" else mem.copy()
        engine_way()
        same = bool((mem == want).all())
        assert same, f"{name}: the converted read and the engine way differ"
        row = {"bench": "conversion", "kind": kind, "case": name, "via": args.via, "tokens": tokens, "layers": layers,
               "sources_mapped": len(got.sources_mapped), "bytes_landed": int(got.bytes_landed),
               "bytes": int(got.bytes_converted), "pieces": got.pieces, "plain_s": t_plain, "converted_s": t_conv,
               "engine_way_s": t_engine, "one_shot_s": t_once, "ratio_vs_plain": t_plain / t_conv, "speedup_vs_engine_way": t_engine / t_conv}
        rows.append(row)
        gb = got.bytes_converted / 1e9
        print(f"{name:<42} {len(got.sources_mapped):>6} {got.pieces:>8} {got.bytes_converted / got.pieces / 1024:>9.1f} "
              f"{gb / t_plain:>8.2f} {gb / t_conv:>10.2f} {gb / t_once:>9.2f} {gb / t_engine:>11.2f} {t_plain / t_conv:>7.2f}x "
              f"{t_engine / t_conv:>8.2f}x", flush=True)
    finally:
        for ep in reversed(eps):
            ep.close()
        for a in arenas:
            a.free()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default="host", choices=["host", "cuda"])
    ap.add_argument("--tokens", type=int, default=0, help="default: 2048 on host, 32768 on cuda")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--via", default="peer", choices=["peer", "tcp"])
    ap.add_argument("--json", default="")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--profile", action="store_true", help="cuda: print each way's GPU time against its wall time")
    args = ap.parse_args()
    args.tokens = args.tokens or (32768 if args.kind == "cuda" else 2048)
    if args.kind == "cuda":  # a current context for the CUDA arenas
        import torch
        torch.cuda.set_device(0)
        torch.zeros(1, device="cuda")
    mib = args.tokens * 2 * args.layers * HEADS * DIM * ELT / 2**20
    print(f"kvcomm {kvcomm.__version__}: {args.tokens} tokens x {args.layers} layers (K, V) x {HEADS} heads x {DIM} x "
          f"{ELT} B = {mib:.0f} MiB per read, {args.kind} memory, via {args.via}; median of {args.reps}; GB/s of the destination's bytes")
    print(f"{'case':<42} {'mapped':>6} {'items':>8} {'KiB/item':>9} {'plain':>8} {'converted':>10} {'one-shot':>9} {'engine way':>11} "
          f"{'vs plain':>8} {'vs engine':>9}")
    rows: list = []
    case("identity (TP1 bs64 NHD -> same)", 1, 64, "nhd", 64, "nhd", args, rows)
    if args.kind == "host":
        case("TP2 -> TP1, bs64 NHD both (1 KiB pieces)", 2, 64, "nhd", 64, "nhd", args, rows)
        case("TP2 -> TP1, bs64 NHD -> bs16 HND (256 B)", 2, 64, "nhd", 16, "hnd", args, rows)
        case("TP1 -> TP1, bs16 -> bs64 NHD (32 KiB)", 1, 16, "nhd", 64, "nhd", args, rows)
    else:
        case("TP2 -> TP1, bs64 HND both (64 KiB pieces)", 2, 64, "hnd", 64, "hnd", args, rows)
        case("TP2 -> TP1, bs128 HND both (128 KiB)", 2, 128, "hnd", 128, "hnd", args, rows)
        case("TP1 -> TP1, bs16 -> bs64 NHD (32 KiB)", 1, 16, "nhd", 64, "nhd", args, rows)
        case("TP1 -> TP1, bs64 -> bs256 NHD (128 KiB)", 1, 64, "nhd", 256, "nhd", args, rows)
        case("TP2 -> TP1, bs64 NHD -> bs16 HND (256 B)", 2, 64, "nhd", 16, "hnd", args, rows)
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
