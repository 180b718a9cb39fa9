"""SymmetricBuffer: symmetric memory whose regions (this rank's and each same-host peer's) are zero-copy arrays."""

from __future__ import annotations

import sys
from typing import Any, Iterable, List, Optional, Tuple, Union

import numpy as np

from . import _kvcomm, limits
from ._errors import I32, U64, UnsupportedError, check_int, count_of, invalid, shown

MemoryKind = _kvcomm.MemoryKind
Communicator = _kvcomm.Communicator

_KINDS = {"auto": MemoryKind.Auto, "cuda": MemoryKind.Cuda, "host": MemoryKind.Host}


def _kind(kind: Union[str, "_kvcomm.MemoryKind"], call: str, rank: int) -> "_kvcomm.MemoryKind":
    """A kvcomm.MemoryKind member or its name ('auto', 'cuda', 'host'); an int (even a member's value) or anything
    else is refused, naming the value."""
    if isinstance(kind, MemoryKind):
        return kind
    k = _KINDS.get(kind.lower()) if isinstance(kind, str) else None
    if k is None:
        raise invalid(call, rank, f"kind {shown(kind)} is not one of 'auto', 'cuda', 'host' (or a kvcomm.MemoryKind)")
    return k


def _communicator(comm: Any, call: str) -> Communicator:
    if not isinstance(comm, Communicator):
        raise invalid(call, -1, f"comm must be a kvcomm.Communicator, got {type(comm).__name__}")
    return comm


_FRAMEWORKS = ("numpy", "torch", "dlpack")


def _default_framework(cuda: bool) -> str:
    if not cuda:
        return "numpy"
    if "torch" in sys.modules:
        return "torch"
    try:
        import torch  # noqa: F401
    except ImportError:
        return "dlpack"
    return "torch"


class SymmetricBuffer:
    """One region per member of a communicator, each mapped into every same-host member at a stable address.

    Call order (collective calls on every member, in the same order): ``create`` (or ``adopt``), then ``grow``
    (created) or ``commit``/``release`` (adopted) as often as needed, then ``close()`` or dropping the last reference
    (a Publisher holds one). ``local()`` and ``peer(r)`` are zero-copy views: numpy arrays on host memory, torch
    tensors (or DLPack objects without torch) on CUDA memory. A view keeps the buffer alive; after an explicit
    ``close()`` views must no longer be used.
    """

    def __init__(self, native: "_kvcomm.SymmetricBuffer") -> None:
        """Wraps a native buffer; use create() or adopt()."""
        if not isinstance(native, _kvcomm.SymmetricBuffer):
            raise invalid("SymmetricBuffer", -1, "SymmetricBuffer(...) wraps a native buffer: use "
                          f"SymmetricBuffer.create() or adopt() (got {type(native).__name__})")
        self._native = native

    # ---- creation (collective) ----
    @classmethod
    def create(cls, comm: Communicator, capacity: int, initial_bytes: Optional[int] = None,
               kind: Union[str, "_kvcomm.MemoryKind"] = "auto") -> "SymmetricBuffer":
        """Reserves `capacity` bytes per member and maps the first `initial_bytes` (default: all) everywhere."""
        comm = _communicator(comm, "SymmetricBuffer.create")
        if initial_bytes is None:
            initial_bytes = capacity
        capacity = check_int(capacity, "capacity", "SymmetricBuffer.create", comm.rank)
        initial_bytes = check_int(initial_bytes, "initial_bytes", "SymmetricBuffer.create", comm.rank)
        return cls(_kvcomm.SymmetricBuffer.create(comm, capacity, initial_bytes,
                                                    _kind(kind, "SymmetricBuffer.create", comm.rank)))

    @classmethod
    def adopt(cls, comm: Communicator, base: Any, reserved_bytes: int,
              kind: Union[str, "_kvcomm.MemoryKind"] = "auto") -> "SymmetricBuffer":
        """Adopts the range the engine reserved at `base` (an int address); nothing is mapped until commit()."""
        comm = _communicator(comm, "SymmetricBuffer.adopt")
        if isinstance(base, bool) or not isinstance(base, int):
            raise invalid("SymmetricBuffer.adopt", comm.rank, f"base must be an address (int), got {shown(base)}")
        base = check_int(base, "base", "SymmetricBuffer.adopt", comm.rank)
        reserved_bytes = check_int(reserved_bytes, "reserved_bytes", "SymmetricBuffer.adopt", comm.rank)
        return cls(_kvcomm.SymmetricBuffer.adopt(comm, base, reserved_bytes,
                                                   _kind(kind, "SymmetricBuffer.adopt", comm.rank)))

    # ---- changes (collective) ----
    def grow(self, new_bytes: int) -> None:
        """Maps up to `new_bytes` everywhere; addresses and existing bytes stay."""
        self._native.grow(check_int(new_bytes, "new_bytes", "SymmetricBuffer.grow", self.rank))

    def commit(self, ranges: Iterable[Tuple[int, int]]) -> None:
        """The engine mapped memory at these (offset, bytes) ranges; peers map the same ranges."""
        self._native.commit(self._ranges(ranges, "SymmetricBuffer.commit"))

    def release(self, ranges: Iterable[Tuple[int, int]]) -> None:
        """Peers unmap these committed ranges."""
        self._native.release(self._ranges(ranges, "SymmetricBuffer.release"))

    def _ranges(self, ranges: Iterable[Tuple[int, int]], call: str) -> List[Tuple[int, int]]:
        rank, cap = self.rank, limits.MAX_BUFFER_RANGES
        if isinstance(ranges, (str, bytes)) or not hasattr(ranges, "__iter__"):
            raise invalid(call, rank, f"ranges must be a list of (offset, bytes) pairs, got {type(ranges).__name__}")
        count_of(ranges, "ranges", call, rank, cap, "MAX_BUFFER_RANGES")
        out = []
        for k, r in enumerate(ranges):
            if k >= cap:
                raise invalid(call, rank, f"more than kvcomm.limits.MAX_BUFFER_RANGES = {cap} ranges")
            if not isinstance(r, (tuple, list)) or len(r) != 2:
                raise invalid(call, rank, f"range {k}: expected an (offset, bytes) pair, got {shown(r)}")
            out.append((check_int(r[0], f"range {k}: offset", call, rank),
                        check_int(r[1], f"range {k}: bytes", call, rank)))
        return out

    def close(self) -> None:
        """Unmaps peer windows, then releases this rank's memory (local; idempotent)."""
        self._native.close()

    def __enter__(self) -> "SymmetricBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- views ----
    def _view(self, call: str, rank: int, offset: int, nbytes: Optional[int], dtype: Any,
              framework: Optional[str]) -> Any:
        rank = check_int(rank, "rank", call, self.rank, I32)
        offset = check_int(offset, "offset", call, self.rank)
        if nbytes is not None:
            nbytes = check_int(nbytes, "nbytes", call, self.rank)
        if nbytes is None:
            nbytes = 0
            for o, b in self._native.backed_ranges():
                if o <= offset < o + b:
                    nbytes = o + b - offset
            if nbytes == 0:
                if self._native.peer_table_ptr() == 0:  # the tables are freed at close(): nothing is backed
                    raise invalid(call, self.rank, "the buffer is closed")
                raise invalid(call, self.rank, f"offset {offset} is not inside backed memory")
        fw = self._framework(framework, call)
        view_dtype, itemsize = self._dtype(dtype, fw, call)
        if itemsize > 1 and nbytes % itemsize != 0:
            raise invalid(call, self.rank, f"nbytes {nbytes} is not a multiple of {itemsize} bytes, the size of "
                          f"dtype {view_dtype}")
        raw = self._native._region_view(rank, offset, nbytes, fw)
        if view_dtype is None:
            return raw
        return raw.view(view_dtype)

    def _framework(self, framework: Any, call: str) -> str:
        cuda = self.kind == MemoryKind.Cuda
        if framework is None:
            return _default_framework(cuda)
        if not isinstance(framework, str) or framework not in _FRAMEWORKS:
            raise invalid(call, self.rank, f"framework {shown(framework)} is not one of 'numpy', 'torch', 'dlpack'")
        if framework == "numpy" and cuda:
            raise invalid(call, self.rank, "framework 'numpy' cannot view CUDA memory: use 'torch' or 'dlpack'")
        if framework == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                raise UnsupportedError(f"kvcomm [rank {self.rank}] {call}: framework 'torch' needs torch, which "
                                       "is not installed") from None
        return framework

    def _dtype(self, dtype: Any, framework: str, call: str) -> Tuple[Any, int]:
        """The dtype a view is cast to (None: uint8 as it is) and its size, or InvalidArgumentError."""
        if dtype is None:
            return None, 1
        if framework == "dlpack":
            raise invalid(call, self.rank, "dtype: a DLPack view is uint8; view it as another dtype in the framework "
                          "that imports it")
        if framework == "torch":
            torch = sys.modules.get("torch")
            if torch is None or not isinstance(dtype, torch.dtype):
                raise invalid(call, self.rank, f"dtype {shown(dtype)} is not a torch.dtype (torch views)")
            return dtype, torch.empty((), dtype=dtype).element_size()
        try:
            dt = np.dtype(dtype)
        except (TypeError, ValueError) as e:
            raise invalid(call, self.rank, f"dtype {shown(dtype)} is not a numpy dtype ({e})") from None
        if dt.hasobject or dt.itemsize == 0:
            raise invalid(call, self.rank, f"dtype {dt} cannot view memory (Python objects or no size)")
        return dt, dt.itemsize

    def local(self, dtype: Any = None, offset: int = 0, nbytes: Optional[int] = None,
              framework: Optional[str] = None) -> Any:
        """This rank's memory [offset, offset + nbytes) (default: to the end of the backed range) as a 1-D uint8
        array, or viewed as `dtype` (numpy or torch dtype). framework: 'numpy', 'torch' or 'dlpack'."""
        return self._view("SymmetricBuffer.local", self.rank, offset, nbytes, dtype, framework)

    def peer(self, rank: int, dtype: Any = None, offset: int = 0, nbytes: Optional[int] = None,
             framework: Optional[str] = None) -> Any:
        """Member `rank`'s memory as mapped here (same arguments as local())."""
        return self._view("SymmetricBuffer.peer", rank, offset, nbytes, dtype, framework)

    def peer_table(self, framework: Optional[str] = None) -> Any:
        """uint64[size] of member base addresses (0 = not mapped) at a stable address (device memory on CUDA); torch
        tensors get the same words as int64."""
        return self._native._table_view(False, self._framework(framework, "SymmetricBuffer.peer_table"))

    def backed_bitmap(self, framework: Optional[str] = None) -> Any:
        """uint64 words (int64 for torch); bit g % 64 of word g / 64 says whether granule g is backed on every
        member."""
        return self._native._table_view(True, self._framework(framework, "SymmetricBuffer.backed_bitmap"))

    # ---- queries ----
    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def size(self) -> int:
        return self._native.size

    @property
    def capacity(self) -> int:
        return self._native.capacity

    @property
    def mapped_bytes(self) -> int:
        """Bytes backed on every member (mapped prefix, or committed bytes of an adopted buffer)."""
        return self._native.mapped_bytes

    @property
    def generation(self) -> int:
        """Increments with every grow/commit/release."""
        return self._native.generation

    @property
    def granularity(self) -> int:
        return self._native.granularity

    @property
    def kind(self) -> "_kvcomm.MemoryKind":
        """MemoryKind.Cuda or MemoryKind.Host (never Auto once created)."""
        return self._native.kind

    @property
    def device(self) -> int:
        """CUDA ordinal of a CUDA buffer (0 for host buffers)."""
        return self._native.device

    @property
    def adopted(self) -> bool:
        return self._native.adopted

    @property
    def handle_type(self) -> str:
        """'posix_fd', 'fabric', 'cuda_ipc' or 'memfd'."""
        return self._native.handle_type

    @property
    def communicator(self) -> Communicator:
        return self._native.communicator

    def is_mapped(self, rank: int) -> bool:
        return self._native.is_mapped(check_int(rank, "rank", "SymmetricBuffer.is_mapped", self.rank, I32))

    def is_backed(self, offset: int, nbytes: int) -> bool:
        call = "SymmetricBuffer.is_backed"
        return self._native.is_backed(check_int(offset, "offset", call, self.rank, U64),
                                      check_int(nbytes, "nbytes", call, self.rank, U64))

    def backed_ranges(self) -> List[Tuple[int, int]]:
        return self._native.backed_ranges()

    def local_ptr(self) -> int:
        return self._native.local_ptr()

    def peer_ptr(self, rank: int) -> int:
        return self._native.peer_ptr(check_int(rank, "rank", "SymmetricBuffer.peer_ptr", self.rank, I32))

    def peer_table_ptr(self) -> int:
        return self._native.peer_table_ptr()

    def backed_bitmap_ptr(self) -> int:
        return self._native.backed_bitmap_ptr()

    def __repr__(self) -> str:
        return (f"kvcomm.SymmetricBuffer(rank={self.rank}, size={self.size}, kind={self.kind.name}, "
                f"mapped_bytes={self.mapped_bytes}, capacity={self.capacity})")
