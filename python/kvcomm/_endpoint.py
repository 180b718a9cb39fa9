"""Endpoints: KV transfers between processes that meet at run time (a prefill and a decode instance, a KV server and
the engines it serves), with no communicator and no collective step. Each process makes one Endpoint, registers the
memory it already has (a numpy array, a torch tensor on the CPU or a GPU, a SymmetricBuffer, an Arena) with its KV
layout, and hands each registration's metadata (bytes) to its peers over its own channel. A peer connects from the
metadata alone and reads remote blocks into its own registered memory, or writes its blocks into the remote's.

Arrays go through _arrays.require and layouts through the Fetcher's checks; block ids are validated like the Fetcher's
host ids. A registration keeps what it registered alive until it is unregistered (or the endpoint closed), so a peer
never reads or writes memory Python has released. Messages say "[rank -1]": endpoints have no rank. The C++ rules hold
underneath (docs/api/endpoint.md): stale metadata (revoked, unregistered, restarted) fails the transfer with the owner's
reason in its status; a malformed or truncated metadata raises InvalidArgumentError at connect().
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from . import _kvcomm, limits
from ._arena import Arena, _current_cuda_device
from ._arrays import INT64, require
from ._errors import check_int, invalid, shown
from ._fetch import FetchStatus, KvRegion, _regions, host_ids
from ._stream import stream_handle
from ._symm import MemoryKind, SymmetricBuffer

Access = _kvcomm.Access
TransferVia = _kvcomm.TransferVia

_ACCESS = {"read_write": Access.ReadWrite, "read_only": Access.ReadOnly}
_VIA = {"auto": TransferVia.Auto, "peer": TransferVia.Peer, "tcp": TransferVia.Tcp, "rdma": TransferVia.Rdma}
_I64 = (-(1 << 63), 1 << 63)


def _access(value: Any, call: str) -> "_kvcomm.Access":
    """A kvcomm.Access member or its name; an int (even a member's value) or anything else is refused."""
    if isinstance(value, Access):
        return value
    a = _ACCESS.get(value.lower()) if isinstance(value, str) else None
    if a is None:
        raise invalid(call, -1, f"access {shown(value)} is not one of 'read_write', 'read_only' (or a kvcomm.Access)")
    return a


def _via(value: Any, call: str) -> "_kvcomm.TransferVia":
    if isinstance(value, TransferVia):
        return value
    v = _VIA.get(value.lower()) if isinstance(value, str) else None
    if v is None:
        raise invalid(call, -1, f"via {shown(value)} is not one of 'auto', 'peer', 'tcp', 'rdma' (or a "
                      "kvcomm.TransferVia)")
    return v


def _ms(value: Any, what: str, call: str) -> int:
    """A timeout in ms: None or < 0 is no bound."""
    return -1 if value is None else check_int(value, what, call, -1, _I64[1], _I64[0])


def _message(value: Any, what: str, call: str) -> bytes:
    """A notification message: bytes-like (bytes, bytearray, memoryview) or a str (sent as UTF-8), at most
    kvcomm.limits.MAX_NOTIFICATION_BYTES bytes."""
    if isinstance(value, str):
        data = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    else:
        raise invalid(call, -1, f"{what} must be bytes or a str, got {shown(value)}")
    if len(data) > limits.MAX_NOTIFICATION_BYTES:
        raise invalid(call, -1, f"{what} is {len(data)} bytes, longer than kvcomm.limits.MAX_NOTIFICATION_BYTES "
                      f"({limits.MAX_NOTIFICATION_BYTES})")
    return data


@dataclass(frozen=True)
class Notification:
    """A notification this endpoint received (Endpoint.notifications): the sending endpoint's id (`sender`; a
    restarted sender has another) and name, the registration of this endpoint whose metadata it used, and the bytes
    it sent."""

    sender: int
    sender_name: str
    registration: int
    message: bytes


_NATIVE_I64 = np.dtype(np.int64)


def _plain_ids(obj: Any) -> bool:
    """A 1-D, aligned, C-contiguous numpy array of native int64 within the pair limit: what host_ids would accept
    as it is, told without its general protocol walk."""
    if type(obj) is not np.ndarray or obj.dtype != _NATIVE_I64 or obj.ndim != 1:
        return False
    flags = obj.flags
    return flags.c_contiguous and flags.aligned and obj.shape[0] <= limits.MAX_FETCH_PAIRS


def _read_only(obj: Any) -> bool:
    """Whether the producer says the memory must not be written (a read into it, or a peer's write, would)."""
    if isinstance(obj, np.ndarray):
        return not obj.flags.writeable
    for name in ("__array_interface__", "__cuda_array_interface__"):
        try:
            iface = getattr(obj, name, None)
        except Exception:  # noqa: BLE001 - require() already read it; a second read that raises says nothing new
            continue
        if isinstance(iface, dict):
            data = iface.get("data")
            return isinstance(data, (tuple, list)) and len(data) == 2 and bool(data[1])
    try:
        return memoryview(obj).readonly
    except TypeError:
        return False


def _layout_of(raw: tuple) -> List[KvRegion]:
    regions, _ = raw
    return [KvRegion(*r) for r in regions]


class _RegisteredMemory:
    """What a registration and a peer's view of one (RemoteMemory) both say of it, read from the native object."""

    _native: Any

    @property
    def id(self) -> int:
        """Random 64-bit id (in the metadata)."""
        return self._native.id

    @property
    def generation(self) -> int:
        """Starts at 1; revoke() increments it."""
        return self._native.generation

    @property
    def kind(self) -> "_kvcomm.MemoryKind":
        return self._native.kind

    @property
    def layout(self) -> List[KvRegion]:
        """The registered layout, normalised (block_stride 0 reads back as block_bytes)."""
        return _layout_of(self._native.layout)

    @property
    def layout_version(self) -> int:
        return self._native.layout[1]

    @property
    def contents(self) -> List[Any]:
        """What the regions hold (kvcomm.conversion.KvContents, one per region), as registered with ``contents=``;
        [] when not described. A peer reads it from the metadata."""
        from .conversion import _back
        return [_back(c) for c in self._native.contents]

    @property
    def access(self) -> "_kvcomm.Access":
        return self._native.access


def _described(contents: Optional[Sequence[Any]], call: str) -> List[tuple]:
    """The raw form of register()'s contents= (None: not described)."""
    if contents is None:
        return []
    from .conversion import _contents
    return _contents(contents, call, "contents")


class Registration(_RegisteredMemory):
    """Memory registered with an Endpoint (Endpoint.register, register_buffer, register_arena). Valid until
    ``Endpoint.unregister(registration)`` or ``Endpoint.close()``; until then it keeps what it registered alive."""

    def __init__(self, native: "_kvcomm.Registration", obj: Any = None, writable: bool = True,
                 keep: Any = None) -> None:
        """Wraps a native registration; use Endpoint.register()."""
        if not isinstance(native, _kvcomm.Registration):
            raise invalid("Registration", -1, "Registration(...) is made by Endpoint.register(), register_buffer() "
                          f"or register_arena() (got {type(native).__name__})")
        self._native = native
        self._obj = obj
        self._keep = keep  # what else keeps the memory alive (an imported DLPack tensor)
        self._writable = writable

    @property
    def data_ptr(self) -> int:
        return self._native.data_ptr

    @property
    def bytes(self) -> int:
        return self._native.bytes

    @property
    def device(self) -> int:
        """CUDA ordinal of the memory (-1 for host memory)."""
        return self._native.device

    @property
    def registered(self) -> bool:
        """False once unregistered (or the endpoint closed)."""
        return self._native.registered

    @property
    def array(self) -> Any:
        """What was registered (the array, buffer or arena), held until unregistered; None afterwards."""
        return self._obj

    def metadata(self) -> bytes:
        """What peers connect with (Endpoint.connect). Anyone holding these bytes may read (and, read_write, write)
        this memory: hand them to peers only."""
        return self._native.metadata()

    def revoke(self) -> None:
        """Replaces the capability and increments the generation: every earlier metadata is refused from now on
        ("capability refused" for new connections, "stale generation" for open ones). Give peers metadata() again.
        Same-host peers that map the memory are waited for until they unmapped it (kvcomm.TimeoutError naming them
        past the endpoint's timeout), so nothing copies through the old metadata once it returns."""
        self._native.revoke()

    def __repr__(self) -> str:
        state = "registered" if self.registered else "unregistered"
        return (f"kvcomm.Registration(id={self.id:#x}, generation={self.generation}, kind={self.kind.name}, "
                f"bytes={self.bytes}, access={self.access.name}, {state})")


class RemoteMemory(_RegisteredMemory):
    """A peer's registration as this endpoint knows it from its metadata (Endpoint.connect)."""

    def __init__(self, native: "_kvcomm.RemoteMemory") -> None:
        """Wraps a native remote; use Endpoint.connect()."""
        if not isinstance(native, _kvcomm.RemoteMemory):
            raise invalid("RemoteMemory", -1, "RemoteMemory(...) is made by Endpoint.connect() (got "
                          f"{type(native).__name__})")
        self._native = native

    @property
    def peer_name(self) -> str:
        """The peer endpoint's name, as its metadata says."""
        return self._native.peer_name

    @property
    def address(self) -> str:
        """Where the peer endpoint listens ("host:port")."""
        return self._native.address

    def __repr__(self) -> str:
        return (f"kvcomm.RemoteMemory(peer_name={self.peer_name!r}, id={self.id:#x}, generation={self.generation}, "
                f"address={self.address!r}, access={self.access.name})")


class Transfer:
    """A polled transfer (Endpoint.read / write). Dropping it waits until nothing it started can still touch either
    side's memory (a transfer in flight is cancelled first)."""

    def __init__(self, native: "_kvcomm.Transfer") -> None:
        """Wraps a native transfer; use Endpoint.read() or write()."""
        if not isinstance(native, _kvcomm.Transfer):
            raise invalid("Transfer", -1, "Transfer(...) is made by Endpoint.read() or Endpoint.write() (got "
                          f"{type(native).__name__})")
        self._native = native

    @staticmethod
    def _status(raw: tuple) -> FetchStatus:
        state, done, total, failed, error = raw
        return FetchStatus(state, done, total, failed, error)

    def test(self) -> FetchStatus:
        """Non-blocking. Failed: failed_blocks are destination ids (local blocks of a read, remote ones of a write)
        and error says why."""
        return self._status(self._native.test())

    def wait(self, timeout_ms: Optional[int] = None) -> FetchStatus:
        """Blocks (without the GIL) up to timeout_ms (None or < 0: until it ends). Expiry returns an InProgress
        status and cancels nothing. Done and Failed are final."""
        return self._status(self._native.wait(_ms(timeout_ms, "timeout_ms", "Transfer.wait")))

    @property
    def info(self) -> "_kvcomm.FetchPlanInfo":
        """Pairs, runs after coalescing, bytes, and the runs per transport (tcp_runs, ...)."""
        return self._native.info

    @property
    def transport(self) -> "_kvcomm.FetchTransport":
        """What carries it (FetchTransport.Tcp in this version)."""
        return self._native.transport

    def __repr__(self) -> str:
        return f"kvcomm.Transfer({self.info!r})"


class Endpoint:
    """One per process: its listener, its registrations and its connections to peers.

    Call order: ``Endpoint(name=...)`` (or ``Endpoint.create``); ``register(array, layout)`` each piece of KV memory
    and send ``registration.metadata()`` to peers; a peer does ``remote = connect(metadata)`` then
    ``read(mine, remote, remote_blocks, local_blocks)`` / ``write(...)`` and waits on the returned Transfer;
    ``unregister(registration)`` when the memory goes away; ``close()`` (or leaving a ``with`` block) at the end."""

    def __init__(self, name: str = "", *, tcp_address: str = "", timeout_ms: int = -1,
                 connections_per_peer: int = 4, max_queued_notifications: int = 65536) -> None:
        """Listens (TCP) and is ready to register memory and connect to peers. name: how peers' errors name this
        endpoint ('' : 'pid <pid>'; at most 63 bytes); tcp_address: 'a.b.c.d:port' or '[v6]:port' to listen on
        ('' : this host's address as KVCOMM_SOCKET_IFNAME picks it, an ephemeral port); timeout_ms: a transfer with
        no progress for this long fails (< 0: KVCOMM_FETCH_NET_TIMEOUT_MS, 3000); connections_per_peer: parallel
        connections per (local, remote) registration pair (1 to 64); max_queued_notifications: most notifications
        received and not yet taken (notifications()), a sender beyond it gets BusyError (at least 1)."""
        call = "Endpoint"
        self._held: Dict[int, Registration] = {}
        for what, v in (("name", name), ("tcp_address", tcp_address)):
            if not isinstance(v, str):
                raise invalid(call, -1, f"{what} must be a str, got {shown(v)}")
        ms = check_int(timeout_ms, "timeout_ms", call, -1, _I64[1], _I64[0])
        connections = check_int(connections_per_peer, "connections_per_peer", call, -1, 65, 1)
        queued = check_int(max_queued_notifications, "max_queued_notifications", call, -1, _I64[1], 1)
        self._native = _kvcomm.Endpoint.create(name, tcp_address, ms, connections, queued)

    @classmethod
    def create(cls, name: str = "", **options: Any) -> "Endpoint":
        """Same as ``Endpoint(name, **options)``."""
        return cls(name, **options)

    @property
    def id(self) -> int:
        """Random 64-bit id of this endpoint (a restarted process has another: its old metadata is refused)."""
        return self._native.id

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def address(self) -> str:
        """Where it listens ("host:port")."""
        return self._native.address

    @property
    def registrations(self) -> List[Registration]:
        """The registrations of this endpoint not yet unregistered."""
        return list(self._held.values())

    # ---- registration ----
    def _hold(self, reg: Registration) -> Registration:
        self._held[reg.id] = reg
        return reg

    def register(self, array: Any, layout: Any, *, access: Union[str, "_kvcomm.Access"] = "read_write",
                 version: int = 0, contents: Optional[Sequence[Any]] = None) -> Registration:
        """Registers the memory of `array` with its KV layout (a list of KvRegion or (offset, block_bytes,
        block_stride, num_blocks) tuples, offsets in bytes from the array's first byte; the Fetcher's rules).
        `array`: a contiguous numpy array or torch tensor (or anything with __array_interface__,
        __cuda_array_interface__ or DLPack) on the CPU (host memory) or a GPU (CUDA memory on its device), of any
        dtype; its bytes must hold the layout. access: 'read_write' (peers read its blocks and write into them) or
        'read_only' (peers only read; a read-only array must be registered so). version: the engine's version of
        the layout. contents: what the regions hold (kvcomm.conversion.KvContents, one per region), checked against
        the layout and carried in the metadata (peers converting from it need not be told); None: not described. The
        registration keeps `array` alive until it is unregistered."""
        call = "Endpoint.register"
        acc = _access(access, call)
        regions = _regions(layout, call, -1)
        ver = check_int(version, "version", call, -1)
        v = require(array, "array", call, -1, device=("cpu", "cuda"),
                    device_why="endpoints register host ('cpu') or CUDA ('cuda') memory", layout="contiguous",
                    expected="a numpy array, a torch tensor, or a DLPack / __array_interface__ / "
                    "__cuda_array_interface__ object")
        writable = not _read_only(array)
        if not writable and acc == Access.ReadWrite:
            raise invalid(call, -1, "array is read-only: peers could write it (register it with access='read_only')")
        if v.device == "cuda":
            kind, device = MemoryKind.Cuda, v.device_id if v.device_id >= 0 else _current_cuda_device()
        else:
            kind, device = MemoryKind.Host, -1
        native = self._native.register_memory(v.ptr, v.size * v.itemsize, kind, device, regions, ver, acc,
                                              _described(contents, call))
        return self._hold(Registration(native, array, writable, v.obj))

    def register_buffer(self, buffer: SymmetricBuffer, layout: Any, *,
                        access: Union[str, "_kvcomm.Access"] = "read_write", version: int = 0,
                        contents: Optional[Sequence[Any]] = None) -> Registration:
        """Registers this rank's memory of a SymmetricBuffer (its backed part must hold the layout); memory the
        buffer stops backing is no longer served. contents: as register()."""
        call = "Endpoint.register_buffer"
        if not isinstance(buffer, SymmetricBuffer):
            raise invalid(call, -1, f"buffer must be a kvcomm.SymmetricBuffer, got {type(buffer).__name__}")
        acc = _access(access, call)
        regions = _regions(layout, call, -1)
        native = self._native.register_buffer(buffer._native, regions, check_int(version, "version", call, -1), acc,
                                              _described(contents, call))
        return self._hold(Registration(native, buffer))

    def register_arena(self, arena: Arena, *, access: Union[str, "_kvcomm.Access"] = "read_write",
                       contents: Optional[Sequence[Any]] = None) -> Registration:
        """Registers an arena this process owns, with its own layout; the arena cannot be freed or shrunk until it
        is unregistered. contents: as register()."""
        call = "Endpoint.register_arena"
        if not isinstance(arena, Arena):
            raise invalid(call, -1, f"arena must be a kvcomm.Arena, got {type(arena).__name__}")
        native = self._native.register_arena(arena._native, _access(access, call), _described(contents, call))
        return self._hold(Registration(native, arena))

    def _registration(self, reg: Any, what: str, call: str) -> Registration:
        if not isinstance(reg, Registration):
            raise invalid(call, -1, f"{what} must be a kvcomm.Registration, got {type(reg).__name__}")
        return reg

    def unregister(self, registration: Registration, timeout_ms: Optional[int] = None) -> None:
        """New connections and requests are refused ("unregistered"), this endpoint's transfers that use it are
        waited for up to `timeout_ms` (None or < 0: no bound) and then cancelled, and requests peers are being served
        from it end; when it returns nothing reads or writes the memory any more, and the registration lets go of
        what it registered. Idempotent."""
        call = "Endpoint.unregister"
        reg = self._registration(registration, "registration", call)
        self._native.unregister(reg._native, _ms(timeout_ms, "timeout_ms", call))
        if self._held.get(reg.id) is reg:
            del self._held[reg.id]
        reg._obj = reg._keep = None

    # ---- peers ----
    def connect(self, metadata: Any) -> RemoteMemory:
        """A peer's registration from its metadata (bytes, bytearray or memoryview). Lazy (nothing is sent until a
        transfer) and idempotent. InvalidArgumentError names what is wrong: not kvcomm metadata, truncated or
        corrupted, a wire version this build does not speak, a malformed layout. Stale metadata (revoked,
        unregistered, restarted) is refused by its owner at the first transfer."""
        if not isinstance(metadata, (bytes, bytearray, memoryview)):
            raise invalid("Endpoint.connect", -1, f"metadata must be bytes, got {type(metadata).__name__}")
        return RemoteMemory(self._native.connect(bytes(metadata)))

    def disconnect(self, remote: RemoteMemory) -> None:
        """Forgets a peer's registration: its running transfers are cancelled (failed, "disconnected"), its
        connections close, a same-host mapping is unmapped, and the handle refuses further transfers (connect again
        from the metadata). Idempotent."""
        if not isinstance(remote, RemoteMemory):
            raise invalid("Endpoint.disconnect", -1, f"remote must be a kvcomm.RemoteMemory (Endpoint.connect), got "
                          f"{type(remote).__name__}")
        self._native.disconnect(remote._native)

    def read_device(self, local: Registration, remote: RemoteMemory, remote_blocks: Any, local_blocks: Any, *,
                    stream: Any = None) -> None:
        """Same-host peers: stream-ordered pull with the ids in device memory (CUDA registrations: int64 CUDA tensors
        on the registration's GPU; host registrations: int64 CPU arrays, copied synchronously), safe to capture in
        torch.cuda.graph (rewrite the ids between replays; make the first call for a pair before capturing: an empty
        batch does only that). A bad id copies nothing and is recorded: poll_error(local, remote). Keep the id
        tensors alive until the stream ran it."""
        self._device_transfer("Endpoint.read_device", False, local, remote, remote_blocks, local_blocks, stream)

    def write_device(self, local: Registration, remote: RemoteMemory, remote_blocks: Any, local_blocks: Any, *,
                     stream: Any = None) -> None:
        """read_device's push: local block local_blocks[i] into remote block remote_blocks[i]."""
        self._device_transfer("Endpoint.write_device", True, local, remote, remote_blocks, local_blocks, stream)

    def poll_error(self, local: Registration, remote: RemoteMemory) -> Optional[dict]:
        """Reads (and clears) the first error a read_device/write_device between these two recorded, as a dict, or
        None (synchronise the stream first)."""
        call = "Endpoint.poll_error"
        reg = self._registration(local, "local", call)
        if not isinstance(remote, RemoteMemory):
            raise invalid(call, -1, f"remote must be a kvcomm.RemoteMemory, got {type(remote).__name__}")
        return self._native.poll_error(reg._native, remote._native)

    def _device_transfer(self, call: str, push: bool, local: Any, remote: Any, remote_blocks: Any, local_blocks: Any,
                         stream: Any) -> None:
        reg = self._registration(local, "local", call)
        if not isinstance(remote, RemoteMemory):
            raise invalid(call, -1, f"remote must be a kvcomm.RemoteMemory (Endpoint.connect), got "
                          f"{type(remote).__name__}")
        cuda = reg.kind == MemoryKind.Cuda

        def ids(obj: Any, name: str) -> Any:
            return require(obj, name, call, -1, device="cuda" if cuda else "cpu", device_id=reg.device if cuda else -1,
                           device_why=f"the local registration is {'CUDA' if cuda else 'host'} memory: it needs "
                           f"'{'cuda' if cuda else 'cpu'}' arrays", dtypes=INT64, dtype_text="int64", ndim=1,
                           layout="contiguous", aligned=True, max_len=limits.MAX_FETCH_PAIRS,
                           max_len_name="kvcomm.limits.MAX_FETCH_PAIRS",
                           expected="a torch tensor, a numpy array, or a DLPack / __cuda_array_interface__ object")

        r, l_ = ids(remote_blocks, "remote_blocks"), ids(local_blocks, "local_blocks")
        if r.shape[0] != l_.shape[0]:
            raise invalid(call, -1, f"remote_blocks has {r.shape[0]} ids but local_blocks has {l_.shape[0]}")
        s = stream_handle(stream, cuda, reg.device if cuda else -1, -1, call)
        self._native.read_device(reg._native, remote._native, r.ptr, l_.ptr, r.shape[0], s, push)

    def _remote(self, remote: Any, call: str) -> RemoteMemory:
        if not isinstance(remote, RemoteMemory):
            raise invalid(call, -1, f"remote must be a kvcomm.RemoteMemory (Endpoint.connect), got "
                          f"{type(remote).__name__}")
        return remote

    def _start(self, call: str, push: bool, local: Any, remote: Any, remote_blocks: Any, local_blocks: Any,
               via: Any, notify: Any) -> Transfer:
        reg = self._registration(local, "local", call)
        self._remote(remote, call)
        how = _via(via, call)
        message = None if notify is None else _message(notify, "notify", call)
        if _plain_ids(remote_blocks) and _plain_ids(local_blocks):  # the common case, a few microseconds cheaper
            if remote_blocks.shape[0] != local_blocks.shape[0]:
                raise invalid(call, -1, f"remote_blocks has {remote_blocks.shape[0]} ids but local_blocks has "
                              f"{local_blocks.shape[0]}")
            return Transfer(self._native.start_arrays(reg._native, remote._native, remote_blocks, local_blocks, how,
                                                      message, push))
        r = host_ids(remote_blocks, "remote_blocks", call, -1, "endpoints read block ids on the host")
        m = host_ids(local_blocks, "local_blocks", call, -1, "endpoints read block ids on the host")
        if r.shape[0] != m.shape[0]:
            raise invalid(call, -1, f"remote_blocks has {r.shape[0]} ids but local_blocks has {m.shape[0]}")
        op = self._native.write if push else self._native.read
        native = op(reg._native, remote._native, r.ptr, m.ptr, r.shape[0], how, message)
        del r, m  # read before the call returned
        return Transfer(native)

    def read(self, local: Registration, remote: RemoteMemory, remote_blocks: Any, local_blocks: Any, *,
             via: Union[str, "_kvcomm.TransferVia"] = "auto", notify: Union[bytes, str, None] = None) -> Transfer:
        """Pulls remote blocks into local ones: pair i copies remote block remote_blocks[i] into local block
        local_blocks[i], in every region (the layouts: same region count and block_bytes). -1 on either side skips
        the pair. Ids (int64 numpy arrays, torch CPU tensors, lists of ints) are validated before anything moves (in
        range, no duplicate destination) and read before it returns. via: 'auto', 'peer', 'tcp', 'rdma' (a demanded
        path that cannot run raises UnsupportedError naming why). notify: a message (bytes, or a str sent as UTF-8;
        at most kvcomm.limits.MAX_NOTIFICATION_BYTES) the remote endpoint receives once the blocks are read (so it
        may reuse them); the transfer is done only once the remote acknowledged it, and one that fails never
        delivers it."""
        call = "Endpoint.read"
        reg = self._registration(local, "local", call)
        if not reg._writable:
            raise invalid(call, -1, "local: the registered array is read-only: a read would write it")
        return self._start(call, False, reg, remote, remote_blocks, local_blocks, via, notify)

    def write(self, local: Registration, remote: RemoteMemory, remote_blocks: Any, local_blocks: Any, *,
              via: Union[str, "_kvcomm.TransferVia"] = "auto", notify: Union[bytes, str, None] = None) -> Transfer:
        """Pushes local blocks into remote ones (the remote registration must be read_write): pair i copies local
        block local_blocks[i] into remote block remote_blocks[i]. CUDA memory: the blocks must be final when write()
        is called (synchronise the stream that produced them). notify: as read's, delivered once the blocks are
        visible in the remote's memory."""
        return self._start("Endpoint.write", True, local, remote, remote_blocks, local_blocks, via, notify)

    # ---- notifications ----
    def notify(self, remote: RemoteMemory, message: Union[bytes, str]) -> None:
        """Sends `message` (bytes, or a str sent as UTF-8; at most kvcomm.limits.MAX_NOTIFICATION_BYTES) to the
        endpoint that owns `remote` and returns once that endpoint holds it. This endpoint's notifications to one
        endpoint (these and those of transfers) arrive there in the order they were issued, each once. Raises
        InvalidArgumentError for metadata the owner refuses (revoked, unregistered, a restart), BusyError when its
        inbox is full, NetworkError when it cannot be reached (then whether it arrived is unknown)."""
        call = "Endpoint.notify"
        r = self._remote(remote, call)
        self._native.notify(r._native, _message(message, "message", call))

    def notifications(self, timeout_ms: Optional[int] = 0) -> List[Notification]:
        """Takes the notifications received so far, oldest first (each sender's in the order it issued them); waits
        up to `timeout_ms` (None or < 0: no bound) for one when there is none. Empty when none came, or once the
        endpoint closed."""
        ms = _ms(timeout_ms, "timeout_ms", "Endpoint.notifications")
        return [Notification(*n) for n in self._native.notifications(ms)]

    def close(self) -> None:
        """Unregisters everything (waiting for transfers as unregister() does, with no bound), stops listening and
        drops every connection. Idempotent."""
        self._native.close()
        for reg in self._held.values():
            reg._obj = reg._keep = None
        self._held.clear()

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # Closed before the arrays it holds are released, whatever order the collector drops attributes in.
        native = getattr(self, "_native", None)
        if native is not None:
            try:
                native.close()
            except Exception:  # noqa: BLE001 - nothing to report to at collection time
                pass

    def __repr__(self) -> str:
        return (f"kvcomm.Endpoint(name={self.name!r}, address={self.address!r}, "
                f"registrations={len(self._held)})")


__all__ = ["Access", "Endpoint", "Registration", "RemoteMemory", "Transfer", "TransferVia"]
