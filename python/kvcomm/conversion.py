"""KV contents and conversion plans (``import kvcomm.conversion``): what a layout's regions hold, and which bytes of
which source land where in a cache laid out differently (another TP split, block size, token/head order). The C++
API's ``kvcomm/kv_contents.hpp`` and ``kvcomm/kv_conversion.hpp``, with the same checks (docs/api/kv-conversion.md).

``read_converted`` reads a token range from endpoints whose caches are laid out differently into a host or CUDA
registration (same-host sources straight through their mappings; others land through the usual path first; the
plan's pieces then rebuild the local blocks: memcpy, or one conversion kernel on the GPU);
``apply_conversion`` applies a plan between host arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import _kvcomm
from ._errors import check_int, invalid
from ._endpoint import Endpoint, Registration, RemoteMemory, _ms, _via
from ._fetch import FetchStatus, KvRegion
from ._symm import SymmetricBuffer

_ORDERS = {"nhd": 0, "hnd": 1}


@dataclass(frozen=True)
class KvContents:
    """What one region's blocks hold: per block `tokens_per_block` tokens; per token the heads [head_begin, head_end)
    (head_end 0: num_heads) of the model's `num_heads`, each `head_dim` elements of `element_bytes` bytes; `order`
    "nhd" (tokens x heads x dim) or "hnd" (heads x tokens x dim); `replicated`: every rank holds every head."""

    element_bytes: int
    head_dim: int
    tokens_per_block: int
    num_heads: int = 1
    head_begin: int = 0
    head_end: int = 0
    order: str = "nhd"
    replicated: bool = False


@dataclass
class ConversionPlan:
    """`pieces[s]`: source s's copies, an (n, 3) uint64 array of (src_offset, dst_offset, bytes); `head_source[r]`:
    the source of each head the destination's region r holds; `bytes`: all pieces together."""

    pieces: List[np.ndarray]
    head_source: List[List[int]]
    bytes: int

    @property
    def count(self) -> int:
        return sum(len(p) for p in self.pieces)


def _raw(c: Any, call: str, what: str) -> tuple:
    if not isinstance(c, KvContents):
        raise invalid(call, -1, f"{what}: expected a kvcomm.conversion.KvContents, got {type(c).__name__}")
    # Checked once per object (KvContents is frozen): checking the fields of every region's contents on every read
    # was most of a converted read's host time (one H100, 512 MiB reads of 8 regions: 0.86-0.91x of a plain read
    # before, 0.92-1.06x after).
    raw = c.__dict__.get("_kvcomm_raw")
    if raw is not None:
        return raw
    fields = [check_int(getattr(c, name), f"{what}: {name}", call, -1, 1 << 32)
              for name in ("element_bytes", "head_dim", "tokens_per_block", "num_heads", "head_begin", "head_end")]
    if c.order not in _ORDERS:
        raise invalid(call, -1, f"{what}: order {c.order!r} is not 'nhd' or 'hnd'")
    if not isinstance(c.replicated, bool):
        raise invalid(call, -1, f"{what}: replicated {c.replicated!r} is not a bool")
    raw = (*fields, _ORDERS[c.order], c.replicated)
    object.__setattr__(c, "_kvcomm_raw", raw)
    return raw


def _back(raw: tuple) -> KvContents:
    *f, order, replicated = raw
    return KvContents(*f, order="nhd" if order == 0 else "hnd", replicated=replicated)


def _regions(layout: Any, call: str, what: str) -> List[tuple]:
    regions = [KvRegion(*r) if isinstance(r, tuple) and len(r) == 4 else r for r in layout]
    if not all(isinstance(r, KvRegion) for r in regions):
        raise invalid(call, -1, f"{what}: expected a list of kvcomm.KvRegion (or 4-tuples)")
    return [(r.offset, r.block_bytes, r.block_stride, r.num_blocks) for r in regions]


def _contents(contents: Any, call: str, what: str) -> List[tuple]:
    return [_raw(c, call, f"{what}[{i}]") for i, c in enumerate(contents)]


def _blocks(table: Any, call: str, what: str) -> np.ndarray:
    a = np.asarray(table)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise invalid(call, -1, f"{what}: a 1-D list or array of block ids (-1 skips), got {a.dtype} {a.shape}")
    if a.size and a.dtype == np.uint64 and int(a.max()) > (1 << 63) - 1:
        raise invalid(call, -1, f"{what}: block id {int(a.max())} does not fit in int64")
    return np.ascontiguousarray(a, np.int64)  # read in place natively (a list of Python ints cost ~0.1 ms a table)


def _token_args(call: str, num_tokens: Any, first_token: Any, preferred_source: Any) -> Tuple[int, int, int]:
    """(num_tokens, first_token, preferred_source) checked as the native signatures take them."""
    return (check_int(num_tokens, "num_tokens", call, -1, 1 << 63),
            check_int(first_token, "first_token", call, -1, 1 << 63),
            check_int(preferred_source, "preferred_source", call, -1, 1 << 31, -(1 << 31)))


def check_description(layout: Sequence[KvRegion], contents: Sequence[KvContents]) -> None:
    """Raises InvalidArgumentError, naming the region and the field, unless `contents` describe `layout`."""
    call = "kvcomm.conversion.check_description"
    _kvcomm.check_description(_regions(layout, call, "layout"), _contents(contents, call, "contents"), call)


def split_for_tp(model: KvContents, tp_size: int, tp_rank: int) -> KvContents:
    """`model` as TP rank `tp_rank` of `tp_size` holds it (heads split as engines split them; counts must divide)."""
    call = "kvcomm.conversion.split_for_tp"
    raw = _raw(model, call, "model")
    return _back(_kvcomm.split_for_tp(raw, check_int(tp_size, "tp_size", call, -1, 1 << 32),
                                      check_int(tp_rank, "tp_rank", call, -1, 1 << 32)))


def why_not_convertible(src: Sequence[KvContents], dst: Sequence[KvContents]) -> str:
    """"" when caches described by `src` convert into ones described by `dst`, else one sentence saying why not."""
    call = "kvcomm.conversion.why_not_convertible"
    return _kvcomm.why_not_convertible(_contents(src, call, "src"), _contents(dst, call, "dst"))


def plan_conversion(sources: Sequence[Tuple[Sequence[KvRegion], Sequence[KvContents]]], dst_layout: Sequence[KvRegion],
                    dst_contents: Sequence[KvContents], src_blocks: Any, dst_blocks: Any, num_tokens: int, *,
                    first_token: int = 0, preferred_source: int = 0) -> ConversionPlan:
    """The copies that move tokens [first_token, first_token + num_tokens) from `sources` ((layout, contents) each)
    into the destination, the tokens named by both sides' block tables (token t: block table[t // tokens_per_block]
    of each side; -1 skips a block). Raises InvalidArgumentError naming what is wrong before planning anything."""
    call = "kvcomm.conversion.plan_conversion"
    src = []
    for i, s in enumerate(sources):
        if not (isinstance(s, tuple) and len(s) == 2):
            raise invalid(call, -1, f"sources[{i}]: expected a (layout, contents) tuple")
        src.append((_regions(s[0], call, f"sources[{i}] layout"), _contents(s[1], call, f"sources[{i}] contents")))
    n, first, preferred = _token_args(call, num_tokens, first_token, preferred_source)
    pieces, heads, total = _kvcomm.plan_conversion(
        src, _regions(dst_layout, call, "dst_layout"), _contents(dst_contents, call, "dst_contents"),
        _blocks(src_blocks, call, "src_blocks"), _blocks(dst_blocks, call, "dst_blocks"), first, n, preferred)
    return ConversionPlan(list(pieces), [list(h) for h in heads], int(total))


def apply_conversion(pieces: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
    """Copies `pieces` (one source's, from plan_conversion) from host array `src` into host array `dst` (contiguous
    arrays, addressed as bytes); every piece is checked against both sizes before any is copied."""
    call = "kvcomm.conversion.apply_conversion"
    p = np.asarray(pieces)
    if p.dtype != np.uint64 or p.ndim != 2 or p.shape[1] != 3 or not p.flags.c_contiguous:
        raise invalid(call, -1, f"pieces: a C-contiguous (n, 3) uint64 array from plan_conversion, got {p.dtype} "
                      f"{p.shape}")
    for name, a in (("src", src), ("dst", dst)):
        if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
            raise invalid(call, -1, f"{name}: a C-contiguous numpy array (host memory)")
    if not dst.flags.writeable:
        raise invalid(call, -1, "dst is read-only")
    _kvcomm.apply_conversion(p.ctypes.data, len(p), src.ctypes.data, src.nbytes, dst.ctypes.data, dst.nbytes)


@dataclass
class ConvertedRead:
    """What read_converted did: `status` (a FetchStatus: Done, or Failed naming the source, nothing written),
    `bytes_converted` into the local registration, `bytes_landed` by the transports, `pieces`, `sources_read`, and
    `sources_mapped` (those read straight through a same-host mapping: nothing landed for them)."""

    status: Any
    bytes_converted: int
    bytes_landed: int
    pieces: int
    sources_read: List[int]
    sources_mapped: List[int]

    @property
    def ok(self) -> bool:
        return self.status.done

    @classmethod
    def of(cls, native: tuple) -> "ConvertedRead":
        """From the native (status, converted, landed, pieces, read, mapped) tuple of a converted read or fetch."""
        status, converted, landed, pieces, read, mapped = native
        return cls(FetchStatus(*status), int(converted), int(landed), int(pieces), list(read), list(mapped))


class ConvertedReader:
    """read_converted with its landing areas kept between reads (grown as needed): repeated reads pay neither
    allocation nor page faults. Reads through one reader run one at a time; the endpoint must stay open."""

    def __init__(self, endpoint: Endpoint) -> None:
        if not isinstance(endpoint, Endpoint):
            raise invalid("kvcomm.conversion.ConvertedReader", -1,
                          f"endpoint: expected a kvcomm.Endpoint, got {type(endpoint).__name__}")
        self._endpoint = endpoint
        self._native = _kvcomm.ConvertedReader(endpoint._native)

    @property
    def landing_bytes(self) -> int:
        """Bytes of landing memory held between reads."""
        return int(self._native.landing_bytes)

    def read(self, local: Registration, local_contents: Optional[Sequence[KvContents]],
             sources: Sequence[Any], src_blocks: Any, dst_blocks: Any,
             num_tokens: int, *, first_token: int = 0, preferred_source: int = 0, via: Any = "auto",
             timeout_ms: Optional[int] = None) -> "ConvertedRead":
        """As read_converted (same arguments but the endpoint)."""
        call = "kvcomm.conversion.ConvertedReader.read"
        if not isinstance(local, Registration):
            raise invalid(call, -1, f"local: expected a kvcomm.Registration, got {type(local).__name__}")
        src = []
        for i, s in enumerate(sources):
            if isinstance(s, RemoteMemory):  # described by its metadata
                s = (s, None)
            if not (isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], RemoteMemory)):
                raise invalid(call, -1, f"sources[{i}]: expected a kvcomm.RemoteMemory or a (RemoteMemory, contents) "
                              "tuple")
            src.append((s[0]._native, [] if s[1] is None else _contents(s[1], call, f"sources[{i}] contents")))
        n, first, preferred = _token_args(call, num_tokens, first_token, preferred_source)
        timeout = _ms(timeout_ms, "timeout_ms", call)
        return ConvertedRead.of(self._native.read(
            local._native, [] if local_contents is None else _contents(local_contents, call, "local_contents"), src,
            _blocks(src_blocks, call, "src_blocks"), _blocks(dst_blocks, call, "dst_blocks"), first, n, preferred,
            _via(via, call), timeout))


def read_converted(endpoint: Endpoint, local: Registration, local_contents: Optional[Sequence[KvContents]],
                   sources: Sequence[Any], src_blocks: Any, dst_blocks: Any,
                   num_tokens: int, *, first_token: int = 0, preferred_source: int = 0, via: Any = "auto",
                   timeout_ms: Optional[int] = None) -> ConvertedRead:
    """Reads tokens [first_token, first_token + num_tokens) from `sources` ((remote, contents) each: a peer's
    registration and what it holds; a bare remote, or contents None, takes the contents its owner registered, from
    its metadata) into `local` (a host or CUDA registration of `endpoint`, described by `local_contents`, or by the
    contents it was registered with when None), converting TP split, block size and order; returns when every byte is in place or a source
    failed (then nothing was written). `via="auto"` reads a source on this host with memory of the local kind
    through its mapping (no landing); others land first (via "tcp"/"rdma": every source lands). Raises
    InvalidArgumentError for what plan_conversion refuses, before anything moves; UnsupportedError when via="peer"
    cannot reach a source. One-shot (its landing areas are made for the call); a ConvertedReader keeps them between
    reads."""
    if not isinstance(endpoint, Endpoint):
        raise invalid("kvcomm.conversion.read_converted", -1,
                      f"endpoint: expected a kvcomm.Endpoint, got {type(endpoint).__name__}")
    return ConvertedReader(endpoint).read(local, local_contents, sources, src_blocks, dst_blocks, num_tokens,
                                          first_token=first_token, preferred_source=preferred_source, via=via,
                                          timeout_ms=timeout_ms)


class ConvertedFetcher:
    """Converted fetches among the members of a SymmetricBuffer's group whose caches are laid out differently (a
    prefill group and a decode group of one world: another TP size, block size, token/head order).

    ``ConvertedFetcher(buffer, layout, contents)`` on every member (collective): each member its own layout (inside
    the backed part of its buffer) and what its regions hold; a bad layout or description on one member raises on
    every member, naming it. Then ``fetch(sources, ...)`` is one-sided: tokens from the members ``sources`` (ranks)
    into this member's buffer, converted (same-host members through their mappings, others landed first); all or
    nothing. ``close()`` (or dropping it) on every member once no member fetches any more."""

    def __init__(self, buffer: SymmetricBuffer, layout: Sequence[KvRegion], contents: Sequence[KvContents], *,
                 tcp_address: str = "", net_timeout_ms: Optional[int] = None) -> None:
        call = "kvcomm.conversion.ConvertedFetcher"
        if not isinstance(buffer, SymmetricBuffer):
            raise invalid(call, -1, f"buffer: expected a kvcomm.SymmetricBuffer, got {type(buffer).__name__}")
        # Arguments this rank cannot even convert must not leave the others in the collective: join it with an
        # empty layout (refused on every member together), then raise the precise error here.
        error: Optional[BaseException] = None
        try:
            regions, described = _regions(layout, call, "layout"), _contents(contents, call, "contents")
            if not isinstance(tcp_address, str):
                raise invalid(call, buffer.rank, f"tcp_address: expected a str, got {type(tcp_address).__name__}")
            timeout = -1 if net_timeout_ms is None else check_int(net_timeout_ms, "net_timeout_ms", call, buffer.rank, 1 << 63,
                                                                  -(1 << 63))
        except Exception as e:  # noqa: BLE001 - raised below, after the collective
            error, regions, described, tcp_address, timeout = e, [], [], "", -1
        try:
            self._native = _kvcomm.ConvertedFetcher.create(buffer._native, regions, described, tcp_address, timeout)
        except Exception:
            if error is not None:
                raise error from None
            raise
        self._buffer = buffer

    @property
    def rank(self) -> int:
        return int(self._native.rank)

    @property
    def size(self) -> int:
        return int(self._native.size)

    def contents(self, rank: int) -> List[KvContents]:
        """Member `rank`'s contents, as it registered them."""
        return [_back(c) for c in self._native.contents(check_int(rank, "rank", "ConvertedFetcher.contents", -1,
                                                                  1 << 31, -(1 << 31)))]

    def layout(self, rank: int) -> List[KvRegion]:
        """Member `rank`'s layout, as it registered it."""
        return [KvRegion(*r) for r in self._native.layout(check_int(rank, "rank", "ConvertedFetcher.layout", -1,
                                                                    1 << 31, -(1 << 31)))]

    def fetch(self, sources: Sequence[int], src_blocks: Any, dst_blocks: Any, num_tokens: int, *,
              first_token: int = 0, preferred_source: int = 0, via: Any = "auto",
              timeout_ms: Optional[int] = None) -> ConvertedRead:
        """Tokens [first_token, first_token + num_tokens) from the members `sources` (ranks, each once, not this
        member; `src_blocks` the table they share, `dst_blocks` this member's) into this member's buffer, converted.
        `preferred_source` indexes `sources`; the result's sources_read and sources_mapped are member ranks. Raises
        InvalidArgumentError before anything moves for bad sources and whatever plan_conversion refuses; a member that
        failed (left, died) fails the fetch (status failed, naming it), this member's memory untouched."""
        call = "kvcomm.conversion.ConvertedFetcher.fetch"
        if isinstance(sources, (str, bytes)) or not hasattr(sources, "__iter__"):
            raise invalid(call, -1, f"sources: expected a list of member ranks, got {type(sources).__name__}")
        ranks = [check_int(s, f"sources[{i}]", call, -1, 1 << 31, -(1 << 31)) for i, s in enumerate(sources)]
        n, first, preferred = _token_args(call, num_tokens, first_token, preferred_source)
        timeout = _ms(timeout_ms, "timeout_ms", call)
        return ConvertedRead.of(self._native.fetch(
            ranks, _blocks(src_blocks, call, "src_blocks"), _blocks(dst_blocks, call, "dst_blocks"), first, n,
            preferred, _via(via, call), timeout))

    def close(self) -> None:
        """Unregisters and closes this member's endpoint (other members' fetches from it fail from then on)."""
        self._native.close()


__all__ = ["ConvertedFetcher", "ConvertedRead", "ConvertedReader", "read_converted", "ConversionPlan", "KvContents", "apply_conversion", "check_description", "plan_conversion",
           "split_for_tp", "why_not_convertible"]
