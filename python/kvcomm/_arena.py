"""Arenas: KV memory shared between independent processes of one host (a KV offload or prefix-cache server and the
engines it serves). An owner creates an Arena described by a KV layout and offers it over an ArenaSession; the
importer presents the one-use capability and maps the arena (ArenaImport). Either side may own. Processes meet
through an ArenaServer's address; no communicator is involved (messages say "[rank -1]": arenas have no rank).

Arguments are checked here (ints, layouts, arrays through _arrays.require, capabilities) and every rule of the C++
API holds underneath (docs/api/arena.md): a lease makes free()/shrink() raise kvcomm.BusyError, a refused
capability raises kvcomm.InvalidArgumentError with the owner's reason, a gone owner kvcomm.NetworkError.
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple, Union

import numpy as np

from . import _kvcomm, limits
from ._arrays import ArrayView, require
from ._errors import UnsupportedError, check_int, count_of, invalid, shown
from ._fetch import KvRegion, _regions
from ._symm import MemoryKind, _default_framework, _kind

OwnerLoss = _kvcomm.OwnerLoss

_CONSTANTS = _kvcomm._arena_constants()
#: Default time to live of a capability (ms).
DEFAULT_TTL_MS: int = _CONSTANTS["default_ttl_ms"]
#: The most bytes of one application message (ArenaSession.send).
MAX_MESSAGE_BYTES: int = _CONSTANTS["max_message_bytes"]

_I64 = (-(1 << 63), 1 << 63)
_CAPABILITY = struct.Struct("=QQ16siIQ")  # kvcomm::ArenaCapability, field by field (48 bytes)
assert _CAPABILITY.size == _CONSTANTS["capability_bytes"]
_IPC_HANDLE_BYTES: int = _CONSTANTS["ipc_handle_bytes"]
_OWNER_LOSS = {"keep": OwnerLoss.Keep, "release": OwnerLoss.Release}
_FRAMEWORKS = ("numpy", "torch", "dlpack")


@dataclass(frozen=True)
class ArenaCapability:
    """What an importer presents: a one-use 128-bit token bound to (arena, generation, importer pid and uid) with an
    expiry. ``bytes(cap)`` / ``cap.to_bytes()`` are the C++ ArenaCapability's 48 bytes (what C and C++ peers send);
    ``ArenaCapability.from_bytes(data)`` reads them back. Useless to any process but the one it names."""

    arena_id: int
    generation: int
    token: bytes
    importer_pid: int
    importer_uid: int
    expires_at_ms: int  # CLOCK_REALTIME ms; informational (the owner's clock decides)

    def to_bytes(self) -> bytes:
        return _CAPABILITY.pack(self.arena_id, self.generation, self.token, self.importer_pid, self.importer_uid,
                                self.expires_at_ms)

    def __bytes__(self) -> bytes:
        return self.to_bytes()

    @classmethod
    def from_bytes(cls, data: Any) -> "ArenaCapability":
        """A capability from its 48 bytes (bytes, bytearray or memoryview)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise invalid("ArenaCapability.from_bytes", -1, f"data must be bytes, got {type(data).__name__}")
        raw = bytes(data)
        if len(raw) != _CAPABILITY.size:
            raise invalid("ArenaCapability.from_bytes", -1, f"data has {len(raw)} bytes, a capability has "
                          f"{_CAPABILITY.size}")
        return cls(*_CAPABILITY.unpack(raw))


@dataclass(frozen=True)
class ArenaGrowth:
    """What Arena.grow() did: the new generation, the importers that mapped the new bytes before it returned, and one
    line per importer that failed or did not answer in time (the growth itself stands)."""

    generation: int
    importers_updated: int
    failures: Tuple[str, ...] = ()


# ---- argument checks ----------------------------------------------------------------------------------------------


def _layout(layout: Any, call: str) -> List[Tuple[int, int, int, int]]:
    """A layout (KvRegion list or 4-tuples) as native tuples, counted against kvcomm.limits.MAX_ARENA_REGIONS first."""
    if not isinstance(layout, KvRegion):
        count_of(layout, "regions", call, -1, limits.MAX_ARENA_REGIONS, "MAX_ARENA_REGIONS")
    regions = _regions(layout, call, -1)
    if len(regions) > limits.MAX_ARENA_REGIONS:
        raise invalid(call, -1, f"{len(regions)} regions, more than kvcomm.limits.MAX_ARENA_REGIONS = "
                      f"{limits.MAX_ARENA_REGIONS}")
    return regions


def _ms(value: Any, what: str, call: str) -> int:
    return check_int(value, what, call, -1, *reversed(_I64))


def _size(value: Any, what: str, call: str) -> int:
    return check_int(value, what, call, -1)


def _owner_loss(value: Any, call: str) -> "_kvcomm.OwnerLoss":
    if isinstance(value, OwnerLoss):
        return value
    v = _OWNER_LOSS.get(value.lower()) if isinstance(value, str) else None
    if v is None:
        raise invalid(call, -1, f"on_owner_loss {shown(value)} is not one of 'keep', 'release' (or a "
                      "kvcomm.OwnerLoss)")
    return v


def _capability(value: Any, call: str) -> bytes:
    if isinstance(value, ArenaCapability):
        return value.to_bytes()
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if len(raw) != _CAPABILITY.size:
            raise invalid(call, -1, f"capability has {len(raw)} bytes, a capability has {_CAPABILITY.size}")
        return raw
    raise invalid(call, -1, f"capability must be a kvcomm.ArenaCapability or its {_CAPABILITY.size} bytes, got "
                  f"{type(value).__name__}")


def _current_cuda_device() -> int:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return int(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - no usable CUDA in torch: the default device
        pass
    return 0


class _Memory:
    """What Arena and ArenaImport share: copies in and out, pins and zero-copy views of the mapped bytes."""

    _native: Any
    _name: str

    def _cuda(self) -> bool:
        return self._native.kind == MemoryKind.Cuda

    def _device(self) -> int:
        raise NotImplementedError

    def _array(self, obj: Any, name: str, call: str) -> ArrayView:
        """A host array to copy from or into (contiguous bytes): read/write copy between the arena (host or device
        memory) and host memory; device-to-device copies go through view()."""
        return require(obj, name, call, -1, device="cpu",
                       device_why="read/write copy between the arena and host memory (copy device memory through "
                       "view())", layout="contiguous", expected="a numpy array, a torch CPU tensor, bytes or anything "
                       "with __array_interface__ or DLPack")

    def write(self, offset: int, data: Any) -> None:
        """Copies the bytes of `data` (any contiguous host array; bytes, bytearray) to [offset, offset + nbytes),
        synchronously, pinned while it runs."""
        call = f"{self._name}.write"
        offset = _size(offset, "offset", call)
        v = self._array(data, "data", call)
        self._native.write(offset, v.ptr, v.size * v.itemsize)

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        """A new uint8 numpy array holding [offset, offset + nbytes), copied synchronously."""
        call = f"{self._name}.read"
        offset = _size(offset, "offset", call)
        nbytes = _size(nbytes, "nbytes", call)
        if nbytes > self.bytes:  # checked before anything is sized by it
            raise invalid(call, -1, f"[{offset}, +{nbytes}) is not inside the {self.bytes} mapped bytes")
        out = np.empty(nbytes, dtype=np.uint8)
        self._native.read(offset, out.ctypes.data, nbytes)
        return out

    def read_into(self, offset: int, out: Any) -> None:
        """Copies [offset, offset + out's bytes) into `out` (a writable contiguous host array)."""
        call = f"{self._name}.read_into"
        offset = _size(offset, "offset", call)
        if isinstance(out, np.ndarray) and not out.flags.writeable:
            raise invalid(call, -1, "out is a read-only numpy array")
        if isinstance(out, (bytes, memoryview)) and (isinstance(out, bytes) or out.readonly):
            raise invalid(call, -1, f"out is read-only ({type(out).__name__})")
        v = self._array(out, "out", call)
        self._native.read(offset, v.ptr, v.size * v.itemsize)

    def pin(self, offset: int, nbytes: int) -> "ArenaPin":
        """Pins [offset, offset + nbytes) for an operation in flight (a copy, a transfer, a registered region):
        while the pin lives the owner cannot free or shrink it. ``with arena.pin(o, n) as p: ...`` releases it."""
        call = f"{self._name}.pin"
        return ArenaPin(self._native.pin(_size(offset, "offset", call), _size(nbytes, "nbytes", call)))

    def view(self, dtype: Any = None, offset: int = 0, nbytes: Optional[int] = None,
             framework: Optional[str] = None) -> Any:
        """[offset, offset + nbytes) (default: to the end of the mapped bytes) as a zero-copy 1-D uint8 array, or
        viewed as `dtype`: numpy on host memory, torch (or DLPack without torch) on CUDA memory. The view keeps
        this object alive; after free() / close() it must no longer be used."""
        call = f"{self._name}.view"
        offset = _size(offset, "offset", call)
        if nbytes is not None and _size(nbytes, "nbytes", call) == 0:
            raise invalid(call, -1, "nbytes 0: a view needs at least one byte (None: to the end)")
        nbytes = 0 if nbytes is None else nbytes
        if nbytes == 0 and offset >= self.bytes:
            raise invalid(call, -1, f"offset {offset} is not inside the {self.bytes} mapped bytes")
        cuda = self._cuda()
        if framework is None:
            framework = _default_framework(cuda)
        if not isinstance(framework, str) or framework not in _FRAMEWORKS:
            raise invalid(call, -1, f"framework {shown(framework)} is not one of 'numpy', 'torch', 'dlpack'")
        if framework == "numpy" and cuda:
            raise invalid(call, -1, "framework 'numpy' cannot view CUDA memory: use 'torch' or 'dlpack'")
        if framework == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                raise UnsupportedError(f"kvcomm [rank -1] {call}: framework 'torch' needs torch, which is not "
                                       "installed") from None
        raw = self._view(offset, nbytes, framework)
        if dtype is None:
            return raw
        if framework == "dlpack":
            raise invalid(call, -1, "dtype: a DLPack view is uint8; view it as another dtype in the framework that "
                          "imports it")
        if framework == "torch":
            return raw.view(dtype)
        try:
            dt = np.dtype(dtype)
        except (TypeError, ValueError) as e:
            raise invalid(call, -1, f"dtype {shown(dtype)} is not a numpy dtype ({e})") from None
        if dt.hasobject or dt.itemsize == 0 or raw.nbytes % dt.itemsize:
            raise invalid(call, -1, f"dtype {dt} cannot view {raw.nbytes} bytes")
        return raw.view(dt)

    def _view(self, offset: int, nbytes: int, framework: str) -> Any:
        raise NotImplementedError

    @property
    def data_ptr(self) -> int:
        """Address of the mapping (device memory for CUDA arenas); 0 once released."""
        return self._native.data_ptr

    @property
    def bytes(self) -> int:
        """Bytes mapped now."""
        return self._native.bytes

    @property
    def capacity(self) -> int:
        return self._native.capacity

    @property
    def kind(self) -> "_kvcomm.MemoryKind":
        return self._native.kind

    @property
    def handle_type(self) -> str:
        """'memfd' (host), 'posix_fd' (CUDA VMM) or 'cuda_ipc' (legacy IPC)."""
        return self._native.handle_type

    @property
    def generation(self) -> int:
        return self._native.generation

    @property
    def layout(self) -> List[KvRegion]:
        regions, _ = self._native.layout
        return [KvRegion(*r) for r in regions]

    @property
    def layout_version(self) -> int:
        return self._native.layout[1]

    @property
    def operations(self) -> int:
        """Pins (operations in flight) on this object in this process."""
        return self._native.operations


class ArenaPin:
    """A reference on (arena or import, range) held by an operation in flight; ``release()`` (or leaving a ``with``
    block) ends it. A released pin is a pin of nothing: data_ptr, offset and bytes are 0."""

    def __init__(self, native: "_kvcomm.ArenaPin") -> None:
        if not isinstance(native, _kvcomm.ArenaPin):
            raise invalid("ArenaPin", -1, "ArenaPin(...) is made by Arena.pin() or ArenaImport.pin() (got "
                          f"{type(native).__name__})")
        self._native = native

    @property
    def data_ptr(self) -> int:
        return self._native.data_ptr

    @property
    def offset(self) -> int:
        return self._native.offset

    @property
    def bytes(self) -> int:
        return self._native.bytes

    @property
    def valid(self) -> bool:
        return self._native.valid

    def release(self) -> None:
        """Ends the operation (idempotent)."""
        self._native.release()

    def __enter__(self) -> "ArenaPin":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"kvcomm.ArenaPin(offset={self.offset}, bytes={self.bytes})"


class Arena(_Memory):
    """Memory this process owns, described by a KV layout, shareable with other local processes.

    Call order: ``Arena(layout)`` (or ``Arena.create``), ``session.offer(arena)`` -> send the capability -> the peer
    imports; ``grow``/``shrink`` as needed; ``free()`` once every importer closed (BusyError before), then
    ``close()``. ``close()`` (or leaving a ``with`` block) without ``free()`` withdraws the arena: importers keep
    their mappings until they close them."""

    _name = "Arena"

    def __init__(self, layout: Any, *, kind: Union[str, "_kvcomm.MemoryKind"] = "auto", capacity: int = 0,
                 legacy_ipc: bool = False, version: int = 0) -> None:
        """Allocates the layout's extent (a list of KvRegion or (offset, block_bytes, block_stride, num_blocks)
        tuples, at most kvcomm.limits.MAX_ARENA_REGIONS) and reserves `capacity` bytes of address space for growth
        (0: the extent, no growth). kind: 'auto' (CUDA with a current context), 'cuda' or 'host'. legacy_ipc (CUDA):
        cuMemAlloc the capacity, exportable with ipc_handle(). version: the engine's version of the layout."""
        call = "Arena"
        regions = _layout(layout, call)
        if not isinstance(legacy_ipc, bool):
            raise invalid(call, -1, f"legacy_ipc must be a bool, got {type(legacy_ipc).__name__}")
        self._native = _kvcomm.Arena.create(regions, check_int(version, "version", call, -1), _kind(kind, call, -1),
                                            _size(capacity, "capacity", call), legacy_ipc)

    @classmethod
    def create(cls, layout: Any, **options: Any) -> "Arena":
        """Same as ``Arena(layout, **options)``."""
        return cls(layout, **options)

    def _device(self) -> int:
        return max(self._native.device, 0)

    def _view(self, offset: int, nbytes: int, framework: str) -> Any:
        return self._native._view(offset, nbytes, framework)

    # ---- queries ----
    @property
    def granularity(self) -> int:
        return self._native.granularity

    @property
    def device(self) -> int:
        """CUDA ordinal of the memory (-1 for host memory)."""
        return self._native.device

    @property
    def id(self) -> int:
        return self._native.id

    @property
    def leases(self) -> int:
        """Imports that hold a lease now."""
        return self._native.leases

    @property
    def importers(self) -> List[int]:
        """Pids of the processes holding leases (one entry per lease)."""
        return list(self._native.importers)

    @property
    def live_capabilities(self) -> int:
        return self._native.live_capabilities

    @property
    def freed(self) -> bool:
        return self._native.freed

    # ---- capabilities ----
    def offer(self, pid: int, uid: Optional[int] = None, ttl_ms: int = DEFAULT_TTL_MS) -> ArenaCapability:
        """A one-use capability for process `pid` (user `uid`, default this process's) to import this arena within
        `ttl_ms` (1 ms to one day). ArenaSession.offer binds it to the session's peer."""
        call = "Arena.offer"
        pid = check_int(pid, "pid", call, -1, 1 << 31, -(1 << 31))
        uid = os.getuid() if uid is None else check_int(uid, "uid", call, -1, 1 << 32)
        return ArenaCapability.from_bytes(self._native.offer(pid, uid, _ms(ttl_ms, "ttl_ms", call)))

    def revoke_capabilities(self) -> None:
        """Withdraws every capability not yet used (imports already made keep their leases)."""
        self._native.revoke_capabilities()

    # ---- changes ----
    def grow(self, new_bytes: int, timeout_ms: int = -1) -> ArenaGrowth:
        """Maps [bytes, new_bytes) at the same addresses here and in every importer, waiting up to `timeout_ms`
        (< 0: 10 s) for each importer. Capabilities issued before are stale."""
        call = "Arena.grow"
        return ArenaGrowth(*self._grown(self._native.grow(_size(new_bytes, "new_bytes", call),
                                                          _ms(timeout_ms, "timeout_ms", call))))

    def grow_layout(self, layout: Any, version: int = 0, timeout_ms: int = -1) -> ArenaGrowth:
        """grow() to the new layout's extent; the new layout becomes the arena's (and the importers')."""
        call = "Arena.grow_layout"
        return ArenaGrowth(*self._grown(self._native.grow_layout(_layout(layout, call), check_int(
            version, "version", call, -1), _ms(timeout_ms, "timeout_ms", call))))

    @staticmethod
    def _grown(raw: tuple) -> tuple:
        generation, updated, failures = raw
        return generation, updated, tuple(failures)

    def shrink(self, new_bytes: int, wait_ms: int = 0) -> None:
        """Releases whole chunks from the top, keeping at least `new_bytes`. BusyError (nothing changed) while any
        lease exists or a pin overlaps the released bytes after waiting up to `wait_ms` (< 0: no bound)."""
        call = "Arena.shrink"
        self._native.shrink(_size(new_bytes, "new_bytes", call), _ms(wait_ms, "wait_ms", call))

    def shrink_layout(self, layout: Any, version: int = 0, wait_ms: int = 0) -> None:
        """shrink() to the new layout's extent, which becomes the arena's layout."""
        call = "Arena.shrink_layout"
        self._native.shrink_layout(_layout(layout, call), check_int(version, "version", call, -1),
                                   _ms(wait_ms, "wait_ms", call))

    def free(self, wait_ms: int = 0) -> None:
        """Unmaps and releases the memory now; BusyError (nothing changed) while leases or pins exist after waiting
        up to `wait_ms` (< 0: no bound). Afterwards only the queries answer; a second free() does nothing."""
        self._native.free(_ms(wait_ms, "wait_ms", "Arena.free"))

    def ipc_handle(self) -> bytes:
        """The 64-byte legacy CUDA IPC handle of a legacy_ipc arena (ArenaImport.open_ipc opens it)."""
        return self._native.ipc_handle()

    def close(self) -> None:
        """Drops this process's arena object now (idempotent). Not freed, the arena is withdrawn: importers are told
        and keep their mappings until they close them; the memory is returned when the last one does."""
        self._native._release()

    def __enter__(self) -> "Arena":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if not self._native.valid:
            return "kvcomm.Arena(closed)"
        return (f"kvcomm.Arena(id={self.id:#x}, kind={self.kind.name}, bytes={self.bytes}, capacity={self.capacity}, "
                f"leases={self.leases})")


class ArenaImport(_Memory):
    """Another process's arena mapped here; holds a lease on it until ``close()`` (or leaving a ``with`` block).
    Made by ArenaSession.import_() or ArenaImport.open_ipc()."""

    _name = "ArenaImport"

    def __init__(self, native: "_kvcomm.ArenaImport", device: int = 0) -> None:
        if not isinstance(native, _kvcomm.ArenaImport):
            raise invalid("ArenaImport", -1, "ArenaImport(...) is made by ArenaSession.import_() or "
                          f"ArenaImport.open_ipc() (got {type(native).__name__})")
        self._native = native
        self._device_id = device

    @classmethod
    def open_ipc(cls, handle: Any, layout: Any, version: int = 0) -> "ArenaImport":
        """Opens a legacy CUDA IPC handle (Arena.ipc_handle()'s 64 bytes) on the current device; the layout's extent
        must fit in the owner's allocation. No lease, no dead-owner detection; not registrable with a NIC."""
        call = "ArenaImport.open_ipc"
        if not isinstance(handle, (bytes, bytearray, memoryview)) or len(bytes(handle)) != _IPC_HANDLE_BYTES:
            raise invalid(call, -1, f"handle must be the {_IPC_HANDLE_BYTES} bytes of Arena.ipc_handle(), got "
                          f"{shown(handle)}")
        regions = _layout(layout, call)
        return cls(_kvcomm.ArenaImport.open_ipc(bytes(handle), regions, check_int(version, "version", call, -1)),
                   _current_cuda_device())

    def _device(self) -> int:
        return self._device_id

    def _view(self, offset: int, nbytes: int, framework: str) -> Any:
        return self._native._view(offset, nbytes, framework, self._device_id)

    @property
    def arena_id(self) -> int:
        return self._native.arena_id

    @property
    def owner_pid(self) -> int:
        return self._native.owner_pid

    @property
    def owner_alive(self) -> bool:
        """False once the owner is known gone (process death, closed session, arena released)."""
        return self._native.owner_alive

    @property
    def owner_lost_reason(self) -> str:
        return self._native.owner_lost_reason

    @property
    def closed(self) -> bool:
        return self._native.closed

    def check(self) -> None:
        """Raises NetworkError naming the owner and the reason when it is gone, InvalidArgumentError when closed."""
        self._native.check()

    def close(self, timeout_ms: int = -1) -> None:
        """Drains (waits up to `timeout_ms` for every pin; < 0: no bound; TimeoutError leaves the import closing),
        unmaps, and tells the owner, which drops the lease before this returns. Idempotent."""
        self._native.close(_ms(timeout_ms, "timeout_ms", "ArenaImport.close"))

    def __enter__(self) -> "ArenaImport":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"kvcomm.ArenaImport(arena_id={self.arena_id:#x}, owner_pid={self.owner_pid}, bytes={self.bytes}, "
                f"closed={self.closed})")


class ArenaSession:
    """One connection between two local processes (a client and an ArenaServer); either side may offer arenas and
    import the other's, and small application messages travel on it. Made by ArenaSession.connect() (client) or
    ArenaServer.accept() (server). Leases live on their session: when it ends, they are dropped on both sides."""

    def __init__(self, native: "_kvcomm.ArenaSession") -> None:
        if not isinstance(native, _kvcomm.ArenaSession):
            raise invalid("ArenaSession", -1, "ArenaSession(...) wraps a native session: use ArenaSession.connect() "
                          f"or ArenaServer.accept() (got {type(native).__name__})")
        self._native = native

    @classmethod
    def connect(cls, address: str, timeout_ms: int = -1) -> "ArenaSession":
        """Connects to the server at `address` ('@name': abstract socket; otherwise a filesystem path), waiting for it
        to appear until `timeout_ms` (< 0: 10 s); the server must run as the same uid."""
        call = "ArenaSession.connect"
        if not isinstance(address, str) or not address:
            raise invalid(call, -1, f"address must be a non-empty str, got {shown(address)}")
        return cls(_kvcomm.ArenaSession.connect(address, _ms(timeout_ms, "timeout_ms", call)))

    @property
    def peer_pid(self) -> int:
        return self._native.peer_pid

    @property
    def peer_uid(self) -> int:
        return self._native.peer_uid

    @property
    def alive(self) -> bool:
        return self._native.alive

    @property
    def lost_reason(self) -> str:
        return self._native.lost_reason

    def offer(self, arena: Arena, ttl_ms: int = DEFAULT_TTL_MS) -> ArenaCapability:
        """Owner side: a capability for the peer process to import `arena` within `ttl_ms`."""
        call = "ArenaSession.offer"
        if not isinstance(arena, Arena):
            raise invalid(call, -1, f"arena must be a kvcomm.Arena, got {type(arena).__name__}")
        return ArenaCapability.from_bytes(self._native.offer(arena._native, _ms(ttl_ms, "ttl_ms", call)))

    def import_(self, capability: Any, *, on_owner_loss: Union[str, "_kvcomm.OwnerLoss"] = "keep",
                timeout_ms: int = -1) -> ArenaImport:
        """Importer side: imports the arena the peer offered (an ArenaCapability or its 48 bytes). A refused
        capability (forged, used, expired, another process or generation, arena freed) raises InvalidArgumentError
        with the owner's reason. on_owner_loss: 'keep' (mapping stays readable) or 'release' (unmapped once no pin
        is left). CUDA arenas are mapped on the current device."""
        call = "ArenaSession.import_"
        raw = _capability(capability, call)
        loss = _owner_loss(on_owner_loss, call)
        return ArenaImport(self._native.import_(raw, loss, _ms(timeout_ms, "timeout_ms", call)),
                           _current_cuda_device())

    def send(self, data: Any) -> None:
        """Sends an application message (bytes-like, at most MAX_MESSAGE_BYTES) to the peer."""
        call = "ArenaSession.send"
        if isinstance(data, ArenaCapability):
            data = data.to_bytes()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise invalid(call, -1, f"data must be bytes, got {type(data).__name__}")
        raw = bytes(data)
        if len(raw) > MAX_MESSAGE_BYTES:
            raise invalid(call, -1, f"a message of {len(raw)} bytes, more than kvcomm.ArenaSession.MAX_MESSAGE_BYTES "
                          f"= {MAX_MESSAGE_BYTES}")
        self._native.send(raw)

    def receive(self, timeout_ms: int = -1) -> bytes:
        """The next application message, waiting up to `timeout_ms` (< 0: no bound): TimeoutError on expiry,
        NetworkError once the session ended and no message is left."""
        return self._native.receive(_ms(timeout_ms, "timeout_ms", "ArenaSession.receive"))

    def close(self) -> None:
        """Ends the session now: leases over it are dropped on both sides. Idempotent."""
        self._native.close()

    def __enter__(self) -> "ArenaSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"kvcomm.ArenaSession(peer_pid={self.peer_pid}, alive={self.alive})"


ArenaSession.MAX_MESSAGE_BYTES = MAX_MESSAGE_BYTES  # type: ignore[attr-defined]


class ArenaServer:
    """Where clients meet a server process: one thread serves every connection. ``ArenaServer(address)`` (or
    ``ArenaServer.listen``), then ``accept()`` per client; ``close()`` (or leaving a ``with`` block) stops
    listening and ends every session."""

    def __init__(self, address: str = "", *, max_sessions: int = 1024, max_pending_handshakes: int = 64,
                 handshake_timeout_ms: int = -1, request_timeout_ms: int = -1) -> None:
        """Listens on `address`: '@name' (abstract socket), a filesystem path (its directory must be mode 0700 and
        owned by this user), or '' for a fresh abstract name (see address)."""
        call = "ArenaServer"
        if not isinstance(address, str):
            raise invalid(call, -1, f"address must be a str, got {shown(address)}")
        self._native = _kvcomm.ArenaServer.listen(address, _size(max_sessions, "max_sessions", call),
                                                  _size(max_pending_handshakes, "max_pending_handshakes", call),
                                                  _ms(handshake_timeout_ms, "handshake_timeout_ms", call),
                                                  _ms(request_timeout_ms, "request_timeout_ms", call))

    @classmethod
    def listen(cls, address: str = "", **options: Any) -> "ArenaServer":
        """Same as ``ArenaServer(address, **options)``."""
        return cls(address, **options)

    @property
    def address(self) -> str:
        """What clients pass to ArenaSession.connect."""
        return self._native.address

    @property
    def sessions(self) -> int:
        return self._native.sessions

    @property
    def refused_connections(self) -> int:
        return self._native.refused_connections

    def accept(self, timeout_ms: int = -1) -> ArenaSession:
        """The next client whose handshake completed, waiting up to `timeout_ms` (< 0: no bound): TimeoutError on
        expiry, AbortedError after close()."""
        return ArenaSession(self._native.accept(_ms(timeout_ms, "timeout_ms", "ArenaServer.accept")))

    def close(self) -> None:
        self._native.close()

    def __enter__(self) -> "ArenaServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"kvcomm.ArenaServer(address={self.address!r}, sessions={self.sessions})"


__all__ = ["Arena", "ArenaCapability", "ArenaGrowth", "ArenaImport", "ArenaPin", "ArenaServer", "ArenaSession",
           "OwnerLoss"]
