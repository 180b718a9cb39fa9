"""Building a world Communicator: from a TCP unique id, or over a process group the program already has
(torch.distributed group or Store, mpi4py, any allgather callable)."""

from __future__ import annotations

import itertools
from typing import Any, Callable, Optional, Sequence, Union

from . import _kvcomm
from ._errors import UnsupportedError, check_int, invalid

Communicator = _kvcomm.Communicator
UniqueId = _kvcomm.UniqueId

AllgatherFn = Callable[[bytes], Union[bytes, Sequence[bytes]]]


def _built(comm: Communicator, bootstrap: str) -> Communicator:
    """Notes on a world how it was bootstrapped: its repr names it (kvcomm.Communicator(..., bootstrap='tcp'))."""
    comm._bootstrap = bootstrap
    return comm


def create_unique_id(ifname: str = "") -> UniqueId:
    """A new TCP bootstrap id; call it in the process that will be rank 0 and hand ``str(id)`` to every rank."""
    return UniqueId.create(ifname)


def init_tcp(unique_id: Union[UniqueId, str], rank: int, size: int, timeout_ms: int = -1) -> Communicator:
    """World communicator over TCP (collective): every rank passes the same id (object or its string)."""
    uid = UniqueId.from_string(unique_id) if isinstance(unique_id, str) else unique_id
    return _built(Communicator.from_unique_id(uid, rank, size, timeout_ms), "tcp")  # checks each argument


def init_allgather(rank: int, size: int, allgather: AllgatherFn) -> Communicator:
    """World communicator over the caller's ``allgather(data: bytes) -> bytes | [bytes, ...]`` (collective).

    The callable gathers equal-sized bytes from every rank in rank order; kvcomm calls it (with the GIL) only while
    this function runs, to exchange its own TCP addresses.
    """
    return _built(Communicator.from_allgather(rank, size, allgather), "allgather")


def init_torch(group: Optional[Any] = None) -> Communicator:
    """World communicator over a torch.distributed process group (default: the world group), collective over it.

    The bootstrap's few bytes travel through ``torch.distributed.all_gather_object`` (gloo or NCCL groups alike; with
    NCCL, set the CUDA device first as torch requires)."""
    try:
        import torch.distributed as dist
    except ImportError as e:
        raise UnsupportedError(f"kvcomm [rank -1] init_torch: needs torch.distributed ({e})") from None
    try:
        rank, size = dist.get_rank(group), dist.get_world_size(group)
    except (RuntimeError, ValueError, TypeError, AttributeError) as e:  # no process group, or not a group
        raise invalid("init_torch", -1, f"group {group!r} is not a torch.distributed group this process is in "
                      f"({type(e).__name__}: {e})") from None
    if rank < 0:
        raise invalid("init_torch", -1, "this process is not a member of the group")

    def allgather(data: bytes) -> Sequence[bytes]:
        out: list = [None] * size
        dist.all_gather_object(out, data, group=group)
        return out

    return _built(Communicator.from_allgather(rank, size, allgather), "torch")


_store_calls = itertools.count()


def init_store(store: Any, rank: int, size: int, prefix: str = "kvcomm") -> Communicator:
    """World communicator over a torch.distributed Store (TCPStore, FileStore, PrefixStore ...), collective over
    ``size`` ranks: each contributes with ``store.set`` and reads the others with ``store.get`` (which waits up to the
    store's timeout). Every call of this function on a store needs a distinct ``prefix`` or the same call order."""
    if not isinstance(prefix, str):
        raise invalid("init_store", -1, f"prefix must be a str, got {type(prefix).__name__}")
    for what in ("set", "get"):
        if not callable(getattr(store, what, None)):
            raise invalid("init_store", -1, f"store must have set() and get() (a torch.distributed Store), got "
                          f"{type(store).__name__}")
    size = check_int(size, "size", "init_store", -1, 1 << 31)
    call = next(_store_calls)

    def allgather(data: bytes) -> Sequence[bytes]:
        key = f"{prefix}/bootstrap/{call}"
        store.set(f"{key}/{rank}", data)
        return [bytes(store.get(f"{key}/{r}")) for r in range(size)]

    return _built(Communicator.from_allgather(rank, size, allgather), "store")


def init_mpi4py(comm: Optional[Any] = None) -> Communicator:
    """World communicator over an mpi4py communicator (default MPI.COMM_WORLD), collective over it."""
    if comm is None:
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise UnsupportedError(f"kvcomm [rank -1] init_mpi4py: needs mpi4py ({e})") from None
        comm = MPI.COMM_WORLD
    try:
        rank, size = comm.Get_rank(), comm.Get_size()
    except Exception as e:  # noqa: BLE001 - not an mpi4py communicator
        raise invalid("init_mpi4py", -1, f"comm must be an mpi4py communicator, got {type(comm).__name__} "
                      f"({type(e).__name__}: {e})") from None
    return _built(Communicator.from_allgather(rank, size, lambda data: comm.allgather(data)), "mpi4py")
