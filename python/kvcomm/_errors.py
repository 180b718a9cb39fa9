"""kvcomm's exceptions: one class per kvcomm::ErrorCode, all deriving from kvcomm.Error.

The native library's messages are kept as they are ("kvcomm [rank R] <call>: <cause>"). Each class also derives from
the closest built-in exception, so ``except ValueError`` catches bad input and ``except TimeoutError`` a timeout.
"""

from __future__ import annotations

import builtins
from typing import Dict, Type

import numpy as np

from . import _kvcomm

ErrorCode = _kvcomm.ErrorCode


class Error(RuntimeError):
    """Base of every exception kvcomm raises; ``code`` says which kind."""

    code: "_kvcomm.ErrorCode" = ErrorCode.InternalError


class InvalidArgumentError(Error, ValueError):
    """The caller passed something wrong (sizes, dtypes, devices, ranges); nothing was changed or written."""

    code = ErrorCode.InvalidArgument


class UnsupportedError(Error):
    """The requested mode cannot run here (no GPU, no P2P, handle type not available)."""

    code = ErrorCode.Unsupported


class SystemError(Error, OSError):  # noqa: A001 - mirrors kvcomm::ErrorCode::SystemError
    """An operating-system call failed."""

    code = ErrorCode.SystemError


class CudaError(Error):
    """A CUDA driver or runtime call failed."""

    code = ErrorCode.CudaError


class NetworkError(Error, ConnectionError):
    """A socket or transport failed, or a peer went away."""

    code = ErrorCode.NetworkError


class RemoteError(Error):
    """Another rank reported a failure during a collective step (or a bootstrap callback failed)."""

    code = ErrorCode.RemoteError


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 - mirrors kvcomm::ErrorCode::Timeout
    """A bounded wait expired (a peer never arrived, the root was unreachable)."""

    code = ErrorCode.Timeout


class AbortedError(Error):
    """The operation was stopped because the object is closing."""

    code = ErrorCode.Aborted


class InternalError(Error):
    """A kvcomm invariant broke: a bug; please report it."""

    code = ErrorCode.InternalError


class BusyError(Error):
    """The object is in use (an arena with leases or operations in flight); nothing was changed."""

    code = ErrorCode.Busy


ERROR_CLASSES: Dict["_kvcomm.ErrorCode", Type[Error]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        UnsupportedError,
        SystemError,
        CudaError,
        NetworkError,
        RemoteError,
        TimeoutError,
        AbortedError,
        InternalError,
        BusyError,
    )
}

for _code, _cls in ERROR_CLASSES.items():
    _kvcomm._register_error_class(_code, _cls)


def invalid(call: str, rank: int, cause: str) -> InvalidArgumentError:
    """An InvalidArgumentError worded like the library's own ("kvcomm [rank R] call: cause")."""
    return InvalidArgumentError(f"kvcomm [rank {rank}] {call}: {cause}")


U64 = 1 << 64
I32 = 1 << 31


def shown(value: object, width: int = 60) -> str:
    """repr(value), cut to a readable length (for messages naming what the caller passed)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that raises still gets a message
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[:width - 3] + "..."


def check_count(value: object, what: str, call: str, rank: int, limit: int, limit_name: str, low: int = 1) -> int:
    """`value` as an int in [low, limit] (a count with a documented limit, kvcomm.limits.<limit_name>), else
    InvalidArgumentError naming it, the value and the limit."""
    v = check_int(value, what, call, rank, 1 << 63, -(1 << 63))
    if not low <= v <= limit:
        raise invalid(call, rank, f"{what} {v} is outside [{low}, {limit}] (kvcomm.limits.{limit_name} = {limit})")
    return v


def count_of(items: object, what: str, call: str, rank: int, limit: int, limit_name: str) -> None:
    """Refuses a sized collection of more than `limit` items (kvcomm.limits.<limit_name>) before anything iterates it;
    collections without a length are counted as they are read."""
    try:
        n = len(items)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - no length: counted while read
        return
    if n > limit:
        raise invalid(call, rank, f"{n} {what}, more than kvcomm.limits.{limit_name} = {limit}")


def check_int(value: object, what: str, call: str, rank: int, limit: int = U64, low: int = 0) -> int:
    """`value` as an int in [low, limit): a Python or numpy int (not a bool), else InvalidArgumentError naming it.
    Checked here, so that a value the native signature cannot hold is the library's error, not nanobind's TypeError."""
    kind = "a non-negative int" if low == 0 else "an int"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise invalid(call, rank, f"{what} must be {kind}, got {type(value).__name__} {shown(value)}")
    v = int(value)
    if v < low or v >= limit:
        raise invalid(call, rank, f"{what} {v} is outside [{low}, {limit}): it must be {kind} below {limit}")
    return v
