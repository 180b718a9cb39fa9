"""Reading a CUDA stream handle from whatever the caller passes (an int, a torch/CuPy stream, the CUDA stream
protocol, or None for torch's current stream)."""

from __future__ import annotations

import sys
from typing import Any

from ._errors import invalid


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
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream)
    if hasattr(stream, "__cuda_stream__"):  # the CUDA stream protocol: (version, handle)
        return int(stream.__cuda_stream__()[1])
    if hasattr(stream, "ptr"):  # cupy.cuda.Stream
        return int(stream.ptr)
    raise invalid(call, rank, f"cannot read a CUDA stream handle from {type(stream).__name__}")
