"""Publisher: every producer stores its final KV rows into every replica of a SymmetricBuffer, then one barrier.

Everything an array can get wrong (dtype, layout, device, size) is checked here before the library sees a pointer;
the library then checks offsets, strides and slots against the backed memory. A refused call writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Union

from . import _kvcomm, limits
from ._arrays import SLOT_TYPES, ArrayView, int64_list, is_int_list, require
from ._barrier import Barrier
from ._device_errors import DeviceErrors
from ._errors import I32, check_count, check_int, count_of, invalid
from ._stream import stream_handle
from ._symm import MemoryKind, SymmetricBuffer

PublishMode = _kvcomm.PublishMode
PublishThen = _kvcomm.PublishThen

# What publish(then=...) accepts: the names, or a PublishThen.
_THEN = {"none": PublishThen.Nothing, "barrier": PublishThen.Barrier, "signal": PublishThen.Signal}


def _then(then: Any, call: str, rank: int) -> "_kvcomm.PublishThen":
    if isinstance(then, PublishThen):
        return then
    if isinstance(then, str) and then in _THEN:
        return _THEN[then]
    raise invalid(call, rank, f"then must be 'none', 'barrier' or 'signal' (or a kvcomm.PublishThen), got {then!r}")


@dataclass
class CacheTensor:
    """One cache tensor of a publish call: rows from `src`, destinations in the buffer (bytes).

    Row i of `src` (``src[i]``, all dimensions but the first; contiguous, any dtype: bytes are opaque) lands in every
    replica at ``offset + (slot // block_size) * block_stride + (slot % block_size) * row_stride`` with
    ``slot = slot_mapping[i]``. block_stride 0 means ``block_size * row_stride``, row_stride 0 means the row's bytes.
    `row_bytes`, if given, is checked against the rows of `src`.
    """

    src: Any
    offset: int = 0
    block_size: int = 1
    block_stride: int = 0
    row_stride: int = 0
    row_bytes: Optional[int] = None


def _stream_handle(stream: Any, buffer: SymmetricBuffer, call: str) -> int:
    return stream_handle(stream, buffer.kind == MemoryKind.Cuda, buffer.device, buffer.rank, call)


class Publisher(DeviceErrors):
    """Publication into a SymmetricBuffer's replicas, and its barrier.

    Call order: ``Publisher(buffer)`` once, collectively. Per step, on every member: ``publish()`` for each layer, the
    last one with ``then="barrier"`` (or ``barrier.sync()`` after it) before anyone reads peers' rows; or
    ``then="signal"`` and ``barrier.wait()`` just before the reads, so the round trip overlaps other work. On CUDA
    buffers both run on a stream (default: torch's current stream) without host synchronisation and can be captured in a
    CUDA graph (torch.cuda.graph); source arrays must stay alive until the stream has run. After the stream
    finished, ``check_errors()`` raises slots found out of range on the device and barrier timeouts. On host buffers
    every call is synchronous and a bad slot is refused before anything is written.
    """

    def __init__(self, buffer: SymmetricBuffer, lanes: int = 2, barrier_timeout_ms: int = -1,
                 staging_tokens: int = 4096, staging_bytes_per_token: int = 1024) -> None:
        """Collective over the buffer's group; picks Direct or Fallback (KVCOMM_DIRECT)."""
        if not isinstance(buffer, SymmetricBuffer):
            raise invalid("Publisher", -1, f"expected a kvcomm.SymmetricBuffer, got {type(buffer).__name__}")
        lanes = check_count(lanes, "lanes", "Publisher", buffer.rank, limits.MAX_BARRIER_LANES, "MAX_BARRIER_LANES")
        barrier_timeout_ms = check_int(barrier_timeout_ms, "barrier_timeout_ms", "Publisher", buffer.rank, 1 << 63,
                                       -(1 << 63))
        staging_tokens = check_int(staging_tokens, "staging_tokens", "Publisher", buffer.rank)
        staging_bytes_per_token = check_int(staging_bytes_per_token, "staging_bytes_per_token", "Publisher",
                                            buffer.rank)
        self._buffer = buffer
        self._native = _kvcomm.Publisher.create(buffer._native, lanes, barrier_timeout_ms, staging_tokens,
                                                staging_bytes_per_token)
        self._barrier = Barrier._borrowed(self._native.barrier)

    @classmethod
    def create(cls, buffer: SymmetricBuffer, lanes: int = 2, barrier_timeout_ms: int = -1,
               staging_tokens: int = 4096, staging_bytes_per_token: int = 1024) -> "Publisher":
        """``Publisher(buffer, ...)``, spelt as every collective object's factory is (``Barrier.create``,
        ``Fetcher.create``, ``SymmetricBuffer.create``, ``Arena.create``)."""
        return cls(buffer, lanes, barrier_timeout_ms, staging_tokens, staging_bytes_per_token)

    @property
    def barrier(self) -> Barrier:
        """The publisher's barrier (``sync()``, ``signal()``, ``wait()``, ``device_handle()``, errors), borrowed: it
        keeps the publisher alive. Every call on it refuses a closed buffer. In Fallback mode it is a collective (a
        small NCCL or bootstrap allgather): ``sync()`` and ``signal()`` run the whole of it, ``wait()`` only checks
        its lane, ``device_handle()`` raises InvalidArgumentError."""
        return self._barrier

    @property
    def buffer(self) -> SymmetricBuffer:
        return self._buffer

    @property
    def mode(self) -> "_kvcomm.PublishMode":
        return self._native.mode

    @property
    def mode_reason(self) -> str:
        """Why this mode was chosen."""
        return self._native.mode_reason

    # ---- validation ----
    def _array(self, obj: Any, name: str, call: str, **rules: Any) -> ArrayView:
        """`obj` checked by _arrays.require() (the one place arrays are accepted) for this buffer's device."""
        b = self._buffer
        cuda = b.kind == MemoryKind.Cuda
        return require(obj, name, call, b.rank, device="cuda" if cuda else "cpu", device_id=b.device if cuda else -1,
                       device_why=f"the buffer is {'CUDA' if cuda else 'host'} memory: it needs "
                       f"'{'cuda' if cuda else 'cpu'}' arrays",
                       expected="a torch tensor, a numpy array, or a DLPack / __cuda_array_interface__ object",
                       **rules)

    def _prepare(self, tensors: Union[CacheTensor, Sequence[CacheTensor]], slot_mapping: Any,
                 num_tokens: Optional[int], call: str) -> tuple:
        rank = self._buffer.rank
        if isinstance(tensors, CacheTensor):
            tensors = [tensors]
        if isinstance(tensors, (str, bytes)) or not hasattr(tensors, "__iter__"):
            raise invalid(call, rank, f"tensors must be a CacheTensor or a list of them, got {type(tensors).__name__}")
        cap = limits.MAX_PUBLISH_TENSORS
        count_of(tensors, "tensors", call, rank, cap, "MAX_PUBLISH_TENSORS")
        listed = []
        for t in tensors:
            if len(listed) == cap:
                raise invalid(call, rank, f"more than kvcomm.limits.MAX_PUBLISH_TENSORS = {cap} tensors")
            listed.append(t)
        tensors = listed
        if not tensors:
            raise invalid(call, rank, "no tensors: at least one CacheTensor is needed")
        if is_int_list(slot_mapping):  # converted like fetch's list ids; host memory, so only host buffers
            if self._buffer.kind == MemoryKind.Cuda:
                raise invalid(call, rank, "slot_mapping: a Python list lives in host memory, but the buffer is CUDA "
                              "memory: pass an int64 or int32 CUDA tensor")
            slot_mapping = int64_list(slot_mapping, "slot_mapping", "slot", call, rank)
        slots = self._array(slot_mapping, "slot_mapping", call, dtypes=SLOT_TYPES, dtype_text="int64 or int32",
                            ndim=1, layout="contiguous", aligned=True)
        n = slots.shape[0]
        if num_tokens is not None:
            n = check_int(num_tokens, "num_tokens", call, rank, 1 << 63, -(1 << 63))
        if n < 0 or n > slots.shape[0]:
            raise invalid(call, rank, f"num_tokens {n} outside [0, {slots.shape[0]}] (slot_mapping's length)")
        raw: List[tuple] = []
        keep: List[ArrayView] = [slots]
        for k, t in enumerate(tensors):
            if not isinstance(t, CacheTensor):
                raise invalid(call, rank, f"tensor {k}: expected a kvcomm.CacheTensor, got {type(t).__name__}")
            v = self._array(t.src, f"tensor {k} (src)", call, min_ndim=1, layout="rows")
            keep.append(v)
            if v.rows < n:
                raise invalid(call, rank, f"tensor {k}: src has {v.rows} rows but num_tokens is {n}: kvcomm would "
                              "read past its end")
            row_bytes = v.row_bytes
            if row_bytes == 0:
                raise invalid(call, rank, f"tensor {k}: rows of src are empty (shape {v.shape})")
            if t.row_bytes is not None and t.row_bytes != row_bytes:
                raise invalid(call, rank, f"tensor {k}: rows of src hold {row_bytes} bytes, row_bytes says "
                              f"{t.row_bytes}")
            src_stride = v.strides[0] if v.rows > 1 else row_bytes
            if src_stride < row_bytes:
                raise invalid(call, rank, f"tensor {k}: src rows overlap or run backwards (row stride "
                              f"{src_stride} bytes, rows of {row_bytes} bytes)")
            geometry = [check_int(getattr(t, field), f"tensor {k}: {field}", call, rank)
                        for field in ("offset", "block_size", "block_stride", "row_stride")]
            if geometry[1] < 1:
                raise invalid(call, rank, f"tensor {k}: block_size must be at least 1")
            raw.append((v.ptr, src_stride, row_bytes, *geometry))
        return raw, slots.ptr, slots.itemsize == 8, slots.shape[0], n, keep

    # ---- operations ----
    def publish(self, tensors: Union[CacheTensor, Sequence[CacheTensor]], slot_mapping: Any, *,
                num_tokens: Optional[int] = None, stream: Any = None, then: Any = "none", lane: int = 0) -> None:
        """Stores row i of every tensor at slot_mapping[i] (< 0: padding, skipped) in every replica, then runs `then`
        on `lane`: "none", "barrier" (the whole barrier: every member's rows are visible when it returns, in stream
        order) or "signal" (its first half: pair it with ``barrier.wait()`` just before the rows are read). In Direct
        mode on CUDA the barrier is fused into the publish kernel.

        slot_mapping: 1-D contiguous int64 or int32 array on the buffer's device (host buffers: also a Python list
        of ints, converted to int64); num_tokens defaults to its length, and every src must have at least that many
        rows. stream: an int handle, a torch/CuPy stream, or None for torch's current stream (CUDA buffers only)."""
        call = "Publisher.publish"
        rank = self._buffer.rank
        how = _then(then, call, rank)
        lane = check_int(lane, "lane", call, rank, I32)
        raw, slots, slot64, count, n, keep = self._prepare(tensors, slot_mapping, num_tokens, call)
        s = _stream_handle(stream, self._buffer, call)
        self._native._publish(raw, slots, slot64, count, n, s, how, lane)
        del keep

    def __repr__(self) -> str:
        return f"kvcomm.Publisher(mode={self.mode.name}, buffer={self._buffer!r})"
