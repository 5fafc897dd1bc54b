"""Fixtures for the shared-state tests: a key prefix of the test's own on the shared Redis (removed
afterwards), and a private redis-server on a spare port that a test may stop."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.redisproc import PrivateRedis

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"pointsman-test-{uuid.uuid4().hex[:8]}:"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=name + "*"):
        client.delete(key)
    client.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()
