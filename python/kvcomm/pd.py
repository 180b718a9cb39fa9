"""Prefill/decode KV hand-off over endpoints, independent of any engine (``import kvcomm.pd``).

A prefill instance computes a request's KV blocks and must keep them until the decode instance has pulled them; a
decode instance pulls them into its own slots and says so. This module is that protocol, over an Endpoint and its
notifications, with nothing engine-specific:

- ``Producer(endpoint, registrations, hold_timeout_ms=...)`` on the prefill side: ``hold(request_id, blocks)`` pins a
  finished request's blocks and returns its transfer parameters (a JSON-serialisable dict: hand it to the decode
  side with the request, as vLLM's kv_transfer_params); ``poll()`` returns the requests whose blocks may be reused:
  the decode side pulled them ("done"), failed to ("failed"), gave up ("aborted"), or never came within the hold
  timeout ("timeout": a decode instance that died mid-pull is released this way). Until a request is released its
  blocks must not be reused: a pull may be reading them.
- ``Consumer(endpoint, registrations)`` on the decode side: ``pull(request_id, params, blocks)`` starts reading the
  producer's blocks into local ``blocks`` (every registration: one per layer, or one for the whole cache; -1 skips
  a block, for prefix hits); ``poll()`` returns the pulls that ended, with the local blocks that did not land, and
  tells each producer to release its blocks; ``abort(request_id)`` cancels a pull (nothing it started touches either
  cache when it returns) and tells the producer.

Request ids are the engines' own; the parameters carry a random key of the producer's, so two engines' ids never
collide and a late or forged message for another hold is ignored. Both sides own their endpoint's notifications
(others are kept in ``unhandled``).
"""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._endpoint import Endpoint, Registration, RemoteMemory, Transfer
from ._errors import Error, check_int, invalid, shown

_PREFIX = b"kvcomm.pd "
_VERSION = 1
_REASONS = {b"done": "done", b"failed": "failed", b"aborted": "aborted"}


def _registrations(endpoint: Any, registrations: Any, call: str) -> List[Registration]:
    if not isinstance(endpoint, Endpoint):
        raise invalid(call, -1, f"endpoint must be a kvcomm.Endpoint, got {type(endpoint).__name__}")
    regs = [registrations] if isinstance(registrations, Registration) else list(registrations)
    if not regs or not all(isinstance(r, Registration) for r in regs):
        raise invalid(call, -1, "registrations must be one kvcomm.Registration or a non-empty list of them")
    for r in regs:
        if not r.registered:
            raise invalid(call, -1, f"registration {r.id:#x} is not registered")
    return regs


def _blocks(blocks: Any, limit: int, what: str, call: str, skips: bool) -> List[int]:
    try:
        out = [int(b) for b in np.asarray(blocks, dtype=np.int64).ravel().tolist()]
    except (TypeError, ValueError, OverflowError):
        raise invalid(call, -1, f"{what} must be block ids (ints), got {shown(blocks)}") from None
    for b in out:
        if not (0 <= b < limit or (skips and b == -1)):
            raise invalid(call, -1, f"{what}: block {b} is outside [0, {limit})" + (" (-1 skips)" if skips else ""))
    return out


def _num_blocks(regs: Sequence[Registration]) -> int:
    return min(min(r.num_blocks for r in reg.layout) for reg in regs)


@dataclass(frozen=True)
class Released:
    """A held request whose blocks the producer may reuse: reason "done", "failed", "aborted" (by the decode side)
    or "timeout" (no word within the hold timeout)."""

    request_id: str
    blocks: List[int]
    reason: str


@dataclass(frozen=True)
class Pulled:
    """A pull that ended: ok when every block landed; failed_blocks are the local blocks that did not (each may be
    partly written); error says why."""

    request_id: str
    ok: bool
    failed_blocks: List[int] = field(default_factory=list)
    error: str = ""


class Producer:
    """The prefill side: holds finished requests' blocks until the decode side pulled them (or the hold timed out)."""

    def __init__(self, endpoint: Endpoint, registrations: Any, *, hold_timeout_ms: int = 120000) -> None:
        call = "pd.Producer"
        self._ep = endpoint
        self._regs = _registrations(endpoint, registrations, call)
        self._timeout = check_int(hold_timeout_ms, "hold_timeout_ms", call, -1, 1 << 40, 1) / 1000.0
        self._limit = _num_blocks(self._regs)
        self._held: Dict[str, Tuple[str, List[int], float]] = {}  # key -> (request id, blocks, deadline)
        self._by_request: Dict[str, str] = {}
        self.unhandled: List[Any] = []  # notifications of this endpoint that are not the protocol's
        self.ignored = 0  # protocol messages naming no held request (late, repeated or forged)

    @property
    def held(self) -> List[str]:
        """Request ids whose blocks are held."""
        return list(self._by_request)

    def hold(self, request_id: str, blocks: Any, *, key: Optional[str] = None) -> Dict[str, Any]:
        """Holds `blocks` (ids in every registration) of a finished request until the decode side pulled them, and
        returns the transfer parameters to hand to it (JSON-serialisable). `key`: the hold's key when the parameters
        were made elsewhere first (an engine's scheduler process; 16 to 64 hex digits, fresh), else a random one."""
        call = "pd.Producer.hold"
        if not isinstance(request_id, str):
            raise invalid(call, -1, f"request_id must be a str, got {shown(request_id)}")
        if request_id in self._by_request:
            raise invalid(call, -1, f"request {request_id!r} is already held")
        ids = _blocks(blocks, self._limit, "blocks", call, skips=False)
        if key is None:
            key = os.urandom(8).hex()
        elif not (isinstance(key, str) and 16 <= len(key) <= 64 and all(c in "0123456789abcdef" for c in key)):
            raise invalid(call, -1, f"key must be 16 to 64 lowercase hex digits, got {shown(key)}")
        elif key in self._held:
            raise invalid(call, -1, f"key {key} is already held")
        self._held[key] = (request_id, ids, time.monotonic() + self._timeout)
        self._by_request[request_id] = key
        # The registrations' metadata as they are now (a revoke since the last hold gave them new ones).
        metadata = [base64.b64encode(r.metadata()).decode() for r in self._regs]
        return {"kvcomm_pd": _VERSION, "key": key, "producer": self._ep.id, "metadata": metadata, "blocks": ids}

    def _release(self, key: str, reason: str) -> Released:
        request_id, ids, _ = self._held.pop(key)
        del self._by_request[request_id]
        return Released(request_id, ids, reason)

    def poll(self, timeout_ms: int = 0) -> List[Released]:
        """The requests released since the last call (waiting up to `timeout_ms` for a message when none is due)."""
        out: List[Released] = []
        now = time.monotonic()
        for key in [k for k, (_, _, deadline) in self._held.items() if deadline <= now]:
            out.append(self._release(key, "timeout"))
        wait = 0 if out else check_int(timeout_ms, "timeout_ms", "pd.Producer.poll", -1, 1 << 62, -(1 << 62))
        if self._held:  # never past the next hold's deadline
            due = max(0, int((min(d for _, _, d in self._held.values()) - now) * 1000) + 1)
            wait = due if wait < 0 else min(wait, due)
        for n in self._ep.notifications(wait):
            verb, _, key = n.message[len(_PREFIX):].partition(b" ") if n.message.startswith(_PREFIX) else (b"", b"", b"")
            reason = _REASONS.get(verb)
            if reason is None:
                self.unhandled.append(n)
                continue
            k = key.decode(errors="replace")
            if k in self._held:
                out.append(self._release(k, reason))
            else:
                self.ignored += 1
        return out


class Consumer:
    """The decode side: pulls held requests' blocks into its own slots and tells the producers when it is done."""

    def __init__(self, endpoint: Endpoint, registrations: Any) -> None:
        self._ep = endpoint
        self._regs = _registrations(endpoint, registrations, "pd.Consumer")
        self._limit = _num_blocks(self._regs)
        self._remotes: Dict[str, RemoteMemory] = {}
        self._pulls: Dict[str, Tuple[str, List[Transfer], List[int], RemoteMemory]] = {}  # request -> key, ...
        self.unhandled: List[Any] = []

    @property
    def pulling(self) -> List[str]:
        return list(self._pulls)

    def _remote(self, metadata: str) -> RemoteMemory:
        if metadata not in self._remotes:
            self._remotes[metadata] = self._ep.connect(base64.b64decode(metadata))
        return self._remotes[metadata]

    def pull(self, request_id: str, params: Dict[str, Any], blocks: Any) -> None:
        """Starts reading the producer's blocks (`params` from Producer.hold) into local `blocks`, in every
        registration (-1 skips a block). InvalidArgumentError for parameters that are not the producer's or do not
        match this side (registration count, block count)."""
        call = "pd.Consumer.pull"
        if not isinstance(request_id, str):
            raise invalid(call, -1, f"request_id must be a str, got {shown(request_id)}")
        if request_id in self._pulls:
            raise invalid(call, -1, f"request {request_id!r} is already being pulled")
        if not isinstance(params, dict) or params.get("kvcomm_pd") != _VERSION:
            raise invalid(call, -1, f"params are not kvcomm.pd transfer parameters (version {_VERSION})")
        try:
            key, metadata, remote_blocks = str(params["key"]), list(params["metadata"]), list(params["blocks"])
        except (KeyError, TypeError):
            raise invalid(call, -1, "params lack key, metadata or blocks") from None
        if len(metadata) != len(self._regs):
            raise invalid(call, -1, f"the producer has {len(metadata)} registrations, this side {len(self._regs)}")
        local = _blocks(blocks, self._limit, "blocks", call, skips=True)
        if len(local) != len(remote_blocks):
            raise invalid(call, -1, f"the producer holds {len(remote_blocks)} blocks, blocks names {len(local)}")
        remotes = [self._remote(m) for m in metadata]
        src, dst = np.asarray(remote_blocks, np.int64), np.asarray(local, np.int64)
        transfers: List[Transfer] = []
        try:
            for reg, rem in zip(self._regs, remotes):
                transfers.append(self._ep.read(reg, rem, src, dst))
        except Error:
            del transfers  # cancelled: nothing they started touches either cache once they are gone
            raise
        self._pulls[request_id] = (key, transfers, local, remotes[0])

    def _tell(self, remote: RemoteMemory, verb: bytes, key: str) -> str:
        try:
            self._ep.notify(remote, _PREFIX + verb + b" " + key.encode())
            return ""
        except Error as e:  # the producer is gone or refuses: its hold times out there
            return f"; telling the producer failed: {e}"

    def _finish(self, request_id: str) -> Optional[Pulled]:
        """The pull's result once every transfer of it ended (the producer told), else None."""
        key, transfers, _, remote = self._pulls[request_id]
        states = [t.test() for t in transfers]
        if any(s.in_progress for s in states):
            return None
        failed = sorted({int(b) for s in states if s.failed for b in s.failed_blocks.tolist()})
        errors = "; ".join(sorted({s.error for s in states if s.failed and s.error}))
        ok = not errors and not failed
        del self._pulls[request_id]
        told = self._tell(remote, b"done" if ok else b"failed", key)
        return Pulled(request_id, ok, failed, errors + told)

    def poll(self) -> List[Pulled]:
        """The pulls that ended since the last call (each producer told to release its blocks)."""
        return [p for p in (self._finish(r) for r in list(self._pulls)) if p is not None]

    def wait(self, request_id: str, timeout_ms: int = -1) -> Optional[Pulled]:
        """Blocks until the pull of `request_id` ended (None after `timeout_ms`; < 0: no bound) and returns its
        result (poll() then no longer returns it)."""
        if request_id not in self._pulls:
            raise invalid("pd.Consumer.wait", -1, f"no pull of request {request_id!r}")
        for t in self._pulls[request_id][1]:
            if t.wait(timeout_ms).in_progress:
                return None
        return self._finish(request_id)

    def abort(self, request_id: str) -> None:
        """Cancels the pull of `request_id` (when it returns nothing it started touches either cache) and tells the
        producer to release its blocks. No-op for a request not being pulled."""
        entry = self._pulls.pop(request_id, None)
        if entry is None:
            return
        key, transfers, _, remote = entry
        del entry
        transfers.clear()  # each Transfer cancels and waits when it goes away
        self._tell(remote, b"aborted", key)
