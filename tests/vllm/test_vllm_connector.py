"""kvcomm.vllm's KvcommConnector driven through vLLM's own objects (the real vllm package, 0.33.0, from PyPI): a
prefill instance and a decode instance, each a scheduler-side and a worker-side connector, in this process on host
memory (no model weights: a tiny local model config). The prefill scheduler keeps a finished request's blocks and
returns the kv_transfer_params the decode request carries; the decode scheduler says the prompt loads
asynchronously, gets its blocks allocated and hands the pull to its worker; the worker pulls, reports the request
finished receiving, and the prefill worker reports it finished sending once the decode side said done. Every byte of
every layer's decode cache is checked against the prefill cache's blocks (untouched blocks included). Also: an aborted
prefill request frees its blocks at once; a pull whose producer revoked its registrations reports the blocks as load
errors and still finishes; a cache of several KV cache groups or of an unknown shape is refused naming why."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch

import kvcomm
from kvcomm.vllm import KvcommConnector, KvcommConnectorMetadata
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request, RequestStatus

BLOCK, HEADS, DIM, NUM_BLOCKS = 16, 2, 16, 64
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(2)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": HEADS, "num_hidden_layers": len(LAYERS), "vocab_size": 128,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "float16", "head_dim": DIM}))
    return d


def vllm_config(model_dir: Path, role: str, block: int = BLOCK) -> VllmConfig:
    mc = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float16", max_model_len=512)
    kv = KVTransferConfig(kv_connector="KvcommConnector", kv_connector_module_path="kvcomm.vllm", kv_role=role,
                          kv_connector_extra_config={"hold_timeout_ms": 3000, "tcp_address": "127.0.0.1:0"})
    return VllmConfig(model_config=mc, kv_transfer_config=kv, cache_config=CacheConfig(block_size=block),
                      device_config=DeviceConfig(device="cpu"))


def kv_cache_config(groups: int = 1, block: int = BLOCK, heads: int = HEADS) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=block, num_kv_heads=heads, head_size=DIM, dtype=torch.float16)
    return KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(layer_names=list(LAYERS), kv_cache_spec=spec)
                                          for _ in range(groups)])


class Instance:
    """One vLLM instance: its scheduler-side and worker-side connectors and the worker's layer caches."""

    def __init__(self, model_dir: Path, role: str, seed: int) -> None:
        cfg = vllm_config(model_dir, role)
        self.scheduler = KvcommConnector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config())
        self.worker = KvcommConnector(cfg, KVConnectorRole.WORKER, kv_cache_config())
        g = torch.Generator().manual_seed(seed)
        # FlashAttention's shape: [2 (K, V), num_blocks, block_size, num_kv_heads, head_size]
        self.caches = {name: torch.randn(2, NUM_BLOCKS, BLOCK, HEADS, DIM, generator=g).to(torch.float16)
                       for name in LAYERS}
        self.worker.register_kv_caches(self.caches)
        self.scheduler.set_xfer_handshake_metadata({0: self.worker.get_handshake_metadata()})

    def step(self, finished: Tuple[str, ...] = ()) -> Tuple[set, set]:
        """One engine step: the scheduler's metadata to the worker, start_load_kv, get_finished."""
        meta = self.scheduler.build_connector_meta(None)
        assert isinstance(meta, KvcommConnectorMetadata)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        self.worker.wait_for_save()
        sending, recving = self.worker.get_finished(set(finished))
        self.worker.clear_connector_metadata()
        return sending or set(), recving or set()

    def close(self) -> None:
        self.worker.shutdown()


def request(rid: str, tokens: int, params: Dict[str, Any]) -> Request:
    sp = SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": params})  # how vLLM's API passes them
    return Request(request_id=rid, prompt_token_ids=list(range(tokens)), sampling_params=sp, pooling_params=None)


def blocks(ids: List[int]) -> KVCacheBlocks:
    return KVCacheBlocks(blocks=([KVCacheBlock(block_id=i) for i in ids],))


def until(fn, seconds: float = 30) -> Any:
    end = time.time() + seconds
    while time.time() < end:
        got = fn()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError("timed out")


@pytest.fixture
def pair(model_dir):
    prefill, decode = Instance(model_dir, "kv_producer", 1), Instance(model_dir, "kv_consumer", 2)
    yield prefill, decode
    decode.close()
    prefill.close()


def hand_off(prefill: Instance, rid: str, prefill_blocks: List[int], tokens: int) -> Dict[str, Any]:
    """The prefill instance finishes `rid` (its blocks `prefill_blocks`) and returns the decode request's params."""
    req = request(rid, tokens, {"do_remote_decode": True})
    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
    delay, params = prefill.scheduler.request_finished(req, (prefill_blocks,))
    assert delay and params["do_remote_prefill"] and "kvcomm" in params
    return json.loads(json.dumps(params))  # through the proxy, as JSON


def test_a_request_is_handed_from_prefill_to_decode_byte_exact(pair):
    prefill, decode = pair
    params = hand_off(prefill, "req-1", [3, 5, 9], 40)
    assert prefill.step() == (set(), set())  # held now; not released before the decode side says done
    before = {n: c.clone() for n, c in decode.caches.items()}
    dreq = request("req-1", 40, params)
    n, asynchronous = decode.scheduler.get_num_new_matched_tokens(dreq, 0)
    assert n == 40 and asynchronous
    decode.scheduler.update_state_after_alloc(dreq, blocks([7, 8, 20]), n)
    assert decode.scheduler.get_num_new_matched_tokens(dreq, 0) == (0, False)  # loaded once
    got = until(lambda: decode.step()[1])
    assert got == {"req-1"}
    assert decode.worker.get_block_ids_with_load_errors() == set()
    for name in LAYERS:
        want = before[name].clone()
        want[:, [7, 8, 20]] = prefill.caches[name][:, [3, 5, 9]]
        assert torch.equal(decode.caches[name], want), name  # every block, K and V planes
    sending = until(lambda: prefill.step(("req-1",))[0])
    assert sending == {"req-1"}


def test_a_prefix_the_decode_side_computed_pulls_only_the_rest(pair):
    prefill, decode = pair
    params = hand_off(prefill, "req-2", [10, 11, 12, 13], 64)
    prefill.step()
    before = {n: c.clone() for n, c in decode.caches.items()}
    dreq = request("req-2", 64, params)
    n, _ = decode.scheduler.get_num_new_matched_tokens(dreq, 32)  # two blocks computed locally (prefix cache)
    assert n == 32
    decode.scheduler.update_state_after_alloc(dreq, blocks([30, 31]), n)
    assert until(lambda: decode.step()[1]) == {"req-2"}
    for name in LAYERS:
        want = before[name].clone()
        want[:, [30, 31]] = prefill.caches[name][:, [12, 13]]
        assert torch.equal(decode.caches[name], want), name
    assert until(lambda: prefill.step(("req-2",))[0]) == {"req-2"}


def test_aborted_and_failed_hand_offs(pair):
    prefill, decode = pair
    aborted = request("gone", 40, {"do_remote_decode": True})
    aborted.status = RequestStatus.FINISHED_ABORTED
    assert prefill.scheduler.request_finished(aborted, ([1, 2, 3],)) == (False, None)  # freed at once
    params = hand_off(prefill, "req-3", [4, 6], 32)
    prefill.step()
    for r in prefill.worker._regs:  # the prefill worker revokes its registrations: the pull fails
        r.revoke()
    dreq = request("req-3", 32, params)
    n, _ = decode.scheduler.get_num_new_matched_tokens(dreq, 0)
    decode.scheduler.update_state_after_alloc(dreq, blocks([40, 41]), n)
    assert until(lambda: decode.step()[1]) == {"req-3"}  # finished receiving, with load errors
    assert decode.worker.get_block_ids_with_load_errors() == {40, 41}
    # The decode side's "failed" cannot reach the revoked registration: the hold times out (3 s here) and the
    # blocks are released all the same.
    assert until(lambda: prefill.step(("req-3",))[0]) == {"req-3"}


def test_unsupported_configurations_are_refused(model_dir):
    cfg = vllm_config(model_dir, "kv_both")
    with pytest.raises(kvcomm.UnsupportedError, match="KV cache groups"):
        KvcommConnector(cfg, KVConnectorRole.WORKER, kv_cache_config(groups=2))
    w = KvcommConnector(cfg, KVConnectorRole.WORKER, kv_cache_config())
    with pytest.raises(kvcomm.UnsupportedError, match="neither"):
        w.register_kv_caches({LAYERS[0]: torch.zeros(3, 5, dtype=torch.float16)})
    w.shutdown()


def test_prefill_tp2_to_decode_tp1_with_another_block_size_converts(model_dir):
    """A prefill instance of TP 2 (each worker's caches hold one of the model's two KV heads, 16-token blocks) and a
    decode instance of TP 1 (both heads, 32-token blocks): the decode worker reads the prompt's tokens from both
    prefill workers, converting head split and block size; every byte of every layer's decode cache against the
    prefill caches (the rest of the last block and every other block untouched); both prefill workers release."""
    cfg = vllm_config(model_dir, "kv_producer")
    scheduler = KvcommConnector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config(heads=1))
    workers, caches = [], []
    for r in range(2):
        w = KvcommConnector(cfg, KVConnectorRole.WORKER, kv_cache_config(heads=1))
        w._tp_rank, w._tp_size = r, 2  # as vLLM's TP group of two would number them
        g = torch.Generator().manual_seed(10 + r)
        caches.append({name: torch.randn(2, NUM_BLOCKS, BLOCK, 1, DIM, generator=g).to(torch.float16)
                       for name in LAYERS})
        w.register_kv_caches(caches[r])
        workers.append(w)
    scheduler.set_xfer_handshake_metadata({r: w.get_handshake_metadata() for r, w in enumerate(workers)})
    dcfg = vllm_config(model_dir, "kv_consumer", block=2 * BLOCK)
    dsched = KvcommConnector(dcfg, KVConnectorRole.SCHEDULER, kv_cache_config(block=2 * BLOCK))
    dworker = KvcommConnector(dcfg, KVConnectorRole.WORKER, kv_cache_config(block=2 * BLOCK))
    g = torch.Generator().manual_seed(20)
    dcaches = {name: torch.randn(2, NUM_BLOCKS, 2 * BLOCK, HEADS, DIM, generator=g).to(torch.float16)
               for name in LAYERS}
    dworker.register_kv_caches(dcaches)
    before = {n: c.clone() for n, c in dcaches.items()}

    def step(sched: KvcommConnector, ws: List[KvcommConnector], finished: Tuple[str, ...] = ()) -> Tuple[set, set]:
        meta = sched.build_connector_meta(None)
        sending, recving = set(), set()
        for w in ws:
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            s_, r_ = w.get_finished(set(finished))
            w.clear_connector_metadata()
            sending |= s_ or set()
            recving |= r_ or set()
        return sending, recving

    try:
        req = request("req-tp", 40, {"do_remote_decode": True})
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        src = [3, 5, 9]
        delay, params = scheduler.request_finished(req, (src,))
        assert delay and set(params["kvcomm"]) == {"0", "1"}
        params = json.loads(json.dumps(params))
        step(scheduler, workers)  # both prefill workers hold
        dreq = request("req-tp", 40, params)
        n, asynchronous = dsched.get_num_new_matched_tokens(dreq, 0)
        assert n == 40 and asynchronous
        dsched.update_state_after_alloc(dreq, blocks([7, 8]), n)
        assert until(lambda: step(dsched, [dworker])[1]) == {"req-tp"}
        assert dworker.get_block_ids_with_load_errors() == set()
        for name in LAYERS:
            want = before[name].clone()
            for t in range(40):
                for h in range(HEADS):
                    want[:, [7, 8][t // 32], t % 32, h] = caches[h][name][:, src[t // 16], t % 16, 0]
            assert torch.equal(dcaches[name], want), name
        assert until(lambda: step(scheduler, workers, ("req-tp",))[0]) == {"req-tp"}
    finally:
        dworker.shutdown()
        for w in workers:
            w.shutdown()
