"""kvcomm.conversion from Python: descriptions, plans and their application between host arrays, against a numpy
oracle independent of the planner (each side's cache built from a model tensor with numpy views: a block is a
(tokens, heads, bytes) or (heads, tokens, bytes) array at the block id its table gives); every byte of the decode
side's memory checked (poisoned, gaps between blocks, untouched blocks, skipped tokens). Refusals name what differs.
The full matrix runs in C++ (tests/unit/test_kv_conversion.cpp)."""

from __future__ import annotations

import numpy as np
import pytest

import kvcomm
import multirank
from kvcomm.conversion import KvContents, apply_conversion, check_description, plan_conversion, read_converted, \
    split_for_tp, why_not_convertible

D, E, T, POISON = 4, 2, 150, 0xEE
U = D * E


def side(heads: int, tp: int, rank: int, tpb: int, order: str, rng: np.random.Generator):
    c = split_for_tp(KvContents(E, D, tpb, heads, order=order), tp, rank)
    held = (c.head_end or c.num_heads) - c.head_begin
    bb = tpb * held * U
    n = 2 * ((T + tpb - 1) // tpb) + 3
    layout = [kvcomm.KvRegion(0, bb, 0, n), kvcomm.KvRegion(n * bb + 64, bb, bb + 32, n)]  # 2nd: gaps
    mem = np.full(layout[1].offset + n * (bb + 32) + 64, POISON, np.uint8)
    table = rng.permutation(n)[:(T + tpb - 1) // tpb].astype(np.int64)
    return layout, [c, c], table, mem


def place(model: np.ndarray, layout, contents, table, mem, lo: int, hi: int, also=None, also_tpb: int = 1) -> None:
    """The oracle: tokens [lo, hi) of `model` (regions x tokens x heads x bytes) into `mem` through numpy views."""
    for r, (reg, c) in enumerate(zip(layout, contents)):
        hb, he, tpb = c.head_begin, c.head_end or c.num_heads, c.tokens_per_block
        stride = reg.block_stride or reg.block_bytes
        for t in range(lo, hi):
            b = table[t // tpb]
            if b < 0 or (also is not None and also[t // also_tpb] < 0):
                continue
            start = reg.offset + int(b) * stride
            blk = mem[start:start + reg.block_bytes]
            blk = blk.reshape(tpb, he - hb, U) if c.order == "nhd" else blk.reshape(he - hb, tpb, U).transpose(1, 0, 2)
            blk[t % tpb] = model[r, t, hb:he]


CASES = [(8, 2, 1, 16, 64, "nhd", "hnd"), (8, 1, 2, 64, 16, "hnd", "nhd"), (8, 4, 2, 32, 32, "nhd", "nhd"),
         (8, 2, 4, 128, 16, "hnd", "hnd"), (4, 8, 2, 16, 32, "nhd", "hnd")]


@pytest.mark.parametrize("heads,tp_src,tp_dst,bs_src,bs_dst,o_src,o_dst", CASES)
def test_plans_rebuild_the_decode_cache_byte_for_byte(heads, tp_src, tp_dst, bs_src, bs_dst, o_src, o_dst):
    rng = np.random.default_rng(heads * 1000 + tp_src * 100 + tp_dst * 10 + bs_src)
    model = rng.integers(0, 256, (2, T, heads, U), dtype=np.uint8)
    srcs = [side(heads, tp_src, r, bs_src, o_src, rng) for r in range(tp_src)]
    table = srcs[0][2].copy()
    table[min(2, len(table) - 1)] = -1  # a block the prefill side lacks
    for layout, contents, _, mem in srcs:
        check_description(layout, contents)
        place(model, layout, contents, table, mem, 0, T)
    first = 7
    for d in range(tp_dst):
        layout, contents, dtable, mem = side(heads, tp_dst, d, bs_dst, o_dst, rng)
        dtable[1] = -1  # a block the decode side skips
        plan = plan_conversion([(s[0], s[1]) for s in srcs], layout, contents, table, dtable, T - first,
                               first_token=first, preferred_source=d % tp_src)
        assert plan.count == sum(len(p) for p in plan.pieces) and plan.bytes > 0
        for (_, _, _, smem), pieces in zip(srcs, plan.pieces):
            apply_conversion(pieces, smem, mem)
        want = np.full_like(mem, POISON)
        place(model, layout, contents, dtable, want, first, T, also=table, also_tpb=bs_src)
        bad = np.flatnonzero(mem != want)
        assert bad.size == 0, f"decode rank {d}: {bad.size} bytes differ, first at {bad[:5]}"


def test_refusals_name_what_is_wrong():
    rng = np.random.default_rng(1)
    layout, contents, table, mem = side(8, 1, 0, 16, "nhd", rng)
    fp8 = [KvContents(1, 8, 16, 8), KvContents(1, 8, 16, 8)]
    assert "elements of 2 bytes on the source, 1 on the destination" in why_not_convertible(contents, fp8)
    assert why_not_convertible(contents, contents) == ""
    with pytest.raises(kvcomm.InvalidArgumentError, match="cannot be converted"):
        plan_conversion([(layout, contents)], layout, fp8, table, table, 16)
    with pytest.raises(kvcomm.InvalidArgumentError, match="order 'thd' is not 'nhd' or 'hnd'"):
        check_description(layout, [KvContents(E, D, 16, 8, order="thd")] * 2)
    # Contents are checked once per object and remembered only when valid: a bad one is refused on every use, one
    # equal in value to a checked one (2.0 == 2) is checked on its own.
    bad = KvContents(E, D, 16, 8, head_begin=-1)
    for _ in range(2):
        with pytest.raises(kvcomm.InvalidArgumentError, match="head_begin -1 is outside"):
            check_description(layout, [bad, bad])
    checked = KvContents(E, D, 16, 8)
    check_description(layout, [checked, checked])
    assert KvContents(float(E), D, 16, 8) == checked
    with pytest.raises(kvcomm.InvalidArgumentError, match="element_bytes must be a non-negative int, got float"):
        check_description(layout, [KvContents(float(E), D, 16, 8)] * 2)
    with pytest.raises(kvcomm.InvalidArgumentError, match="region 0: a block holds 32 tokens"):
        check_description(layout, [KvContents(E, D, 32, 8)] * 2)
    with pytest.raises(kvcomm.InvalidArgumentError, match="8 heads do not divide over TP 3"):
        split_for_tp(KvContents(E, D, 16, 8), 3, 0)
    with pytest.raises(kvcomm.InvalidArgumentError, match="expected a kvcomm.conversion.KvContents"):
        split_for_tp((E, D, 16, 8), 2, 0)
    with pytest.raises(kvcomm.InvalidArgumentError, match=r"srcBlocks\[0\] = 999 is outside"):
        plan_conversion([(layout, contents)], layout, contents, [999] + list(table[1:]), table, 16)
    with pytest.raises(kvcomm.InvalidArgumentError, match="held by no source"):
        half = split_for_tp(KvContents(E, D, 16, 8), 2, 0)
        hl = [kvcomm.KvRegion(0, 16 * 4 * U, 0, 64)]
        plan_conversion([(hl, [half])], layout[:1], contents[:1], table, table, 16)
    plan = plan_conversion([(layout, contents)], layout, contents, table, table, 16)
    before = mem.copy()
    with pytest.raises(kvcomm.InvalidArgumentError, match="does not fit"):
        apply_conversion(plan.pieces[0], mem[:100], mem)
    with pytest.raises(kvcomm.InvalidArgumentError, match="uint64 array"):
        apply_conversion(plan.pieces[0].astype(np.int64), mem, mem)
    np.testing.assert_array_equal(mem, before)


def test_contents_registered_travel_in_the_metadata():
    """Sources and the destination registered with contents=: a peer reads them from the metadata, and a converted
    read passes none; a registration whose contents do not fit its layout is refused."""
    rng = np.random.default_rng(78)
    model = rng.integers(0, 256, (2, T, 8, U), dtype=np.uint8)
    srcs = [side(8, 2, r, 16, "nhd", rng) for r in range(2)]
    table = srcs[0][2]
    eps = []
    try:
        remotes = []
        layout, contents, dtable, mem = side(8, 1, 0, 64, "hnd", rng)
        dec = kvcomm.Endpoint("decode", tcp_address="127.0.0.1:0")
        eps.append(dec)
        mine = dec.register(mem, layout, contents=contents)
        assert mine.contents == contents
        for r, (slayout, scontents, _, smem) in enumerate(srcs):
            place(model, slayout, scontents, table, smem, 0, T)
            ep = kvcomm.Endpoint(f"prefill-{r}", tcp_address="127.0.0.1:0")
            eps.append(ep)
            remote = dec.connect(ep.register(smem, slayout, contents=scontents).metadata())
            assert remote.contents == scontents
            remotes.append(remote)
        got = read_converted(dec, mine, None, remotes, table, dtable, T, via="tcp", timeout_ms=60000)
        assert got.ok, got
        want = np.full_like(mem, POISON)
        place(model, layout, contents, dtable, want, 0, T, also=table, also_tpb=16)
        np.testing.assert_array_equal(mem, want)
        bad = [KvContents(c.element_bytes, c.head_dim * 2, c.tokens_per_block, c.num_heads) for c in contents]
        with pytest.raises(kvcomm.InvalidArgumentError, match="region 0"):
            dec.register(np.zeros_like(mem), layout, contents=bad)
    finally:
        for ep in reversed(eps):
            ep.close()


@pytest.mark.parametrize("arenas", [False, True], ids=["tcp", "peer"])
def test_read_converted_from_endpoints_tp2_to_tp1(arenas):
    """Two prefill endpoints (TP 2, 16-token NHD blocks) and a decode endpoint (TP 1, 64-token HND blocks): the
    decode memory byte for byte against the oracle; a revoked source fails the read and writes nothing."""
    rng = np.random.default_rng(77)
    model = rng.integers(0, 256, (2, T, 8, U), dtype=np.uint8)
    srcs = [side(8, 2, r, 16, "nhd", rng) for r in range(2)]
    table = srcs[0][2]
    eps, regs, keep = [], [], []
    try:
        for r, (layout, contents, _, mem) in enumerate(srcs):
            place(model, layout, contents, table, mem, 0, T)
            ep = kvcomm.Endpoint(f"prefill-{r}", tcp_address="127.0.0.1:0")
            eps.append(ep)
            if arenas:
                arena = kvcomm.Arena(layout, kind="host")
                keep.append(arena)
                arena.view()[:mem.size] = mem
                regs.append(ep.register_arena(arena))
            else:
                regs.append(ep.register(mem, layout))
        layout, contents, dtable, mem = side(8, 1, 0, 64, "hnd", rng)
        dec = kvcomm.Endpoint("decode", tcp_address="127.0.0.1:0")
        eps.append(dec)
        mine = dec.register(mem, layout)
        sources = [(dec.connect(reg.metadata()), s[1]) for reg, s in zip(regs, srcs)]
        got = read_converted(dec, mine, contents, sources, table, dtable, T - 3, first_token=3,
                             via="peer" if arenas else "tcp", timeout_ms=60000)
        assert got.ok and got.bytes_converted > 0 and got.sources_read == [0, 1], got
        # Same-host arenas are read through their mappings (nothing lands); plain memory over TCP lands.
        assert got.sources_mapped == ([0, 1] if arenas else []) and (got.bytes_landed == 0) == arenas, got
        want = np.full_like(mem, POISON)
        place(model, layout, contents, dtable, want, 3, T, also=table, also_tpb=16)
        np.testing.assert_array_equal(mem, want)
        # A reader keeps its landing areas (over TCP: sources land): a second read of the same shape allocates
        # nothing more.
        from kvcomm.conversion import ConvertedReader
        reader = ConvertedReader(dec)
        for _ in range(2):
            mem[:] = POISON
            got = reader.read(mine, contents, sources, table, dtable, T - 3, first_token=3, via="tcp")
            assert got.ok and got.sources_mapped == [], got
            np.testing.assert_array_equal(mem, want)
            held = reader.landing_bytes if _ == 0 else held
        assert reader.landing_bytes == held > 0
        # A revoked source: Failed, naming it; the decode memory as it was.
        regs[1].revoke()
        mem[:] = POISON
        sources = [(dec.connect(reg.metadata()) if i == 0 else s, c) for i, (reg, (s, c)) in
                   enumerate(zip(regs, sources))]
        got = read_converted(dec, mine, contents, sources, table, dtable, T, timeout_ms=60000)
        assert not got.ok and "source 1 (prefill-1)" in got.status.error, got
        assert (mem == POISON).all()
        with pytest.raises(kvcomm.InvalidArgumentError, match="expected a kvcomm.Registration"):
            read_converted(dec, mem, contents, sources, table, dtable, T)
    finally:
        for ep in reversed(eps):
            ep.close()
        for a in keep:
            a.free()


def _converted_fetcher_group(comm: kvcomm.Communicator) -> None:
    """Ranks 0-1: a prefill group (TP 2, 16-token NHD blocks); ranks 2-3: a decode group (TP 2, 32-token HND blocks),
    one world, one host buffer each; every decode member fetches from both prefill members, every byte checked."""
    from kvcomm.conversion import ConvertedFetcher
    rank, pre = comm.rank, comm.rank < 2
    rng = np.random.default_rng(500)
    model = rng.integers(0, 256, (2, T, 8, U), dtype=np.uint8)
    sides = [side(8, 2, r % 2, 16 if r < 2 else 32, "nhd" if r < 2 else "hnd", np.random.default_rng(600 + r))
             for r in range(4)]
    table = sides[0][2]
    layout, contents, mytable, image = sides[rank]
    if pre:
        place(model, layout, contents, table, image, 0, T)
    most = max(s[3].size for s in sides)
    buf = kvcomm.SymmetricBuffer.create(comm, most, most, kind="host")
    buf.local()[:image.size] = image
    # A description this member's layout does not hold (rank 3's head_dim) fails create on every member, naming it.
    bad = [KvContents(E, D + 1, c.tokens_per_block, c.num_heads, c.head_begin, c.head_end, c.order) for c in contents]
    with pytest.raises(kvcomm.InvalidArgumentError, match="rank 3"):
        ConvertedFetcher(buf, layout, bad if rank == 3 else contents)
    # A malformed argument: that member raises its own error, the others (who joined) one naming it.
    with pytest.raises(kvcomm.InvalidArgumentError, match="contents\\[0\\]: expected" if rank == 1 else "rank 1"):
        ConvertedFetcher(buf, layout, "not contents" if rank == 1 else contents)
    f = ConvertedFetcher(buf, layout, contents)
    assert (f.rank, f.size) == (rank, 4)
    assert f.contents(1) == sides[1][1]
    assert [(g.offset, g.block_bytes, g.num_blocks) for g in f.layout(2)] == \
        [(g.offset, g.block_bytes, g.num_blocks) for g in sides[2][0]]
    comm.barrier()  # every prefill member's bytes are in place
    if not pre:
        for via in ("auto", "tcp"):
            buf.local()[:image.size] = image
            got = f.fetch([0, 1], table, mytable, T - 3, first_token=3, via=via, timeout_ms=60000)
            assert got.ok and got.sources_read == [rank - 2], got  # the prefill member holding this member's heads
            assert got.sources_mapped == (got.sources_read if via == "auto" else []), got
            want = np.full_like(image, POISON)
            place(model, layout, contents, mytable, want, 3, T, also=table, also_tpb=16)
            np.testing.assert_array_equal(buf.local()[:image.size], want)
        with pytest.raises(kvcomm.InvalidArgumentError, match="this member"):
            f.fetch([rank], table, mytable, T)
        with pytest.raises(kvcomm.InvalidArgumentError, match="sources"):
            f.fetch(0, table, mytable, T)
    comm.barrier()  # nobody leaves while a decode member still reads
    f.close()


def test_converted_fetcher_between_a_prefill_and_a_decode_group():
    multirank.run(_converted_fetcher_group, 4)
