"""Reading arrays from any framework as (pointer, shape, byte strides, dtype, device), without copying.

Accepted: torch tensors, anything with ``__array_interface__`` (numpy) or ``__cuda_array_interface__`` (CuPy, Numba,
torch), and anything DLPack or buffer-protocol (JAX, bytes, memoryview) through the native importer.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

from . import _kvcomm
from ._errors import invalid

# DLPack codes (dlpack.h): dtype codes and device types.
_DL_KINDS = {0: "i", 1: "u", 2: "f", 3: "V", 4: "f", 5: "c", 6: "b"}
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


@dataclass(frozen=True)
class ArrayView:
    """What kvcomm needs to know about an array; ``obj`` keeps the memory alive while the view is used."""

    ptr: int
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]  # bytes
    itemsize: int
    kind: str  # numpy kind letter: i (signed), u (unsigned), f (float), c (complex), b (bool), V (other)
    device: str  # "cpu" or "cuda"
    device_id: int  # CUDA ordinal; -1 when the producer does not say
    obj: Any

    @property
    def dtype_name(self) -> str:
        names = {"i": "int", "u": "uint", "f": "float", "c": "complex", "b": "bool", "V": "opaque"}
        return f"{names.get(self.kind, self.kind)}{self.itemsize * 8}"

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * self.itemsize if self.shape else self.itemsize

    def rows_contiguous(self) -> bool:
        """Whether each row (all dimensions but the first) is one contiguous run of bytes."""
        expected = self.itemsize
        for dim in range(len(self.shape) - 1, 0, -1):
            if self.shape[dim] != 1 and self.strides[dim] != expected:
                return False
            expected *= self.shape[dim]
        return True


def _torch_view(t: Any) -> ArrayView:
    import torch

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
    )


def _interface_view(obj: Any, iface: dict, device: str) -> Optional[ArrayView]:
    typestr = iface["typestr"]
    kind = typestr[1]
    if kind == "O":  # Python object pointers: not data kvcomm can move
        return None
    digits = re.match(r"\d+", typestr[2:])  # "<M8[ns]" (datetime) carries a unit after its size
    if digits is None:
        return None
    itemsize = int(digits.group())
    shape = tuple(int(s) for s in iface["shape"])
    strides = iface.get("strides")
    if strides is None:  # C-contiguous
        acc, out = itemsize, []
        for s in reversed(shape):
            out.append(acc)
            acc *= s
        strides = tuple(reversed(out))
    ptr = int(iface["data"][0]) + int(iface.get("offset", 0) or 0)
    return ArrayView(ptr, shape, tuple(int(s) for s in strides), itemsize, kind if kind in "iufcb" else "V", device,
                     -1 if device == "cuda" else 0, obj)


def inspect(obj: Any) -> Optional[ArrayView]:
    """The ArrayView of `obj`, or None when it is not an array kvcomm can read."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _torch_view(obj)
    iface = getattr(obj, "__array_interface__", None)
    if isinstance(iface, dict):
        return _interface_view(obj, iface, "cpu")
    iface = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(iface, dict):
        return _interface_view(obj, iface, "cuda")
    try:
        info = _kvcomm.array_info(obj)
    except Exception:  # a producer that refuses export (e.g. a DLPack error) is simply not readable
        info = None
    if info is None:
        return None
    ptr, shape, strides, itemsize, code, bits, lanes, dev_type, dev_id = info
    kind = _DL_KINDS.get(code, "V") if lanes == 1 else "V"
    if dev_type in (_DL_CPU, _DL_CUDA_HOST):
        device, dev_id = "cpu", 0
    elif dev_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        device = "cuda"
    else:
        device = f"dlpack-device-{dev_type}"
    return ArrayView(ptr, tuple(shape), tuple(strides), itemsize * lanes, kind, device, dev_id, obj)


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def is_int_list(obj: Any) -> bool:
    """Whether `obj` is a Python sequence of ids that int64_list() converts (a list, tuple or range)."""
    return isinstance(obj, (list, tuple, range))


def int64_list(values: Any, name: str, noun: str, call: str, rank: int) -> np.ndarray:
    """A Python list (tuple, range) of ints as a new int64 numpy array. Anything that is not an int (floats, strings,
    None, bools alone) and any value outside int64 raises InvalidArgumentError naming `name` and the value: a cast
    would wrap a value at or above 2**63 into another id (or -1, padding)."""
    try:
        a = np.asarray(values)
    except (TypeError, ValueError) as e:  # ragged nesting and the like
        raise invalid(call, rank, f"{name}: a list of {noun}s must be a flat list of ints ({e})") from None
    if a.size == 0:
        return np.zeros(a.shape, np.int64)
    if a.dtype == object or a.dtype.kind not in "iu":
        # Not one integer dtype: name the first value that is not an int (a bool is not one) as the caller wrote it;
        # else the ints are beyond what one 64-bit dtype holds (or mix uint64 with negatives): check each.
        items = list(values) if a.ndim == 1 else list(a.flat)
        for v in items:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise invalid(call, rank, f"{name}: a list of {noun}s must hold ints, got {type(v).__name__} {v!r}")
        for v in items:
            if not _I64_MIN <= int(v) <= _I64_MAX:
                raise invalid(call, rank, f"{name}: {noun} {int(v)} does not fit int64")
        return np.array([int(v) for v in items], np.int64).reshape(a.shape)
    hi, lo = int(a.max()), int(a.min())
    if hi > _I64_MAX or lo < _I64_MIN:  # numpy holds values at or above 2**63 as uint64
        raise invalid(call, rank, f"{name}: {noun} {hi if hi > _I64_MAX else lo} does not fit int64")
    return a.astype(np.int64)
