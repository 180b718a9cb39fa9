"""Fetcher: pull KV blocks that live in another member's cache straight into this rank's own blocks.

Every member registers its own layout once (regions that one block id indexes together: one per layer and K/V);
a request names a source rank and pairs of block ids. Ids are validated here (dtype int64, 1-D, contiguous, same
length, the right device) and used in place, never converted or copied (Python lists are turned into int64 arrays);
the library then validates every id against the layouts before anything moves. A refused call writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _kvcomm, limits
from ._arrays import INT32, INT64, ArrayView, int64_list, is_int_list, require
from ._device_errors import DeviceErrors
from ._errors import Error, InvalidArgumentError, check_count, check_int, count_of, invalid, shown
from ._stream import stream_handle
from ._symm import MemoryKind, SymmetricBuffer

FetchPath = _kvcomm.FetchPath
FetchTransport = _kvcomm.FetchTransport
FetchState = _kvcomm.FetchState
FetchPlanInfo = _kvcomm.FetchPlanInfo

_PATHS = {"auto": FetchPath.Auto, "kernel": FetchPath.Kernel, "copy": FetchPath.CopyEngine,
          "copy_engine": FetchPath.CopyEngine, "host": FetchPath.Host}


@dataclass(frozen=True)
class KvRegion:
    """One region of a KV layout, bytes from the buffer's base: block b occupies
    ``[offset + b * block_stride, offset + b * block_stride + block_bytes)``; block_stride 0 means block_bytes.
    Valid block ids are ``[0, num_blocks)`` (num_blocks must be given and positive). A plain 4-tuple
    ``(offset, block_bytes, block_stride, num_blocks)`` works wherever a KvRegion does."""

    offset: int
    block_bytes: int
    block_stride: int = 0
    num_blocks: int = 0


@dataclass(frozen=True)
class FetchRequest:
    """Blocks to pull from member `src_rank`: pair i copies its block ``src_ids[i]`` into this rank's block
    ``dst_ids[i]``, in every region; -1 on either side skips the pair. A tuple ``(src_rank, src_ids, dst_ids)`` or
    ``(src_rank, src_ids, dst_ids, src_layout_hash)`` works wherever a FetchRequest does. src_layout_hash 0 accepts
    the source's registered layout; any other value must equal it."""

    src_rank: int
    src_ids: Any
    dst_ids: Any
    src_layout_hash: int = 0


@dataclass(frozen=True)
class FetchStatus:
    """What FetchOperation.test()/wait() report. Failed: `failed_blocks` (int64 numpy array) names the destination
    blocks whose bytes are not known to have landed (each may be partly written) and `error` says why."""

    state: "_kvcomm.FetchState"
    bytes_done: int
    bytes_total: int
    failed_blocks: np.ndarray = field(repr=False)
    error: str = ""

    @property
    def done(self) -> bool:
        return self.state == FetchState.Done

    @property
    def failed(self) -> bool:
        return self.state == FetchState.Failed

    @property
    def in_progress(self) -> bool:
        return self.state == FetchState.InProgress


def _regions(layout: Any, call: str, rank: int) -> List[Tuple[int, int, int, int]]:
    if isinstance(layout, KvRegion):
        layout = [layout]
    if isinstance(layout, (str, bytes)) or not hasattr(layout, "__iter__"):
        raise invalid(call, rank, f"layout must be a list of KvRegion or (offset, block_bytes, block_stride, "
                      f"num_blocks) tuples, got {type(layout).__name__}")
    cap = limits.MAX_FETCH_REGIONS
    count_of(layout, "regions", call, rank, cap, "MAX_FETCH_REGIONS")
    out = []
    for j, r in enumerate(layout):
        if j >= cap:
            raise invalid(call, rank, f"more than kvcomm.limits.MAX_FETCH_REGIONS = {cap} regions")
        if isinstance(r, KvRegion):
            r = (r.offset, r.block_bytes, r.block_stride, r.num_blocks)
        if not isinstance(r, (tuple, list)) or len(r) != 4:
            raise invalid(call, rank, f"region {j}: expected a KvRegion or a 4-tuple (offset, block_bytes, "
                          f"block_stride, num_blocks), got {r!r}")
        names = ("offset", "block_bytes", "block_stride", "num_blocks")
        out.append(tuple(check_int(v, f"region {j}: {n}", call, rank) for n, v in zip(names, r)))
    return out


def host_ids(obj: Any, name: str, call: str, rank: int, elsewhere: str) -> ArrayView:
    """Block ids read on the host (a 1-D contiguous int64 CPU array, or a Python list of ints converted to one), at
    most kvcomm.limits.MAX_FETCH_PAIRS; `elsewhere` says where ids in device memory go instead."""
    if is_int_list(obj):
        obj = int64_list(obj, name, "block id", call, rank, limits.MAX_FETCH_PAIRS, "kvcomm.limits.MAX_FETCH_PAIRS")
    return require(obj, name, call, rank, device="cpu", device_why=f"host block ids must be on the CPU ({elsewhere})",
                   dtypes=INT64, dtype_text="int64", ndim=1, layout="contiguous", aligned=True,
                   max_len=limits.MAX_FETCH_PAIRS, max_len_name="kvcomm.limits.MAX_FETCH_PAIRS",
                   expected="an int64 numpy array, a torch CPU tensor, or a list of ints")


def layout_hash(layout: Any, version: int = 0) -> int:
    """FNV-1a hash of a layout (a list of KvRegion or 4-tuples, and the engine's version): what requests
    (src_layout_hash) and peers compare."""
    return _kvcomm.layout_hash(_regions(layout, "layout_hash", -1), check_int(version, "version", "layout_hash", -1))


def _path(path: Any, call: str, rank: int) -> "_kvcomm.FetchPath":
    """A kvcomm.FetchPath member or its name; an int (even a member's value) or anything else is refused."""
    if isinstance(path, FetchPath):
        return path
    p = _PATHS.get(path.lower()) if isinstance(path, str) else None
    if p is None:
        raise invalid(call, rank, f"path {shown(path)} is not one of 'auto', 'kernel', 'copy', 'host' (or a "
                      "kvcomm.FetchPath)")
    return p


def _join_then_raise(convert: Callable[[], Tuple[Any, ...]], nothing: Tuple[Any, ...],
                     collective: Callable[[Tuple[Any, ...]], Any]) -> Any:
    """Join the collective, then raise (C++'s detail::joinThenThrow for the package's own argument checks): a rank
    whose arguments do not convert still takes part in `collective`, with `nothing` (refused by every member
    together, or nothing to do), so no member waits on it; its own InvalidArgumentError is raised afterwards, and
    wins over the collective's error about the empty arguments."""
    bad: Optional[InvalidArgumentError] = None
    try:
        args = convert()
    except InvalidArgumentError as e:
        bad, args = e, nothing
    try:
        result = collective(args)
    except Error:
        if bad is not None:
            raise bad from None
        raise
    if bad is not None:
        raise bad
    return result


class FetchPlan:
    """A validated, coalesced batch (Fetcher.plan), reusable with Fetcher.submit while the buffer does not change
    (after a grow/commit/release and Fetcher.refresh() it is stale: plan again)."""

    def __init__(self, native: "_kvcomm.FetchPlan") -> None:
        """Wraps a native plan; use Fetcher.plan()."""
        if not isinstance(native, _kvcomm.FetchPlan):
            raise invalid("FetchPlan", -1, f"FetchPlan(...) wraps a native plan: use Fetcher.plan() (got "
                          f"{type(native).__name__})")
        self._native = native

    @property
    def info(self) -> "_kvcomm.FetchPlanInfo":
        return self._native.info

    @property
    def generation(self) -> int:
        """The buffer generation the plan was validated at."""
        return self._native.generation

    def __repr__(self) -> str:
        return f"kvcomm.FetchPlan({self.info!r})"


class FetchOperation:
    """A polled fetch (Fetcher.start). It keeps what it writes through alive, so dropping its Fetcher neither stops
    nor waits for it; dropping the operation waits until nothing can still write the destination."""

    def __init__(self, native: "_kvcomm.FetchOperation", rank: int = -1) -> None:
        """Wraps a native operation; use Fetcher.start()."""
        if not isinstance(native, _kvcomm.FetchOperation):
            raise invalid("FetchOperation", -1, f"FetchOperation(...) wraps a native operation: use Fetcher.start() "
                          f"(got {type(native).__name__})")
        self._native = native
        self._rank = check_int(rank, "rank", "FetchOperation", -1, 1 << 31, -1)

    @staticmethod
    def _status(raw: tuple) -> FetchStatus:
        state, done, total, failed, error = raw
        return FetchStatus(state, done, total, failed, error)

    def test(self) -> FetchStatus:
        """Non-blocking: the state, bytes done of bytes total, and (Failed) the failed blocks and the error."""
        return self._status(self._native.test())

    def wait(self, timeout_ms: int = -1) -> FetchStatus:
        """Blocks (without the GIL) up to timeout_ms (< 0: until it ends). Expiry returns an InProgress status and
        cancels nothing. Done and Failed are final."""
        # Checked like every other integer argument: int() truncated 1.9 to 1 and took "5".
        ms = check_int(timeout_ms, "timeout_ms", "FetchOperation.wait", self._rank, 1 << 63, -(1 << 63))
        return self._status(self._native.wait(ms))


Requests = Union[FetchRequest, tuple, Sequence[Union[FetchRequest, tuple]]]


class Fetcher(DeviceErrors):
    """Fetches of KV blocks between the members of a SymmetricBuffer's group.

    Call order:
      1. ``Fetcher(buffer, layout)`` on every member (collective): each registers its own layout (members may place
         regions differently, but every member needs the same number of regions with the same block_bytes).
      2. Any number of one-sided fetches, from any member (the source does nothing; its bytes must be final, e.g.
         after a barrier): ``fetch()`` (stream-ordered; host buffers: done when it returns), ``plan()`` once +
         ``submit()`` many times, ``fetch_device()`` (ids in device memory, capturable in a CUDA graph),
         ``start()`` (polled), ``fetch_all()`` (collective: every member's requests, between two barriers).
      3. After the buffer grows (or commit/release), ``refresh()`` on every member before the next host-planned fetch.

    Host ids (fetch, plan, start, fetch_all) are CPU arrays: int64 numpy arrays, torch CPU tensors, anything with
    ``__array_interface__`` or DLPack, or Python lists (converted). They are read before the call returns.
    """

    def __init__(self, buffer: SymmetricBuffer, layout: Any, *, version: int = 0, lanes: int = 1,
                 barrier_timeout_ms: int = -1) -> None:
        """Collective over the buffer's group. layout: a list of KvRegion (or 4-tuples); version: the engine's own
        version of it (part of the hash); barrier_timeout_ms: the collective form's barrier. lanes: unused (checked,
        then ignored: fetch_all's barriers run on one lane), kept so existing callers keep working."""
        if not isinstance(buffer, SymmetricBuffer):
            raise invalid("Fetcher", -1, f"expected a kvcomm.SymmetricBuffer, got {type(buffer).__name__}")
        self._buffer = buffer
        call = "Fetcher"
        # A malformed layout on one rank must not leave the others in the collective: register an empty layout
        # (refused by every rank together), then raise the precise error here.
        def convert() -> Tuple[Any, ...]:
            regions = _regions(layout, call, buffer.rank)
            ver = check_int(version, "version", call, buffer.rank)
            check_count(lanes, "lanes", call, buffer.rank, limits.MAX_BARRIER_LANES, "MAX_BARRIER_LANES")
            return regions, ver, check_int(barrier_timeout_ms, "barrier_timeout_ms", call, buffer.rank, 1 << 63,
                                           -(1 << 63))

        def create(args: Tuple[Any, ...]) -> None:
            self._native = _kvcomm.Fetcher.create(buffer._native, *args)

        _join_then_raise(convert, ([], 0, -1), create)

    @classmethod
    def create(cls, buffer: SymmetricBuffer, layout: Any, **options: Any) -> "Fetcher":
        """Same as ``Fetcher(buffer, layout, **options)``."""
        return cls(buffer, layout, **options)

    # ---- validation ----
    @property
    def _rank(self) -> int:
        return self._buffer.rank

    def _host_ids(self, obj: Any, name: str, call: str) -> ArrayView:
        return host_ids(obj, name, call, self._rank, "ids in device memory go through fetch_device()")

    def _requests(self, requests: Requests, call: str) -> Tuple[list, list]:
        rank = self._rank
        if isinstance(requests, FetchRequest) or (isinstance(requests, tuple) and len(requests) in (3, 4)
                                                  and isinstance(requests[0], (int, np.integer))):
            requests = [requests]
        if not hasattr(requests, "__iter__"):
            raise invalid(call, rank, f"requests must be a list of (src_rank, src_ids, dst_ids) tuples or "
                          f"FetchRequest, got {type(requests).__name__}")
        cap, pairs_cap = limits.MAX_FETCH_REQUESTS, limits.MAX_FETCH_PAIRS
        count_of(requests, "requests", call, rank, cap, "MAX_FETCH_REQUESTS")
        raw, keep, pairs = [], [], 0
        for k, q in enumerate(requests):
            if k >= cap:
                raise invalid(call, rank, f"more than kvcomm.limits.MAX_FETCH_REQUESTS = {cap} requests")
            if isinstance(q, FetchRequest):
                q = (q.src_rank, q.src_ids, q.dst_ids, q.src_layout_hash)
            if not isinstance(q, (tuple, list)) or len(q) not in (3, 4):
                raise invalid(call, rank, f"request {k}: expected (src_rank, src_ids, dst_ids[, src_layout_hash]) "
                              f"or a FetchRequest, got {type(q).__name__}")
            src_rank = check_int(q[0], f"request {k}: source rank", call, rank, self._buffer.size)
            h = check_int(q[3], f"request {k}: src_layout_hash", call, rank) if len(q) == 4 else 0
            s = self._host_ids(q[1], f"request {k}: src_ids", call)
            d = self._host_ids(q[2], f"request {k}: dst_ids", call)
            if s.shape[0] != d.shape[0]:
                raise invalid(call, rank, f"request {k}: src_ids has {s.shape[0]} ids but dst_ids has {d.shape[0]}")
            pairs += s.shape[0]
            if pairs > pairs_cap:
                raise invalid(call, rank, f"requests 0 to {k} hold {pairs} block pairs, more than "
                              f"kvcomm.limits.MAX_FETCH_PAIRS = {pairs_cap}")
            raw.append((src_rank, s.ptr, d.ptr, s.shape[0], h))
            keep += [s, d]
        return raw, keep

    def _stream(self, stream: Any, call: str) -> int:
        b = self._buffer
        return stream_handle(stream, b.kind == MemoryKind.Cuda, b.device, b.rank, call)

    # ---- fetches ----
    def plan(self, requests: Requests, *, path: Any = "auto", copy_engine_min_run_bytes: int = 0) -> FetchPlan:
        """Validates and coalesces without moving anything (InvalidArgumentError naming the request and pair: id out
        of range, negative id other than -1, duplicate destination, stale generation, layout hash mismatch)."""
        call = "Fetcher.plan"
        raw, keep = self._requests(requests, call)
        how = _path(path, call, self._rank)
        ce = check_int(copy_engine_min_run_bytes, "copy_engine_min_run_bytes", call, self._rank)
        p = self._native.plan(raw, how, ce, 0)
        del keep
        return FetchPlan(p)

    def submit(self, plan: FetchPlan, stream: Any = None) -> None:
        """Enqueues a plan made by this fetcher (stream-ordered; host buffers: done when it returns). Refused while
        the stream is being captured (host ids would be frozen into the graph: use fetch_device())."""
        if not isinstance(plan, FetchPlan):
            raise invalid("Fetcher.submit", self._rank, f"expected a kvcomm.FetchPlan, got {type(plan).__name__}")
        self._native.submit(plan._native, self._stream(stream, "Fetcher.submit"))

    def fetch(self, requests: Requests, stream: Any = None, path: Any = "auto", *,
              copy_engine_min_run_bytes: int = 0, validation: str = "host") -> "_kvcomm.FetchPlanInfo":
        """plan() + submit() in one call; returns the plan's info (pairs, runs after coalescing, bytes, path).
        requests: ``[(src_rank, src_ids, dst_ids), ...]`` (or FetchRequest). path: 'auto' (KVCOMM_FETCH_PATH, else per
        run), 'kernel', 'copy' or 'host'; a path that cannot run on this buffer raises UnsupportedError.
        validation: 'host' (a bad pair raises here) or 'device' (CUDA buffers, same-host sources: the kernel checks
        the pairs, all or nothing, and check_errors() raises a bad one after the stream ran; host work per call stops
        growing with the pairs; host buffers still check here)."""
        call = "Fetcher.fetch"
        if validation not in ("host", "device"):
            raise invalid(call, self._rank, f"validation {shown(validation)} is not one of 'host', 'device'")
        raw, keep = self._requests(requests, call)
        s = self._stream(stream, call)
        how = _path(path, call, self._rank)
        ce = check_int(copy_engine_min_run_bytes, "copy_engine_min_run_bytes", call, self._rank)
        info = self._native.fetch(raw, s, how, ce, 0, validation == "device")
        del keep
        return info

    def fetch_device(self, src_ids: Any, dst_ids: Any, src_rank: Optional[int] = None, *, src_ranks: Any = None,
                     stream: Any = None) -> None:
        """Stream-ordered fetch of ids in device memory (CUDA buffers: int64 CUDA tensors on the buffer's GPU;
        host buffers: int64 CPU arrays), safe to capture in torch.cuda.graph: rewrite the ids between replays.
        Sources: one `src_rank` for every pair, or `src_ranks` (int32, one per pair). CUDA: an id outside the layout
        skips that pair and check_errors() raises it; host buffers refuse the whole batch before copying. A destination
        named by several pairs goes whole to the last of them. Keep the id tensors alive until the stream ran the
        fetch."""
        call = "Fetcher.fetch_device"
        rank = self._rank
        cuda = self._buffer.kind == MemoryKind.Cuda
        if (src_rank is None) == (src_ranks is None):
            raise invalid(call, rank, "pass exactly one of src_rank (every pair) and src_ranks (one per pair)")

        def ids(obj: Any, name: str, dtype: str, dtypes: Any) -> ArrayView:
            return require(obj, name, call, rank, device="cuda" if cuda else "cpu",
                           device_id=self._buffer.device if cuda else -1,
                           device_why=f"the buffer is {'CUDA' if cuda else 'host'} memory: it needs "
                           f"'{'cuda' if cuda else 'cpu'}' arrays", dtypes=dtypes,
                           dtype_text=dtype, ndim=1, layout="contiguous", aligned=True,
                           max_len=limits.MAX_FETCH_PAIRS, max_len_name="kvcomm.limits.MAX_FETCH_PAIRS",
                           expected="a torch tensor, a numpy array, or a DLPack / __cuda_array_interface__ object")

        s = ids(src_ids, "src_ids", "int64", INT64)
        d = ids(dst_ids, "dst_ids", "int64", INT64)
        if s.shape[0] != d.shape[0]:
            raise invalid(call, rank, f"src_ids has {s.shape[0]} ids but dst_ids has {d.shape[0]}")
        ranks_ptr, one = 0, -1
        if src_ranks is not None:
            r = ids(src_ranks, "src_ranks", "int32", INT32)
            if r.shape[0] != s.shape[0]:
                raise invalid(call, rank, f"src_ranks has {r.shape[0]} entries but there are {s.shape[0]} pairs")
            ranks_ptr = r.ptr
        else:
            one = check_int(src_rank, "src_rank", call, rank, self._buffer.size)
        self._native.fetch_device(s.ptr, d.ptr, ranks_ptr, one, s.shape[0], self._stream(stream, call))

    def start(self, requests: Requests, *, path: Any = "auto", max_bytes_per_second: int = 0,
              stream: Any = None) -> FetchOperation:
        """Starts a polled fetch (validated like plan(); ids are read before it returns). max_bytes_per_second paces
        host-memory copies (0: unlimited). CUDA buffers enqueue on `stream` (None: the fetcher's own stream); host
        buffers copy on a worker thread."""
        call = "Fetcher.start"
        raw, keep = self._requests(requests, call)
        p = _path(path, call, self._rank)
        bps = check_int(max_bytes_per_second, "max_bytes_per_second", call, self._rank)
        s = 0 if stream is None else self._stream(stream, call)
        op = self._native.start(raw, s, p, 0, bps)
        del keep
        return FetchOperation(op, self._rank)

    def fetch_all(self, requests: Requests = (), stream: Any = None, path: Any = "auto", *,
                  copy_engine_min_run_bytes: int = 0) -> "_kvcomm.FetchPlanInfo":
        """Collective: every member passes its own requests (possibly none) and the call returns, in stream order,
        once every member's blocks landed; it starts with a barrier (every source's earlier writes are visible) and
        ends with one (no source block is overwritten while a peer reads it). A bad request fails this rank only,
        after the barriers: the other members' fetches still complete."""
        call = "Fetcher.fetch_all"

        def convert() -> Tuple[Any, ...]:
            raw, keep = self._requests(requests, call)
            return (raw, keep, self._stream(stream, call), _path(path, call, self._rank),
                    check_int(copy_engine_min_run_bytes, "copy_engine_min_run_bytes", call, self._rank))

        return _join_then_raise(convert, ([], [], self._stream(None, call), FetchPath.Auto, 0),
                                lambda a: self._native.fetch_all(a[0], a[2], a[3], a[4], 0))

    def refresh(self) -> None:
        """Collective: revalidates every member's layout against the buffer as it is now (after grow, commit or
        release) and adopts its generation. Plans made before stay stale."""
        self._native.refresh()

    # ---- queries ----
    @property
    def buffer(self) -> SymmetricBuffer:
        return self._buffer

    def layout(self, rank: Optional[int] = None) -> List[KvRegion]:
        """Member `rank`'s registered layout (default: this rank's)."""
        regions, _ = self._native.layout(self._member(rank, "Fetcher.layout"))
        return [KvRegion(*r) for r in regions]

    def layout_version(self, rank: Optional[int] = None) -> int:
        """The version member `rank` registered with its layout."""
        return self._native.layout(self._member(rank, "Fetcher.layout_version"))[1]

    def transport(self, rank: Optional[int] = None) -> "_kvcomm.FetchTransport":
        """What carries fetches from member `rank` (default: this rank) to this rank (FetchTransport.Peer, Tcp, Rdma;
        None_: none), as the layout queries take `rank`."""
        return self._native.transport(self._member(rank, "Fetcher.transport"))

    def layout_hash(self, rank: Optional[int] = None) -> int:
        """Hash of member `rank`'s layout (default: this rank's), as FetchRequest.src_layout_hash expects it."""
        return self._native.layout_hash(self._member(rank, "Fetcher.layout_hash"))

    def _member(self, rank: Optional[int], call: str) -> int:
        return self._rank if rank is None else check_int(rank, "rank", call, self._rank, self._buffer.size)

    @property
    def generation(self) -> int:
        """The buffer generation the layouts were validated at."""
        return self._native.generation

    def device_handle(self) -> bytes:
        """The bytes of a kvcomm::FetchDeviceHandle (kvcomm/device/fetch.hpp), for custom CUDA kernels."""
        return self._native.device_handle()

    def __repr__(self) -> str:
        return f"kvcomm.Fetcher(regions={len(self.layout())}, generation={self.generation}, buffer={self._buffer!r})"
