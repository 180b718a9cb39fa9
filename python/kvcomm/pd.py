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

Caches laid out differently on the two sides (prefill TP 4, decode TP 2; other block sizes or token/head order):
give both sides their caches' contents (``contents=``, one list of kvcomm.conversion.KvContents per registration;
or register the caches with ``contents=``, which their metadata then carries), and pass the decode side every prefill rank's parameters with the request's token count:
``pull(request_id, [params of each prefill rank], blocks, num_tokens=n)``. The pull then runs
a kvcomm.conversion.ConvertedReader per registration (on a thread of its own: poll/wait/abort work as for a plain
pull; abort waits for it to end), reading each head from a rank that holds it.

Request ids are the engines' own; the parameters carry a random key of the producer's, so two engines' ids never
collide and a late or forged message for another hold is ignored. Both sides own their endpoint's notifications
(others are kept in ``unhandled``).
"""

from __future__ import annotations

import base64
import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._endpoint import Endpoint, Registration, RemoteMemory, Transfer
from ._errors import Error, check_int, invalid, shown
from .conversion import ConvertedReader, KvContents, check_description

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


def _contents(contents: Any, regs: Sequence[Registration], call: str) -> Optional[List[List[KvContents]]]:
    """One list of KvContents per registration (checked against its layout); None given: the contents the
    registrations were made with (Endpoint.register(contents=)), or None when one has none."""
    if contents is None:
        registered = [r.contents for r in regs]
        return registered if all(registered) else None
    out = [list(c) for c in contents]
    if len(out) != len(regs):
        raise invalid(call, -1, f"contents has {len(out)} entries, one per registration ({len(regs)}) is needed")
    for reg, c in zip(regs, out):
        check_description(reg.layout, c)
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

    def __init__(self, endpoint: Endpoint, registrations: Any, *, hold_timeout_ms: int = 120000,
                 contents: Any = None) -> None:
        call = "pd.Producer"
        self._ep = endpoint
        self._regs = _registrations(endpoint, registrations, call)
        self._contents = _contents(contents, self._regs, call)
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
        params = {"kvcomm_pd": _VERSION, "key": key, "producer": self._ep.id, "metadata": metadata, "blocks": ids}
        if self._contents is not None:
            params["contents"] = [[dataclasses.asdict(c) for c in reg] for reg in self._contents]
        return params

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


@dataclass
class _Pull:
    """A pull in progress: its producers' keys and a remote of each (to tell them), the local blocks, and either its
    transfers or (converted) the thread reading and its result."""

    keys: List[str]
    remotes: List[RemoteMemory]
    local: List[int]
    transfers: List[Transfer] = field(default_factory=list)
    thread: Optional[threading.Thread] = None
    result: Optional[Tuple[List[int], str]] = None

    def ended(self, timeout_ms: int = 0) -> bool:
        if self.thread is not None:
            self.thread.join(None if timeout_ms < 0 else timeout_ms / 1000.0)
            return not self.thread.is_alive()
        return all(not t.wait(timeout_ms).in_progress for t in self.transfers)

    def outcome(self) -> Tuple[List[int], str]:
        if self.thread is not None:
            return self.result if self.result is not None else ([b for b in self.local if b >= 0], "no result")
        states = [t.test() for t in self.transfers]
        failed = sorted({int(b) for s in states if s.failed for b in s.failed_blocks.tolist()})
        return failed, "; ".join(sorted({s.error for s in states if s.failed and s.error}))


class Consumer:
    """The decode side: pulls held requests' blocks into its own slots and tells the producers when it is done."""

    def __init__(self, endpoint: Endpoint, registrations: Any, *, contents: Any = None) -> None:
        self._ep = endpoint
        self._regs = _registrations(endpoint, registrations, "pd.Consumer")
        self._contents = _contents(contents, self._regs, "pd.Consumer")
        self._limit = _num_blocks(self._regs)
        self._remotes: Dict[str, RemoteMemory] = {}
        self._pulls: Dict[str, "_Pull"] = {}
        self._reader: Optional[ConvertedReader] = None  # converted pulls: landing areas kept between pulls
        self.unhandled: List[Any] = []

    @property
    def pulling(self) -> List[str]:
        return list(self._pulls)

    def _remote(self, metadata: str) -> RemoteMemory:
        if metadata not in self._remotes:
            self._remotes[metadata] = self._ep.connect(base64.b64decode(metadata))
        return self._remotes[metadata]

    def _params(self, params: Any, call: str) -> Tuple[str, List[str], List[int], Any]:
        if not isinstance(params, dict) or params.get("kvcomm_pd") != _VERSION:
            raise invalid(call, -1, f"params are not kvcomm.pd transfer parameters (version {_VERSION})")
        try:
            key, metadata, remote_blocks = str(params["key"]), list(params["metadata"]), list(params["blocks"])
        except (KeyError, TypeError):
            raise invalid(call, -1, "params lack key, metadata or blocks") from None
        if len(metadata) != len(self._regs):
            raise invalid(call, -1, f"the producer has {len(metadata)} registrations, this side {len(self._regs)}")
        return key, metadata, remote_blocks, params.get("contents")

    def pull(self, request_id: str, params: Any, blocks: Any, *, num_tokens: Optional[int] = None,
             first_token: int = 0) -> None:
        """Starts reading the producer's blocks (`params` from Producer.hold) into local `blocks`, in every
        registration (-1 skips a block). With contents on both sides, `params` may be a list (every prefill rank's)
        and `num_tokens` (the request's tokens; `first_token` skips a prefix) makes it a converted pull. Raises
        InvalidArgumentError for parameters that are not the producer's or do not match this side."""
        call = "pd.Consumer.pull"
        if not isinstance(request_id, str):
            raise invalid(call, -1, f"request_id must be a str, got {shown(request_id)}")
        if request_id in self._pulls:
            raise invalid(call, -1, f"request {request_id!r} is already being pulled")
        many = [self._params(p, call) for p in (params if isinstance(params, list) else [params])]
        if not many:
            raise invalid(call, -1, "params: an empty list")
        if num_tokens is not None:
            self._pulls[request_id] = self._converted(request_id, many, blocks, num_tokens, first_token, call)
            return
        if len(many) > 1:
            raise invalid(call, -1, "several producers' params: a converted pull (pass num_tokens, and contents on "
                          "both sides)")
        key, metadata, remote_blocks, _ = many[0]
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
        self._pulls[request_id] = _Pull([key], [remotes[0]], local, transfers=transfers)

    def _converted(self, request_id: str, many: List[Tuple[str, List[str], List[int], Any]], blocks: Any,
                   num_tokens: Any, first_token: Any, call: str) -> "_Pull":
        remotes = [[self._remote(m) for m in metadata] for _, metadata, _, _ in many]
        try:  # each producer's: as its params carry them, else as its metadata does (registered with contents=)
            contents = [[[KvContents(**c) for c in reg] for reg in c_all] if c_all is not None else
                        [r.contents for r in remotes[p]] for p, (*_, c_all) in enumerate(many)]
        except TypeError:
            raise invalid(call, -1, "params' contents are not KvContents fields") from None
        if self._contents is None or any(not c for per in contents for c in per):
            raise invalid(call, -1, "a converted pull needs contents on both sides (Producer/Consumer contents=, or "
                          "registrations made with contents=)")
        tables = {tuple(b) for _, _, b, _ in many}
        if len(tables) != 1:
            raise invalid(call, -1, "the producers hold different block tables: a converted pull reads one token "
                          "range, named by one table, from every prefill rank")
        n = check_int(num_tokens, "num_tokens", call, -1, 1 << 48, 0)
        first = check_int(first_token, "first_token", call, -1, 1 << 48, 0)
        local = _blocks(blocks, self._limit, "blocks", call, skips=True)
        src_table = list(many[0][2])
        pull = _Pull([k for k, *_ in many], [r[0] for r in remotes], local)
        if self._reader is None:
            self._reader = ConvertedReader(self._ep)
        reader = self._reader

        def run() -> None:
            failed, errors = set(), []
            try:
                for i, reg in enumerate(self._regs):
                    got = reader.read(reg, self._contents[i],
                                      [(remotes[p][i], contents[p][i]) for p in range(len(many))], src_table, local,
                                      n, first_token=first)
                    if not got.ok:
                        failed.update(int(b) for b in got.status.failed_blocks.tolist())
                        errors.append(got.status.error)
            except Error as e:
                failed.update(b for b in local if b >= 0)
                errors.append(str(e))
            pull.result = (sorted(failed), "; ".join(errors))

        pull.thread = threading.Thread(target=run, name=f"kvcomm.pd pull {request_id}", daemon=True)
        pull.thread.start()
        return pull

    def _tell(self, remote: RemoteMemory, verb: bytes, key: str) -> str:
        try:
            self._ep.notify(remote, _PREFIX + verb + b" " + key.encode())
            return ""
        except Error as e:  # the producer is gone or refuses: its hold times out there
            return f"; telling the producer failed: {e}"

    def _finish(self, request_id: str) -> Optional[Pulled]:
        """The pull's result once it ended (its producers told), else None."""
        pull = self._pulls[request_id]
        if not pull.ended(0):
            return None
        failed, errors = pull.outcome()
        ok = not errors and not failed
        del self._pulls[request_id]
        told = "".join(self._tell(r, b"done" if ok else b"failed", k) for r, k in zip(pull.remotes, pull.keys))
        return Pulled(request_id, ok, failed, errors + told)

    def poll(self) -> List[Pulled]:
        """The pulls that ended since the last call (each producer told to release its blocks)."""
        return [p for p in (self._finish(r) for r in list(self._pulls)) if p is not None]

    def wait(self, request_id: str, timeout_ms: int = -1) -> Optional[Pulled]:
        """Blocks until the pull of `request_id` ended (None after `timeout_ms`; < 0: no bound) and returns its
        result (poll() then no longer returns it)."""
        if request_id not in self._pulls:
            raise invalid("pd.Consumer.wait", -1, f"no pull of request {request_id!r}")
        if not self._pulls[request_id].ended(timeout_ms):
            return None
        return self._finish(request_id)

    def abort(self, request_id: str) -> None:
        """Cancels the pull of `request_id` (when it returns nothing it started touches either cache; a converted
        pull is waited for) and tells the producers to release their blocks. No-op for a request not being pulled."""
        pull = self._pulls.pop(request_id, None)
        if pull is None:
            return
        pull.transfers.clear()  # each Transfer cancels and waits when it goes away
        if pull.thread is not None:
            pull.thread.join()
        for r, k in zip(pull.remotes, pull.keys):
            self._tell(r, b"aborted", k)
