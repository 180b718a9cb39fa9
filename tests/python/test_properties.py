"""Property tests over kvcomm's whole Python front end, driven by one table with an entry for every public callable of
the package (functions, classes and their methods, found with dir()/inspect): a public callable without an entry fails
test_table_covers_every_public_callable.

Each entry generates calls: every argument in turn over its domain (the others valid) — integers from INT64_MIN - 1 to
UINT64_MAX + 1 around every documented bound, each enum's members, names and integer neighbours, counts around each
limit of kvcomm.limits, wrong types (str, float, None, bytes, lists, bools) — and every array argument over every numpy
dtype in both byte orders, contiguous, strided, reversed, misaligned, 0-d and 2-d, delivered as numpy arrays,
__array_interface__ objects, DLPack capsules and DLPack objects (from numpy), the buffer protocol, bytes, and
__cuda_array_interface__ (refused on host). Arrays whose bytes read natively are valid ids or slots but whose dtype,
byte order or layout is not the documented one are refused: an implementation that read them in place would write.

The property: each call either succeeds as documented (publish and fetch are then checked byte for byte against a
numpy oracle over the whole buffer) or raises the documented kvcomm.Error subclass, with nothing written (the whole host
buffer, filled with a random pattern, is compared after every refused call); never another exception type.

One rank, in this process (init_tcp with size 1), host memory. The CUDA cases (torch CUDA tensors, DLPack from torch,
__cuda_array_interface__ on a GPU) are in test_cuda.py.
"""

from __future__ import annotations

import enum
import inspect
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import pytest

import kvcomm

I64_MIN, I64_MAX, U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
L = kvcomm.limits


# ---- expectations -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """What a call must do: succeed (ok), raise `cls` (whose message contains `match`), or either (any: succeed or raise
    some kvcomm.Error, for values the front end passes on and the library judges)."""

    ok: bool = False
    any: bool = False
    cls: type = kvcomm.InvalidArgumentError
    match: str = ""


OK = Expect(ok=True)
ANY = Expect(any=True)
BAD = Expect()


def bad(cls: type = kvcomm.InvalidArgumentError, match: str = "") -> Expect:
    return Expect(cls=cls, match=match)


def worst(*expects: Expect) -> Expect:
    """The expectation of a call whose arguments carry these expectations: the first refusal wins."""
    for e in expects:
        if not e.ok and not e.any:
            return e
    return ANY if any(e.any for e in expects) else OK


class Lazy:
    """A value made fresh for each call (a unique id, a new buffer); `text` names it in reports."""

    def __init__(self, make: Callable[[], Any], text: str) -> None:
        self.make, self.text = make, text

    def __repr__(self) -> str:
        return self.text


def _value(v: Any) -> Any:
    return v.make() if isinstance(v, Lazy) else v


# ---- scalar domains ---------------------------------------------------------------------------------------------

INT_EDGES = sorted({I64_MIN - 1, I64_MIN, I32_MIN - 1, I32_MIN, -2, -1, 0, 1, 2, 3, 4, 7, 8, 9, 31, 32, 33, 4095,
                    4096, 4097, 65535, 65536, 65537, 1 << 24, (1 << 24) + 1, I32_MAX, I32_MAX + 1, 1 << 32, I64_MAX,
                    I64_MAX + 1, U64_MAX, U64_MAX + 1})
NP_INTS = [np.int8(-1), np.int32(7), np.int64(I64_MIN), np.uint8(255), np.uint64(U64_MAX), np.int64(0), np.int16(1)]
NOT_INTS = ["3", "", 3.0, 2.5, float("nan"), float("inf"), None, b"3", [3], (3,), {}, object(), 1j, np.float64(2.0),
            np.bool_(True), True, False, np.array([1]), np.array(1.5)]
NOT_STRS = [3, 3.0, None, b"lo", ["lo"], object(), True]
NOT_BYTES = ["ab", 3, None, [1, 2], object(), bytearray(b"ab"), memoryview(b"ab")]
NOT_OBJECTS = [None, 0, 1, "x", 2.5, b"x", [], object()]


def int_domain(lo: int, hi: int, inside: Expect = OK, values: Optional[Iterable[int]] = None,
               outside: Expect = BAD, neighbours: bool = True, np_ints: bool = True) -> List[Tuple[Any, Expect]]:
    """An int argument documented for [lo, hi]: values in it get `inside`, every other int `outside`, every non-int
    (float, str, None, bool, numpy bool, arrays) an InvalidArgumentError. `values` (default: the int edges) and,
    with `neighbours`, lo and hi and their neighbours are the ints tried (with `np_ints`, numpy ints of each width
    too)."""
    ints = set(INT_EDGES if values is None else values)
    if neighbours:
        ints |= {lo - 1, lo, lo + 1, hi - 1, hi, hi + 1}
    out: List[Tuple[Any, Expect]] = [(v, inside if lo <= v <= hi else outside) for v in sorted(ints)]
    if np_ints:
        out += [(v, inside if lo <= int(v) <= hi else outside) for v in NP_INTS]
    out += [(v, BAD) for v in NOT_INTS]
    return out


def with_none(domain: List[Tuple[Any, Expect]], expect: Expect = OK) -> List[Tuple[Any, Expect]]:
    """`domain` where None (a documented default) gets `expect`."""
    return [(v, expect if v is None else e) for v, e in domain] + [(None, expect)]


def enum_domain(enum_type: Any, names: Dict[str, Any], ok_override: Dict[Any, Expect] = {},
                int_values_ok: bool = False) -> List[Tuple[Any, Expect]]:
    """An enum argument: its members and names (any case) are accepted, every int (each member's value and its
    neighbours, and the int edges) refused unless `int_values_ok` (an IntEnum whose values are documented), other
    enums' members, other strings and other types refused."""
    out: List[Tuple[Any, Expect]] = []
    for member in enum_type.__members__.values():
        out.append((member, ok_override.get(member, OK)))
    for name, member in names.items():
        e = ok_override.get(member, OK)
        out += [(name, e), (name.upper(), e)]
    values = sorted({int(m.value) for m in enum_type.__members__.values()})
    ints = set(INT_EDGES) | {v + d for v in values for d in (-1, 0, 1)}
    for v in sorted(ints):
        member = next((m for m in enum_type.__members__.values() if int(m.value) == v), None)
        out.append((v, ok_override.get(member, OK) if (int_values_ok and member is not None) else BAD))
    others = [m for e in (kvcomm.MemoryKind, kvcomm.FetchPath, kvcomm.FetchState, kvcomm.PublishMode,
                          kvcomm.ErrorCode) if e is not enum_type for m in e.__members__.values()]
    out += [(m, BAD) for m in others[:6]]
    out += [(v, BAD) for v in ("gpu", "", " auto", "Auto ", "host\0", None, 1.0, b"host", ["host"], object(), True)]
    return out


KIND = enum_domain(kvcomm.MemoryKind, {"auto": kvcomm.MemoryKind.Auto, "cuda": kvcomm.MemoryKind.Cuda,
                                       "host": kvcomm.MemoryKind.Host},
                   ok_override={kvcomm.MemoryKind.Cuda: bad(kvcomm.UnsupportedError)}
                   if not kvcomm._kvcomm.built_with_cuda() else {kvcomm.MemoryKind.Cuda: ANY})
PATH = enum_domain(kvcomm.FetchPath, {"auto": kvcomm.FetchPath.Auto, "kernel": kvcomm.FetchPath.Kernel,
                                      "copy": kvcomm.FetchPath.CopyEngine, "copy_engine": kvcomm.FetchPath.CopyEngine,
                                      "host": kvcomm.FetchPath.Host},
                   ok_override={kvcomm.FetchPath.Kernel: bad(kvcomm.UnsupportedError),  # host buffers
                                kvcomm.FetchPath.CopyEngine: bad(kvcomm.UnsupportedError),
                                # what a plan over the network reports, never a path to demand
                                kvcomm.FetchPath.Network: bad(kvcomm.InvalidArgumentError)})
AXIS = enum_domain(kvcomm.Axis, {}, int_values_ok=True)
AXIS = [(v, e) for v, e in AXIS if not isinstance(v, str) or e is not OK]  # axis takes no names


def lanes_domain() -> List[Tuple[Any, Expect]]:
    return int_domain(1, L.MAX_BARRIER_LANES, values=set(INT_EDGES) | set(range(-1, L.MAX_BARRIER_LANES + 3)))


# ---- arrays ------------------------------------------------------------------------------------------------------

NATIVE = "<" if np.little_endian else ">"
SWAPPED = ">" if np.little_endian else "<"
DTYPES = list({np.dtype(d).str if not np.dtype(d).names else "rec": np.dtype(d) for d in (
    *"?bBhHiIlLqQefdgFDG", "M8[ns]", "m8[s]", "S8", "U2", "V8", "S3", [("a", "<i4"), ("b", "<i4")])}.values())
LAYOUTS = ("contiguous", "readonly", "strided", "reversed", "misaligned", "0d", "2d")
PROTOCOLS = ("numpy", "array_interface", "dlpack_capsule", "dlpack_object", "buffer", "bytes", "cuda_array_interface")
HOST_PROTOCOLS = {"numpy", "array_interface", "dlpack_capsule", "dlpack_object", "buffer"}


def _swapped(dt: np.dtype) -> Optional[np.dtype]:
    """dt in the other byte order, or None when its byte order means nothing (one byte, strings of bytes)."""
    if dt.names:
        sw = np.dtype([(n, dt.fields[n][0].newbyteorder(SWAPPED)) for n in dt.names])
        return None if sw.isnative else sw
    sw = dt.newbyteorder(SWAPPED)
    return None if sw.isnative or dt.kind in "SVb" or dt.itemsize == 1 else sw


class Iface:
    """Hands out another array's memory through one protocol attribute (keeping the array alive)."""

    def __init__(self, keep: Any, **attrs: Any) -> None:
        self._keep = keep
        for k, v in attrs.items():
            setattr(self, k, v)


class DLPackObject:
    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kw: Any) -> Any:
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self) -> Any:
        return self._a.__dlpack_device__()


def _layout(a: np.ndarray, layout: str) -> Optional[np.ndarray]:
    """`a` (1-D, C-contiguous) laid out as `layout`, with the same elements in the same logical order."""
    if layout == "contiguous":
        return a
    if layout == "readonly":
        r = a.copy()
        r.flags.writeable = False
        return r
    if layout == "strided":  # every other element of an array twice as long (the gaps hold zero bytes)
        big = np.zeros((2 * a.shape[0],) + a.shape[1:], a.dtype)
        big[::2] = a
        return big[::2]
    if layout == "reversed":
        return a[::-1].copy()[::-1]
    if layout == "misaligned":  # contiguous, one byte past an aligned address
        raw = np.zeros(a.nbytes + 1, np.uint8)
        m = np.ndarray(a.shape, a.dtype, buffer=raw.data, offset=1)
        m[...] = a
        return m
    if layout == "0d":
        return a[0:1].reshape(()) if a.ndim == 1 else None
    if layout == "2d":
        n = a.shape[0]
        return a.reshape((2, n // 2) + a.shape[1:]) if n % 2 == 0 else None
    raise AssertionError(layout)


def _protocol(a: np.ndarray, protocol: str) -> Optional[Any]:
    if protocol == "numpy":
        return a
    if protocol == "array_interface":
        return Iface(a, __array_interface__=dict(a.__array_interface__))
    if protocol == "cuda_array_interface":  # memory that is not on a GPU: only ever refused on host buffers
        iface = a.__array_interface__
        cai = {"shape": a.shape, "typestr": iface["typestr"], "data": iface["data"], "version": 3,
               "strides": None if a.flags.c_contiguous else a.strides}
        if a.dtype.names:
            cai["descr"] = iface["descr"]
        return Iface(a, __cuda_array_interface__=cai)
    if protocol in ("dlpack_capsule", "dlpack_object"):
        try:
            a.__dlpack__()
        except (BufferError, TypeError, ValueError):  # numpy exports only native, DLPack-expressible arrays
            return None
        # a capsule is consumed by the call that imports it: a fresh one for each call
        return Lazy(a.__dlpack__, "capsule") if protocol == "dlpack_capsule" else DLPackObject(a)
    if protocol == "buffer":
        try:
            return memoryview(a)
        except (ValueError, TypeError, BufferError):
            return None
    if protocol == "bytes":
        return a.tobytes() if a.ndim == 1 and a.flags.c_contiguous else None
    raise AssertionError(protocol)


@dataclass
class ArrayCase:
    label: str
    obj: Any
    ok: bool  # the argument's rules accept it
    values: Optional[np.ndarray]  # what an accepted array holds (native), for the oracle


def _typed(values: np.ndarray, dt: np.dtype, accepted: Iterable[np.dtype]) -> Iterator[Tuple[str, np.ndarray, bool]]:
    """`values` as dtype dt in both byte orders. Accepted dtypes hold the values; a swapped one holds the same bytes
    (so a reader that ignored the byte order would see valid values); 8-byte dtypes that are not accepted hold the
    int64 bytes of the values (a reader that ignored the dtype would see valid ids)."""
    accepted = set(accepted)
    if dt in accepted or dt.kind in "iufcb":
        native = values.astype(dt)
    elif dt.itemsize == 8 and not dt.names:
        native = values.astype(np.int64).view(dt)
    elif dt.names and dt.itemsize == 8:
        native = values.astype(np.int64).view(dt)
    else:
        native = np.zeros(values.shape, dt)
    yield f"{dt.str}", native, dt in accepted
    sw = _swapped(dt)
    if sw is not None:
        yield f"{sw.str if not sw.names else 'swapped ' + str(sw)}", native.view(sw), False


def array_cases(values: np.ndarray, accepted: Iterable[np.dtype], ok_layouts: Iterable[str],
                lists: bool = False, dtypes: Iterable[np.dtype] = DTYPES) -> List[ArrayCase]:
    """Every dtype x byte order x layout x protocol of `values` (1-D, or rows when values is 2-D), and (lists=True)
    Python lists; `ok` marks what an argument accepting `accepted` dtypes in `ok_layouts` must accept."""
    accepted = list(accepted)
    ok_layouts = set(ok_layouts)
    out = []
    for dt in dtypes:
        for text, typed, dtype_ok in _typed(values, dt, accepted):
            for layout in LAYOUTS:
                arr = _layout(typed, layout)
                if arr is None:
                    continue
                for protocol in PROTOCOLS:
                    obj = _protocol(arr, protocol)
                    if obj is None:
                        continue
                    ok = dtype_ok and layout in ok_layouts and protocol in HOST_PROTOCOLS
                    out.append(ArrayCase(f"{text} {layout} {protocol}", obj, ok, arr if ok else None))
    if lists:
        v = [int(x) for x in values.tolist()]
        out += [ArrayCase("list", v, True, values.astype(np.int64)),
                ArrayCase("tuple", tuple(v), True, values.astype(np.int64)),
                ArrayCase("list of numpy ints", [np.int32(x) for x in v], True, values.astype(np.int64)),
                ArrayCase("list with a float", v[:-1] + [float(v[-1])], False, None),
                ArrayCase("list with a str", v[:-1] + [str(v[-1])], False, None),
                ArrayCase("list with None", v[:-1] + [None], False, None),
                ArrayCase("list with a bool", v[:-1] + [True], False, None),
                ArrayCase("list with 2**63", v[:-1] + [1 << 63], False, None),
                ArrayCase("list with UINT64_MAX", v[:-1] + [U64_MAX], False, None),
                ArrayCase("list with numpy UINT64_MAX", v[:-1] + [np.uint64(U64_MAX)], False, None),
                ArrayCase("list with INT64_MIN - 1", [I64_MIN - 1] + v[1:], False, None),
                ArrayCase("nested list", [v[:2], v[2:]], False, None),
                ArrayCase("ragged list", [v[:1], v[1:]], False, None)]
    out += [ArrayCase(f"not an array: {v!r}", v, False, None) for v in ("0123", 5, 2.5, None, object(), {1: 2})]
    out.append(ArrayCase("object array", values.astype(object), False, None))
    return out


# ---- the world and its buffer -------------------------------------------------------------------------------------

CAPACITY = 64 * 1024
REGION = (1024, 48, 64, 40)  # offset, block_bytes, block_stride, num_blocks: block b at 1024 + 64 b, 48 bytes
SRC_IDS = np.array([1, 2, 3, 7], np.int64)
DST_IDS = np.array([10, 11, 12, 20], np.int64)
ROW_OFFSET = 8192
SLOTS = np.array([0, 3, 5, 6], np.int64)
ROW_BYTES = 32
ROWS = np.random.default_rng(7).integers(0, 256, (4, ROW_BYTES), dtype=np.uint8)


class Ctx:
    """A 1-rank world with a host buffer filled with a random pattern, and the objects the entries call."""

    def __init__(self) -> None:
        self.comm = kvcomm.init_tcp(kvcomm.create_unique_id(), 0, 1, timeout_ms=60000)
        self.buf = kvcomm.SymmetricBuffer.create(self.comm, CAPACITY, kind="host")
        self.pattern = PATTERN
        self.view = self.buf.local()
        self.view[:] = self.pattern
        self.fetcher = kvcomm.Fetcher(self.buf, [REGION])
        self.publisher = kvcomm.Publisher(self.buf)
        self.barrier = kvcomm.Barrier(self.comm, kind="host")
        self.failures: List[str] = []
        self.calls = 0

    def restore(self) -> None:
        self.view[:] = self.pattern

    def scratch(self) -> kvcomm.SymmetricBuffer:
        return kvcomm.SymmetricBuffer.create(self.comm, CAPACITY, 8192, kind="host")

    def check(self, label: str, thunk: Callable[[], Any], expect: Expect,
              oracle: Optional[Callable[[Any], Optional[np.ndarray]]] = None) -> None:
        """Runs one call and records a failure unless it did what `expect` says (with nothing written if refused;
        with the buffer as `oracle` computes it, from the pattern, if it succeeded)."""
        self.calls += 1
        try:
            result = thunk()
        except kvcomm.Error as e:
            if expect.ok:
                self.failures.append(f"{label}: refused ({type(e).__name__}: {e}), documented to succeed")
            elif not expect.any and (not isinstance(e, expect.cls) or expect.match not in str(e)):
                self.failures.append(f"{label}: raised {type(e).__name__} ({e}), expected {expect.cls.__name__}"
                                     f"{' matching ' + repr(expect.match) if expect.match else ''}")
            bad = np.flatnonzero(self.view != self.pattern)
            if bad.size:
                self.failures.append(f"{label}: refused but wrote {bad.size} bytes (first at {bad[0]})")
                self.restore()
            return
        except BaseException as e:  # noqa: BLE001 - the property: nothing but kvcomm.Error
            if not issubclass(expect.cls, kvcomm.Error) and isinstance(e, expect.cls) and not expect.ok:
                return  # Python's own protocol (an Enum lookup), as documented
            self.failures.append(f"{label}: raised {type(e).__name__} (not a kvcomm.Error): {e}")
            self.restore()
            return
        if not expect.ok and not expect.any:
            self.failures.append(f"{label}: succeeded (returned {str(result)[:60]}), expected "
                                 f"{expect.cls.__name__}")
        want = oracle(result) if oracle is not None else None
        if want is None:
            want = self.pattern
        bad = np.flatnonzero(self.view != want)
        if bad.size:
            self.failures.append(f"{label}: the buffer differs from the oracle in {bad.size} bytes (first at {bad[0]})")
        self.restore()

    def vary(self, label: str, fn: Callable[..., Any], defaults: Dict[str, Any],
             domains: Dict[str, List[Tuple[Any, Expect]]], base: Expect = OK,
             oracle: Optional[Callable[[Any], Optional[np.ndarray]]] = None) -> None:
        """Each argument of `domains` over its domain, the others at `defaults`."""
        for name, domain in domains.items():
            for value, expect in domain:
                kw = dict(defaults)
                kw[name] = value

                def thunk(kw: Dict[str, Any] = kw) -> Any:
                    return fn(**{k: _value(v) for k, v in kw.items()})

                self.check(f"{label}({name}={value!r})", thunk, worst(expect, base),
                           oracle if expect.ok else None)

    def report(self) -> None:
        if self.failures:
            shown = "\n".join(self.failures[:40])
            raise AssertionError(f"{len(self.failures)} of {self.calls} calls broke the property:\n{shown}")


@pytest.fixture(scope="module")
def ctx() -> Iterator[Ctx]:
    c = Ctx()
    yield c


PATTERN = np.random.default_rng(11).integers(0, 256, CAPACITY, dtype=np.uint8)


def fetch_oracle(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The buffer after block src[i] was copied into block dst[i] (-1: skipped), from the pattern."""
    img = PATTERN.copy()
    off, nbytes, stride, _ = REGION
    for s, d in zip(np.asarray(src).tolist(), np.asarray(dst).tolist()):
        if s == -1 or d == -1:
            continue
        img[off + d * stride:off + d * stride + nbytes] = PATTERN[off + s * stride:off + s * stride + nbytes]
    return img


def publish_oracle(rows: np.ndarray, slots: np.ndarray, n: Optional[int] = None) -> np.ndarray:
    """The buffer after row i of `rows` landed at slot slots[i] (< 0: padding) of the rows at ROW_OFFSET."""
    img = PATTERN.copy()
    for i, s in enumerate(slots.tolist()[:n]):
        if s < 0:
            continue
        row = np.frombuffer(np.ascontiguousarray(rows[i]).tobytes(), np.uint8)
        img[ROW_OFFSET + s * row.size:ROW_OFFSET + (s + 1) * row.size] = row
    return img



# ---- the table: one entry per public callable ------------------------------------------------------------------

Entry = Callable[[Ctx], None]
TABLE: Dict[str, Entry] = {}


def entry(*names: str) -> Callable[[Entry], Entry]:
    def add(fn: Entry) -> Entry:
        for n in names:
            assert n not in TABLE, n
            TABLE[n] = fn
        return fn
    return add


def _no_call(reason: str) -> Entry:
    def run(c: Ctx) -> None:
        pass
    run.__doc__ = reason
    return run


# -- module functions and bootstraps


def _fresh_uid() -> Lazy:
    return Lazy(lambda: str(kvcomm.create_unique_id()), "<fresh id str>")


# A world's size in a 1-rank test: 1, and sizes no bootstrap takes (a valid size above 1 waits for ranks that never
# come: init_tcp tries one below, with a short timeout).
SIZE_DOMAIN = int_domain(1, 1, values=[I64_MIN - 1, I32_MIN, -1, 0, 1, L.MAX_RANKS + 1, I32_MAX, I32_MAX + 1,
                                       U64_MAX + 1], neighbours=False, np_ints=False) + \
    [(np.int64(1), OK), (np.int8(-1), BAD), (np.uint64(U64_MAX), BAD)]


@entry("init_tcp", "Communicator.from_unique_id")
def _init_tcp(c: Ctx) -> None:
    for label, fn in (("init_tcp", kvcomm.init_tcp), ("Communicator.from_unique_id",
                                                      kvcomm.Communicator.from_unique_id)):
        uid_domain = [(_fresh_uid(), OK), (Lazy(kvcomm.create_unique_id, "<fresh UniqueId>"), OK),
                      ("zz", BAD), ("", BAD)] + [(v, BAD) for v in NOT_OBJECTS if not isinstance(v, str)]
        if fn is kvcomm.Communicator.from_unique_id:
            uid_domain = [(Lazy(kvcomm.create_unique_id, "<fresh UniqueId>"), OK), ("zz", BAD)] + \
                [(v, BAD) for v in NOT_OBJECTS]
        c.vary(label, fn, {"unique_id": _fresh_uid() if fn is kvcomm.init_tcp else
                           Lazy(kvcomm.create_unique_id, "<fresh UniqueId>"),
                           "rank": 0, "size": 1, "timeout_ms": 2000},
               {"unique_id": uid_domain,
                # rank 0 of 1: every other rank is outside the group (the library's InvalidArgumentError)
                "rank": int_domain(0, 0),
                # sizes above 1 would wait for ranks that never come: one is tried, with a short timeout
                "size": SIZE_DOMAIN,
                "timeout_ms": int_domain(I64_MIN, I64_MAX, inside=OK)})
    c.check("init_tcp size 2 times out", lambda: kvcomm.init_tcp(kvcomm.create_unique_id(), 0, 2, 200),
            bad(kvcomm.TimeoutError))


@entry("create_unique_id", "UniqueId.create")
def _create_unique_id(c: Ctx) -> None:
    for label, fn in (("create_unique_id", kvcomm.create_unique_id), ("UniqueId.create", kvcomm.UniqueId.create)):
        c.vary(label, fn, {"ifname": ""},
               {"ifname": [("", OK), ("lo", ANY), ("no-such-if0", BAD)] + [(v, BAD) for v in NOT_STRS]})


@entry("UniqueId.from_string", "UniqueId.to_string", "UniqueId")
def _unique_id(c: Ctx) -> None:
    text = str(kvcomm.create_unique_id())
    c.vary("UniqueId.from_string", kvcomm.UniqueId.from_string, {"text": text},
           {"text": [(text, OK), ("zz", BAD), ("", BAD), (text[:-2], BAD), (text + "00", BAD)] +
            [(v, BAD) for v in NOT_STRS]})
    c.check("UniqueId.to_string", lambda: kvcomm.UniqueId.from_string(text).to_string() == text or 1 / 0, OK)
    for args in ((), (text,), (1, 2)):
        c.check(f"UniqueId{args!r}", lambda args=args: kvcomm.UniqueId(*args), BAD)


@entry("init_allgather", "Communicator.from_allgather")
def _init_allgather(c: Ctx) -> None:
    def raises(data: bytes) -> bytes:
        raise KeyError("no such group")

    for label, fn in (("init_allgather", kvcomm.init_allgather),
                      ("Communicator.from_allgather", kvcomm.Communicator.from_allgather)):
        c.vary(label, fn, {"rank": 0, "size": 1, "allgather": lambda d: d},
               {"rank": int_domain(0, 0),
                # size 2 with an allgather that returns one rank's bytes: refused by the size check of the result
                "size": SIZE_DOMAIN,
                "allgather": [(lambda d: d, OK), (lambda d: [d], OK), (raises, bad(kvcomm.RemoteError, "KeyError")),
                              (lambda d: 5, bad(kvcomm.RemoteError)), (lambda d: d + b"x", ANY)] +
                [(v, BAD) for v in NOT_OBJECTS]})


class DictStore:
    def __init__(self) -> None:
        self.d: Dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self.d[key] = bytes(value)

    def get(self, key: str) -> bytes:
        return self.d[key]


@entry("init_store")
def _init_store(c: Ctx) -> None:
    c.vary("init_store", kvcomm.init_store, {"store": Lazy(DictStore, "DictStore()"), "rank": 0, "size": 1,
                                             "prefix": "p"},
           {"store": [(Lazy(DictStore, "DictStore()"), OK)] + [(v, BAD) for v in NOT_OBJECTS],
            "rank": int_domain(0, 0),
            "size": SIZE_DOMAIN,
            "prefix": [("p", OK), ("", OK)] + [(v, BAD) for v in NOT_STRS]})


@entry("init_torch")
def _init_torch(c: Ctx) -> None:
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        for group in (None, 5, "world"):
            c.check(f"init_torch({group!r}) without torch", lambda g=group: kvcomm.init_torch(g),
                    bad(kvcomm.UnsupportedError))
        return
    import torch.distributed as dist

    if not dist.is_initialized():  # no process group: refused as bad use
        c.check("init_torch() without a process group", lambda: kvcomm.init_torch(), BAD)


@entry("init_mpi4py")
def _init_mpi4py(c: Ctx) -> None:
    try:
        import mpi4py  # noqa: F401
        have = True
    except ImportError:
        have = False
    c.check("init_mpi4py()", lambda: kvcomm.init_mpi4py(), ANY if have else bad(kvcomm.UnsupportedError))
    for v in (5, "world", object()):
        c.check(f"init_mpi4py({v!r})", lambda v=v: kvcomm.init_mpi4py(v), BAD)


@entry("capabilities")
def _capabilities(c: Ctx) -> None:
    c.check("capabilities()", lambda: isinstance(kvcomm.capabilities(), str) or 1 / 0, OK)


@entry("use_local_device")
def _use_local_device(c: Ctx) -> None:
    c.vary("use_local_device", kvcomm.use_local_device, {"local_rank": 0},
           {"local_rank": int_domain(0, I32_MAX)})


def regions_domain() -> List[Tuple[Any, Expect]]:
    one = kvcomm.KvRegion(0, 64, 0, 16)
    many = lambda n: [(j * 8, 8, 0, 1) for j in range(n)]  # noqa: E731
    out: List[Tuple[Any, Expect]] = [
        ([one], OK), (one, OK), ([(0, 64, 0, 16)], OK), ((REGION,), OK),
        (Lazy(lambda: many(L.MAX_FETCH_REGIONS - 1), f"{L.MAX_FETCH_REGIONS - 1} regions"), OK),
        (Lazy(lambda: many(L.MAX_FETCH_REGIONS), f"{L.MAX_FETCH_REGIONS} regions"), OK),
        (Lazy(lambda: many(L.MAX_FETCH_REGIONS + 1), f"{L.MAX_FETCH_REGIONS + 1} regions"),
         bad(match="MAX_FETCH_REGIONS")),
        (Lazy(lambda: iter(many(L.MAX_FETCH_REGIONS + 1)), "an iterator of 4097 regions"),
         bad(match="MAX_FETCH_REGIONS")),
        ([(0, 64, 0)], BAD), ([(0, 64, 0, 16, 1)], BAD), ([[0, 64, 0, 16]], OK), (["0, 64, 0, 16"], BAD),
        ("regions", BAD), (5, BAD), (None, BAD), ([None], BAD),
    ]
    for k in range(4):  # each field over the int domain (sizes: non-negative ints below 2**64)
        for v, e in int_domain(0, U64_MAX, inside=ANY, values=[-1, 0, 1, 64, I64_MAX + 1, U64_MAX, U64_MAX + 1]):
            r = [0, 64, 0, 16]
            r[k] = v
            out.append(([tuple(r)], e))
    return out


@entry("layout_hash")
def _layout_hash(c: Ctx) -> None:
    # a hash of any well-formed layout, even one a Fetcher refuses (sizes the library judges hash like others)
    c.vary("layout_hash", kvcomm.layout_hash, {"layout": [REGION], "version": 0},
           {"layout": [(v, OK if (e.ok or e.any) else e) for v, e in regions_domain()] + [([(0, 0, 0, 0)], OK)],
            "version": int_domain(0, U64_MAX)})


# -- Communicator and ParallelGroups (native classes, arguments checked by the binding)


@entry("Communicator", "Communicator.allgather", "Communicator.barrier", "Communicator.members",
       "Communicator.num_hosts", "Communicator.topology_string", "Communicator.same_host",
       "Communicator.can_access_peer", "Communicator.world_rank", "Communicator.split")
def _communicator(c: Ctx) -> None:
    comm = c.comm
    for args in ((), (0, 1), ("x",)):
        c.check(f"Communicator{args!r}", lambda args=args: kvcomm.Communicator(*args), BAD)
    c.vary("Communicator.allgather", comm.allgather, {"data": b"ab"},
           {"data": [(b"ab", OK), (b"", OK), (bytes(4096), OK)] + [(v, BAD) for v in NOT_BYTES]})
    for name in ("barrier", "members", "num_hosts", "topology_string"):
        c.check(f"Communicator.{name}()", getattr(comm, name), OK)
    for name in ("same_host", "can_access_peer"):
        c.vary(f"Communicator.{name}", getattr(comm, name), {"a": 0, "b": 0},
               {"a": int_domain(0, 0), "b": int_domain(0, 0)})
    c.vary("Communicator.world_rank", comm.world_rank, {"rank": 0}, {"rank": int_domain(0, 0)})
    c.vary("Communicator.split", comm.split, {"color": 0, "key": 0},
           {"color": int_domain(I32_MIN, I32_MAX), "key": int_domain(I32_MIN, I32_MAX)})


@entry("ParallelGroups", "ParallelGroups.create", "ParallelGroups.group_of")
def _layout_entry(c: Ctx) -> None:
    for args in ((), (c.comm,)):
        c.check(f"ParallelGroups{args!r}", lambda args=args: kvcomm.ParallelGroups(*args), BAD)
    sizes = {n: int_domain(1, 1, values=[I64_MIN, -1, 0, 1, 2, L.MAX_RANKS, L.MAX_RANKS + 1, I32_MAX,
                                         U64_MAX + 1]) for n in ("tp", "pcp", "pp", "dp")}
    c.vary("ParallelGroups.create", kvcomm.ParallelGroups.create, {"world": c.comm, "tp": 1, "pcp": 1, "pp": 1, "dp": 1},
           {"world": [(c.comm, OK)] + [(v, BAD) for v in NOT_OBJECTS], **sizes})
    # group_of is arithmetic: any layout up to kvcomm.limits.MAX_RANKS members
    sizes = {n: int_domain(1, L.MAX_RANKS, values=[I64_MIN, -1, 0, 1, 2, 7, L.MAX_RANKS, L.MAX_RANKS + 1,
                                                   I32_MAX, U64_MAX + 1]) for n in ("tp", "pcp", "pp", "dp")}
    c.vary("ParallelGroups.group_of", kvcomm.ParallelGroups.group_of, {"tp": 1, "pcp": 1, "pp": 1, "dp": 1, "rank": 0, "axis": 0},
           {**sizes, "rank": int_domain(0, 0), "axis": AXIS})
    c.check("ParallelGroups.group_of(256, 256, ...) past MAX_RANKS",
            lambda: kvcomm.ParallelGroups.group_of(256, 257, 1, 1, 0, 0), bad(match="MAX_RANKS"))


# -- SymmetricBuffer


@entry("SymmetricBuffer", "SymmetricBuffer.create", "SymmetricBuffer.adopt", "SymmetricBuffer.close",
       "SymmetricBuffer.grow", "SymmetricBuffer.commit", "SymmetricBuffer.release")
def _buffer_lifecycle(c: Ctx) -> None:
    for v in NOT_OBJECTS:
        c.check(f"SymmetricBuffer({v!r})", lambda v=v: kvcomm.SymmetricBuffer(v), BAD)

    def create(**kw: Any) -> None:
        kvcomm.SymmetricBuffer.create(**kw).close()

    c.vary("SymmetricBuffer.create", create, {"comm": c.comm, "capacity": 8192, "initial_bytes": 4096,
                                              "kind": "host"},
           {"comm": [(c.comm, OK)] + [(v, BAD) for v in NOT_OBJECTS],
            # sizes the front end passes on: the library maps them or refuses with its own error
            "capacity": int_domain(0, U64_MAX, inside=ANY, values=[v for v in INT_EDGES if v <= 1 << 32 or
                                                                   v >= I64_MAX]),
            "initial_bytes": with_none(int_domain(0, U64_MAX, inside=ANY,
                                                  values=[v for v in INT_EDGES if v <= 1 << 32 or v >= I64_MAX])),
            "kind": KIND})
    c.check("SymmetricBuffer.create(initial_bytes=None)", lambda: create(comm=c.comm, capacity=8192,
                                                                         initial_bytes=None, kind="host"), OK)

    def adopt(**kw: Any) -> None:
        kvcomm.SymmetricBuffer.adopt(**kw).close()  # never committed: nothing is mapped at `base`

    c.vary("SymmetricBuffer.adopt", adopt, {"comm": c.comm, "base": 1 << 40, "reserved_bytes": 1 << 20,
                                            "kind": "host"},
           {"comm": [(c.comm, OK)] + [(v, BAD) for v in NOT_OBJECTS],
            "base": int_domain(0, U64_MAX, inside=ANY, values=[-1, 0, 4096, 1 << 40, U64_MAX, U64_MAX + 1]),
            "reserved_bytes": int_domain(0, U64_MAX, inside=ANY, values=[-1, 0, 4096, 1 << 20, U64_MAX + 1]),
            "kind": KIND})
    s = c.scratch()
    c.vary("SymmetricBuffer.grow", s.grow, {"new_bytes": 8192},
           {"new_bytes": int_domain(0, U64_MAX, inside=ANY, values=[-1, 0, 4096, 8192, 16384, CAPACITY,
                                                                    CAPACITY + 1, U64_MAX, U64_MAX + 1])})
    ranges = [(0, 4096)]
    for name in ("commit", "release"):  # created buffers: refused ("only adopted"); counts refused before that
        c.vary(f"SymmetricBuffer.{name}", getattr(s, name), {"ranges": ranges},
               {"ranges": [(ranges, BAD), ([], ANY), ([(0, 4096, 1)], BAD), ([(-1, 4096)], BAD), ([5], BAD),
                           (Lazy(lambda: [(0, 4096)] * (L.MAX_BUFFER_RANGES + 1), "65537 ranges"),
                            bad(match="MAX_BUFFER_RANGES")),
                           (Lazy(lambda: iter([(0, 4096)] * (L.MAX_BUFFER_RANGES + 1)), "an iterator of 65537"),
                            bad(match="MAX_BUFFER_RANGES"))] + [(v, BAD) for v in NOT_OBJECTS if v != []]})
    c.check("SymmetricBuffer.close()", s.close, OK)
    c.check("SymmetricBuffer.close() again", s.close, OK)
    c.check("local() after close()", s.local, bad(match="closed"))


VIEW_DTYPES = [(None, OK), (np.uint8, OK), (np.int32, OK), (np.float64, OK), ("i8", OK), (np.dtype(">i4"), OK),
               (np.complex128, OK), (np.dtype("V16"), OK), (np.clongdouble, BAD),  # 32 bytes: 16 is no multiple
               (np.dtype("S3"), BAD), (object, BAD), (np.dtype([("a", "O")]), BAD), ("not a dtype", BAD), (5, BAD),
               (2.5, BAD)]


@entry("SymmetricBuffer.local", "SymmetricBuffer.peer", "SymmetricBuffer.peer_table", "SymmetricBuffer.backed_bitmap",
       "SymmetricBuffer.is_mapped", "SymmetricBuffer.is_backed", "SymmetricBuffer.backed_ranges",
       "SymmetricBuffer.local_ptr", "SymmetricBuffer.peer_ptr", "SymmetricBuffer.peer_table_ptr",
       "SymmetricBuffer.backed_bitmap_ptr")
def _buffer_views(c: Ctx) -> None:
    b = c.buf
    have_torch = _have("torch")
    frameworks = [(None, OK), ("numpy", OK), ("dlpack", OK), ("torch", OK if have_torch else
                                                             bad(kvcomm.UnsupportedError)),
                  ("NumPy", BAD), ("jax", BAD), ("", BAD), (5, BAD), (None, OK), (b"numpy", BAD)]
    for name, fn, extra in (("local", b.local, {}), ("peer", b.peer, {"rank": 0})):
        defaults = {"dtype": None, "offset": 0, "nbytes": 16, "framework": None, **extra}
        domains = {"dtype": VIEW_DTYPES,
                   "offset": int_domain(0, CAPACITY - 16, values=[-1, 0, 1, 4096, CAPACITY - 16, CAPACITY - 15,
                                                                  CAPACITY, I64_MAX, U64_MAX, U64_MAX + 1]),
                   "nbytes": with_none(int_domain(1, CAPACITY, values=[-1, 0, 1, 16, CAPACITY, CAPACITY + 1,
                                                                       U64_MAX, U64_MAX + 1])),
                   "framework": frameworks}
        if name == "peer":
            domains["rank"] = int_domain(0, 0)
        c.vary(f"SymmetricBuffer.{name}", fn, defaults, domains)
    # a dtype view over a range that is no multiple of its size: a kvcomm error, not numpy's ValueError
    c.check("local(np.float64, nbytes=12)", lambda: b.local(dtype=np.float64, offset=0, nbytes=12),
            bad(match="multiple"))
    c.check("local(np.int32, framework='dlpack')", lambda: b.local(np.int32, framework="dlpack"), BAD)
    for name in ("peer_table", "backed_bitmap"):
        c.vary(f"SymmetricBuffer.{name}", getattr(b, name), {"framework": None}, {"framework": frameworks})
    c.vary("SymmetricBuffer.is_mapped", b.is_mapped, {"rank": 0}, {"rank": int_domain(0, I32_MAX)})
    c.vary("SymmetricBuffer.peer_ptr", b.peer_ptr, {"rank": 0}, {"rank": int_domain(0, 0)})
    c.vary("SymmetricBuffer.is_backed", b.is_backed, {"offset": 0, "nbytes": 16},
           {"offset": int_domain(0, U64_MAX), "nbytes": int_domain(0, U64_MAX)})
    for name in ("backed_ranges", "local_ptr", "peer_table_ptr", "backed_bitmap_ptr"):
        c.check(f"SymmetricBuffer.{name}()", getattr(b, name), OK)


# -- Publisher


def _have(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


@entry("Publisher", "Publisher.create", "Publisher.poll_error", "Publisher.check_errors")
def _publisher(c: Ctx) -> None:
    for label, fn in (("Publisher", kvcomm.Publisher), ("Publisher.create", kvcomm.Publisher.create)):
        c.vary(label, fn, {"buffer": c.buf, "lanes": 2, "barrier_timeout_ms": -1,
                           "staging_tokens": 4096, "staging_bytes_per_token": 1024},
               {"buffer": [(c.buf, OK), (c.comm, BAD)] + [(v, BAD) for v in NOT_OBJECTS],
                "lanes": lanes_domain(),
                "barrier_timeout_ms": int_domain(I64_MIN, I64_MAX),
                "staging_tokens": int_domain(0, U64_MAX, inside=ANY, values=[-1, 0, 1, 4096, U64_MAX + 1]),
                "staging_bytes_per_token": int_domain(0, U64_MAX, inside=ANY, values=[-1, 0, 1, 1024,
                                                                                         U64_MAX + 1])})
    p = c.publisher  # lanes=2
    lane = int_domain(0, 1, values=[I64_MIN, -1, 0, 1, 2, 7, 8, I32_MAX + 1, U64_MAX + 1])
    streams = [(None, OK), (0, OK), (12345, OK), ("ignored on host", OK)]  # host buffers ignore the stream
    c.check("Publisher.barrier is a Barrier", lambda: isinstance(p.barrier, kvcomm.Barrier) or 1 / 0, OK)
    c.vary("Publisher.barrier.sync", p.barrier.sync, {"stream": None, "lane": 0}, {"lane": lane, "stream": streams})

    def signal_then_wait(lane: Any, stream: Any = None) -> None:  # per lane the calls alternate signal, wait
        p.barrier.signal(stream=stream, lane=lane)
        p.barrier.wait(stream=stream, lane=lane)

    c.vary("Publisher.barrier.signal/wait", signal_then_wait, {"lane": 0, "stream": None}, {"lane": lane, "stream": streams})
    c.check("Publisher.poll_error()", lambda: p.poll_error() is None or 1 / 0, OK)
    c.check("Publisher.check_errors()", p.check_errors, OK)


def _tensor_cases() -> List[Tuple[str, Any, Expect]]:
    """The `tensors` argument around its count limit, and malformed."""
    t = kvcomm.CacheTensor(ROWS, offset=ROW_OFFSET)
    n = L.MAX_PUBLISH_TENSORS
    return [("one CacheTensor", t, OK), ("[t]", [t], OK), (f"{n} tensors", [t] * n, OK),
            (f"{n + 1} tensors", [t] * (n + 1), bad(match="MAX_PUBLISH_TENSORS")),
            (f"a generator of {n + 1}", (x for x in [t] * (n + 1)), bad(match="MAX_PUBLISH_TENSORS")),
            ("[]", [], BAD), ("None", None, BAD), ("'t'", "t", BAD), ("[ROWS]", [ROWS], BAD), ("[None]", [None], BAD),
            ("offset -1", kvcomm.CacheTensor(ROWS, offset=-1), BAD),
            ("offset 2**64", kvcomm.CacheTensor(ROWS, offset=1 << 64), BAD),
            ("offset 2.0", kvcomm.CacheTensor(ROWS, offset=2.0), BAD),
            ("block_size 0", kvcomm.CacheTensor(ROWS, offset=ROW_OFFSET, block_size=0), BAD),
            ("block_size True", kvcomm.CacheTensor(ROWS, offset=ROW_OFFSET, block_size=True), BAD),
            ("row_bytes 33", kvcomm.CacheTensor(ROWS, offset=ROW_OFFSET, row_bytes=33), BAD),
            ("row_bytes 32", kvcomm.CacheTensor(ROWS, offset=ROW_OFFSET, row_bytes=32), OK),
            ("offset past the buffer", kvcomm.CacheTensor(ROWS, offset=CAPACITY), BAD),
            ("row_stride 2**63", kvcomm.CacheTensor(ROWS, offset=ROW_OFFSET, row_stride=1 << 63), BAD),
            ("0-d src", kvcomm.CacheTensor(np.array(5, np.int64), offset=ROW_OFFSET), BAD),
            ("1-d src of int64", kvcomm.CacheTensor(np.arange(4, dtype=np.int64), offset=ROW_OFFSET), OK)]


@entry("Publisher.publish", "CacheTensor")
def _publish(c: Ctx) -> None:
    p = c.publisher
    calls = {"publish": p.publish,
             "publish(then='barrier')": lambda *a, **kw: p.publish(*a, then="barrier", **kw),
             "publish(then='signal')": lambda *a, **kw: (p.publish(*a, then="signal", **kw),
                                                         p.barrier.wait(lane=kw.get("lane", 0)))}
    slot_cases = array_cases(SLOTS, [np.dtype(np.int64), np.dtype(np.int32)], {"contiguous", "readonly"}, lists=True)
    slot_cases += [ArrayCase("slot 1 << 40", np.array([0, 3, 5, 1 << 40], np.int64), False, None),
                   ArrayCase("slot 1 << 40 (list)", [0, 3, 5, 1 << 40], False, None),
                   ArrayCase("padding", np.array([0, -1, 5, -7], np.int64), True, np.array([0, -1, 5, -7])),
                   ArrayCase("empty", np.zeros(0, np.int64), False, None)]  # fewer slots than... (num_tokens 4)
    src_values = ROWS  # 4 rows of 32 bytes, viewed as every dtype
    for name, fn in calls.items():
        label = f"Publisher.{name}"
        # slot mappings: every dtype, byte order, layout and protocol (num_tokens follows the length)
        for case in slot_cases:
            def run(case: ArrayCase = case) -> Any:
                return fn(kvcomm.CacheTensor(ROWS, offset=ROW_OFFSET), _value(case.obj))
            expect = OK if case.ok else BAD
            if case.label == "empty":
                expect = OK  # no tokens: nothing to write
            c.check(f"{label}(slot_mapping={case.label})", run, expect,
                    (lambda r, case=case: publish_oracle(ROWS, case.values)) if case.ok else None)
        # cache tensors: their count, their geometry and malformed values
        for text, tensors, expect in _tensor_cases():
            rows = np.arange(4, dtype=np.int64)[:, None] if text.startswith("1-d") else ROWS
            c.check(f"{label}(tensors={text})", lambda t=tensors: fn(t, SLOTS), expect,
                    (lambda r, rows=rows: publish_oracle(rows, SLOTS)) if expect.ok else None)
        # num_tokens: [0, len(slot_mapping)]
        for v, e in with_none(int_domain(0, 4, values=[I64_MIN, -1, 0, 1, 4, 5, I64_MAX, U64_MAX + 1])):
            c.check(f"{label}(num_tokens={v!r})", lambda v=v: fn(kvcomm.CacheTensor(ROWS, offset=ROW_OFFSET), SLOTS,
                                                                num_tokens=v), e,
                    (lambda r, v=v: publish_oracle(ROWS, SLOTS, None if v is None else int(v))) if e.ok else None)
        if name != "publish":  # a lane is used (and checked) only when something runs after the rows
            for v, e in int_domain(0, 1, values=[I64_MIN, -1, 0, 1, 2, 8, I32_MAX + 1, U64_MAX + 1]):
                c.check(f"{label}(lane={v!r})", lambda v=v: fn(kvcomm.CacheTensor(ROWS, offset=ROW_OFFSET), SLOTS,
                                                              lane=v), e,
                        (lambda r: publish_oracle(ROWS, SLOTS)) if e.ok else None)
    # then: the three names and the enum; anything else refused before anything is written
    for v, e in [("none", OK), ("barrier", OK), ("signal", OK), (kvcomm.PublishThen.Barrier, OK), ("Barrier", BAD),
                 (1, BAD), (None, BAD), ("", BAD)]:
        def run_then(v: Any = v) -> None:
            p.publish(kvcomm.CacheTensor(ROWS, offset=ROW_OFFSET), SLOTS, then=v)
            if v == "signal":
                p.barrier.wait()
        c.check(f"Publisher.publish(then={v!r})", run_then, e, (lambda r: publish_oracle(ROWS, SLOTS)) if e.ok else None)
    # sources: every dtype (rows of 32 bytes viewed as it), byte order, layout and protocol; any dtype is accepted
    # in native byte order, rows must be contiguous and run forwards, 0-d is refused, misaligned rows are fine
    src_dtypes = [d for d in DTYPES if 32 % d.itemsize == 0]
    for case in array_cases(src_values, src_dtypes, {"contiguous", "readonly", "strided", "misaligned"},
                            dtypes=src_dtypes):
        if case.label.endswith(" bytes"):
            continue  # bytes: one 1-D run of bytes, rows of one byte: another geometry (below)
        src = case.obj
        expect = OK if case.ok else BAD  # 2d (2 x 2 rows): fewer rows than slots; reversed: rows run backwards
        c.check(f"Publisher.publish(src={case.label})",
                lambda s=src: p.publish(kvcomm.CacheTensor(_value(s), offset=ROW_OFFSET), SLOTS), expect,
                (lambda r, v=case.values: publish_oracle(v.reshape(v.shape[0], -1) if v is not None else v, SLOTS))
                if expect.ok else None)
    # a source as bytes: one row per byte
    c.check("Publisher.publish(src=bytes)", lambda: p.publish(kvcomm.CacheTensor(ROWS.tobytes(), offset=ROW_OFFSET),
                                                             SLOTS),
            OK, lambda r: publish_oracle(ROWS.reshape(-1)[:, None], SLOTS))
    # CacheTensor is a record: any fields construct it; publish judges them (above)
    for args in ((None,), (ROWS, "x", 0.5, None, [], object())):
        c.check(f"CacheTensor{args!r}", lambda a=args: kvcomm.CacheTensor(*a), OK)


# -- Barrier


@entry("Barrier", "Barrier.create", "Barrier.sync", "Barrier.signal", "Barrier.wait", "Barrier.device_handle",
       "Barrier.poll_error", "Barrier.check_errors")
def _barrier(c: Ctx) -> None:
    for label, fn in (("Barrier", kvcomm.Barrier), ("Barrier.create", kvcomm.Barrier.create)):
        c.vary(label, fn, {"comm": c.comm, "lanes": 2, "timeout_ms": -1, "kind": "host"},
               {"comm": [(c.comm, OK), (c.buf, BAD)] + [(v, BAD) for v in NOT_OBJECTS],
                "lanes": lanes_domain(), "timeout_ms": int_domain(I64_MIN, I64_MAX), "kind": KIND})
    b = c.barrier  # lanes=2
    lane = int_domain(0, 1, values=[I64_MIN, -1, 0, 1, 2, 7, 8, I32_MAX + 1, U64_MAX + 1])
    streams = [(None, OK), (0, OK), ("ignored on host", OK)]
    c.vary("Barrier.sync", b.sync, {"stream": None, "lane": 0}, {"lane": lane, "stream": streams})

    def signal_then_wait(lane: Any, stream: Any = None) -> None:
        b.signal(stream=stream, lane=lane)
        b.wait(stream=stream, lane=lane)

    c.vary("Barrier.signal/wait", signal_then_wait, {"lane": 0, "stream": None}, {"lane": lane, "stream": streams})
    c.check("Barrier.device_handle()", b.device_handle, ANY)
    c.check("Barrier.poll_error()", b.poll_error, OK)
    c.check("Barrier.check_errors()", b.check_errors, OK)


# -- Fetcher


@entry("Fetcher", "Fetcher.create", "KvRegion")
def _fetcher_create(c: Ctx) -> None:
    for label, fn in (("Fetcher", kvcomm.Fetcher), ("Fetcher.create", kvcomm.Fetcher.create)):
        c.vary(label, fn, {"buffer": c.buf, "layout": [REGION], "version": 0, "lanes": 1, "barrier_timeout_ms": -1},
               {"buffer": [(c.buf, OK), (c.comm, BAD)] + [(v, BAD) for v in NOT_OBJECTS],
                "layout": regions_domain() + [([], BAD), ([(0, 0, 0, 16)], BAD), ([(0, 64, 0, 0)], BAD),
                                              ([(CAPACITY, 64, 0, 1)], BAD)],
                "version": int_domain(0, U64_MAX),
                "lanes": lanes_domain(),
                "barrier_timeout_ms": int_domain(I64_MIN, I64_MAX)})
    for args in ((0, 64), ("a", None, 1.5, [])):  # a record: Fetcher and layout_hash judge its fields
        c.check(f"KvRegion{args!r}", lambda a=args: kvcomm.KvRegion(*a), OK)


def _id_cases(values: np.ndarray) -> List[ArrayCase]:
    return array_cases(values, [np.dtype(np.int64)], {"contiguous", "readonly"}, lists=True)


@entry("Fetcher.fetch", "Fetcher.plan", "Fetcher.submit", "Fetcher.start", "Fetcher.fetch_all", "FetchRequest",
       "FetchPlan", "FetchOperation", "FetchOperation.test", "FetchOperation.wait", "FetchStatus")
def _fetch(c: Ctx) -> None:
    f = c.fetcher

    def via_plan(reqs: Any, **kw: Any) -> Any:
        stream = kw.pop("stream", None)
        return f.submit(f.plan(reqs, **kw), stream)

    def via_start(reqs: Any, **kw: Any) -> Any:
        st = f.start(reqs, **kw).wait(30000)
        if st.failed:
            raise kvcomm.InternalError(f"fetch failed: {st.error}")
        return st

    calls = {"fetch": f.fetch, "plan+submit": via_plan, "start+wait": via_start, "fetch_all": f.fetch_all}
    src_cases, dst_cases = _id_cases(SRC_IDS), _id_cases(DST_IDS)
    for name, fn in calls.items():
        label = f"Fetcher.{name}"
        # ids: every dtype, byte order, layout, protocol; the swapped ones hold valid ids' bytes: read in place they
        # would copy blocks, so a refusal is checked over the whole buffer
        every = name == "fetch"  # the other calls share the checks: every other case is enough
        for k, case in enumerate(src_cases):
            if every or k % 3 == 0:
                c.check(f"{label}(src_ids={case.label})", lambda o=case.obj: fn([(0, _value(o), DST_IDS)]),
                        OK if case.ok else BAD,
                        (lambda r, v=case.values: fetch_oracle(v, DST_IDS)) if case.ok else None)
        for k, case in enumerate(dst_cases):
            if every or k % 3 == 1:
                c.check(f"{label}(dst_ids={case.label})", lambda o=case.obj: fn([(0, SRC_IDS, _value(o))]),
                        OK if case.ok else BAD,
                        (lambda r, v=case.values: fetch_oracle(SRC_IDS, v)) if case.ok else None)
        # ids' values: -1 skips, other negatives and ids past the layout are refused, duplicates refused
        for text, s, d, e in (("padding", [1, -1, 3, 7], [10, 11, -1, 20], OK),
                              ("id 40 (num_blocks)", [1, 2, 3, 40], DST_IDS, BAD),
                              ("id -2", [1, 2, 3, -2], DST_IDS, BAD),
                              ("id INT64_MAX", [1, 2, 3, I64_MAX], DST_IDS, BAD),
                              ("id INT64_MIN", [1, 2, 3, I64_MIN], DST_IDS, BAD),
                              ("3 << 56", [3 << 56], [9 << 56], BAD),
                              ("duplicate destination", [1, 2], [10, 10], BAD),
                              ("lengths differ", [1, 2, 3], DST_IDS, BAD),
                              ("empty", [], [], OK)):
            s, d = np.array(s, np.int64), np.array(d, np.int64)
            c.check(f"{label}(ids {text})", lambda s=s, d=d: fn([(0, s, d)]), e,
                    (lambda r, s=s, d=d: fetch_oracle(s, d)) if e.ok else None)
        # requests' structure and counts
        e0 = np.zeros(0, np.int64)
        big = np.zeros(L.MAX_FETCH_PAIRS + 1, np.int64)  # calloc'd: never touched by a refusal
        half = np.zeros(L.MAX_FETCH_PAIRS // 2 + 1, np.int64)
        structure = [  # (what, requests, expectation); the accepted ones copy SRC_IDS into DST_IDS unless empty
            ("a tuple", (0, SRC_IDS, DST_IDS), OK), ("a FetchRequest", [kvcomm.FetchRequest(0, SRC_IDS, DST_IDS)], OK),
            ("with the layout hash", [(0, SRC_IDS, DST_IDS, f.layout_hash(0))], OK),
            ("a wrong layout hash", [(0, SRC_IDS, DST_IDS, f.layout_hash(0) ^ 1)], BAD),
            ("layout hash -1", [(0, SRC_IDS, DST_IDS, -1)], BAD),
            ("layout hash 2**64", [(0, SRC_IDS, DST_IDS, 1 << 64)], BAD),
            ("src_rank 1", [(1, SRC_IDS, DST_IDS)], BAD), ("src_rank -1", [(-1, SRC_IDS, DST_IDS)], BAD),
            ("src_rank True", [(True, SRC_IDS, DST_IDS)], BAD), ("src_rank 0.0", [(0.0, SRC_IDS, DST_IDS)], BAD),
            ("src_rank 2**64", [(1 << 64, SRC_IDS, DST_IDS)], BAD), ("src_rank '0'", [("0", SRC_IDS, DST_IDS)], BAD),
            ("src_rank np.int64(0)", [(np.int64(0), SRC_IDS, DST_IDS)], OK),
            ("a 2-tuple", [(0, SRC_IDS)], BAD), ("a 5-tuple", [(0, SRC_IDS, DST_IDS, 0, 0)], BAD),
            ("None", None, BAD), ("5", 5, BAD), ("'x'", "x", BAD), ("[None]", [None], BAD), ("[]", [], OK),
            (f"{L.MAX_FETCH_REQUESTS + 1} requests", [(0, e0, e0)] * (L.MAX_FETCH_REQUESTS + 1),
             bad(match="MAX_FETCH_REQUESTS")),
            (f"a generator of {L.MAX_FETCH_REQUESTS + 1}", Lazy(lambda: ((0, e0, e0) for _ in
                                                                           range(L.MAX_FETCH_REQUESTS + 1)), "gen"),
             bad(match="MAX_FETCH_REQUESTS")),
            (f"{L.MAX_FETCH_PAIRS + 1} pairs in one request", [(0, big, big)], bad(match="MAX_FETCH_PAIRS")),
            (f"{L.MAX_FETCH_PAIRS + 2} pairs in two", [(0, half, half), (0, half, half)],
             bad(match="MAX_FETCH_PAIRS")),
            (f"a list of {L.MAX_FETCH_PAIRS + 1} ids", Lazy(lambda: [(0, range(L.MAX_FETCH_PAIRS + 1), e0)], "range"),
             bad(match="MAX_FETCH_PAIRS")),
        ]
        if name == "plan+submit":  # the accepted side of the request limit, once
            structure.append((f"{L.MAX_FETCH_REQUESTS} requests", [(0, e0, e0)] * L.MAX_FETCH_REQUESTS, OK))
        for text, reqs, e in structure:
            empty = text == "[]" or text.endswith(" requests")
            c.check(f"{label}(requests={text})", lambda r=reqs: fn(_value(r)), e,
                    (lambda r: fetch_oracle(SRC_IDS, DST_IDS)) if e.ok and not empty else None)
        # path and the other options
        for v, e in PATH:
            c.check(f"{label}(path={v!r})", lambda v=v: fn([(0, SRC_IDS, DST_IDS)], path=v), e,
                    (lambda r: fetch_oracle(SRC_IDS, DST_IDS)) if e.ok else None)
        option = "max_bytes_per_second" if name == "start+wait" else "copy_engine_min_run_bytes"
        for v, e in int_domain(0, U64_MAX, values=[I64_MIN, -1, 0, 1, 1 << 20, U64_MAX, U64_MAX + 1]):
            if option == "max_bytes_per_second" and isinstance(v, (int, np.integer)) and 0 < int(v) < 1 << 20:
                continue  # a slow pace is a slow test, not another property
            c.check(f"{label}({option}={v!r})", lambda v=v: fn([(0, SRC_IDS, DST_IDS)], **{option: v}), e,
                    (lambda r: fetch_oracle(SRC_IDS, DST_IDS)) if e.ok else None)
        if name == "fetch":  # where the pairs are checked: host buffers check on the host either way (docs)
            for v, e in (("host", OK), ("device", OK), ("Device", BAD), ("", BAD), (None, BAD), (1, BAD),
                         (True, BAD)):
                c.check(f"{label}(validation={v!r})", lambda v=v: fn([(0, SRC_IDS, DST_IDS)], validation=v), e,
                        (lambda r: fetch_oracle(SRC_IDS, DST_IDS)) if e.ok else None)
            for text, s, d in (("id 40 (num_blocks)", [1, 2, 3, 40], DST_IDS),
                               ("duplicate destination", [1, 2], [10, 10])):
                s, d = np.array(s, np.int64), np.array(d, np.int64)
                c.check(f"{label}(validation='device', ids {text})",
                        lambda s=s, d=d: fn([(0, s, d)], validation="device"), BAD)
    # submit(plan): only this fetcher's plans
    plan = f.plan([(0, SRC_IDS, DST_IDS)])
    for v, e in [(plan, OK)] + [(v, BAD) for v in NOT_OBJECTS + [plan.info]]:
        c.check(f"Fetcher.submit({v!r})", lambda v=v: f.submit(v), e,
                (lambda r: fetch_oracle(SRC_IDS, DST_IDS)) if e.ok else None)
    for v in NOT_OBJECTS:
        c.check(f"FetchPlan({v!r})", lambda v=v: kvcomm.FetchPlan(v), BAD)
        c.check(f"FetchOperation({v!r})", lambda v=v: kvcomm.FetchOperation(v), BAD)
    op = f.start([(0, SRC_IDS, DST_IDS)])
    c.check("FetchOperation.wait()", lambda: op.wait(30000).done or 1 / 0, OK,
            lambda r: fetch_oracle(SRC_IDS, DST_IDS))
    c.check("FetchOperation.test()", lambda: op.test().done or 1 / 0, OK)
    for v, e in int_domain(I64_MIN, I64_MAX):
        c.check(f"FetchOperation.wait({v!r})", lambda v=v: op.wait(v), e)
    # records: any fields construct them; calls judge them
    for cls, n in ((kvcomm.FetchRequest, 3), (kvcomm.FetchStatus, 4)):
        c.check(f"{cls.__name__}(None x {n})", lambda cls=cls, n=n: cls(*([None] * n)), OK)


@entry("Fetcher.fetch_device")
def _fetch_device(c: Ctx) -> None:
    f = c.fetcher
    ranks = np.zeros(4, np.int32)
    for case in _id_cases(SRC_IDS):
        if case.label.startswith(("list", "tuple", "nested", "ragged")):
            continue  # device ids are arrays: a list is not one
        c.check(f"Fetcher.fetch_device(src_ids={case.label})", lambda o=case.obj: f.fetch_device(_value(o), DST_IDS, 0),
                OK if case.ok else BAD, (lambda r, v=case.values: fetch_oracle(v, DST_IDS)) if case.ok else None)
    for case in _id_cases(DST_IDS)[::2]:
        if case.label.startswith(("list", "tuple", "nested", "ragged")):
            continue
        c.check(f"Fetcher.fetch_device(dst_ids={case.label})", lambda o=case.obj: f.fetch_device(SRC_IDS, _value(o), 0),
                OK if case.ok else BAD, (lambda r, v=case.values: fetch_oracle(SRC_IDS, v)) if case.ok else None)
    for case in array_cases(np.zeros(4, np.int64), [np.dtype(np.int32)], {"contiguous", "readonly"}):
        c.check(f"Fetcher.fetch_device(src_ranks={case.label})",
                lambda o=case.obj: f.fetch_device(SRC_IDS, DST_IDS, src_ranks=_value(o)), OK if case.ok else BAD,
                (lambda r: fetch_oracle(SRC_IDS, DST_IDS)) if case.ok else None)
    c.vary("Fetcher.fetch_device", lambda **kw: f.fetch_device(SRC_IDS, DST_IDS, **kw),
           {"src_rank": 0}, {"src_rank": int_domain(0, 0), "stream": [(None, OK), (0, OK), ("ignored", OK)]},
           oracle=lambda r: fetch_oracle(SRC_IDS, DST_IDS))
    c.check("fetch_device(neither rank)", lambda: f.fetch_device(SRC_IDS, DST_IDS), BAD)
    c.check("fetch_device(both ranks)", lambda: f.fetch_device(SRC_IDS, DST_IDS, 0, src_ranks=ranks), BAD)
    c.check("fetch_device(src_ranks [1, ...])", lambda: f.fetch_device(SRC_IDS, DST_IDS,
                                                                       src_ranks=np.ones(4, np.int32)), BAD)
    big = np.zeros(L.MAX_FETCH_PAIRS + 1, np.int64)
    c.check("fetch_device(2**24 + 1 ids)", lambda: f.fetch_device(big, big, 0), bad(match="MAX_FETCH_PAIRS"))


@entry("Fetcher.refresh", "Fetcher.layout", "Fetcher.layout_version", "Fetcher.layout_hash", "Fetcher.device_handle",
       "Fetcher.poll_error", "Fetcher.check_errors", "Fetcher.transport")
def _fetcher_queries(c: Ctx) -> None:
    f = c.fetcher
    c.check("Fetcher.refresh()", f.refresh, OK)
    for name in ("layout", "layout_version", "layout_hash"):
        c.vary(f"Fetcher.{name}", getattr(f, name), {"rank": None}, {"rank": with_none(int_domain(0, 0))})
    c.check("Fetcher.device_handle()", f.device_handle, ANY)
    # One member: it reaches itself through its own mappings (the peer transport).
    c.vary("Fetcher.transport", f.transport, {"rank": None}, {"rank": with_none(int_domain(0, 0))})
    c.check("Fetcher.transport(0) is Peer", lambda: f.transport(0) == kvcomm.FetchTransport.Peer or 1 / 0, OK)
    c.check("Fetcher.poll_error()", f.poll_error, OK)
    c.check("Fetcher.check_errors()", f.check_errors, OK)


# -- arenas: one process, which imports its own arenas over a session to its own server


ARENA_LAYOUT = [(0, 4096, 0, 8)]
ARENA_CAPACITY = 1 << 20
MS = int_domain(I64_MIN, I64_MAX)
TTL = int_domain(1, 86400000)
# A request's bound: below a second a live peer may or may not answer in time (TimeoutError); < 0 is the default.
REQUEST_MS = [(v, ANY if e.ok and 0 <= int(v) < 1000 else e) for v, e in MS]


class Arenas:
    """The objects the arena entries call: a server, a session to it and its accepted end, an arena and its import."""

    def __init__(self) -> None:
        self.server = kvcomm.ArenaServer()
        self.session = kvcomm.ArenaSession.connect(self.server.address)
        self.peer = self.server.accept(10000)
        self.arena = kvcomm.Arena(ARENA_LAYOUT, kind="host", capacity=ARENA_CAPACITY)
        self.imp = self.session.import_(self.session.offer(self.arena))
        self.pending: List[Any] = []

    def fresh_cap(self) -> Lazy:
        return Lazy(lambda: self.session.offer(self.arena), "<fresh capability>")

    def fresh_arena(self) -> kvcomm.Arena:
        return kvcomm.Arena(ARENA_LAYOUT, kind="host", capacity=ARENA_CAPACITY)

    def fresh_import(self) -> kvcomm.ArenaImport:
        self.pending.append(self.fresh_arena())  # the owner's object lives as long as the test
        return self.session.import_(self.session.offer(self.pending[-1]))


_ARENAS: List[Arenas] = []


def _arenas() -> Arenas:
    if not _ARENAS:
        _ARENAS.append(Arenas())
    return _ARENAS[0]


def _layouts() -> List[Tuple[Any, Expect]]:
    many = [(i * 8192, 4096, 0, 1) for i in range(L.MAX_ARENA_REGIONS + 1)]
    return [(ARENA_LAYOUT, OK), ([kvcomm.KvRegion(0, 4096, 0, 8)], OK), (kvcomm.KvRegion(0, 4096, 0, 8), OK),
            ([], BAD), ([(0, 0, 0, 1)], BAD), ([(0, 4096, 0, 4), (4096, 4096, 0, 4)], BAD), ("x", BAD), (None, BAD),
            ([(0, 4096, 0)], BAD), ([(0, "4096", 0, 1)], BAD), (many, bad(match="MAX_ARENA_REGIONS"))]


@entry("Arena", "Arena.create")
def _arena_create(c: Ctx) -> None:
    for fn, label in ((kvcomm.Arena, "Arena"), (kvcomm.Arena.create, "Arena.create")):
        c.vary(label, lambda **kw: fn(**kw).close(), {"layout": ARENA_LAYOUT, "kind": "host"},
               {"layout": _layouts(), "kind": KIND, "capacity": int_domain(0, U64_MAX, inside=ANY),
                "legacy_ipc": [(False, OK), (True, BAD), (1, BAD), (None, BAD), ("yes", BAD)],
                "version": int_domain(0, U64_MAX)})
    a = kvcomm.Arena(ARENA_LAYOUT, kind="host", capacity=ARENA_CAPACITY, version=5)
    c.check("Arena layout and sizes", lambda: (a.layout == [kvcomm.KvRegion(0, 4096, 0, 8)] and a.layout_version == 5
                                               and a.capacity >= ARENA_CAPACITY and a.bytes >= 8 * 4096) or 1 / 0, OK)
    a.close()


@entry("Arena.offer", "Arena.revoke_capabilities", "Arena.ipc_handle")
def _arena_offer(c: Ctx) -> None:
    a = _arenas().fresh_arena()
    c.vary("Arena.offer", a.offer, {"pid": 1234}, {"pid": int_domain(1, I32_MAX), "uid": with_none(
        int_domain(0, (1 << 32) - 1)), "ttl_ms": TTL})
    c.check("Arena.revoke_capabilities()", lambda: (a.revoke_capabilities(), a.live_capabilities == 0 or 1 / 0), OK)
    c.check("Arena.ipc_handle() (host)", a.ipc_handle, bad(match="legacyIpc"))
    a.close()


@entry("Arena.grow", "Arena.grow_layout", "Arena.shrink", "Arena.shrink_layout", "Arena.free", "Arena.close")
def _arena_changes(c: Ctx) -> None:
    A = _arenas()
    c.vary("Arena.grow", lambda **kw: A.fresh_arena().grow(**kw), {"new_bytes": ARENA_CAPACITY},
           {"new_bytes": int_domain(8 * 4096, ARENA_CAPACITY, values=set(INT_EDGES) | {U64_MAX}),
            "timeout_ms": MS})
    c.check("Arena.grow(capacity)", lambda: A.fresh_arena().grow(ARENA_CAPACITY) == kvcomm.ArenaGrowth(2, 0) or 1 / 0,
            OK)
    c.vary("Arena.grow_layout", lambda **kw: A.fresh_arena().grow_layout(**kw), {"layout": [(0, 4096, 0, 16)]},
           {"layout": _layouts(), "version": int_domain(0, U64_MAX), "timeout_ms": MS})
    c.vary("Arena.shrink", lambda **kw: A.fresh_arena().shrink(**kw), {"new_bytes": 8 * 4096},
           {"new_bytes": int_domain(0, U64_MAX, inside=ANY), "wait_ms": MS})
    c.vary("Arena.shrink_layout", lambda **kw: A.fresh_arena().shrink_layout(**kw), {"layout": [(0, 4096, 0, 4)]},
           {"layout": _layouts(), "version": int_domain(0, U64_MAX), "wait_ms": MS})
    c.vary("Arena.free", lambda **kw: A.fresh_arena().free(**kw), {}, {"wait_ms": MS})
    c.check("Arena.free() (leased)", lambda: A.arena.free(), bad(kvcomm.BusyError, "busy"))
    c.check("Arena.shrink() (leased)", lambda: A.arena.shrink(A.arena.bytes), bad(kvcomm.BusyError, "busy"))
    a = A.fresh_arena()
    c.check("Arena.close()", lambda: (a.close(), a.close()), OK)
    c.check("Arena.offer() (closed)", lambda: a.offer(1234), bad(match="empty"))


def _memory_entries(c: Ctx, label: str, m: Any) -> None:
    """write/read/read_into/pin/view of an Arena or ArenaImport: ranges against the mapped bytes, arrays, dtypes."""
    n = m.bytes
    data = [(np.zeros(8, np.uint8), OK), (b"12345678", OK), (bytearray(8), OK), (np.zeros(1, np.int64), OK),
            (np.zeros(16, np.uint8)[::2], BAD), ("12345678", BAD), (None, BAD), (3, BAD), ([1, 2], BAD)]
    c.vary(f"{label}.write", m.write, {"offset": 0, "data": np.zeros(8, np.uint8)},
           {"offset": int_domain(0, n - 8, values=set(INT_EDGES) | {n - 8, n, U64_MAX}), "data": data})
    c.vary(f"{label}.read", m.read, {"offset": 0, "nbytes": 8},
           {"offset": int_domain(0, n - 8, values=set(INT_EDGES) | {n - 8, n, U64_MAX}),
            "nbytes": int_domain(0, n, values=set(INT_EDGES) | {n, U64_MAX})})
    c.check(f"{label}.write/read round trip", lambda: (m.write(100, bytes(range(8))),
                                                       m.read(100, 8).tobytes() == bytes(range(8)) or 1 / 0), OK)
    outs = [(np.zeros(8, np.uint8), OK), (bytearray(8), OK), (b"12345678", BAD),
            (np.zeros(8, np.uint8)[::2], BAD), (None, BAD), ("x", BAD)]
    ro = np.zeros(8, np.uint8)
    ro.setflags(write=False)
    outs.append((ro, BAD))
    c.vary(f"{label}.read_into", m.read_into, {"offset": 0, "out": np.zeros(8, np.uint8)},
           {"offset": int_domain(0, n - 8, values=set(INT_EDGES) | {n - 8, n}), "out": outs})
    c.vary(f"{label}.pin", lambda **kw: m.pin(**kw).release(), {"offset": 0, "nbytes": 8},
           {"offset": int_domain(0, n - 8, values=set(INT_EDGES) | {n - 8, n}),
            "nbytes": int_domain(1, n, values=set(INT_EDGES) | {n, n + 1})})
    c.vary(f"{label}.view", m.view, {},
           {"offset": int_domain(0, n - 1, values=set(INT_EDGES) | {n - 1, n}),
            "nbytes": with_none(int_domain(1, n, values=set(INT_EDGES) | {n, n + 1})),
            "dtype": [(None, OK), (np.uint32, OK), ("float64", OK), (np.dtype("V3"), BAD), (object, BAD),
                      ("nope", BAD)],
            "framework": [(None, OK), ("numpy", OK), ("dlpack", OK), ("cupy", BAD), (3, BAD)]})


@entry("Arena.write", "Arena.read", "Arena.read_into", "Arena.pin", "Arena.view", "ArenaPin", "ArenaPin.release")
def _arena_memory(c: Ctx) -> None:
    A = _arenas()
    _memory_entries(c, "Arena", A.arena)
    for v in NOT_OBJECTS:
        c.check(f"ArenaPin({v!r})", lambda v=v: kvcomm.ArenaPin(v), BAD)
    p = A.arena.pin(8, 8)
    c.check("ArenaPin.release()", lambda: (p.release(), p.release(), (p.bytes, p.offset) == (0, 0) or 1 / 0), OK)


@entry("ArenaImport", "ArenaImport.open_ipc", "ArenaImport.write", "ArenaImport.read", "ArenaImport.read_into",
       "ArenaImport.pin", "ArenaImport.view", "ArenaImport.check", "ArenaImport.close")
def _arena_import(c: Ctx) -> None:
    A = _arenas()
    _memory_entries(c, "ArenaImport", A.imp)
    for v in NOT_OBJECTS:
        c.check(f"ArenaImport({v!r})", lambda v=v: kvcomm.ArenaImport(v), BAD)
    c.vary("ArenaImport.open_ipc", kvcomm.ArenaImport.open_ipc, {"handle": bytes(64), "layout": ARENA_LAYOUT},
           {"handle": [(bytes(64), ANY), (bytes(63), BAD), ("x" * 64, BAD), (None, BAD), (3, BAD)],
            "layout": [(v, ANY if e.ok else e) for v, e in _layouts()], "version": [(0, ANY), (-1, BAD), ("1", BAD)]},
           base=ANY)
    c.check("ArenaImport.check()", A.imp.check, OK)
    c.vary("ArenaImport.close", lambda **kw: A.fresh_import().close(**kw), {}, {"timeout_ms": MS})
    i = A.fresh_import()
    c.check("ArenaImport.close() twice", lambda: (i.close(), i.close(), i.closed or 1 / 0), OK)
    c.check("ArenaImport.check() (closed)", i.check, bad(match="closed"))


@entry("ArenaSession", "ArenaSession.connect", "ArenaSession.offer", "ArenaSession.import_", "ArenaSession.send",
       "ArenaSession.receive", "ArenaSession.close")
def _arena_session(c: Ctx) -> None:
    A = _arenas()
    for v in NOT_OBJECTS:
        c.check(f"ArenaSession({v!r})", lambda v=v: kvcomm.ArenaSession(v), BAD)
    nobody = f"@kvcomm-props-nobody-{id(c)}"
    c.vary("ArenaSession.connect", lambda **kw: kvcomm.ArenaSession.connect(**kw).close(),
           {"address": A.server.address, "timeout_ms": 5000},
           {"address": [(A.server.address, OK), ("", BAD), (None, BAD), (3, BAD), (b"@x", BAD),
                        (nobody, bad(kvcomm.Error))],
            "timeout_ms": REQUEST_MS})
    while True:  # the server's ends of those sessions
        try:
            A.server.accept(0).close()
        except kvcomm.TimeoutError:
            break
    imp_or_not = [(A.imp, BAD)] + [(v, BAD) for v in NOT_OBJECTS]
    c.vary("ArenaSession.offer", A.session.offer, {"arena": A.arena},
           {"arena": [(A.arena, OK)] + imp_or_not, "ttl_ms": TTL})
    loss = enum_domain(kvcomm.OwnerLoss, {"keep": kvcomm.OwnerLoss.Keep, "release": kvcomm.OwnerLoss.Release})
    c.vary("ArenaSession.import_", lambda **kw: A.session.import_(**kw).close(), {"capability": A.fresh_cap()},
           {"capability": [(A.fresh_cap(), OK), (bytes(48), BAD), (bytes(47), BAD), ("x" * 48, BAD), (None, BAD),
                           (3, BAD)],
            "on_owner_loss": loss, "timeout_ms": REQUEST_MS})
    cap = A.session.offer(A.arena)
    c.check("ArenaSession.import_(used)", lambda: (A.session.import_(cap).close(), A.session.import_(cap)),
            bad(match="already used"))
    big = L and kvcomm.ArenaSession.MAX_MESSAGE_BYTES
    c.vary("ArenaSession.send", A.session.send, {"data": b"x"},
           {"data": [(b"", OK), (b"x", OK), (bytes(big), OK), (bytes(big + 1), bad(match="MAX_MESSAGE_BYTES")),
                     (bytearray(3), OK), (memoryview(b"ab"), OK), (cap, OK), ("x", BAD), (None, BAD), (3, BAD)]})

    def receive(**kw: Any) -> Any:
        A.peer.send(b"m")
        return A.session.receive(**kw)

    # The message is sent just before each call from this process's other session: a bound under 100 ms may expire
    # before the poll thread has moved it (the machine may be busy), so those bounds may time out as documented.
    soon = [(v, ANY if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= int(v) < 100 else e)
            for v, e in MS]
    c.vary("ArenaSession.receive", receive, {}, {"timeout_ms": soon})
    for s in (A.session, A.peer):  # drain (a message may still be on its way: wait a little for each)
        while True:
            try:
                s.receive(200)
            except kvcomm.TimeoutError:
                break
    c.check("ArenaSession.receive(0) (empty)", lambda: A.session.receive(0), bad(kvcomm.TimeoutError))
    s = kvcomm.ArenaSession.connect(A.server.address)
    c.check("ArenaSession.close()", lambda: (s.close(), s.close(), (not s.alive) or 1 / 0), OK)
    c.check("ArenaSession.send() (closed)", lambda: s.send(b"x"), bad(kvcomm.NetworkError))
    while True:
        try:
            A.server.accept(0).close()
        except kvcomm.TimeoutError:
            break


@entry("ArenaServer", "ArenaServer.listen", "ArenaServer.accept", "ArenaServer.close")
def _arena_server(c: Ctx) -> None:
    A = _arenas()
    for fn, label in ((kvcomm.ArenaServer, "ArenaServer"), (kvcomm.ArenaServer.listen, "ArenaServer.listen")):
        c.vary(label, lambda **kw: fn(**kw).close(), {},
               {"address": [("", OK), (Lazy(lambda: f"@kvcomm-props-{id(object())}", "<fresh @name>"), OK),
                            ("/tmp/kvcomm-props.sock", bad(match="/tmp")), (None, BAD), (3, BAD)],
                "max_sessions": int_domain(0, U64_MAX, inside=ANY), "max_pending_handshakes": int_domain(
                    0, U64_MAX, inside=ANY), "handshake_timeout_ms": MS, "request_timeout_ms": MS})
    live: List[Any] = []

    def accept(**kw: Any) -> Any:
        live.append(kvcomm.ArenaSession.connect(A.server.address))
        return A.server.accept(**kw)

    c.vary("ArenaServer.accept", accept, {}, {"timeout_ms": MS})
    for s in live:
        s.close()
    while True:
        try:
            A.server.accept(0).close()
        except kvcomm.TimeoutError:
            break
    srv = kvcomm.ArenaServer()
    c.check("ArenaServer.close()", lambda: (srv.close(), srv.close()), OK)
    c.check("ArenaServer.accept() (closed)", lambda: srv.accept(0), bad(kvcomm.AbortedError))


@entry("ArenaCapability", "ArenaCapability.to_bytes", "ArenaCapability.from_bytes", "ArenaGrowth")
def _arena_records(c: Ctx) -> None:
    cap = _arenas().session.offer(_arenas().arena)
    c.check("ArenaCapability.to_bytes()", lambda: (len(cap.to_bytes()) == 48 and bytes(cap) == cap.to_bytes()
                                                   and kvcomm.ArenaCapability.from_bytes(cap.to_bytes()) == cap)
            or 1 / 0, OK)
    c.vary("ArenaCapability.from_bytes", kvcomm.ArenaCapability.from_bytes, {"data": bytes(48)},
           {"data": [(bytes(48), OK), (bytearray(48), OK), (memoryview(bytes(48)), OK), (bytes(47), BAD),
                     (bytes(49), BAD), ("x" * 48, BAD), (None, BAD), (3, BAD)]})
    c.check("ArenaCapability(...)", lambda: kvcomm.ArenaCapability(1, 1, bytes(16), 1, 0, 0), OK)
    c.check("ArenaGrowth(1, 0)", lambda: kvcomm.ArenaGrowth(1, 0), OK)


# -- endpoints: two endpoints of this process; the client's registration is the buffer's own memory, so that every
# refused call is checked for writing nothing there, and every read against an oracle of it


EP_PEER = np.random.default_rng(13).integers(0, 256, 4096, dtype=np.uint8)  # the server's memory (REGION fits)


class Endpoints:
    """A server endpoint serving EP_PEER with REGION, a client endpoint with the buffer registered, connected."""

    def __init__(self, c: Ctx) -> None:
        self.server = kvcomm.Endpoint("props server", tcp_address="127.0.0.1:0")
        self.client = kvcomm.Endpoint("props client", tcp_address="127.0.0.1:0")
        self.peer = EP_PEER.copy()
        self.served = self.server.register(self.peer, [REGION])
        self.mine = self.client.register_buffer(c.buf, [REGION])
        self.remote = self.client.connect(self.served.metadata())

    def read(self, **kw: Any) -> Any:
        args = dict(local=self.mine, remote=self.remote, remote_blocks=SRC_IDS, local_blocks=DST_IDS)
        args.update(kw)
        st = self.client.read(**args).wait(30000)
        if not st.done:
            raise kvcomm.InternalError(f"read failed: {st.error}")
        return st

    def write(self, src: Any = SRC_IDS, dst: Any = DST_IDS, **kw: Any) -> Any:
        """A write whose effect on the server's memory is checked here against pairs (src[i] -> dst[i]), the ids the
        call's arguments hold (the buffer is only read)."""
        args = dict(local=self.mine, remote=self.remote, remote_blocks=DST_IDS, local_blocks=SRC_IDS)
        args.update(kw)
        try:
            st = self.client.write(**args).wait(30000)
        except kvcomm.Error:
            if not np.array_equal(self.peer, EP_PEER):
                self.peer[:] = EP_PEER
                raise kvcomm.InternalError("a refused write changed the server's memory") from None
            raise
        try:
            if not st.done:
                raise kvcomm.InternalError(f"write failed: {st.error}")
            want = EP_PEER.copy()
            off, nbytes, stride, _ = REGION
            for s, d in zip(np.asarray(src).tolist(), np.asarray(dst).tolist()):
                if s != -1 and d != -1:
                    want[off + d * stride:off + d * stride + nbytes] = PATTERN[off + s * stride:off + s * stride + nbytes]
            if not np.array_equal(self.peer, want):
                raise kvcomm.InternalError("the server's memory differs from the write's oracle")
            return st
        finally:
            self.peer[:] = EP_PEER


_ENDPOINTS: List[Endpoints] = []


def _endpoints(c: Ctx) -> Endpoints:
    if not _ENDPOINTS:
        _ENDPOINTS.append(Endpoints(c))
    return _ENDPOINTS[0]


def read_oracle(src: Any, dst: Any) -> np.ndarray:
    """The buffer after the server's block src[i] was read into block dst[i] (-1: skipped), from the pattern."""
    img = PATTERN.copy()
    off, nbytes, stride, _ = REGION
    for s, d in zip(np.asarray(src).tolist(), np.asarray(dst).tolist()):
        if s != -1 and d != -1:
            img[off + d * stride:off + d * stride + nbytes] = EP_PEER[off + s * stride:off + s * stride + nbytes]
    return img


ACCESS = enum_domain(kvcomm.Access, {"read_write": kvcomm.Access.ReadWrite, "read_only": kvcomm.Access.ReadOnly})
VIA = enum_domain(kvcomm.TransferVia, {"auto": kvcomm.TransferVia.Auto, "tcp": kvcomm.TransferVia.Tcp,
                                       "peer": kvcomm.TransferVia.Peer, "rdma": kvcomm.TransferVia.Rdma},
                  ok_override={kvcomm.TransferVia.Peer: bad(kvcomm.UnsupportedError),
                               kvcomm.TransferVia.Rdma: bad(kvcomm.UnsupportedError)})
NOT_ZERO_MS = [(v, BAD if e.ok and int(v) == 0 else e) for v, e in MS]  # 0: no time for any progress


@entry("Endpoint", "Endpoint.create", "Endpoint.close")
def _endpoint_create(c: Ctx) -> None:
    for fn, label in ((kvcomm.Endpoint, "Endpoint"), (kvcomm.Endpoint.create, "Endpoint.create")):
        c.vary(label, lambda **kw: fn(**kw).close(), {"tcp_address": "127.0.0.1:0"},
               {"name": [("", OK), ("x" * 63, OK), ("x" * 64, bad(match="longer than")), (None, BAD), (3, BAD),
                         (b"x", BAD)],
                "tcp_address": [("127.0.0.1:0", OK), ("nowhere", bad(kvcomm.Error)), (None, BAD), (3, BAD)],
                "timeout_ms": NOT_ZERO_MS, "connections_per_peer": int_domain(1, 64)})
    ep = kvcomm.Endpoint(tcp_address="127.0.0.1:0")
    c.check("Endpoint.close() twice", lambda: (ep.close(), ep.close()), OK)
    c.check("Endpoint.register() (closed)", lambda: ep.register(np.zeros(4096, np.uint8), [REGION]),
            bad(match="closed"))


def _register_arrays() -> List[Tuple[Any, Expect]]:
    ro = np.zeros(CAPACITY, np.uint8)
    ro.setflags(write=False)
    return [(np.zeros(CAPACITY, np.uint8), OK), (np.zeros(CAPACITY // 4, np.float32), OK),
            (np.zeros((64, CAPACITY // 64), np.uint8), OK), (bytearray(CAPACITY), OK),
            (Lazy(lambda: np.zeros(CAPACITY, np.uint8).__dlpack__(), "<DLPack capsule>"), OK),
            (ro, bad(match="read-only")), (bytes(CAPACITY), bad(match="read-only")),
            (np.zeros(2 * CAPACITY, np.uint8)[::2], bad(match="contiguous")), (np.zeros(100, np.uint8), BAD),
            (np.zeros(CAPACITY // 4, ">i4"), bad(match="byte order")), (np.zeros(CAPACITY, object), BAD),
            ([0] * 16, BAD), (None, BAD), ("x", BAD), (3, BAD)]


@entry("Endpoint.register", "Endpoint.register_buffer", "Endpoint.register_arena", "Endpoint.unregister",
       "Registration", "Registration.metadata", "Registration.revoke")
def _endpoint_register(c: Ctx) -> None:
    E = _endpoints(c)
    ep = E.server

    def register(**kw: Any) -> Any:
        ep.unregister(ep.register(**kw))

    from kvcomm.conversion import KvContents
    # What REGION's 48-byte blocks hold: 3 tokens x 1 head x 8 x 2 bytes (a head dim of 16 does not fit them).
    contents = [(None, OK), ([], OK), ([KvContents(2, 8, 3, 1)], OK), ([KvContents(2, 16, 3, 1)], BAD),
                ([KvContents(2, 8, 3, 1)] * 2, BAD), ("x", BAD), ([1], BAD)]
    c.vary("Endpoint.register", register, {"array": np.zeros(CAPACITY, np.uint8), "layout": [REGION]},
           {"array": _register_arrays(), "layout": regions_domain(), "access": ACCESS,
            "version": int_domain(0, U64_MAX), "contents": contents})
    c.check("Endpoint.register(read-only array, access='read_only')",
            lambda: register(array=bytes(CAPACITY), layout=[REGION], access="read_only"), OK)
    c.vary("Endpoint.register_buffer", lambda **kw: E.client.unregister(E.client.register_buffer(**kw)),
           {"buffer": c.buf, "layout": [REGION]},
           {"buffer": [(c.buf, OK)] + [(v, BAD) for v in NOT_OBJECTS + [c.comm]],
            "layout": [([REGION], OK), ([(0, 64, 0, CAPACITY)], BAD), (None, BAD)], "access": ACCESS})
    arena = kvcomm.Arena(ARENA_LAYOUT, kind="host")
    c.vary("Endpoint.register_arena", lambda **kw: ep.unregister(ep.register_arena(**kw)), {"arena": arena},
           {"arena": [(arena, OK)] + [(v, BAD) for v in NOT_OBJECTS + [c.buf]], "access": ACCESS,
            "contents": [(None, OK), ([KvContents(2, 128, 16, 1)], OK), ([KvContents(2, 64, 16, 1)], BAD)]})
    arena.close()
    c.vary("Endpoint.unregister",
           lambda **kw: ep.unregister(**{"registration": ep.register(np.zeros(4096, np.uint8), [REGION]), **kw}), {},
           {"registration": [(v, BAD) for v in NOT_OBJECTS + [E.remote]], "timeout_ms": with_none(MS)})
    for v in NOT_OBJECTS:
        c.check(f"Registration({v!r})", lambda v=v: kvcomm.Registration(v), BAD)
    reg = ep.register(np.zeros(4096, np.uint8), [REGION])
    c.check("Registration.metadata()", lambda: isinstance(reg.metadata(), bytes) or 1 / 0, OK)
    c.check("Registration.revoke()", lambda: (reg.revoke(), reg.generation == 2 or 1 / 0), OK)
    ep.unregister(reg)
    c.check("Registration.metadata() (unregistered)", reg.metadata, ANY)


@entry("Endpoint.connect", "RemoteMemory")
def _endpoint_connect(c: Ctx) -> None:
    E = _endpoints(c)
    md = E.served.metadata()
    c.vary("Endpoint.connect", E.client.connect, {"metadata": md},
           {"metadata": [(md, OK), (bytearray(md), OK), (memoryview(md), OK), (md[:-1], bad(match="truncated")),
                         (md[:7], bad(match="truncated")), (b"", BAD), (md + b"x", BAD), (bytes(len(md)), BAD),
                         (md.hex(), BAD), (None, BAD), (3, BAD), ([1], BAD)]})
    for v in NOT_OBJECTS:
        c.check(f"RemoteMemory({v!r})", lambda v=v: kvcomm.RemoteMemory(v), BAD)


@entry("Endpoint.read_device", "Endpoint.write_device", "Endpoint.poll_error", "Endpoint.disconnect")
def _endpoint_device(c: Ctx) -> None:
    E = _endpoints(c)
    ids = np.array([1], np.int64)
    # Plain numpy memory cannot be mapped by another process: the device-id forms need the peer path.
    c.check("Endpoint.read_device(a plain numpy peer)", lambda: E.client.read_device(E.mine, E.remote, ids, ids),
            bad(kvcomm.UnsupportedError, match="memfd"))
    arena = kvcomm.Arena([REGION], kind="host")  # memfd: mapped by a peer on this host
    arena.view()[:EP_PEER.size] = EP_PEER
    reg = E.server.register_arena(arena)
    remote = E.client.connect(reg.metadata())
    try:
        def rd(**kw: Any) -> Any:
            args = dict(local=E.mine, remote=remote, remote_blocks=SRC_IDS, local_blocks=DST_IDS)
            args.update(kw)
            return E.client.read_device(**args)

        others = [(v, BAD) for v in NOT_OBJECTS]
        ragged = np.arange(8, dtype=np.int64)[::2]
        id_domain = [(SRC_IDS, OK), (SRC_IDS.astype(np.int32), BAD), (SRC_IDS.reshape(2, 2), BAD), (ragged, BAD),
                     (np.array([1, 2, 3], np.int64), bad(match="ids but")), (np.array([1, 2, 3, 40], np.int64), BAD),
                     (np.array([1, 2, 3, -2], np.int64), BAD), (SRC_IDS.tolist(), BAD)] + others
        c.vary("Endpoint.read_device", rd, {},
               {"local": [(E.mine, OK), (E.served, bad(match="another endpoint")), (remote, BAD)] + others,
                "remote": [(remote, OK), (E.mine, BAD)] + others, "remote_blocks": id_domain},
               oracle=lambda r: read_oracle(SRC_IDS, DST_IDS))
        before = arena.view().copy()
        c.check("Endpoint.write_device(ids 1 -> 5)",
                lambda: E.client.write_device(E.mine, remote, np.array([5], np.int64), np.array([1], np.int64)), OK)
        off, nbytes, stride, _ = REGION
        want = before.copy()
        want[off + 5 * stride:off + 5 * stride + nbytes] = PATTERN[off + stride:off + stride + nbytes]
        if not np.array_equal(arena.view(), want):
            c.failures.append("Endpoint.write_device: the server's arena differs from the oracle")
        c.check("Endpoint.write_device(id 40)",
                lambda: E.client.write_device(E.mine, remote, np.array([40], np.int64), ids), BAD)
        c.check("Endpoint.poll_error()", lambda: E.client.poll_error(E.mine, remote) is None or 1 / 0, OK)
        for v in NOT_OBJECTS:
            c.check(f"Endpoint.poll_error(remote={v!r})", lambda v=v: E.client.poll_error(E.mine, v), BAD)
            c.check(f"Endpoint.disconnect({v!r})", lambda v=v: E.client.disconnect(v), BAD)
        gone = E.client.connect(reg.metadata())
        c.check("Endpoint.disconnect(remote)", lambda: E.client.disconnect(gone), OK)
        c.check("Endpoint.disconnect(remote) again", lambda: E.client.disconnect(gone), OK)
        c.check("Endpoint.read_device(a disconnected remote)", lambda: rd(remote=gone), bad(match="disconnected"))
    finally:
        E.client.disconnect(remote)
        E.server.unregister(reg)
        arena.free()


@entry("Endpoint.read", "Endpoint.write", "Transfer", "Transfer.test", "Transfer.wait")
def _endpoint_transfers(c: Ctx) -> None:
    E = _endpoints(c)
    src_cases, dst_cases = _id_cases(SRC_IDS), _id_cases(DST_IDS)
    for k, case in enumerate(src_cases):
        if k % 3 == 0:
            c.check(f"Endpoint.read(remote_blocks={case.label})", lambda o=case.obj: E.read(remote_blocks=_value(o)),
                    OK if case.ok else BAD, (lambda r, v=case.values: read_oracle(v, DST_IDS)) if case.ok else None)
            c.check(f"Endpoint.write(local_blocks={case.label})",
                    lambda o=case.obj, v=case.values: E.write(v, DST_IDS, local_blocks=_value(o)), OK if case.ok else BAD)
    for k, case in enumerate(dst_cases):
        if k % 3 == 1:
            c.check(f"Endpoint.read(local_blocks={case.label})", lambda o=case.obj: E.read(local_blocks=_value(o)),
                    OK if case.ok else BAD, (lambda r, v=case.values: read_oracle(SRC_IDS, v)) if case.ok else None)
            c.check(f"Endpoint.write(remote_blocks={case.label})",
                    lambda o=case.obj, v=case.values: E.write(SRC_IDS, v, remote_blocks=_value(o)), OK if case.ok else BAD)
    for text, s, d, e in (("padding", [1, -1, 3, 7], [10, 11, -1, 20], OK),
                          ("id 40 (num_blocks)", [1, 2, 3, 40], DST_IDS, BAD),
                          ("id -2", [1, 2, 3, -2], DST_IDS, BAD),
                          ("id INT64_MAX", [1, 2, 3, I64_MAX], DST_IDS, BAD),
                          ("duplicate destination", [1, 2], [10, 10], BAD),
                          ("lengths differ", [1, 2, 3], DST_IDS, BAD),
                          ("empty", [], [], OK)):
        s, d = np.array(s, np.int64), np.array(d, np.int64)
        c.check(f"Endpoint.read(ids {text})", lambda s=s, d=d: E.read(remote_blocks=s, local_blocks=d), e,
                (lambda r, s=s, d=d: read_oracle(s, d)) if e.ok else None)
        c.check(f"Endpoint.write(ids {text})", lambda s=s, d=d: E.write(s, d, local_blocks=s, remote_blocks=d), e)
    big = np.zeros(L.MAX_FETCH_PAIRS + 1, np.int64)
    c.check("Endpoint.read(2**24 + 1 ids)", lambda: E.read(remote_blocks=big, local_blocks=big),
            bad(match="MAX_FETCH_PAIRS"))
    others = [(v, BAD) for v in NOT_OBJECTS]
    for name, fn in (("read", E.read), ("write", E.write)):
        c.vary(f"Endpoint.{name}", fn, {},
               {"local": [(E.mine, OK), (E.served, bad(match="another endpoint")), (E.remote, BAD)] + others,
                "remote": [(E.remote, OK), (E.mine, BAD)] + others, "via": VIA},
               oracle=(lambda r: read_oracle(SRC_IDS, DST_IDS)) if name == "read" else None)
    for v in NOT_OBJECTS:
        c.check(f"Transfer({v!r})", lambda v=v: kvcomm.Transfer(v), BAD)
    t = E.client.read(E.mine, E.remote, SRC_IDS, DST_IDS)
    c.check("Transfer.wait()", lambda: t.wait().done or 1 / 0, OK, lambda r: read_oracle(SRC_IDS, DST_IDS))
    c.view[:] = read_oracle(SRC_IDS, DST_IDS)  # the transfer is done: its bytes stay while it is polled below
    c.pattern = c.view.copy()
    try:
        c.check("Transfer.test()", lambda: t.test().done or 1 / 0, OK)
        for v, e in with_none(MS):
            c.check(f"Transfer.wait({v!r})", lambda v=v: t.wait(v), e)
    finally:
        c.pattern = PATTERN
        c.restore()


@entry("Endpoint.notify", "Endpoint.notifications", "Notification")
def _endpoint_notifications(c: Ctx) -> None:
    E = _endpoints(c)
    n_max = L.MAX_NOTIFICATION_BYTES

    def sent(*messages: bytes) -> Callable[[Any], None]:
        """The check after a call that succeeded: exactly `messages` reached the server, in order."""
        def take(_: Any) -> None:
            got = [n.message for n in E.server.notifications(30000 if messages else 0)]
            while len(got) < len(messages):
                more = [n.message for n in E.server.notifications(30000)]
                if not more:
                    break
                got += more
            if got != list(messages):
                c.failures.append(f"notifications: the server took {got[:4]!r}, expected {list(messages)[:4]!r}")
        return take

    messages = [(b"m", OK), (b"", OK), (bytearray(b"ba"), OK), (memoryview(b"mv"), OK), ("text \u00e9", OK),
                (b"x" * n_max, OK), (b"x" * (n_max + 1), bad(match="MAX_NOTIFICATION_BYTES")),
                ("\u00e9" * (n_max // 2 + 1), bad(match="MAX_NOTIFICATION_BYTES"))] + \
        [(v, BAD) for v in NOT_OBJECTS if not isinstance(v, (str, bytes))]
    for value, expect in messages:
        want = (value.encode() if isinstance(value, str) else bytes(value)) if expect.ok else None

        def call(v: Any = value) -> None:
            E.client.notify(E.remote, v)

        c.check(f"Endpoint.notify(message={str(value)[:20]!r})", call, expect,
                (lambda r, w=want: sent(w)(r)) if expect.ok else None)
    for v in NOT_OBJECTS + [E.mine, E.served]:
        c.check(f"Endpoint.notify(remote={v!r})", lambda v=v: E.client.notify(v, b"x"), BAD)
    # A read and a write carrying notify=: the message arrives, the bytes as the oracle says.
    for value, expect in messages:
        if value is None:
            continue  # notify=None: no notification, below
        def rd(v: Any = value) -> Any:
            return E.read(notify=v)

        c.check(f"Endpoint.read(notify={str(value)[:20]!r})", rd, expect,
                (lambda r, v=value: (sent(v.encode() if isinstance(v, str) else bytes(v))(r),
                                     read_oracle(SRC_IDS, DST_IDS))[1]) if expect.ok else None)
    c.check("Endpoint.read(notify=None)", lambda: E.read(notify=None), OK,
            lambda r: (sent()(r), read_oracle(SRC_IDS, DST_IDS))[1])
    c.check("Endpoint.write(notify='w')", lambda: (E.write(notify="w"), sent(b"w")(None)), OK)
    c.check("Endpoint.write(notify=3)", lambda: E.write(notify=3), BAD)
    # notifications(timeout_ms): one is waiting each time, so no bound makes it wait.
    for v, e in with_none(MS):
        def take(v: Any = v) -> Any:
            if e.ok:
                E.client.notify(E.remote, b"t")
            got = E.server.notifications(v)
            if e.ok and [n.message for n in got] != [b"t"]:
                raise kvcomm.InternalError(f"notifications({v!r}) took {got!r}")
            return got
        c.check(f"Endpoint.notifications(timeout_ms={v!r})", take, e)
    c.check("Endpoint.notifications() (none waiting)", lambda: E.server.notifications() == [] or 1 / 0, OK)
    E.client.notify(E.remote, b"fields")
    n = E.server.notifications(30000)
    c.check("Notification fields", lambda: (len(n) == 1 and n[0].sender == E.client.id and
                                            n[0].sender_name == "props client" and
                                            n[0].registration == E.served.id) or 1 / 0, OK)
    c.check("Notification(...) by hand", lambda: kvcomm.Notification(1, "a", 2, b"m"), OK)
    c.check("Notification is frozen", lambda: setattr(n[0], "message", b""), Expect(cls=AttributeError))


# -- types without calls of their own to generate: enums, exceptions, native records


@entry("MemoryKind", "FetchPath", "FetchState", "PublishMode", "PublishThen", "ErrorCode", "Axis", "OwnerLoss",
       "FetchTransport", "Access", "TransferVia")
def _enums(c: Ctx) -> None:
    """Python enums: lookup by value follows Python's Enum (ValueError for a non-member; kvcomm calls taking an enum
    refuse anything else with InvalidArgumentError, above). Their members are what the docs list."""
    want = {kvcomm.MemoryKind: ["Auto", "Cuda", "Host"], kvcomm.FetchPath: ["Auto", "Kernel", "CopyEngine", "Host", "Network"],
            kvcomm.FetchState: ["InProgress", "Done", "Failed"], kvcomm.PublishMode: ["Direct", "Fallback"],
            kvcomm.PublishThen: ["Nothing", "Barrier", "Signal"], kvcomm.Axis: ["TP", "PCP", "PP", "DP"],
            kvcomm.OwnerLoss: ["Keep", "Release"], kvcomm.FetchTransport: ["None_", "Peer", "Tcp", "Rdma"],
            kvcomm.Access: ["ReadWrite", "ReadOnly"], kvcomm.TransferVia: ["Auto", "Peer", "Tcp", "Rdma"]}
    for e, names in want.items():
        c.check(f"{e.__name__} members", lambda e=e, names=names: list(e.__members__) == names or 1 / 0, OK)
        values = [int(m.value) for m in e]
        for v in sorted({-1, len(values), I64_MAX, U64_MAX + 1} - set(values)):
            c.check(f"{e.__name__}({v})", lambda e=e, v=v: e(v), Expect(cls=ValueError))


def _exceptions(c: Ctx) -> None:
    for name in ERROR_NAMES:
        cls = getattr(kvcomm, name)
        c.check(f"{name} is a kvcomm.Error", lambda cls=cls: issubclass(cls, kvcomm.Error) or 1 / 0, OK)
        c.check(f"{name}('message')", lambda cls=cls: isinstance(cls("message"), kvcomm.Error) or 1 / 0, OK)


ERROR_NAMES = ["Error", "InvalidArgumentError", "UnsupportedError", "SystemError", "CudaError", "NetworkError",
               "RemoteError", "TimeoutError", "AbortedError", "InternalError", "BusyError"]
entry(*ERROR_NAMES)(_exceptions)


@entry("FetchPlanInfo")
def _plan_info(c: Ctx) -> None:
    for args in ((), (1,)):
        c.check(f"FetchPlanInfo{args!r}", lambda a=args: kvcomm.FetchPlanInfo(*a), BAD)


# ---- enumeration and the tests ------------------------------------------------------------------------------------


def public_callables() -> List[str]:
    """Every public callable of the kvcomm package: module-level functions and classes (their constructors), and each
    class's public methods (static and class methods included), except those inherited from Python itself."""
    out = []
    for name in dir(kvcomm):
        if name.startswith("_"):
            continue
        obj = getattr(kvcomm, name)
        if isinstance(obj, types.ModuleType):
            continue
        if inspect.isclass(obj):
            out.append(name)
            for attr in dir(obj):
                if attr.startswith("_"):
                    continue
                owner = next((k for k in obj.__mro__ if attr in vars(k)), None)
                if owner is None or owner.__module__ in ("builtins", "enum") or owner in (object, enum.Enum, int):
                    continue
                raw = vars(owner)[attr]
                if isinstance(raw, property) or not callable(getattr(obj, attr)):
                    continue
                out.append(f"{name}.{attr}")
        elif callable(obj):
            out.append(name)
    return sorted(out)


def test_table_covers_every_public_callable():
    found = public_callables()
    missing = [n for n in found if n not in TABLE]
    assert not missing, f"public callables without an entry in test_properties.TABLE: {missing}"
    stale = sorted(set(TABLE) - set(found))
    assert not stale, f"entries for callables kvcomm does not have (renamed?): {stale}"
    assert set(kvcomm.__all__) - {"__version__"} <= {n.split(".")[0] for n in found} | {"limits"}
    assert len(found) > 90, found  # the enumeration sees the whole package


def test_limits_table():
    names = [n for n in dir(L) if n.startswith("MAX_")]
    assert sorted(names) == sorted(L.__all__)
    for n in names:
        v = getattr(L, n)
        assert isinstance(v, int) and v > 0, (n, v)
    assert (L.MAX_FETCH_REGIONS, L.MAX_BARRIER_LANES, L.MAX_PUBLISH_TENSORS) == (4096, 8, 4)
    assert L.MAX_FETCH_PAIRS == 1 << 24 and L.MAX_ARENA_REGIONS == 1024 and L.MAX_HANDLE_PEERS == 32


_ENTRY_NAMES = sorted({fn.__name__: fn for fn in TABLE.values()})
_ENTRIES = {fn.__name__: fn for fn in TABLE.values()}


@pytest.mark.parametrize("name", _ENTRY_NAMES)
def test_property(ctx: Ctx, name: str):
    ctx.failures, ctx.calls = [], 0
    ctx.restore()
    _ENTRIES[name](ctx)
    ctx.report()
    assert ctx.calls > 0 or _ENTRIES[name].__doc__, name


# ---- the issue's cases, by name -----------------------------------------------------------------------------------


def test_big_endian_ids_and_slots_are_refused(ctx: Ctx):
    """[3 << 56] as '>i8' holds the bytes of 3: read in place it copied block 3 into block 9; a slot 5 << 56 as '>i8'
    wrote row 5. Both are refused, through every protocol that can carry them, with the buffer unchanged."""
    ctx.failures, ctx.calls = [], 0
    ids = np.array([3 << 56], ">i8"), np.array([9 << 56], ">i8")
    slot = np.array([5 << 56], ">i8")
    row = np.ones((1, ROW_BYTES), np.uint8)
    for protocol in ("numpy", "array_interface", "buffer"):
        s, d, sl = (_protocol(a, protocol) for a in (*ids, slot))
        ctx.check(f"fetch {protocol}", lambda s=s, d=d: ctx.fetcher.fetch([(0, s, d)]), bad(match="byte order"))
        ctx.check(f"fetch_device {protocol}", lambda s=s, d=d: ctx.fetcher.fetch_device(s, d, 0),
                  bad(match="byte order"))
        ctx.check(f"publish {protocol}", lambda sl=sl: ctx.publisher.publish(kvcomm.CacheTensor(row), sl),
                  bad(match="byte order"))
    ctx.report()


def test_list_ids_name_the_value_the_caller_wrote(ctx: Ctx):
    """[1, 2**63] was refused as 'got float64' (numpy's conversion): now the message names 2**63 as an int that does
    not fit int64, and a float names the float."""
    f = ctx.fetcher
    with pytest.raises(kvcomm.InvalidArgumentError, match="block id 9223372036854775808 does not fit int64"):
        f.fetch([(0, [1, 2**63], [10, 11])])
    with pytest.raises(kvcomm.InvalidArgumentError, match=r"must hold ints, got float 1\.5"):
        f.fetch([(0, [1, 1.5], [10, 11])])
    with pytest.raises(kvcomm.InvalidArgumentError, match="slot 9223372036854775808 does not fit int64"):
        ctx.publisher.publish(kvcomm.CacheTensor(np.ones((2, 8), np.uint8)), [1, 2**63])
    assert np.array_equal(ctx.view, ctx.pattern)


def test_dlpack_capsule_keeps_its_memory(ctx: Ctx):
    """A DLPack capsule is consumed by the import, which then owns the memory: the ids must stay readable until the
    library is done with them (the capsule's producer is gone by then)."""
    cap_s = np.array(SRC_IDS).__dlpack__()  # the only reference to each array is its capsule
    cap_d = np.array(DST_IDS).__dlpack__()
    ctx.fetcher.fetch([(0, cap_s, cap_d)])
    assert np.array_equal(ctx.view, fetch_oracle(SRC_IDS, DST_IDS))
    ctx.restore()
    with pytest.raises(kvcomm.InvalidArgumentError, match="DLPack"):  # a consumed capsule is no array any more
        ctx.fetcher.fetch([(0, cap_s, DST_IDS)])
    assert np.array_equal(ctx.view, ctx.pattern)


def test_view_dtype_errors_are_kvcomm_errors(ctx: Ctx):
    with pytest.raises(kvcomm.InvalidArgumentError, match="nbytes 12 is not a multiple of 8"):
        ctx.buf.local(dtype=np.float64, offset=0, nbytes=12)
    with pytest.raises(kvcomm.InvalidArgumentError, match="framework"):
        ctx.buf.local(framework="jax")


def test_enum_arguments_refuse_integers(ctx: Ctx):
    with pytest.raises(kvcomm.InvalidArgumentError, match="kind 1 is not one of"):
        kvcomm.SymmetricBuffer.create(ctx.comm, 4096, kind=1)
    with pytest.raises(kvcomm.InvalidArgumentError, match="path 3 is not one of"):
        ctx.fetcher.fetch([(0, SRC_IDS, DST_IDS)], path=3)
    with pytest.raises(kvcomm.InvalidArgumentError, match=r"axis 4 is not a kvcomm.Axis"):
        kvcomm.ParallelGroups.group_of(1, 1, 1, 1, 0, 4)
    with pytest.raises(kvcomm.InvalidArgumentError, match=r"axis must be a kvcomm.Axis .*got str"):
        kvcomm.ParallelGroups.group_of(1, 1, 1, 1, 0, "tp")
    assert kvcomm.ParallelGroups.group_of(2, 2, 1, 1, 3, kvcomm.Axis.PCP) == [1, 3]
    assert np.array_equal(ctx.view, ctx.pattern)

