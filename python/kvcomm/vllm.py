"""kvcomm as a vLLM KV connector (vLLM 0.33.0's ``KVConnectorBase_V1``), over ``kvcomm.pd``: disaggregated prefill
and decode instances hand a request's KV blocks from the prefill workers' caches straight into the decode workers'
caches (peer mappings on one host, RDMA between hosts with devices, TCP otherwise), with no staging.

Launch (both instances; the proxy in front passes ``kv_transfer_params`` from the prefill response to the decode
request, as for vLLM's NixlConnector)::

    vllm serve MODEL --kv-transfer-config \\
      '{"kv_connector": "KvcommConnector", "kv_connector_module_path": "kvcomm.vllm", "kv_role": "kv_both"}'

Scheduler side: a request whose ``kv_transfer_params`` say ``do_remote_decode`` keeps its blocks when it finishes
(``request_finished`` returns True and the parameters the decode instance needs: the prefill workers' registration
metadata, the block ids, a random key); a request whose parameters say ``do_remote_prefill`` loads its prompt's KV
asynchronously (``get_num_new_matched_tokens``). Worker side: ``register_kv_caches`` registers every layer's cache
with the worker's endpoint; ``start_load_kv`` holds the finished prefill requests' blocks and starts the decode pulls;
``get_finished`` reports released holds (sending) and ended pulls (receiving), ``get_block_ids_with_load_errors`` the
blocks that did not land. Supported: one KV cache group (full attention), caches shaped ``[2, num_blocks, ...]`` (K
and V planes) or ``[num_blocks, ...]`` (MLA, or K and V inside a block). The same TP size on both sides: decode rank r pulls from prefill rank r, block for block.
Another TP size (or block size) on the decode side: where the caches are FlashAttention's ``[2, num_blocks,
block_size, kv_heads, head_size]`` planes, each worker registers them described (the model's KV heads it holds, as
vLLM splits them over TP; ``kvcomm.conversion``), and a decode rank reads the prompt's tokens from every prefill rank
that holds its heads, converting TP split and block size on the way (``kvcomm.pd``'s converted pull). Refused with a
clear error: several KV cache groups, other shapes, another TP size with caches that are not described.
``kv_connector_extra_config``: ``hold_timeout_ms`` (default 120000: how long a prefill worker keeps a finished
request's blocks when the decode side never says done) and ``tcp_address`` (what the workers' endpoints listen on;
default: this host's address as KVCOMM_SOCKET_IFNAME picks it).
"""

from __future__ import annotations

import base64
import os
from typing import Any, Dict, List, Optional, Set, Tuple

import kvcomm
import kvcomm.pd as pd
from kvcomm.conversion import KvContents, split_for_tp
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
)



class KvcommHandshakeMetadata(KVConnectorHandshakeMetadata):
    """What a worker tells its scheduler: its registrations' metadata (base64), layer by layer."""

    def __init__(self, tp_rank: int, metadata: List[str]) -> None:
        self.tp_rank = tp_rank
        self.metadata = metadata


class KvcommConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> worker for one step: holds to make (request -> (block ids, key)) and pulls to start (request ->
    (local block ids, the producer's parameters, the first token to load, the tokens to load))."""

    def __init__(self) -> None:
        self.holds: Dict[str, Tuple[List[int], str]] = {}
        self.pulls: Dict[str, Tuple[List[int], Dict[str, Any], int, int]] = {}


def _first_group(block_ids: Any) -> List[int]:
    """The block ids of the single KV cache group (vLLM passes a tuple of lists, one per group)."""
    if isinstance(block_ids, tuple):
        if len(block_ids) != 1:
            raise kvcomm.UnsupportedError(f"kvcomm.vllm: {len(block_ids)} KV cache groups (one is supported)")
        block_ids = block_ids[0]
    return [int(b) for b in block_ids]


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return int(get_tensor_model_parallel_rank())
    except Exception:  # noqa: BLE001 - no model-parallel group (a single worker, or a test): rank 0
        return 0


def _tp_size(vllm_config: Any) -> int:
    try:
        return int(vllm_config.parallel_config.tensor_parallel_size)
    except Exception:  # noqa: BLE001 - no parallel config: one rank
        return 1


def _contents(vllm_config: Any, tensor: Any, tp_size: int, tp_rank: int) -> Optional[List[KvContents]]:
    """What a [2, num_blocks, block_size, kv_heads, head_size] cache's K and V planes hold: the model's KV heads this
    rank keeps, as vLLM splits them over TP (one head on several ranks past the head count). None for another shape,
    or when the model's numbers do not match the tensor."""
    shape = tuple(tensor.shape)
    if len(shape) != 5 or shape[0] != 2:
        return None
    try:
        total = int(vllm_config.model_config.get_total_num_kv_heads())
        head = int(vllm_config.model_config.get_head_size())
        c = split_for_tp(KvContents(tensor.element_size(), head, int(shape[2]), total), tp_size, tp_rank)
    except Exception:  # noqa: BLE001 - no model config, or counts that do not divide: not described
        return None
    if head != shape[4] or (c.head_end or c.num_heads) - c.head_begin != shape[3]:
        return None
    return [c, c]


def _layout(tensor: Any, num_blocks: int) -> List[kvcomm.KvRegion]:
    """A layer cache's regions: [2, num_blocks, ...] is a K plane then a V plane; [num_blocks, ...] one region."""
    shape, item = tuple(tensor.shape), tensor.element_size()
    if not tensor.is_contiguous():
        raise kvcomm.UnsupportedError(f"kvcomm.vllm: a KV cache tensor of shape {shape} is not contiguous")
    per = 1
    if len(shape) >= 2 and shape[0] == 2 and shape[1] == num_blocks:
        for d in shape[2:]:
            per *= d
        block = per * item
        return [kvcomm.KvRegion(0, block, 0, num_blocks), kvcomm.KvRegion(num_blocks * block, block, 0, num_blocks)]
    if shape and shape[0] == num_blocks:
        for d in shape[1:]:
            per *= d
        return [kvcomm.KvRegion(0, per * item, 0, num_blocks)]
    raise kvcomm.UnsupportedError(f"kvcomm.vllm: a KV cache of shape {shape} is neither [2, {num_blocks}, ...] nor "
                                  f"[{num_blocks}, ...]")


class KvcommConnector(KVConnectorBase_V1):
    """vLLM KV connector over kvcomm endpoints (see the module's documentation)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        if kv_cache_config is not None and len(kv_cache_config.kv_cache_groups) > 1:
            raise kvcomm.UnsupportedError(f"kvcomm.vllm: {len(kv_cache_config.kv_cache_groups)} KV cache groups "
                                          "(one is supported)")
        self._num_blocks = kv_cache_config.num_blocks if kv_cache_config is not None else 0
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        # How long a prefill worker keeps a finished request's blocks when the decode side never says done.
        self._hold_timeout_ms = int(extra.get("hold_timeout_ms", 120000))
        self._tcp_address = str(extra.get("tcp_address", ""))
        # Scheduler side
        self._holds: Dict[str, Tuple[List[int], str]] = {}
        self._pulls: Dict[str, Tuple[List[int], Dict[str, Any], int, int]] = {}
        self._handshake: Dict[int, List[str]] = {}
        # Worker side
        self._ep: Optional[kvcomm.Endpoint] = None
        self._regs: List[kvcomm.Registration] = []
        self._producer: Optional[pd.Producer] = None
        self._consumer: Optional[pd.Consumer] = None
        self._tp_rank = _tp_rank()
        self._tp_size = _tp_size(vllm_config)
        self._block_size = 0  # of the described caches (0: not described)
        self._released: Set[str] = set()  # holds released, reported once vLLM names the request finished
        self._finished: Set[str] = set()
        self._load_errors: Set[int] = set()

    # ---- scheduler side ----------------------------------------------------------------------------------------

    def set_xfer_handshake_metadata(self, metadata: Dict[int, KVConnectorHandshakeMetadata]) -> None:
        for tp_rank, m in metadata.items():
            if isinstance(m, KvcommHandshakeMetadata):
                self._handshake[int(tp_rank)] = list(m.metadata)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill") or "kvcomm" not in params:
            return 0, False
        count = len(request.prompt_token_ids or []) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill") or num_external_tokens == 0:
            return
        local = _first_group(blocks.get_block_ids())
        total = len(request.prompt_token_ids or [])
        self._pulls[request.request_id] = (local, params["kvcomm"], total - num_external_tokens, num_external_tokens)
        params["do_remote_prefill"] = False  # loaded once

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = KvcommConnectorMetadata()
        meta.holds, self._holds = self._holds, {}
        meta.pulls, self._pulls = self._pulls, {}
        return meta

    def request_finished(self, request: Any, block_ids: Any) -> Tuple[bool, Optional[Dict[str, Any]]]:
        from vllm.v1.request import RequestStatus
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_decode"):
            return False, None
        if request.status != RequestStatus.FINISHED_LENGTH_CAPPED:
            return False, None  # aborted or stopped early: nothing to hand off, free now
        ids = _first_group(block_ids)
        if not ids or not self._handshake:
            return False, None
        key = os.urandom(8).hex()
        self._holds[request.request_id] = (ids, key)
        # What the decode instance needs, per TP rank (kvcomm.pd's parameters with the key the worker will hold).
        by_rank = {str(r): {"kvcomm_pd": 1, "key": key, "producer": 0, "metadata": md, "blocks": ids}
                   for r, md in self._handshake.items()}
        return True, {"do_remote_prefill": True, "do_remote_decode": False, "kvcomm": by_rank}

    # ---- worker side -------------------------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        if not kv_caches:
            return
        first = next(iter(kv_caches.values()))
        num_blocks = self._num_blocks or int(first.shape[1] if first.shape[0] == 2 else first.shape[0])
        self._ep = kvcomm.Endpoint(f"vllm {self.role.name.lower()} tp{self._tp_rank}", tcp_address=self._tcp_address)
        described: List[Optional[List[KvContents]]] = []
        for name in sorted(kv_caches):
            t = kv_caches[name]
            described.append(_contents(self._vllm_config, t, self._tp_size, self._tp_rank))
            self._regs.append(self._ep.register(t, _layout(t, num_blocks), contents=described[-1]))
        contents = described if all(c is not None for c in described) else None
        self._block_size = int(contents[0][0].tokens_per_block) if contents else 0
        self._producer = pd.Producer(self._ep, self._regs, hold_timeout_ms=self._hold_timeout_ms, contents=contents)
        self._consumer = pd.Consumer(self._ep, self._regs, contents=contents)

    def get_handshake_metadata(self) -> Optional[KVConnectorHandshakeMetadata]:
        if not self._regs:
            return None
        return KvcommHandshakeMetadata(self._tp_rank,
                                       [base64.b64encode(r.metadata()).decode() for r in self._regs])

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvcommConnectorMetadata)
        for request_id, (ids, key) in meta.holds.items():
            self._producer.hold(request_id, ids, key=key)
        for request_id, (local, by_rank, first, count) in meta.pulls.items():
            params = by_rank.get(str(self._tp_rank))
            if len(by_rank) != self._tp_size or params is None or self._converts(params):
                # Another TP size (or block size) on the prefill side: the prompt's tokens from every prefill rank,
                # converted. Token t of the request is in local[t // block_size - skipped] here.
                if not self._block_size:
                    raise kvcomm.UnsupportedError(
                        f"kvcomm.vllm: request {request_id!r}: the prefill instance has {len(by_rank)} TP ranks and "
                        f"this one {self._tp_size}, and this worker's caches are not described (FlashAttention's "
                        "[2, num_blocks, block_size, kv_heads, head_size] caches are)")
                table = [-1] * (first // self._block_size) + list(local)
                ranks = [by_rank[k] for k in sorted(by_rank, key=int)]
                self._consumer.pull(request_id, ranks, table, num_tokens=count, first_token=first)
                continue
            remote = list(params["blocks"])
            # The prefill instance's last len(local) blocks are the ones this instance did not compute itself.
            if len(local) < len(remote):
                params = dict(params, blocks=remote[len(remote) - len(local):])
            elif len(local) > len(remote):
                local = local[:len(remote)]
            self._consumer.pull(request_id, params, local)

    def _converts(self, params: Dict[str, Any]) -> bool:
        """Whether the prefill rank's caches hold another block size than this worker's (a converted pull)."""
        theirs = params.get("contents")
        return bool(theirs and self._block_size and theirs[0][0]["tokens_per_block"] != self._block_size)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # loads run between steps (get_num_new_matched_tokens said asynchronous)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None  # the decode instance pulls: nothing to push

    def wait_for_save(self) -> None:
        return None

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        if self._producer is None:
            return None, None
        self._finished |= set(finished_req_ids)
        self._released |= {r.request_id for r in self._producer.poll(0)}
        sending = self._released & self._finished
        self._released -= sending
        self._finished -= sending
        recving = set()
        for p in self._consumer.poll():
            recving.add(p.request_id)
            self._load_errors.update(p.failed_blocks)
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> Set[int]:
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self) -> None:
        if self._ep is not None:
            self._ep.close()
            self._ep = None
