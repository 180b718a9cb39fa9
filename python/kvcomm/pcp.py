"""PCP (prefill context parallelism) at vLLM's own call site: drop-ins for ``vllm/v1/attention/ops/pcp.py``
(vLLM 0.33.0) that publish each rank's KV rows into every PCP replica instead of all-gathering every rank's rows and
inserting all of them on every rank.

vLLM's PCP ranks each compute a share of a step's tokens; before the cache write, ``_gather_prefill_cache_inputs``
all-gathers every rank's inputs (``maybe_gather_mla_latent_cache_inputs`` for MLA's latent cache,
``maybe_gather_indexer_k`` for the sparse indexer's keys) and each rank then writes all of them into its own cache. The
functions here take the same inputs and return the same types, for a KV cache that is a kvcomm ``SymmetricBuffer``
over the PCP group (its local view is the cache vLLM writes):

- **publish** (``PcpLayer(..., mode="publish")``, the inputs are the cache's final rows: ``kv_cache_dtype="auto"``):
  this rank's share is stored into every replica by ``torch.ops.kvcomm.publish_tensors`` (one kernel, then the
  barrier), and what is returned is only what vLLM inserts locally anyway (replicated decode tokens), often nothing.
- **insert, then replicate** (``mode="replicate"``, for cache writes that quantize: FP8 caches, the indexer's
  ``indexer_k_quant_and_cache``): the functions return this rank's own rows and slots, vLLM's cache op writes them
  into the local replica as it always does, and ``replicate_cache_rows(...)`` right after copies the written rows
  from the local replica into every peer's (a gather of the rows, then one publish kernel and the barrier). The bytes
  in every replica are then exactly what vLLM's own kernel wrote.

Everything runs on torch's current stream with no host synchronisation: shapes decide every branch (they are equal on
every PCP rank, vLLM pads them), so ``torch.compile(fullgraph=True)`` traces it and a CUDA graph replays it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import torch

from . import torch as kt
from ._errors import invalid
from ._publish import Publisher

_THEN = {name: code for code, name in kt._THEN.items()}  # the op's codes for then=


@dataclass(frozen=True)
class Place:
    """Where one input tensor's row for slot s lives in the buffer (bytes): ``offset + (s // block_size) *
    block_stride + (s % block_size) * row_stride`` (strides 0 as in CacheTensor). `row_bytes`: the row's size, needed
    by mode "replicate" (it reads rows back from the local replica); in mode "publish" it is checked when given."""

    offset: int
    block_size: int = 1
    block_stride: int = 0
    row_stride: int = 0
    row_bytes: Optional[int] = None


class PcpLayer:
    """One attention layer's cache in a kvcomm SymmetricBuffer: the publisher of the PCP group, where each input
    tensor's rows land (`places`, in the order the vLLM function takes its tensors), the mode, and what follows the
    publish (`then`: "barrier", default, so peers' rows are visible to the attention that follows; "signal" with a
    later ``publisher.barrier.wait()``; "none" when a later call brings the barrier)."""

    def __init__(self, publisher: Publisher, places: Sequence[Place], *, mode: str = "publish",
                 then: str = "barrier", lane: int = 0) -> None:
        call = "kvcomm.pcp.PcpLayer"
        if not isinstance(publisher, Publisher):
            raise invalid(call, -1, f"expected a kvcomm.Publisher, got {type(publisher).__name__}")
        rank = publisher.buffer.rank
        if mode not in ("publish", "replicate"):
            raise invalid(call, rank, f"mode {mode!r} is not 'publish' or 'replicate'")
        if then not in _THEN:
            raise invalid(call, rank, f"then {then!r} is not 'barrier', 'signal' or 'none'")
        places = list(places)
        if not places or not all(isinstance(p, Place) for p in places):
            raise invalid(call, rank, "places: a non-empty list of kvcomm.pcp.Place, one per input tensor")
        if mode == "replicate" and any(p.row_bytes is None or p.row_bytes <= 0 for p in places):
            raise invalid(call, rank, "mode 'replicate' reads rows back from the local replica: every Place needs "
                          "row_bytes")
        if any(p.block_size < 1 for p in places):
            raise invalid(call, rank, "a Place's block_size must be at least 1")
        self.publisher, self.places, self.mode, self.then, self.lane = publisher, places, mode, _THEN[then], lane
        self.rank, self.size = rank, publisher.buffer.size
        local = publisher.buffer.local()
        self.cache = local if isinstance(local, torch.Tensor) else torch.from_numpy(local)  # host: numpy, shared
        self.handle = kt.register(publisher)

    @classmethod
    def mla(cls, publisher: Publisher, offset: int, block_size: int, kv_lora_rank: int, rope_dim: int,
            element_size: int, **kwargs: Any) -> "PcpLayer":
        """MLA's latent cache as vLLM lays it out (``[num_blocks, block_size, kv_lora_rank + rope_dim]`` of
        `element_size`-byte elements at `offset`): kv_c_normed then k_pe in each token's row."""
        row = (kv_lora_rank + rope_dim) * element_size
        return cls(publisher, [Place(offset, block_size, 0, row, kv_lora_rank * element_size),
                               Place(offset + kv_lora_rank * element_size, block_size, 0, row,
                                     rope_dim * element_size)], **kwargs)

    def close(self) -> None:
        kt.unregister(self.handle)

    def __enter__(self) -> "PcpLayer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _rows(t: torch.Tensor) -> torch.Tensor:
    """`t` as rows of bytes the publish kernel reads (each row contiguous; rows may be strided)."""
    t = t.unsqueeze(1) if t.dim() == 1 else t.flatten(1)
    return t if t.stride(1) == 1 else t.contiguous()


def _publish(layer: PcpLayer, rows: Sequence[torch.Tensor], slots: torch.Tensor) -> None:
    p = layer.places
    torch.ops.kvcomm.publish_tensors(layer.handle, layer.cache, [_rows(r) for r in rows], slots,
                                     [x.offset for x in p], [x.block_size for x in p], [x.block_stride for x in p],
                                     [x.row_stride for x in p], layer.then, layer.lane)


def _share(layer: PcpLayer, n: int, slot_mapping: torch.Tensor, num_decode_tokens: int,
           call: str) -> Optional[torch.Tensor]:
    """This rank's slots in vLLM's expanded slot mapping (`n` tokens per rank), after vLLM's checks; None when vLLM
    would not gather (replicated drafts: the slot mapping is not expanded)."""
    if not 0 <= num_decode_tokens <= n:
        raise invalid(call, layer.rank, f"num_decode_tokens {num_decode_tokens} outside [0, {n}]")
    if slot_mapping.shape[0] <= n:
        return None
    if slot_mapping.shape[0] < layer.size * n:
        raise invalid(call, layer.rank, f"slot_mapping has {slot_mapping.shape[0]} entries: an expanded PCP mapping "
                      f"of {layer.size} ranks x {n} tokens needs {layer.size * n}")
    return slot_mapping[layer.rank * n:(layer.rank + 1) * n]


def gather_prefill_cache_inputs(tensors: Tuple[torch.Tensor, ...], slot_mapping: torch.Tensor, num_decode_tokens: int,
                                shard_decode_requests: bool = False, *, layer: PcpLayer
                                ) -> Tuple[Tuple[torch.Tensor, ...], torch.Tensor]:
    """vLLM's ``_gather_prefill_cache_inputs`` (same inputs, same return types): the rows vLLM would all-gather from
    every rank are this rank's share, published into every replica here (mode "publish"); the return value is what the
    caller's cache op writes locally: the replicated decode tokens vLLM keeps local too (nothing, in the PCP-only mode
    that shards decode requests). In mode "replicate" nothing is published here: the return value is this rank's own
    rows with their slots, and ``replicate_cache_rows`` with the same arguments follows the cache op."""
    call = "kvcomm.pcp.gather_prefill_cache_inputs"
    n = tensors[0].shape[0]
    if any(t.shape[0] != n for t in tensors):
        raise invalid(call, layer.rank, f"the tensors' token counts differ: {[t.shape[0] for t in tensors]}")
    if layer.mode == "publish" and len(tensors) != len(layer.places):
        raise invalid(call, layer.rank, f"{len(tensors)} tensors but the layer has {len(layer.places)} places: one "
                      "per tensor")
    mine = _share(layer, n, slot_mapping, num_decode_tokens, call)
    nd = num_decode_tokens
    if mine is None or (not shard_decode_requests and nd == n):  # vLLM gathers nothing either
        return tuple(t[:nd] for t in tensors), slot_mapping[:nd]
    if layer.mode == "replicate":
        if shard_decode_requests or nd == 0:
            return tuple(tensors), mine
        return tuple(tensors), torch.cat((slot_mapping[:nd], mine[nd:]))  # decode slots as vLLM takes them: rank 0's
    if shard_decode_requests:
        _publish(layer, tensors, mine)
        return tuple(t[:0] for t in tensors), slot_mapping[:0]
    _publish(layer, [t[nd:] for t in tensors], mine[nd:])
    return tuple(t[:nd] for t in tensors), slot_mapping[:nd]


def replicate_cache_rows(slot_mapping: torch.Tensor, num_tokens: int, num_decode_tokens: int,
                         shard_decode_requests: bool = False, *, layer: PcpLayer) -> None:
    """Mode "replicate", after the cache op wrote this rank's rows: copies the rows of this rank's share (the slots
    vLLM would have all-gathered) from the local replica into every peer's, then `then`. `num_tokens`: the rank's
    local token count (the tensors' first dimension). Does nothing where vLLM gathers nothing."""
    call = "kvcomm.pcp.replicate_cache_rows"
    if layer.mode != "replicate":
        raise invalid(call, layer.rank, "the layer's mode is 'publish': its rows were published by the gather call")
    mine = _share(layer, num_tokens, slot_mapping, num_decode_tokens, call)
    nd = num_decode_tokens
    if mine is None or (not shard_decode_requests and nd == num_tokens):
        return
    slots = mine if shard_decode_requests else mine[nd:]
    s = slots.clamp(min=0).to(torch.int64)  # padding (< 0) reads slot 0; the publish skips it
    rows: List[torch.Tensor] = []
    for p in layer.places:
        bstride = p.block_stride or p.block_size * (p.row_stride or p.row_bytes)
        rstride = p.row_stride or p.row_bytes
        base = p.offset + torch.div(s, p.block_size, rounding_mode="floor") * bstride + (s % p.block_size) * rstride
        idx = base.unsqueeze(1) + torch.arange(p.row_bytes, device=s.device)
        rows.append(layer.cache[idx])
    _publish(layer, rows, slots)


def maybe_gather_mla_latent_cache_inputs(kv_c_normed: torch.Tensor, k_pe: torch.Tensor,
                                         slot_mapping: Optional[torch.Tensor], num_decode_tokens: Optional[int],
                                         use_pcp: bool, pcp_shard_decode_requests: bool = False, *,
                                         layer: PcpLayer) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """vLLM's ``maybe_gather_mla_latent_cache_inputs`` over gather_prefill_cache_inputs (layer: ``PcpLayer.mla``)."""
    if not use_pcp or num_decode_tokens is None:
        return kv_c_normed, k_pe, slot_mapping
    if slot_mapping is None:
        raise invalid("kvcomm.pcp.maybe_gather_mla_latent_cache_inputs", layer.rank, "slot_mapping is None")
    n = kv_c_normed.shape[0]
    (c, pe), s = gather_prefill_cache_inputs((kv_c_normed, k_pe.reshape(n, -1)), slot_mapping, num_decode_tokens,
                                             pcp_shard_decode_requests, layer=layer)
    return c, pe.reshape(-1, *k_pe.shape[1:]), s


def maybe_gather_indexer_k(k: torch.Tensor, slot_mapping: torch.Tensor, num_decode_tokens: int, use_pcp: bool,
                           pcp_shard_decode_requests: bool = False, *,
                           layer: PcpLayer) -> Tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``maybe_gather_indexer_k`` over gather_prefill_cache_inputs. vLLM's indexer cache op quantizes `k`
    (``indexer_k_quant_and_cache``): use a layer in mode "replicate" (places: the key bytes and the scale bytes of
    the indexer cache) and ``replicate_cache_rows`` after the cache op."""
    if not use_pcp:
        return k, slot_mapping
    (out,), s = gather_prefill_cache_inputs((k,), slot_mapping, num_decode_tokens, pcp_shard_decode_requests,
                                            layer=layer)
    return out, s


__all__ = ["PcpLayer", "Place", "gather_prefill_cache_inputs", "maybe_gather_indexer_k",
           "maybe_gather_mla_latent_cache_inputs", "replicate_cache_rows"]
