"""kvcomm: publish KV rows into every replica of a symmetric buffer, then one capture-safe barrier; fetch KV blocks
from other ranks' caches into this rank's own blocks.

A first program (4 processes on one host, host memory)::

    import kvcomm, numpy as np
    comm = kvcomm.init_tcp(unique_id, rank, 4)        # unique_id = str(kvcomm.create_unique_id()) on rank 0
    cache = kvcomm.SymmetricBuffer.create(comm, 1 << 20, kind="host")
    pub = kvcomm.Publisher(cache)
    pub.publish(kvcomm.CacheTensor(rows, offset=0), slots, then="barrier")  # rows: [n, 656] uint8, slots: int64
    cache.local()                                      # every rank's rows, as a numpy array

    fetcher = kvcomm.Fetcher(cache, [kvcomm.KvRegion(0, 4096, 0, 64)])  # one region of 64 blocks of 4 KiB
    fetcher.fetch([(peer, np.array([3, 4], np.int64), np.array([10, 11], np.int64))])  # its blocks 3, 4 -> my 10, 11

Arenas share KV memory between independent processes of one host (a KV server and its engines)::

    server = kvcomm.ArenaServer("@kv")                  # server process
    s = server.accept()
    arena = kvcomm.Arena([kvcomm.KvRegion(0, 4096, 0, 64)], kind="host")
    s.send(s.offer(arena).to_bytes())
    ...
    s = kvcomm.ArenaSession.connect("@kv")              # client process
    kv = s.import_(s.receive())                          # kv.view(): the arena's bytes, zero-copy

Endpoints move KV blocks between processes that meet at run time (any hosts), from a registration's metadata alone::

    ep = kvcomm.Endpoint("decode")
    mine = ep.register(kv_cache, layout)                 # a numpy array or torch tensor, host or CUDA
    remote = ep.connect(metadata)                        # bytes from the peer's registration.metadata()
    ep.read(mine, remote, [3, 4], [10, 11]).wait()       # its blocks 3, 4 -> my 10, 11

See docs/python.md for torch tensors, CUDA graphs, torch.distributed bootstraps, Barrier, fetch, arenas and
endpoints.
"""

from __future__ import annotations

import enum

from . import _kvcomm, limits
from ._bootstrap import (
    Communicator,
    UniqueId,
    create_unique_id,
    init_allgather,
    init_mpi4py,
    init_store,
    init_tcp,
    init_torch,
)
from ._errors import (
    AbortedError,
    BusyError,
    CudaError,
    Error,
    ErrorCode,
    InternalError,
    InvalidArgumentError,
    NetworkError,
    RemoteError,
    SystemError,
    TimeoutError,
    UnsupportedError,
    check_int as _check_int,
)
from ._arena import Arena, ArenaCapability, ArenaGrowth, ArenaImport, ArenaPin, ArenaServer, ArenaSession, OwnerLoss
from ._barrier import Barrier
from ._endpoint import Access, Endpoint, Notification, Registration, RemoteMemory, Transfer, TransferVia
from ._fetch import (
    FetchOperation,
    FetchPath,
    FetchTransport,
    FetchPlan,
    FetchPlanInfo,
    FetchRequest,
    FetchState,
    FetchStatus,
    Fetcher,
    KvRegion,
    layout_hash,
)
from ._publish import CacheTensor, PublishMode, Publisher, PublishThen
from ._symm import MemoryKind, SymmetricBuffer

ParallelGroups = _kvcomm.ParallelGroups


class Axis(enum.IntEnum):
    """The dimensions of a ParallelGroups (ParallelGroups.group_of's axis)."""

    TP = 0
    PCP = 1
    PP = 2
    DP = 3


def _version_string(code: int) -> str:
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


__version__ = _version_string(_kvcomm.version())


def capabilities() -> str:
    """What this machine and build can do (GPUs, handle types, RDMA), as kvcomm-info prints it."""
    return _kvcomm.capabilities()


def use_local_device(local_rank: int) -> int:
    """Makes CUDA device local_rank % count current on this thread; returns its ordinal, or -1 without a GPU."""
    return _kvcomm.use_local_device(_check_int(local_rank, "local_rank", "use_local_device", -1, 1 << 31))


__all__ = [
    "AbortedError", "Access", "Arena", "ArenaCapability", "ArenaGrowth", "ArenaImport", "ArenaPin", "ArenaServer",
    "ArenaSession", "Axis", "Barrier", "BusyError", "CacheTensor", "Communicator", "CudaError", "Endpoint", "Error",
    "ErrorCode", "FetchOperation", "FetchPath", "FetchPlan", "FetchPlanInfo", "FetchTransport", "FetchRequest",
    "FetchState", "FetchStatus", "Fetcher", "InternalError", "InvalidArgumentError", "KvRegion", "ParallelGroups",
    "MemoryKind", "NetworkError", "Notification", "OwnerLoss", "PublishMode", "PublishThen", "Publisher", "Registration",
    "RemoteError", "RemoteMemory", "SymmetricBuffer", "SystemError", "TimeoutError", "Transfer", "TransferVia", "UniqueId",
    "UnsupportedError", "__version__", "capabilities", "create_unique_id", "init_allgather", "init_mpi4py",
    "init_store", "init_tcp", "init_torch", "layout_hash", "limits", "use_local_device",
]
