"""Session -> replica hints between gateways through a real Redis: what one gateway placed, its peer
learns within a sync; nothing reaches Redis on the request path; a Redis that goes away costs only
agreement, and the hints buffered meanwhile arrive once it is back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest

from gateway.balancing import Affinity, prefix_blocks
from gateway.balancing.hints import BATCH, MAX_PENDING, ReplicaHints, share_hints
from gateway.config import BackendConfig, BreakerConfig
from gateway.pool import BackendPool
from gateway.shared_state import redis_client
from tests.redisproc import PrivateRedis

URLS = ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]


def _pool(policy: str, urls: list[str] = URLS) -> BackendPool:
    config = BackendConfig.model_validate({
        "name": "engines", "replicas": urls, "models": [{"name": "m"}],
        "balancing": {"policy": policy, "hint_interval": 0.05},
    })
    return BackendPool([config], BreakerConfig())


def _turn(turns: int) -> bytes:
    messages = [{"role": "user", "content": "task " * 2000}]
    messages += [{"role": "tool", "content": f"result {k} " * 900} for k in range(turns)]
    return orjson.dumps({"model": "m", "messages": messages})


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()


@contextlib.asynccontextmanager
async def _gateways(
    redis_server: PrivateRedis, here: BackendPool, peer: BackendPool, redis_timeout: float = 1.0
) -> AsyncIterator[tuple[ReplicaHints, ReplicaHints]]:
    """Two gateways' hints (this one's and a peer's) over one Redis, their clients closed afterwards."""
    clients = [redis_client(redis_server.url, redis_timeout, decode=True) for _ in range(2)]
    try:
        hints_here = share_hints(here.backends, clients[0], "t:")
        hints_peer = share_hints(peer.backends, clients[1], "t:")
        assert isinstance(hints_here, ReplicaHints) and isinstance(hints_peer, ReplicaHints)
        yield hints_here, hints_peer
    finally:
        for client in clients:
            await client.aclose()


async def test_a_peer_learns_where_a_conversation_went(redis_server: PrivateRedis) -> None:
    # The peer lists the replicas in the other order: hints name replicas by URL, not position.
    here, peer = _pool("cache_aware"), _pool("cache_aware", URLS[::-1])
    async with _gateways(redis_server, here, peer) as (hints_here, hints_peer):
        backend = here.backends[0]
        target = backend.replicas[1]
        target.outstanding = 0
        backend.replicas[0].outstanding = 1  # so the first turn goes to replicas[1] by load
        first = Affinity(blocks=prefix_blocks(_turn(1)))
        choice = backend.choose(affinity=first)
        assert choice is not None and choice.replica is target
        backend.placed(choice, first)
        assert await hints_here.sync() and await hints_peer.sync()
        assert hints_peer.applied == 1
        # The next turn arrives at the peer, whose own view knows nothing of this conversation.
        later = Affinity(blocks=prefix_blocks(_turn(2)))
        theirs = peer.backends[0].choose(affinity=later)
        assert theirs is not None and theirs.reason == "prefix"
        assert theirs.replica.base_url == target.base_url  # type: ignore[attr-defined]


async def test_sessions_are_shared_and_a_lost_redis_only_delays_them(redis_server: PrivateRedis) -> None:
    here, peer = _pool("session_affinity"), _pool("session_affinity")
    async with _gateways(redis_server, here, peer, redis_timeout=0.3) as (hints_here, hints_peer):
        assert await hints_peer.sync()  # the peer has read the (empty) stream up to now
        redis_server.stop()
        backend = here.backends[0]
        affinity = Affinity(session=12345)
        backend.replicas[0].outstanding = 5
        choice = backend.choose(affinity=affinity)
        assert choice is not None
        backend.placed(choice, affinity)  # no Redis call here: the request is not held up
        assert not await hints_here.sync()  # Redis is gone: the hint is kept
        assert hints_here.failures == 1
        redis_server.start()
        assert await hints_here.sync()
        assert await hints_peer.sync()
        assert hints_peer.applied == 1
        peer_choice = peer.backends[0].choose(affinity=Affinity(session=12345))
        assert peer_choice is not None and peer_choice.reason == "session"
        assert peer_choice.replica.base_url == choice.replica.base_url  # type: ignore[attr-defined]


def test_least_outstanding_backends_share_nothing() -> None:
    assert share_hints(_pool("least_outstanding").backends, object(), "t:") is None


async def test_an_entry_that_is_not_utf8_does_not_stop_the_hints(redis_server: PrivateRedis) -> None:
    """Whoever can write to the stream may append anything: the entries after it are still applied."""
    peer = _pool("session_affinity")
    client = redis_client(redis_server.url, 1.0, decode=True)
    raw = redis_client(redis_server.url, 1.0, decode=False)
    try:
        hints = share_hints(peer.backends, client, "t:")
        assert hints is not None
        await raw.xadd("t:replica-hints:engines", {b"g": b"\xff\xfe", b"k": b"\x80", b"r": b"\xc3("})
        await raw.xadd("t:replica-hints:engines", {"g": "other", "k": "777", "r": URLS[1]})
        assert await hints.sync()
        assert hints.applied == 1
        choice = peer.backends[0].choose(affinity=Affinity(session=777))
        assert choice is not None and choice.reason == "session"
        assert choice.replica.base_url == URLS[1]  # type: ignore[attr-defined]
    finally:
        await client.aclose()
        await raw.aclose()


async def test_placements_made_while_a_hanging_redis_fails_a_sync_are_the_ones_kept(
    redis_server: PrivateRedis,
) -> None:
    """While Redis is away the buffer keeps the newest placements (the oldest go first), also those made
    during the sync that fails: the newest placement of a session is the one peers must learn."""
    here, peer = _pool("session_affinity"), _pool("session_affinity")
    async with _gateways(redis_server, here, peer, redis_timeout=0.5) as (hints_here, hints_peer):
        try:
            assert await hints_here.sync() and await hints_peer.sync()  # connected; the stream read up to now
            backend = here.backends[0]
            for key in range(1, MAX_PENDING + 1):  # a full buffer of older placements, all on URLS[0]
                hints_here.publish(backend, key, URLS[0])
            redis_server.pause()  # Redis hangs: the next sync's calls time out
            syncing = asyncio.create_task(hints_here.sync())
            await asyncio.sleep(0)  # the sync takes the buffer and waits for Redis
            hints_here.publish(backend, 424242, URLS[1])  # a session placed meanwhile
            assert not await syncing
            redis_server.resume()
            assert await hints_here.sync()
            applied = -1
            while hints_peer.applied != applied:  # read the stream to its end
                applied = hints_peer.applied
                assert await hints_peer.sync()
            choice = peer.backends[0].choose(affinity=Affinity(session=424242))
            assert choice is not None and choice.reason == "session"
            assert choice.replica.base_url == URLS[1]  # type: ignore[attr-defined]
        finally:
            redis_server.resume()


async def test_a_peer_far_behind_catches_up_in_one_sync_through_small_replies(redis_server: PrivateRedis) -> None:
    """A peer behind by a backlog (a Redis outage's buffer, a restart) reads all of it in its next sync, in
    replies of a bounded size: one reply of thousands of entries held the gateway's event loop for a
    tenth of a second and, on a busy machine, outlasted ``shared_state.timeout``, so that sync failed at
    the same place every time and the peer never caught up."""
    here, peer = _pool("session_affinity"), _pool("session_affinity")
    async with _gateways(redis_server, here, peer) as (hints_here, hints_peer):
        assert await hints_here.sync() and await hints_peer.sync()
        reads_before = await _calls(redis_server, "xread")
        backend = here.backends[0]
        for key in range(1, 12_001):
            hints_here.publish(backend, key, URLS[key % 2])
        assert await hints_here.sync()
        assert await hints_peer.sync()
        assert hints_peer.applied == 12_000
        reads = await _calls(redis_server, "xread") - reads_before
        assert reads >= 12_000 // BATCH + 1 and BATCH <= 1_000, (reads, BATCH)
        choice = peer.backends[0].choose(affinity=Affinity(session=11_999))
        assert choice is not None and choice.reason == "session"
        assert choice.replica.base_url == URLS[1]  # type: ignore[attr-defined]


async def _calls(redis_server: PrivateRedis, command: str) -> int:
    """How many times Redis has run ``command`` (its own count, ``INFO commandstats``)."""
    client = redis_client(redis_server.url, 5.0, decode=True)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_peers_late_placement_on_a_lost_replica_does_not_pull_the_conversation_back(
    redis_server: PrivateRedis,
) -> None:
    """A replica that went down here loses its prefixes and, when it returns (its cache gone), does not
    pull them back: not even through a peer that had not noticed yet and placed the conversation there."""
    here, peer = _pool("cache_aware"), _pool("cache_aware")
    async with _gateways(redis_server, here, peer) as (hints_here, hints_peer):
        assert await hints_here.sync() and await hints_peer.sync()
        backend = here.backends[0]
        lost = backend.replicas[0]
        lost.healthy = False  # what the health checker does when the replica fails its checks
        backend.lost(lost)
        # The peer has not noticed yet: its next turn of the conversation goes to that replica.
        theirs = peer.backends[0]
        theirs.replicas[1].outstanding = 1
        turn = Affinity(blocks=prefix_blocks(_turn(1)))
        choice = theirs.choose(affinity=turn)
        assert choice is not None and choice.replica.base_url == lost.base_url  # type: ignore[attr-defined]
        theirs.placed(choice, turn)
        assert await hints_peer.sync() and await hints_here.sync()
        lost.healthy = True  # it returns, restarted: whatever it cached is gone
        later = backend.choose(affinity=Affinity(blocks=prefix_blocks(_turn(2))))
        assert later is not None
        assert later.reason == "load", f"{later.reason} on {later.replica.base_url}"  # type: ignore[attr-defined]
