"""kvcomm's limit table (include/kvcomm/limits.hpp), as the loaded library has it.

Every count the API takes has one documented limit; the package compares a count with its limit before anything is
sized or read, so a count past it raises kvcomm.InvalidArgumentError naming the count and the limit.
"""

from __future__ import annotations

from . import _kvcomm

_TABLE = _kvcomm.limits()

#: Members of a communicator (the size a bootstrap is given; ParallelGroups sizes multiply to at most this).
MAX_RANKS: int = _TABLE["MAX_RANKS"]
#: Regions of one fetch layout (Fetcher's `layout`).
MAX_FETCH_REGIONS: int = _TABLE["MAX_FETCH_REGIONS"]
#: Requests of one fetch call (fetch, plan, start, fetch_all).
MAX_FETCH_REQUESTS: int = _TABLE["MAX_FETCH_REQUESTS"]
#: Block pairs of one fetch call: the sum of its requests' lengths, or fetch_device's length.
MAX_FETCH_PAIRS: int = _TABLE["MAX_FETCH_PAIRS"]
#: Cache tensors of one publish call.
MAX_PUBLISH_TENSORS: int = _TABLE["MAX_PUBLISH_TENSORS"]
#: Lanes of a Barrier, of a Publisher's barrier and of a Fetcher's collective form (lanes is 1 to this).
MAX_BARRIER_LANES: int = _TABLE["MAX_BARRIER_LANES"]
#: Members a Barrier, Direct publishing and fetch_all support.
MAX_HANDLE_PEERS: int = _TABLE["MAX_HANDLE_PEERS"]
#: Ranges of one SymmetricBuffer.commit / release call.
MAX_BUFFER_RANGES: int = _TABLE["MAX_BUFFER_RANGES"]
#: Regions of one arena layout (C++ and C API only).
MAX_ARENA_REGIONS: int = _TABLE["MAX_ARENA_REGIONS"]
#: Bytes of one endpoint notification (Endpoint.notify, read/write's notify=).
MAX_NOTIFICATION_BYTES: int = _TABLE["MAX_NOTIFICATION_BYTES"]

__all__ = ["MAX_ARENA_REGIONS", "MAX_BARRIER_LANES", "MAX_BUFFER_RANGES", "MAX_FETCH_PAIRS", "MAX_FETCH_REGIONS",
           "MAX_FETCH_REQUESTS", "MAX_HANDLE_PEERS", "MAX_NOTIFICATION_BYTES",
           "MAX_PUBLISH_TENSORS", "MAX_RANKS"]
