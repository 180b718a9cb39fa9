"""The device errors of Publisher, Barrier and Fetcher: poll_error() and check_errors(), spelt once."""

from __future__ import annotations

from typing import Any, Optional


class DeviceErrors:
    """Mixin of the objects that own a device error record (their native object is ``self._native``): errors found
    by kernels (a slot or block id out of range, a barrier wait that expired or stopped) are recorded on the device
    and read back here, after the stream finished. On host memory the calls raise such errors themselves."""

    _native: Any

    def poll_error(self) -> Optional[dict]:
        """Reads (and clears) the first device error since the last call, as a dict, or None (synchronise the stream
        first)."""
        return self._native.poll_error()

    def check_errors(self) -> None:
        """Raises the recorded device error, if any: InvalidArgumentError for a slot or block id out of range (naming
        it), kvcomm.TimeoutError for a barrier wait that expired (naming rank, peer and lane), the communicator's own
        error (AbortedError, or NetworkError naming the rank that is gone) for a wait stopped by an abort or a death."""
        self._native.check_errors()
