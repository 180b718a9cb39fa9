"""Reading a CUDA stream handle from whatever the caller passes (an int, a torch/CuPy stream, the CUDA stream
protocol, or None for torch's current stream)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ._errors import check_int, invalid


def stream_handle(stream: Any, cuda: bool, device: int, rank: int, call: str) -> int:
    """The raw cudaStream_t of `stream` for an object on CUDA `device`; 0 for host objects (they ignore streams)."""
    if not cuda:
        return 0  # host memory is synchronous
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return int(torch.cuda.current_stream(device).cuda_stream)
        return 0
    if isinstance(stream, bool):
        raise invalid(call, rank, "stream must be an int handle or a stream object")
    try:
        if isinstance(stream, (int, np.integer)):
            handle = stream
        elif hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
            handle = stream.cuda_stream
        elif hasattr(stream, "__cuda_stream__"):  # the CUDA stream protocol: (version, handle)
            handle = stream.__cuda_stream__()[1]
        elif hasattr(stream, "ptr"):  # cupy.cuda.Stream
            handle = stream.ptr
        else:
            raise invalid(call, rank, f"cannot read a CUDA stream handle from {type(stream).__name__}")
    except (TypeError, ValueError, IndexError, AttributeError) as e:
        raise invalid(call, rank, f"cannot read a CUDA stream handle from {type(stream).__name__} ({e})") from None
    # A handle is an address: the native call holds it as uintptr_t.
    return check_int(handle, "stream handle", call, rank)
