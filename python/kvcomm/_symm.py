"""SymmetricBuffer: symmetric memory whose regions (this rank's and each same-host peer's) are zero-copy arrays."""

from __future__ import annotations

import sys
from typing import Any, Iterable, List, Optional, Tuple, Union

from . import _kvcomm
from ._errors import I32, U64, check_int, invalid

MemoryKind = _kvcomm.MemoryKind
Communicator = _kvcomm.Communicator

_KINDS = {"auto": MemoryKind.Auto, "cuda": MemoryKind.Cuda, "host": MemoryKind.Host}


def _kind(kind: Union[str, "_kvcomm.MemoryKind"], call: str, rank: int) -> "_kvcomm.MemoryKind":
    if isinstance(kind, MemoryKind):
        return kind
    k = _KINDS.get(str(kind).lower())
    if k is None:
        raise invalid(call, rank, f"kind {kind!r} is not one of 'auto', 'cuda', 'host'")
    return k


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
        self._native = native

    # ---- creation (collective) ----
    @classmethod
    def create(cls, comm: Communicator, capacity: int, initial_bytes: Optional[int] = None,
               kind: Union[str, "_kvcomm.MemoryKind"] = "auto") -> "SymmetricBuffer":
        """Reserves `capacity` bytes per member and maps the first `initial_bytes` (default: all) everywhere."""
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
        if not isinstance(base, int):
            raise invalid("SymmetricBuffer.adopt", comm.rank, "base must be an address (int)")
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
        return [(check_int(o, "range offset", call, self.rank), check_int(b, "range bytes", call, self.rank))
                for o, b in ranges]

    def close(self) -> None:
        """Unmaps peer windows, then releases this rank's memory (local; idempotent)."""
        self._native.close()

    def __enter__(self) -> "SymmetricBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- views ----
    def _view(self, rank: int, offset: int, nbytes: Optional[int], dtype: Any, framework: Optional[str]) -> Any:
        call = "SymmetricBuffer.local" if rank == self.rank else "SymmetricBuffer.peer"
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
        fw = framework or _default_framework(self.kind == MemoryKind.Cuda)
        raw = self._native._region_view(rank, offset, nbytes, fw)
        if dtype is None:
            return raw
        return raw.view(dtype)

    def local(self, dtype: Any = None, offset: int = 0, nbytes: Optional[int] = None,
              framework: Optional[str] = None) -> Any:
        """This rank's memory [offset, offset + nbytes) (default: to the end of the backed range) as a 1-D uint8
        array, or viewed as `dtype` (numpy or torch dtype). framework: 'numpy', 'torch' or 'dlpack'."""
        return self._view(self.rank, offset, nbytes, dtype, framework)

    def peer(self, rank: int, dtype: Any = None, offset: int = 0, nbytes: Optional[int] = None,
             framework: Optional[str] = None) -> Any:
        """Member `rank`'s memory as mapped here (same arguments as local())."""
        return self._view(rank, offset, nbytes, dtype, framework)

    def peer_table(self, framework: Optional[str] = None) -> Any:
        """uint64[size] of member base addresses (0 = not mapped) at a stable address (device memory on CUDA); torch
        tensors get the same words as int64."""
        return self._native._table_view(False, framework or _default_framework(self.kind == MemoryKind.Cuda))

    def backed_bitmap(self, framework: Optional[str] = None) -> Any:
        """uint64 words (int64 for torch); bit g % 64 of word g / 64 says whether granule g is backed on every
        member."""
        return self._native._table_view(True, framework or _default_framework(self.kind == MemoryKind.Cuda))

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
