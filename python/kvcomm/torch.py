"""kvcomm's stream-ordered calls as torch custom ops (``import kvcomm.torch``), so that ``torch.compile(fullgraph=True)``
traces them without a graph break and a captured CUDA graph replays them:

- ``torch.ops.kvcomm.publish(handle, cache, rows, slot_mapping, offset, block_size, then, lane)``: Publisher.publish of
  ``rows`` (row i at ``slot_mapping[i]``, < 0 skipped) into every replica; ``then`` 0 none, 1 barrier, 2 signal.
- ``torch.ops.kvcomm.publish_tensors(handle, cache, rows, slot_mapping, offsets, block_sizes, block_strides,
  row_strides, then, lane)``: the same for several tensors in one call (``rows`` a list; tensor k's rows land at
  ``offsets[k] + (slot // block_sizes[k]) * block_strides[k] + (slot % block_sizes[k]) * row_strides[k]``, strides 0
  as in CacheTensor), one kernel.
- ``torch.ops.kvcomm.barrier(handle, cache, kind, lane)``: Barrier.sync / signal / wait (``kind`` 0, 1, 2).
- ``torch.ops.kvcomm.fetch(handle, cache, src_ids, dst_ids, src_rank)``: Fetcher.fetch_device.
- ``torch.ops.kvcomm.endpoint_read(handle, cache, remote_ids, local_ids)`` and ``endpoint_write(...)``:
  Endpoint.read_device / write_device between a registration and a peer.

Objects never cross the op boundary: ``register(obj)`` (a Publisher, Barrier or Fetcher; for endpoints the tuple
``(endpoint, local_registration, remote)``) returns an integer handle the ops take; ``unregister(handle)`` forgets it.
Each op names the cache it writes (``cache``: the buffer's local view, or the registration's tensor) in
``mutates_args``, so the compiler keeps it and orders it with the cache's readers; the fake implementations return
nothing and touch nothing. Every op runs on torch's current stream. ``register_vllm_ops(direct_register_custom_op)``
registers the same ops through vLLM's helper for engines that use it.
"""

# No `from __future__ import annotations`: torch.library infers each op's schema from its real annotations.
import atexit
import itertools
import threading
from typing import Any, Callable, Dict, List

import torch

from ._barrier import Barrier
from ._endpoint import Endpoint
from ._errors import invalid
from ._fetch import Fetcher
from ._publish import CacheTensor, Publisher

_LOCK = threading.Lock()
_OBJECTS: Dict[int, Any] = {}
_NEXT = itertools.count(1)
_THEN = {0: "none", 1: "barrier", 2: "signal"}


@atexit.register
def _release_at_exit() -> None:
    """What is still registered at interpreter exit is released then (its destructors run while the extension is
    alive), not reported by the extension's teardown as leaked."""
    with _LOCK:
        _OBJECTS.clear()


def register(obj: Any) -> int:
    """An integer handle for `obj` (a Publisher, Barrier or Fetcher, or (endpoint, local registration, remote)) that
    the ops take; the object stays alive until unregister(handle)."""
    ok = isinstance(obj, (Publisher, Barrier, Fetcher)) or (
        isinstance(obj, tuple) and len(obj) == 3 and isinstance(obj[0], Endpoint))
    if not ok:
        raise invalid("kvcomm.torch.register", -1, "expected a Publisher, Barrier, Fetcher or (endpoint, registration, "
                      f"remote), got {type(obj).__name__}")
    with _LOCK:
        h = next(_NEXT)
        _OBJECTS[h] = obj
    return h


def unregister(handle: int) -> None:
    with _LOCK:
        _OBJECTS.pop(handle, None)


def _get(handle: int, kind: Any, op: str) -> Any:
    obj = _OBJECTS.get(handle)
    if obj is None or not isinstance(obj, kind):
        raise invalid(f"torch.ops.kvcomm.{op}", -1, f"handle {handle} is not a registered "
                      f"{getattr(kind, '__name__', 'endpoint pair')} (kvcomm.torch.register)")
    return obj


def _stream(t: torch.Tensor) -> Any:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


# ---- the ops' bodies (eager) and fakes ----------------------------------------------------------------------------


def _publish(handle: int, cache: torch.Tensor, rows: torch.Tensor, slot_mapping: torch.Tensor, offset: int,
             block_size: int, then: int, lane: int) -> None:
    pub = _get(handle, Publisher, "publish")
    pub.publish(CacheTensor(rows, offset=offset, block_size=block_size), slot_mapping, stream=_stream(cache),
                then=_THEN.get(then, then), lane=lane)


def _publish_tensors(handle: int, cache: torch.Tensor, rows: List[torch.Tensor], slot_mapping: torch.Tensor,
                     offsets: List[int], block_sizes: List[int], block_strides: List[int], row_strides: List[int],
                     then: int, lane: int) -> None:
    pub = _get(handle, Publisher, "publish_tensors")
    n = len(rows)
    if not (len(offsets) == len(block_sizes) == len(block_strides) == len(row_strides) == n):
        raise invalid("torch.ops.kvcomm.publish_tensors", -1, f"{n} row tensors but {len(offsets)} offsets, "
                      f"{len(block_sizes)} block_sizes, {len(block_strides)} block_strides and {len(row_strides)} "
                      "row_strides: one of each per tensor")
    tensors = [CacheTensor(r, offset=o, block_size=b, block_stride=bs, row_stride=rs)
               for r, o, b, bs, rs in zip(rows, offsets, block_sizes, block_strides, row_strides)]
    pub.publish(tensors, slot_mapping, stream=_stream(cache), then=_THEN.get(then, then), lane=lane)


def _barrier(handle: int, cache: torch.Tensor, kind: int, lane: int) -> None:
    bar = _get(handle, Barrier, "barrier")
    fn = {0: bar.sync, 1: bar.signal, 2: bar.wait}.get(kind)
    if fn is None:
        raise invalid("torch.ops.kvcomm.barrier", -1, f"kind {kind} is not 0 (sync), 1 (signal) or 2 (wait)")
    fn(stream=_stream(cache), lane=lane)


def _fetch(handle: int, cache: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor, src_rank: int) -> None:
    _get(handle, Fetcher, "fetch").fetch_device(src_ids, dst_ids, src_rank, stream=_stream(cache))


def _endpoint(handle: int, cache: torch.Tensor, remote_ids: torch.Tensor, local_ids: torch.Tensor, push: bool) -> None:
    ep, local, remote = _get(handle, tuple, "endpoint_write" if push else "endpoint_read")
    (ep.write_device if push else ep.read_device)(local, remote, remote_ids, local_ids, stream=_stream(cache))


def _endpoint_read(handle: int, cache: torch.Tensor, remote_ids: torch.Tensor, local_ids: torch.Tensor) -> None:
    _endpoint(handle, cache, remote_ids, local_ids, False)


def _endpoint_write(handle: int, cache: torch.Tensor, remote_ids: torch.Tensor, local_ids: torch.Tensor) -> None:
    _endpoint(handle, cache, remote_ids, local_ids, True)


_OPS = {
    "publish": (_publish, ("cache",),
                "(int handle, Tensor(a!) cache, Tensor rows, Tensor slot_mapping, int offset, int block_size, int then, "
                "int lane) -> ()"),
    "publish_tensors": (_publish_tensors, ("cache",),
                        "(int handle, Tensor(a!) cache, Tensor[] rows, Tensor slot_mapping, int[] offsets, "
                        "int[] block_sizes, int[] block_strides, int[] row_strides, int then, int lane) -> ()"),
    "barrier": (_barrier, ("cache",), "(int handle, Tensor(a!) cache, int kind, int lane) -> ()"),
    "fetch": (_fetch, ("cache",),
              "(int handle, Tensor(a!) cache, Tensor src_ids, Tensor dst_ids, int src_rank) -> ()"),
    "endpoint_read": (_endpoint_read, ("cache",),
                      "(int handle, Tensor(a!) cache, Tensor remote_ids, Tensor local_ids) -> ()"),
    "endpoint_write": (_endpoint_write, ("cache",),
                       "(int handle, Tensor(a!) cache, Tensor remote_ids, Tensor local_ids) -> ()"),
}


def _fake(*args: Any, **kwargs: Any) -> None:
    return None


def _register_all() -> None:
    for name, (fn, mutates, _) in _OPS.items():
        op = torch.library.custom_op(f"kvcomm::{name}", mutates_args=mutates)(fn)
        op.register_fake(_fake)


_LIBRARIES = []  # an op lives as long as its library object


def register_vllm_ops(direct_register_custom_op: Callable[..., Any], namespace: str = "kvcomm_vllm") -> None:
    """Registers the same ops through vLLM's ``direct_register_custom_op`` (``vllm.utils.torch_utils``, as vLLM
    registers ``unified_kv_cache_update``), under torch.ops.<namespace>, dispatched to the current platform's key."""
    lib = torch.library.Library(namespace, "FRAGMENT")
    for name, (fn, mutates, _) in _OPS.items():
        direct_register_custom_op(op_name=name, op_func=fn, mutates_args=list(mutates), fake_impl=_fake,
                                  target_lib=lib)
    _LIBRARIES.append(lib)


_register_all()

__all__ = ["register", "register_vllm_ops", "unregister"]
