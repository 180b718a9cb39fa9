"""Barrier: a system-scope release/acquire barrier among the members of a communicator, as its own object."""

from __future__ import annotations

from typing import Any, Union

from . import _kvcomm, limits
from ._device_errors import DeviceErrors
from ._errors import I32, check_count, check_int, invalid
from ._stream import stream_handle
from ._symm import Communicator, MemoryKind, _kind


class Barrier(DeviceErrors):
    """A release/acquire barrier among the members of a communicator (every member must map every other: one host,
    P2P between the GPUs).

    ``signal(lane)`` releases everything the stream did before (stores into peers' memory included); ``wait(lane)``
    returns, in stream order, once every member signalled the same epoch on that lane (acquire); ``sync(lane)``
    is both in one launch. Per lane the calls alternate signal, wait (sync counts as both). On CUDA memory the
    calls enqueue kernels on a stream (default: torch's current stream) and can be captured in a CUDA graph; waits
    are bounded, and ``check_errors()`` raises a timeout the device recorded. On host memory the calls run on the
    calling thread (streams are ignored) and raise ``kvcomm.TimeoutError`` themselves.

    Call order: ``Barrier(comm)`` on every member (collective), then the same per-lane sequence of calls on every
    member, then ``check_errors()`` after synchronising the stream.
    """

    def __init__(self, comm: Communicator, lanes: int = 2, timeout_ms: int = -1,
                 kind: Union[str, "_kvcomm.MemoryKind"] = "auto") -> None:
        """Collective over `comm`. lanes: 1..8 independent epoch sequences, the same on every member; timeout_ms < 0:
        KVCOMM_BARRIER_TIMEOUT_MS (0 is 1 ms, above a day is a day); kind: 'auto' (CUDA with a current CUDA context),
        'cuda' or 'host', the same on every member."""
        if not isinstance(comm, Communicator):
            raise invalid("Barrier", -1, f"expected a kvcomm.Communicator, got {type(comm).__name__}")
        lanes = check_count(lanes, "lanes", "Barrier", comm.rank, limits.MAX_BARRIER_LANES, "MAX_BARRIER_LANES")
        timeout_ms = check_int(timeout_ms, "timeout_ms", "Barrier", comm.rank, 1 << 63, -(1 << 63))
        self._native = _kvcomm.Barrier.create(comm, lanes, timeout_ms, _kind(kind, "Barrier", comm.rank))

    @classmethod
    def _borrowed(cls, native: "_kvcomm.Barrier") -> "Barrier":
        """A Barrier on a native one another object owns (a Publisher's barrier)."""
        b = cls.__new__(cls)
        b._native = native
        return b

    @classmethod
    def create(cls, comm: Communicator, lanes: int = 2, timeout_ms: int = -1,
               kind: Union[str, "_kvcomm.MemoryKind"] = "auto") -> "Barrier":
        """Same as ``Barrier(comm, ...)``."""
        return cls(comm, lanes, timeout_ms, kind)

    def _stream(self, stream: Any, call: str) -> int:
        return stream_handle(stream, self.kind == MemoryKind.Cuda, self._native.device, self.communicator.rank, call)

    def sync(self, stream: Any = None, lane: int = 0) -> None:
        """signal() and wait() in one launch."""
        call = "Barrier.sync"
        self._native.sync(self._stream(stream, call), check_int(lane, "lane", call, self.communicator.rank, I32))

    def signal(self, stream: Any = None, lane: int = 0) -> None:
        """Announces this rank's next epoch on `lane` to every member (release of the stream's earlier work)."""
        call = "Barrier.signal"
        self._native.signal(self._stream(stream, call), check_int(lane, "lane", call, self.communicator.rank, I32))

    def wait(self, stream: Any = None, lane: int = 0) -> None:
        """Returns (in stream order) once every member announced this rank's current epoch on `lane` (acquire)."""
        call = "Barrier.wait"
        self._native.wait(self._stream(stream, call), check_int(lane, "lane", call, self.communicator.rank, I32))

    @property
    def lanes(self) -> int:
        return self._native.lanes

    @property
    def kind(self) -> "_kvcomm.MemoryKind":
        """MemoryKind.Cuda or MemoryKind.Host (never Auto once created)."""
        return self._native.kind

    @property
    def communicator(self) -> Communicator:
        return self._native.communicator

    def device_handle(self) -> bytes:
        """The bytes of a kvcomm::BarrierDeviceHandle (kvcomm/device/barrier.hpp), for custom CUDA kernels that fuse
        the barrier; valid while this object lives."""
        return self._native.device_handle()

    def __repr__(self) -> str:
        c = self.communicator
        return f"kvcomm.Barrier(rank={c.rank}, size={c.size}, kind={self.kind.name}, lanes={self.lanes})"
