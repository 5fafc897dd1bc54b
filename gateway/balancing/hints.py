"""Session -> replica hints shared by gateways in front of the same replicas, through Redis.

Replica choice is local and in-process (no Redis call on the request path). Each placement an
affinity policy makes (a session's replica, or a conversation's last full prefix block and its
replica) is buffered; every ``hint_interval`` seconds one round trip appends the buffer to a Redis
stream per backend (``<key_prefix>replica-hints:<backend>``, capped near ``MAX_STREAM`` entries) and
reads what peer gateways appended since the last read (a backlog goes in more round trips of
``BATCH`` entries, within the same sync). A peer's hint is applied as if this gateway
had made the placement (unless it names a replica this gateway has lost: unhealthy or ejected), so
two gateways mostly agree on where a session lives: a session whose turns alternate between gateways
still lands on one replica.

Replicas are named by base URL in the stream (gateways may list them in different orders); keys are
64-bit hashes (no session id, tenant or prompt text reaches Redis). A gateway starts by reading the
last ``ttl`` seconds of the stream (stream ids are millisecond timestamps), so a restarted gateway
knows where live sessions are. A failing Redis costs only agreement: hints are kept (bounded) and
sent when it answers again; the failure is logged once per 30 s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gateway.breaker import BreakerState
from gateway.redis_failures import RedisFailures, redis_errors, stop_task

if TYPE_CHECKING:
    from gateway.pool import Backend, Replica

log = logging.getLogger("pointsman.balancing")

#: Entries a backend's stream keeps (approximately: ``XADD MAXLEN ~``).
MAX_STREAM = 100_000
#: Hints buffered per backend while Redis is away; the oldest go first.
MAX_PENDING = 20_000
#: Entries sent, and entries read, per stream per round trip (a reply of 1,000 parses in ~25 ms).
BATCH = 1_000
#: Round trips one sync makes at most (a whole stream's worth: ``MAX_STREAM`` / ``BATCH``).
MAX_ROUNDS = 100


class ReplicaHints:
    """Publishes this gateway's placements and applies its peers', for backends that share hints."""

    def __init__(self, client: Any, key_prefix: str, backends: Sequence[Backend], interval: float) -> None:
        self._client = client
        self._interval = interval
        self.gateway_id = os.urandom(6).hex()
        self._backends = {self._stream(key_prefix, b.name): b for b in backends}
        self._stream_of = {b.name: self._stream(key_prefix, b.name) for b in backends}
        self._replicas: dict[str, dict[str, Replica]] = {b.name: {r.base_url: r for r in b.replicas} for b in backends}
        self._pending: dict[str, deque[tuple[int, str]]] = {
            name: deque(maxlen=MAX_PENDING) for name in self._stream_of
        }
        oldest_ms = int((time.time() - max(b.config.balancing.ttl for b in backends)) * 1000) if backends else 0
        self._last_id = {stream: f"{max(oldest_ms, 0)}-0" for stream in self._backends}
        self.applied = 0  # peers' hints applied (for tests and metrics)
        self.failures = 0
        self._failure_log = RedisFailures(log, "replica hints", "gateways may disagree on session placement")
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @staticmethod
    def _stream(prefix: str, backend: str) -> str:
        return f"{prefix}replica-hints:{backend}"

    def publish(self, backend: Backend, key: int, replica_url: str) -> None:
        """Buffer one placement for the next sync (O(1), no I/O)."""
        pending = self._pending.get(backend.name)
        if pending is not None:
            pending.append((key, replica_url))

    async def sync(self) -> bool:
        """Send buffered placements and apply peers' new ones; False if Redis failed.

        One round trip normally. A backlog (this gateway's buffer after an outage, or peers' entries
        after a restart) goes in further round trips of at most ``BATCH`` entries each way, until it is
        all sent and read: a reply of thousands of entries held the event loop (parsing it) for a tenth
        of a second and, on a busy machine, outlasted the Redis timeout, failing every sync at the same
        place. Between round trips the event loop serves requests."""
        for _ in range(MAX_ROUNDS):
            sent, more_to_send = self._take_batches()
            try:
                results = await self._round_trip(sent)
            except redis_errors() as exc:
                self._put_back(sent)
                self.failures += 1
                self._failure_log.failed(exc, "sync")
                return False
            streams = results[-1] or []
            self._apply(streams)
            if not more_to_send and all(len(entries) < BATCH for _, entries in streams):
                break
        return True  # what is left after MAX_ROUNDS (peers writing faster than this reads) goes next sync

    def _take_batches(self) -> tuple[dict[str, list[tuple[int, str]]], bool]:
        """Up to ``BATCH`` of the oldest buffered placements per backend, and whether more remain."""
        sent: dict[str, list[tuple[int, str]]] = {}
        more = False
        for name, pending in self._pending.items():
            if pending:
                sent[name] = [pending.popleft() for _ in range(min(BATCH, len(pending)))]
                more = more or bool(pending)
        return sent, more

    async def _round_trip(self, sent: dict[str, list[tuple[int, str]]]) -> list[Any]:
        from redis.client import NEVER_DECODE  # redis is imported only when Redis is configured

        pipe = self._client.pipeline(transaction=False)
        for name, batch in sent.items():
            stream = self._stream_of[name]
            for key, url in batch:
                pipe.xadd(stream, {"g": self.gateway_id, "k": key, "r": url}, maxlen=MAX_STREAM, approximate=True)
        # Read as bytes whatever the client decodes: anyone who can write to the stream could append an
        # entry that is not UTF-8, which the client's decoding raised on, in every sync, for ever.
        streams, ids = list(self._last_id), list(self._last_id.values())
        pipe.execute_command(
            "XREAD", "COUNT", str(BATCH), "STREAMS", *streams, *ids, keys=streams, **{NEVER_DECODE: []}
        )
        return list(await pipe.execute())

    def _put_back(self, sent: dict[str, list[tuple[int, str]]]) -> None:
        """Keep a batch that failed (bounded) for the next sync, ahead of what was buffered after it: when
        the buffer is full the oldest go first (extendleft on a full deque would drop the newest)."""
        for name, batch in sent.items():
            pending = self._pending[name]
            newer = list(pending)
            pending.clear()
            pending.extend(batch)
            pending.extend(newer)

    def _apply(self, streams: Any) -> None:
        for stream, entries in streams:
            name = stream.decode() if isinstance(stream, bytes) else str(stream)
            backend = self._backends.get(name)
            if backend is None:
                continue
            replicas = self._replicas[backend.name]
            for entry_id, fields in entries:
                self._last_id[name] = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                values = {_text(k): _text(v) for k, v in fields.items()}
                if values.get("g") == self.gateway_id:
                    continue
                replica = replicas.get(values.get("r", ""))
                try:
                    key = int(values.get("k", ""))
                except ValueError:
                    continue  # not ours to read: another version's entry
                if replica is None or not replica.healthy or replica.breaker.state is BreakerState.OPEN:
                    # A replica this gateway lost (see Backend.lost) must not win its conversations back
                    # through a peer that had not noticed yet: when it returns, its cache is gone.
                    continue
                backend.policy.apply_hint(key, replica.slot)
                self.applied += 1

    def start(self) -> None:
        """Sync every ``interval`` seconds in the background until :meth:`close`."""
        self._task = asyncio.create_task(self._run(), name="replica-hints")

    async def close(self) -> None:
        """Stop syncing. Bounded: a Redis client that swallows the cancellation of a call in flight
        (seen with redis-py under load) must not hold up the gateway's shutdown."""
        self._closed = True
        task, self._task = self._task, None
        if task is None:
            return
        await stop_task(task)

    async def _run(self) -> None:
        while not self._closed:
            try:
                await self.sync()
            except Exception:  # a bug, not Redis (sync handles that): logged; hints must not stop for good
                self.failures += 1
                log.exception("replica hints: sync failed")
            await asyncio.sleep(self._interval)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def share_hints(backends: Sequence[Backend], client: Any, key_prefix: str) -> ReplicaHints | None:
    """Hints for the backends whose ``balancing`` shares them (each backend's ``hints`` is set), or None."""
    sharing = [b for b in backends if b.config.balancing.shares_hints]
    if not sharing:
        return None
    hints = ReplicaHints(client, key_prefix, sharing, min(b.config.balancing.hint_interval for b in sharing))
    for backend in sharing:
        backend.hints = hints
    return hints
