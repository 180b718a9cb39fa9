"""kvcomm.pd, the prefill/decode hand-off over endpoints, on host memory: a producer (prefill) holds requests' blocks,
a consumer (decode) pulls them into its own slots and says so, the producer releases them. Every byte of the decode
caches is checked against an oracle built from the prefill caches (untouched blocks included, poisoned); released
reasons are checked for every way a hold ends: done, failed, aborted by the decode side, timed out, and a decode
process killed before it said done (its hold times out, the producer goes on serving). Two producers' equal request ids do not
collide, and messages naming no hold are ignored."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from typing import Any, Dict, List

import numpy as np
import pytest

import kvcomm
import kvcomm.pd as pd

BLOCKS, BB = 32, 4096
# Two "layers": an arena (memfd: a same-host peer maps it) and a plain numpy array (TCP): both paths carry the pull.
LAYOUT = [kvcomm.KvRegion(0, BB, 0, BLOCKS)]


def pattern(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, BLOCKS * BB, dtype=np.uint8)


class Side:
    """An endpoint with two layer caches registered: an arena and a numpy array, filled from seeds (or poisoned)."""

    def __init__(self, name: str, seed: int = -1) -> None:
        self.ep = kvcomm.Endpoint(name, tcp_address="127.0.0.1:0")
        self.arena = kvcomm.Arena(LAYOUT, kind="host")
        self.plain = np.empty(BLOCKS * BB, np.uint8)
        for i, mem in enumerate((self.arena.view(), self.plain)):
            mem[:] = pattern(seed + i) if seed >= 0 else 0xEE
        self.regs = [self.ep.register_arena(self.arena), self.ep.register(self.plain, LAYOUT)]

    def layers(self) -> List[np.ndarray]:
        return [self.arena.view(), self.plain]

    def close(self) -> None:
        self.ep.close()
        self.arena.free()


def expect(before: List[np.ndarray], src: List[np.ndarray], remote: List[int], local: List[int]) -> List[np.ndarray]:
    out = [b.copy() for b in before]
    for o, s in zip(out, src):
        for r, l_ in zip(remote, local):
            if l_ >= 0:
                o[l_ * BB:(l_ + 1) * BB] = s[r * BB:(r + 1) * BB]
    return out


def released(producer: pd.Producer, n: int, timeout_s: float = 30) -> Dict[str, str]:
    got: Dict[str, str] = {}
    end = time.time() + timeout_s
    while len(got) < n and time.time() < end:
        for r in producer.poll(200):
            got[r.request_id] = r.reason
    return got


@pytest.fixture
def pair():
    prefill, decode = Side("prefill", seed=100), Side("decode")
    yield prefill, decode
    decode.close()
    prefill.close()


def test_requests_are_pulled_byte_exact_and_released_when_done(pair):
    prefill, decode = pair
    producer = pd.Producer(prefill.ep, prefill.regs, hold_timeout_ms=30000)
    consumer = pd.Consumer(decode.ep, decode.regs)
    p1 = producer.hold("req-1", [3, 5, 9])
    p2 = producer.hold("req-2", np.array([1, 2, 30], np.int64))
    assert sorted(producer.held) == ["req-1", "req-2"] and p1["key"] != p2["key"]
    assert p1["blocks"] == [3, 5, 9] and len(p1["metadata"]) == 2 and p1["producer"] == prefill.ep.id
    import json
    p2 = json.loads(json.dumps(p2))  # the parameters survive a JSON round trip (an engine's request metadata)
    before = [m.copy() for m in decode.layers()]
    consumer.pull("req-1", p1, [0, 1, 2])
    consumer.pull("req-2", p2, [10, -1, 31])  # -1: a prefix block the decode side already has
    r1, r2 = consumer.wait("req-1", 30000), consumer.wait("req-2", 30000)
    assert r1.ok and r2.ok and r1.failed_blocks == [] and r1.error == "", (r1, r2)
    want = expect(before, prefill.layers(), [3, 5, 9], [0, 1, 2])
    want = expect(want, prefill.layers(), [1, 2, 30], [10, -1, 31])
    for got, w in zip(decode.layers(), want):
        np.testing.assert_array_equal(got, w)
    assert released(producer, 2) == {"req-1": "done", "req-2": "done"}
    assert producer.held == [] and consumer.pulling == [] and consumer.poll() == []
    # The producer's caches were only read.
    for i, mem in enumerate(prefill.layers()):
        np.testing.assert_array_equal(mem, pattern(100 + i))


def test_aborts_timeouts_and_failures_release_the_blocks(pair):
    prefill, decode = pair
    producer = pd.Producer(prefill.ep, prefill.regs, hold_timeout_ms=1500)
    consumer = pd.Consumer(decode.ep, decode.regs)
    pa, pt, pf = producer.hold("abort", [4, 6]), producer.hold("never", [7]), producer.hold("fails", [8])
    consumer.pull("abort", pa, [3, 4])
    consumer.abort("abort")
    consumer.abort("abort")  # no-op the second time
    assert consumer.pulling == []
    # A pull that fails (the producer's registration revoked meanwhile: stale metadata) reports its blocks.
    prefill.regs[1].revoke()
    consumer.pull("fails", pf, [20])
    r = consumer.wait("fails", 30000)
    assert not r.ok and r.failed_blocks == [20] and ("capability" in r.error or "revoked" in r.error), r
    got = released(producer, 3, 10)
    assert got == {"abort": "aborted", "never": "timeout", "fails": "failed"}, got
    del pt
    # Holds made after the revoke carry the new metadata.
    consumer.pull("fresh", producer.hold("fresh", [11]), [21])
    assert consumer.wait("fresh", 30000).ok
    np.testing.assert_array_equal(decode.plain[21 * BB:22 * BB], prefill.plain[11 * BB:12 * BB])
    assert released(producer, 1) == {"fresh": "done"}


def test_two_producers_with_equal_request_ids_do_not_collide_and_stray_messages_are_ignored():
    a, b, decode = Side("prefill a", seed=10), Side("prefill b", seed=20), Side("decode")
    try:
        pa, pb = pd.Producer(a.ep, a.regs), pd.Producer(b.ep, b.regs)
        consumer = pd.Consumer(decode.ep, decode.regs)
        qa, qb = pa.hold("r", [1, 2]), pb.hold("r", [1, 2])
        before = [m.copy() for m in decode.layers()]
        consumer.pull("a:r", qa, [5, 6])
        consumer.pull("b:r", qb, [7, 8])
        assert consumer.wait("a:r", 30000).ok and consumer.wait("b:r", 30000).ok
        want = expect(expect(before, a.layers(), [1, 2], [5, 6]), b.layers(), [1, 2], [7, 8])
        for got, w in zip(decode.layers(), want):
            np.testing.assert_array_equal(got, w)
        assert released(pa, 1) == {"r": "done"} and released(pb, 1) == {"r": "done"}
        # A late repeat, a forged key, and a message that is not the protocol's: none releases anything.
        remote = decode.ep.connect(a.regs[0].metadata())
        qa2 = pa.hold("r2", [3])
        decode.ep.notify(remote, b"kvcomm.pd done " + qa["key"].encode())
        decode.ep.notify(remote, b"kvcomm.pd done 0123456789abcdef")
        decode.ep.notify(remote, b"hello")
        time.sleep(0.3)
        assert pa.poll(500) == [] and pa.held == ["r2"] and pa.ignored == 2
        assert [n.message for n in pa.unhandled] == [b"hello"]
        del qa2
    finally:
        decode.close()
        b.close()
        a.close()


def test_arguments_are_checked(pair):
    prefill, decode = pair
    producer = pd.Producer(prefill.ep, prefill.regs)
    consumer = pd.Consumer(decode.ep, decode.regs)
    params = producer.hold("x", [1])
    bad = kvcomm.InvalidArgumentError
    with pytest.raises(bad, match="already held"):
        producer.hold("x", [2])
    with pytest.raises(bad, match="outside"):
        producer.hold("y", [BLOCKS])
    with pytest.raises(bad, match="request_id"):
        producer.hold(3, [1])
    with pytest.raises(bad, match="hex digits"):
        producer.hold("k", [1], key="not hex")
    given = producer.hold("k", [1], key="00112233445566778899")
    assert given["key"] == "00112233445566778899"  # a key made elsewhere (an engine's scheduler process)
    with pytest.raises(bad, match="already held"):
        producer.hold("k2", [1], key="00112233445566778899")
    with pytest.raises(bad, match="not kvcomm.pd"):
        consumer.pull("x", {"key": "k"}, [1])
    with pytest.raises(bad, match="registrations"):
        pd.Consumer(decode.ep, decode.regs[:1]).pull("x", params, [1])
    with pytest.raises(bad, match="names 2"):
        consumer.pull("x", params, [1, 2])
    with pytest.raises(bad, match="outside"):
        consumer.pull("x", params, [BLOCKS])
    with pytest.raises(bad, match="registrations must be"):
        pd.Producer(prefill.ep, [])
    with pytest.raises(bad, match="endpoint must be"):
        pd.Consumer("ep", decode.regs)
    with pytest.raises(bad, match="no pull"):
        consumer.wait("nothing")
    consumer.pull("x", params, [2])
    with pytest.raises(bad, match="already being pulled"):
        consumer.pull("x", params, [3])
    assert consumer.wait("x", 30000).ok


# ---- a decode process killed before it said done (mid-pull, or right after: the producer cannot tell) -------------------------------------------------------------------------------

BIG_BLOCKS, BIG_BB = 64, 1 << 20


def _decode_process(params: Dict[str, Any], started: Any) -> None:
    try:
        ep = kvcomm.Endpoint("doomed decode", tcp_address="127.0.0.1:0")
        mem = np.zeros(BIG_BLOCKS * BIG_BB, np.uint8)
        consumer = pd.Consumer(ep, ep.register(mem, [kvcomm.KvRegion(0, BIG_BB, 0, BIG_BLOCKS)]))
        consumer.pull("big", params, list(range(BIG_BLOCKS)))
        started.put("pulling")
        time.sleep(60)  # killed before it ends
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        started.put(traceback.format_exc())


def test_a_decode_process_killed_before_it_said_done_times_out_and_the_producer_goes_on():
    ep = kvcomm.Endpoint("prefill", tcp_address="127.0.0.1:0")
    mem = np.random.default_rng(5).integers(0, 256, BIG_BLOCKS * BIG_BB, dtype=np.uint8)
    layout = [kvcomm.KvRegion(0, BIG_BB, 0, BIG_BLOCKS)]
    producer = pd.Producer(ep, ep.register(mem, layout), hold_timeout_ms=2000)
    try:
        ctx = mp.get_context("spawn")
        started = ctx.Queue()
        p = ctx.Process(target=_decode_process, args=(producer.hold("big", list(range(BIG_BLOCKS))), started))
        p.start()
        assert started.get(timeout=120) == "pulling"
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        assert released(producer, 1, 30) == {"big": "timeout"}
        np.testing.assert_array_equal(mem, np.random.default_rng(5).integers(0, 256, mem.size, dtype=np.uint8))
        # The producer's endpoint goes on serving: a new decode side pulls a new hold.
        decode = Side("decode")
        try:
            small = np.zeros(BLOCKS * BB, np.uint8)
            consumer = pd.Consumer(decode.ep, decode.ep.register(small, [kvcomm.KvRegion(0, BB, 0, BLOCKS)]))
            params = producer.hold("after", [0])
            with pytest.raises(kvcomm.InvalidArgumentError):
                consumer.pull("after", params, [0])  # the layouts differ (1 MiB blocks vs 4 KiB): refused
            big = np.zeros(BIG_BLOCKS * BIG_BB, np.uint8)
            consumer = pd.Consumer(decode.ep, decode.ep.register(big, layout))
            consumer.pull("after", params, [7])
            assert consumer.wait("after", 30000).ok
            np.testing.assert_array_equal(big[7 * BIG_BB:8 * BIG_BB], mem[:BIG_BB])
            assert released(producer, 1) == {"after": "done"}
        finally:
            decode.close()
    finally:
        ep.close()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and kvcomm._kvcomm.built_with_cuda()


needs_cuda = pytest.mark.skipif(not _cuda_available(), reason="no CUDA device (torch.cuda.is_available() is False) "
                                "or a host-only build of kvcomm")


def _in_process(target: Any, *args: Any) -> Any:
    """Runs target(*args, results) in a spawned process (the decode side); returns what it put in `results` (a
    traceback there fails the test)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, results))
    p.start()
    got = results.get(timeout=180)
    p.join(60)
    assert not isinstance(got, str), got
    return got


def _cuda_decode_process(params: Dict[str, Any], blocks: List[int], results: Any) -> None:
    """The decode side in its own process: layer caches are torch CUDA tensors, poisoned; pulls `params` into
    `blocks`, sends back (result, the caches' bytes)."""
    try:
        import torch

        ep = kvcomm.Endpoint("decode", tcp_address="127.0.0.1:0")
        layers = [torch.full((BLOCKS * BB,), 0xEE, dtype=torch.uint8, device="cuda") for _ in range(2)]
        regs = [ep.register(t, LAYOUT) for t in layers]
        assert all(r.kind == kvcomm.MemoryKind.Cuda for r in regs)
        consumer = pd.Consumer(ep, regs)
        consumer.pull("gpu", params, blocks)
        r = consumer.wait("gpu", 30000)
        torch.cuda.synchronize()
        results.put(((r.ok, r.failed_blocks, r.error), [t.cpu().numpy() for t in layers]))
        ep.close()
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        results.put(traceback.format_exc())


@needs_cuda
def test_cuda_caches_in_two_processes_are_pulled_byte_exact():
    """Both sides' layer caches are torch CUDA tensors (as an engine's are), prefill here and decode in a process of
    its own (on one GPU: two processes on it): the pull lands in the decode side's GPU slots byte for byte, untouched
    slots keep their poison, the prefill side's cache is only read and its hold is released as done."""
    import torch

    ep = kvcomm.Endpoint("prefill", tcp_address="127.0.0.1:0")
    layers = [torch.from_numpy(pattern(300 + i)).cuda() for i in range(2)]
    try:
        regs = [ep.register(t, LAYOUT) for t in layers]
        assert all(r.kind == kvcomm.MemoryKind.Cuda for r in regs)
        producer = pd.Producer(ep, regs, hold_timeout_ms=60000)
        (ok, failed, error), caches = _in_process(_cuda_decode_process, producer.hold("gpu", [2, 17, 31, 0]),
                                                  [5, 6, -1, 30])
        assert ok and list(failed) == [] and error == "", (ok, failed, error)
        poisoned = [np.full(BLOCKS * BB, 0xEE, np.uint8)] * 2
        want = expect(poisoned, [pattern(300), pattern(301)], [2, 17, 31, 0], [5, 6, -1, 30])
        for c, w in zip(caches, want):
            np.testing.assert_array_equal(c, w)
        assert released(producer, 1) == {"gpu": "done"}
        for i, t in enumerate(layers):
            np.testing.assert_array_equal(t.cpu().numpy(), pattern(300 + i))
    finally:
        ep.close()


def _cuda_converted_decode_process(params: List[Any], seed: int, results: Any) -> None:
    """The TP 1 decode side in its own process: its cache (64-token heads-major blocks, poisoned) a torch CUDA tensor;
    pulls tokens [2, T) from both prefill ranks' `params`, sends back (result, the cache's bytes)."""
    try:
        import torch
        from test_conversion import T, side

        layout, contents, dtable, mem = side(8, 1, 0, 64, "hnd", np.random.default_rng(seed))
        ep = kvcomm.Endpoint("decode", tcp_address="127.0.0.1:0")
        cache = torch.from_numpy(mem).cuda()
        reg = ep.register(cache, layout)
        assert reg.kind == kvcomm.MemoryKind.Cuda
        consumer = pd.Consumer(ep, [reg], contents=[contents])
        consumer.pull("gpu", params, list(dtable), num_tokens=T - 2, first_token=2)
        r = consumer.wait("gpu", 60000)
        torch.cuda.synchronize()
        results.put(((r.ok, r.failed_blocks, r.error), cache.cpu().numpy()))
        ep.close()
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        results.put(traceback.format_exc())


@needs_cuda
def test_cuda_heterogeneous_tp2_to_tp1_in_two_processes_converted():
    """Heterogeneous TP with CUDA caches in two processes (one GPU: both on it): prefill TP 2 here (16-token
    tokens-major blocks, half of the heads each, torch CUDA tensors), decode TP 1 in a process of its own (64-token
    heads-major blocks). The decode cache equals the model oracle byte for byte (poison where no token goes), both
    producers release their holds as done, and the prefill caches are only read."""
    import torch
    from test_conversion import POISON as CPOISON, T, place, side

    rng = np.random.default_rng(7)
    model = rng.integers(0, 256, (2, T, 8, 8), dtype=np.uint8)
    ranks = [side(8, 2, r, 16, "nhd", rng) for r in range(2)]
    table = ranks[0][2]
    eps, caches = [], []
    try:
        producers, params = [], []
        for r, (layout, contents, _, mem) in enumerate(ranks):
            place(model, layout, contents, table, mem, 0, T)
            ep = kvcomm.Endpoint(f"prefill-{r}", tcp_address="127.0.0.1:0")
            eps.append(ep)
            caches.append(torch.from_numpy(mem).cuda())
            reg = ep.register(caches[-1], layout)
            assert reg.kind == kvcomm.MemoryKind.Cuda
            producers.append(pd.Producer(ep, [reg], contents=[contents], hold_timeout_ms=60000))
            params.append(producers[-1].hold("gpu", list(table)))
        seed = 11
        (ok, failed, error), cache = _in_process(_cuda_converted_decode_process, params, seed)
        assert ok and list(failed) == [] and error == "", (ok, failed, error)
        layout, contents, dtable, mem = side(8, 1, 0, 64, "hnd", np.random.default_rng(seed))
        want = np.full_like(mem, CPOISON)
        place(model, layout, contents, dtable, want, 2, T, also=table, also_tpb=16)
        np.testing.assert_array_equal(cache, want)
        for prod in producers:
            assert released(prod, 1) == {"gpu": "done"}
        for c, (_, _, _, mem) in zip(caches, ranks):
            np.testing.assert_array_equal(c.cpu().numpy(), mem)
    finally:
        for ep in reversed(eps):
            ep.close()


def test_heterogeneous_tp_prefill_tp2_to_decode_tp1_converted():
    """Prefill TP 2 (two producers, 16-token tokens-major blocks, each half of the heads) and decode TP 1 (64-token
    heads-major blocks, every head): the decode side pulls both ranks' params with the token count; its cache equals
    the model oracle byte for byte (tests/python/test_conversion.py's), and both producers release their holds."""
    from kvcomm.conversion import KvContents, split_for_tp
    from test_conversion import POISON as CPOISON, T, place, side

    rng = np.random.default_rng(5)
    model = rng.integers(0, 256, (2, T, 8, 8), dtype=np.uint8)
    ranks = [side(8, 2, r, 16, "nhd", rng) for r in range(2)]
    table = ranks[0][2]
    eps = []
    try:
        producers, params = [], []
        for r, (layout, contents, _, mem) in enumerate(ranks):
            place(model, layout, contents, table, mem, 0, T)
            ep = kvcomm.Endpoint(f"prefill-{r}", tcp_address="127.0.0.1:0")
            eps.append(ep)
            producers.append(pd.Producer(ep, [ep.register(mem, layout)], contents=[contents]))
            params.append(producers[-1].hold("req", list(table)))
        layout, contents, dtable, mem = side(8, 1, 0, 64, "hnd", rng)
        dec = kvcomm.Endpoint("decode", tcp_address="127.0.0.1:0")
        eps.append(dec)
        consumer = pd.Consumer(dec, [dec.register(mem, layout)], contents=[contents])
        assert isinstance(contents[0], KvContents) and contents[0] == split_for_tp(contents[0], 1, 0)
        import json
        params = json.loads(json.dumps(params))  # the parameters travel as JSON
        consumer.pull("req", params, list(dtable), num_tokens=T - 2, first_token=2)
        got = consumer.wait("req", 60000)
        assert got is not None and got.ok, got
        want = np.full_like(mem, CPOISON)
        place(model, layout, contents, dtable, want, 2, T, also=table, also_tpb=16)
        np.testing.assert_array_equal(mem, want)
        for p in producers:
            assert released(p, 1) == {"req": "done"}
        with pytest.raises(kvcomm.InvalidArgumentError, match="several producers' params"):
            consumer.pull("again", params, list(dtable))
        plain = pd.Consumer(dec, [dec.register(np.zeros_like(mem), layout)])
        with pytest.raises(kvcomm.InvalidArgumentError, match="needs contents on both sides"):
            plain.pull("again", params, list(dtable), num_tokens=10)
    finally:
        for ep in reversed(eps):
            ep.close()
