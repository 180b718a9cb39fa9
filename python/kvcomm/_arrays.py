"""The one place where the Python front end accepts arrays: every array kvcomm reads in place (publish's rows and slot
mapping, fetch's ids and source ranks) goes through require(), whatever protocol delivered it.

describe() reads an array as (pointer, shape, byte strides, dtype, byte order, device) without copying, from:
  - torch tensors (strided, not conjugate or negative views, not quantized: always native byte order);
  - numpy arrays and anything with ``__array_interface__`` (read through numpy, which parses typestr and descr:
    '<i8', '>i8', '|u1', structured dtypes);
  - anything with ``__cuda_array_interface__`` (CuPy, Numba; its typestr and descr carry the byte order);
  - DLPack producers and capsules (torch, JAX, CuPy, ``arr.__dlpack__()``), through the native importer: DLPack has no
    byte order field, every DLPack tensor is native;
  - the buffer protocol (bytes, bytearray, memoryview, array.array), read through numpy, whose format parser keeps the
    byte order ('>q').
require() then checks, in one order for every caller: an array at all, the device (and CUDA ordinal), the dtype, the
byte order (native only: kvcomm reads the bytes as they are and never converts), the dimensionality, the layout
(contiguous, or contiguous rows), the alignment, a data pointer for a non-empty array, and the length limit. Each
refusal is an InvalidArgumentError naming the argument, what it must be, and what it is.
"""

from __future__ import annotations

import math
import operator
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Tuple, Union

import numpy as np

from . import _kvcomm
from ._errors import invalid

# DLPack codes (dlpack.h): dtype codes and device types.
_DL_KINDS = {0: "i", 1: "u", 2: "f", 3: "V", 4: "f", 5: "c", 6: "b"}
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13

NATIVE = "<" if sys.byteorder == "little" else ">"
_ENDIAN = {"<": "little-endian", ">": "big-endian"}


@dataclass(frozen=True)
class ArrayView:
    """What kvcomm needs to know about an array; ``obj`` keeps the memory alive while the view is used."""

    ptr: int
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]  # bytes
    itemsize: int
    kind: str  # numpy kind letter: i (signed), u (unsigned), f (float), c (complex), b (bool), V (other)
    device: str  # "cpu" or "cuda" (or another device's name)
    device_id: int  # CUDA ordinal; -1 when the producer does not say
    obj: Any
    native: bool = True  # native byte order (or none: one-byte and opaque elements)
    typestr: str = ""  # the dtype as the producer spelled it ('>i8', 'torch.int64', ...), for messages
    protocol: str = ""  # which protocol delivered it, for messages

    @property
    def dtype_name(self) -> str:
        names = {"i": "int", "u": "uint", "f": "float", "c": "complex", "b": "bool", "V": "opaque"}
        name = f"{names.get(self.kind, self.kind)}{self.itemsize * 8}"
        if not self.native:
            order = _ENDIAN.get(self.typestr[:1], "non-native")
            return f"{order} {name} ('{self.typestr}')"
        return name

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * self.itemsize if self.shape else self.itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def _dense_from(self, first: int) -> bool:
        """Whether dimensions first.. are laid out as in a dense row-major array (those of extent 1 need no stride;
        an array without elements is dense)."""
        if self.size == 0:
            return True
        expected = self.itemsize
        for dim in range(len(self.shape) - 1, first - 1, -1):
            if self.shape[dim] != 1 and self.strides[dim] != expected:
                return False
            expected *= self.shape[dim]
        return True

    def rows_contiguous(self) -> bool:
        """Whether each row (all dimensions but the first) is one contiguous run of bytes."""
        return self._dense_from(1)

    def contiguous(self) -> bool:
        """C-contiguous: every dimension of extent > 1 at the stride a dense row-major array has."""
        return self._dense_from(0)


# ---- reading each protocol --------------------------------------------------------------------------------------


def _torch_view(t: Any) -> Tuple[Optional[ArrayView], str]:
    import torch

    if t.layout != torch.strided:
        return None, f"a torch tensor with layout {t.layout} is not an array kvcomm reads (a strided tensor is)"
    if t.is_quantized:
        return None, "a quantized torch tensor is not an array kvcomm reads"
    if t.is_conj() or t.is_neg():  # the memory holds other values than the tensor shows
        return None, "a conjugate or negative torch view is not an array kvcomm reads (resolve_conj()/resolve_neg())"
    dt = t.dtype
    if dt == torch.bool:
        kind = "b"
    elif dt.is_complex:
        kind = "c"
    elif dt.is_floating_point:
        kind = "f"
    elif dt.is_signed:
        kind = "i"
    else:
        kind = "u"
    es = t.element_size()
    dev = t.device
    return ArrayView(
        ptr=t.data_ptr(),
        shape=tuple(t.shape),
        strides=tuple(s * es for s in t.stride()),
        itemsize=es,
        kind=kind,
        device="cuda" if dev.type == "cuda" else ("cpu" if dev.type == "cpu" else dev.type),
        device_id=dev.index if dev.index is not None else (0 if dev.type == "cpu" else -1),
        obj=t,
        typestr=str(dt),
        protocol="torch",
    ), ""


def _numpy_view(a: np.ndarray, obj: Any, protocol: str) -> Tuple[Optional[ArrayView], str]:
    dt = a.dtype
    if dt.hasobject:
        return None, f"{protocol}: an array of Python objects (dtype {dt}) is not an array kvcomm reads"
    kind = dt.kind if dt.kind in "iufcb" else "V"
    ptr = int(a.__array_interface__["data"][0])
    return ArrayView(ptr, tuple(int(s) for s in a.shape), tuple(int(s) for s in a.strides), int(dt.itemsize), kind,
                     "cpu", 0, (obj, a), bool(dt.isnative), dt.str, protocol), ""


def _cuda_interface_view(obj: Any, iface: dict) -> Tuple[Optional[ArrayView], str]:
    protocol = "__cuda_array_interface__"
    try:
        typestr = iface["typestr"]
        if not isinstance(typestr, str):
            return None, f"{protocol}: typestr {typestr!r} is not a typestr ('<i8', '|u1', ...)"
        dt = np.dtype(typestr)  # numpy's parser: kind, size and byte order ('<i8', '>i8', '|u1', '<M8[ns]')
        descr = iface.get("descr")
        if descr is not None and not (len(descr) == 1 and not descr[0][0]):  # fields: their byte orders count too
            fields = np.dtype([tuple(f) for f in descr])
            if fields.itemsize != dt.itemsize:
                return None, f"{protocol}: descr describes {fields.itemsize}-byte elements, typestr {dt.itemsize}"
            dt = fields
        if dt.hasobject:
            return None, f"{protocol}: typestr '{typestr}' holds Python objects: not an array kvcomm reads"
        itemsize = int(dt.itemsize)
        shape = tuple(operator.index(s) for s in iface["shape"])
        if any(s < 0 for s in shape) or itemsize <= 0:
            return None, f"{protocol}: shape {shape} with typestr '{typestr}' describes no array"
        strides = iface.get("strides")
        if strides is None:  # C-contiguous
            acc, out = itemsize, []
            for s in reversed(shape):
                out.append(acc)
                acc *= s
            strides = tuple(reversed(out))
        strides = tuple(operator.index(s) for s in strides)
        if len(strides) != len(shape):
            return None, f"{protocol}: {len(strides)} strides for {len(shape)} dimensions"
        if iface.get("mask") is not None:
            return None, f"{protocol}: a masked array is not an array kvcomm reads"
        data = iface["data"]
        ptr = operator.index(data[0]) if isinstance(data, (tuple, list)) and data else None
        if ptr is None or ptr < 0:
            return None, f"{protocol}: data {data!r} is not (pointer, read_only)"
    except (KeyError, TypeError, ValueError, IndexError) as e:
        return None, f"{protocol} cannot be read ({type(e).__name__}: {e})"
    kind = dt.kind if dt.kind in "iufcb" else "V"
    return ArrayView(ptr, shape, strides, itemsize, kind, "cuda", -1, obj, bool(dt.isnative), typestr, protocol), ""


def _dlpack_view(obj: Any) -> Tuple[Optional[ArrayView], str]:
    try:
        info = _kvcomm.array_info(obj)
    except Exception as e:  # a producer that refuses export (e.g. numpy's DLPack export of a read-only array)
        return None, f"its DLPack export failed ({type(e).__name__}: {e})"
    if info is None:
        return None, ("DLPack: not importable (a capsule already consumed, a dtype DLPack cannot express, or more "
                      "than one lane per element)")
    owner, ptr, shape, strides, itemsize, code, bits, lanes, dev_type, dev_id = info
    kind = _DL_KINDS.get(code, "V") if lanes == 1 else "V"
    if dev_type in (_DL_CPU, _DL_CUDA_HOST):
        device, dev_id = "cpu", 0
    elif dev_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        device = "cuda"
    else:
        device = f"dlpack-device-{dev_type}"
    # `owner` (the imported tensor) keeps the memory alive: a consumed capsule is its only owner.
    return ArrayView(ptr, tuple(shape), tuple(strides), itemsize * lanes, kind, device, dev_id, (obj, owner), True,
                     f"DLPack code {code}, {bits} bits x {lanes}", "DLPack"), ""


def _is_capsule(obj: Any) -> bool:
    return type(obj).__name__ == "PyCapsule"


def describe(obj: Any) -> Tuple[Optional[ArrayView], str]:
    """The ArrayView of `obj` and "", or None and why it is not an array kvcomm can read."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _torch_view(obj)
    if isinstance(obj, np.ndarray):
        return _numpy_view(obj, obj, "numpy")
    try:
        iface = getattr(obj, "__array_interface__", None)
    except Exception as e:  # noqa: BLE001 - a property that raises: not readable
        return None, f"its __array_interface__ raised {type(e).__name__}: {e}"
    if iface is not None:
        if not isinstance(iface, dict):
            return None, f"its __array_interface__ is a {type(iface).__name__}, not a dict"
        try:
            a = np.asarray(obj)  # numpy reads the interface (typestr, descr, data, strides, offset) without copying
        except Exception as e:  # noqa: BLE001 - numpy's reason, as a refusal
            return None, f"its __array_interface__ cannot be read ({type(e).__name__}: {e})"
        return _numpy_view(a, obj, "__array_interface__")
    try:
        iface = getattr(obj, "__cuda_array_interface__", None)
    except Exception as e:  # noqa: BLE001
        return None, f"its __cuda_array_interface__ raised {type(e).__name__}: {e}"
    if iface is not None:
        if not isinstance(iface, dict):
            return None, f"its __cuda_array_interface__ is a {type(iface).__name__}, not a dict"
        return _cuda_interface_view(obj, iface)
    if _is_capsule(obj) or hasattr(obj, "__dlpack__"):
        return _dlpack_view(obj)
    if isinstance(obj, (str, int, float, complex, bool)) or obj is None:
        return None, ""
    try:
        mv = memoryview(obj)
    except TypeError:
        return None, ""
    try:
        a = np.asarray(mv)  # the buffer's format, byte order included ('>q'), as numpy parses it; no copy
    except Exception as e:  # noqa: BLE001
        return None, f"its buffer (format '{mv.format}') cannot be read ({type(e).__name__}: {e})"
    return _numpy_view(a, (obj, mv), "buffer protocol")


def inspect(obj: Any) -> Optional[ArrayView]:
    """The ArrayView of `obj`, or None when it is not an array kvcomm can read (describe() says why)."""
    return describe(obj)[0]


# ---- the one check ------------------------------------------------------------------------------------------------

INT64 = frozenset({("i", 8)})
INT32 = frozenset({("i", 4)})
SLOT_TYPES = frozenset({("i", 8), ("i", 4)})


def require(obj: Any, name: str, call: str, rank: int, *, device: Union[str, Tuple[str, ...]], device_id: int = -1,
            device_why: str = "", dtypes: Optional[Iterable[Tuple[str, int]]] = None, dtype_text: str = "",
            ndim: Optional[int] = None, min_ndim: int = 0, layout: str = "contiguous", aligned: bool = False,
            max_len: Optional[int] = None, max_len_name: str = "", expected: str = "") -> ArrayView:
    """`obj` as an ArrayView that kvcomm may read in place, or InvalidArgumentError naming `name` (and `call`, `rank`).

    device: 'cpu' or 'cuda', or a tuple of those accepted (device_id >= 0: that CUDA ordinal too; device_why: the
    message's reason);
    dtypes: the accepted (kind, itemsize) pairs (None: any dtype whose bytes can be copied: not Python objects),
    always in native byte order; ndim: the exact dimensionality (min_ndim: at least); layout: 'contiguous' (dense
    row-major), 'rows' (each row src[i] one run of bytes) or 'any'; aligned: the pointer is a multiple of the element
    size; max_len: the most elements along the first dimension (max_len_name: the limit's name)."""
    v, why = describe(obj)
    if v is None:
        what = f"{type(obj).__name__} is not an array kvcomm reads"
        raise invalid(call, rank, f"{name}: {what}" + (f": {why}" if why else f" (expected {expected})" if expected
                                                     else ""))
    devices = (device,) if isinstance(device, str) else tuple(device)
    if v.device not in devices:
        wanted = " or ".join(map(repr, devices))
        raise invalid(call, rank, f"{name}: the array is on device '{v.device}', but "
                      f"{device_why or f'kvcomm needs {wanted} arrays here'}")
    if v.device == "cuda" and device_id >= 0 and v.device_id >= 0 and v.device_id != device_id:
        raise invalid(call, rank, f"{name}: the array is on cuda:{v.device_id}, the buffer on cuda:{device_id}")
    if dtypes is not None and (v.kind, v.itemsize) not in dtypes:
        raise invalid(call, rank, f"{name} must be {dtype_text}, got {v.dtype_name} (arrays are read in place and "
                      "never converted)")
    if not v.native:
        raise invalid(call, rank, f"{name} must be in native byte order ({_ENDIAN[NATIVE]}), got {v.dtype_name}: "
                      "kvcomm reads the bytes in place and never converts them (pass .astype(dtype.newbyteorder('=')))")
    if ndim is not None and len(v.shape) != ndim:
        raise invalid(call, rank, f"{name} must be {ndim}-D, got shape {v.shape}")
    if len(v.shape) < min_ndim:
        raise invalid(call, rank, f"{name} is {len(v.shape)}-D (shape {v.shape}): it needs at least {min_ndim} "
                      "dimension(s)")
    if layout == "contiguous" and not v.contiguous():
        if len(v.shape) == 1:
            raise invalid(call, rank, f"{name} must be contiguous (stride {v.strides[0]} bytes, element "
                          f"{v.itemsize})")
        raise invalid(call, rank, f"{name} must be contiguous (shape {v.shape}, byte strides {v.strides})")
    if layout == "rows" and not v.rows_contiguous():
        raise invalid(call, rank, f"{name}: rows are not contiguous (shape {v.shape}, byte strides {v.strides}); "
                      "pass .contiguous() rows")
    n = v.size
    if n > 0 and v.ptr == 0:
        raise invalid(call, rank, f"{name}: {n} elements at a null data pointer")
    if aligned and n > 0 and v.ptr % v.itemsize != 0:
        raise invalid(call, rank, f"{name}: the data at {v.ptr:#x} is not aligned to its {v.itemsize}-byte elements")
    if max_len is not None and v.rows > max_len:
        raise invalid(call, rank, f"{name} has {v.rows} elements, more than {max_len_name} = {max_len}")
    return v


# ---- Python lists of ids --------------------------------------------------------------------------------------


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def is_int_list(obj: Any) -> bool:
    """Whether `obj` is a Python sequence of ids that int64_list() converts (a list, tuple or range)."""
    return isinstance(obj, (list, tuple, range))


def int64_list(values: Any, name: str, noun: str, call: str, rank: int, max_len: Optional[int] = None,
               max_len_name: str = "") -> np.ndarray:
    """A Python list (tuple, range) of ints as a new int64 numpy array. Anything that is not an int (floats, strings,
    None, bools alone) and any value outside int64 raises InvalidArgumentError naming `name` and the value as the
    caller wrote it: a cast would wrap a value at or above 2**63 into another id (or -1, padding). A list longer than
    max_len is refused before anything is converted."""
    if max_len is not None and len(values) > max_len:
        raise invalid(call, rank, f"{name} has {len(values)} {noun}s, more than {max_len_name} = {max_len}")
    # Each value as the caller wrote it, before numpy picks a common dtype (which would show 2**63 beside 1 as a
    # float64): the first that is not an int (a bool is not one), then the first outside int64.
    stack = [iter(values)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, (list, tuple, range)):  # nested: refused below as not 1-D, after the values are checked
                stack.append(iter(v))
                break
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise invalid(call, rank, f"{name}: a list of {noun}s must hold ints, got {type(v).__name__} {v!r}")
            if not _I64_MIN <= int(v) <= _I64_MAX:
                raise invalid(call, rank, f"{name}: {noun} {int(v)} does not fit int64")
        else:
            stack.pop()
    try:
        a = np.array(values, dtype=np.int64)
    except (TypeError, ValueError) as e:  # ragged nesting and the like
        raise invalid(call, rank, f"{name}: a list of {noun}s must be a flat list of ints ({e})") from None
    return a
