"""Every test here runs on both event loops: asyncio's (what the unit tests elsewhere use) and uvloop
(what ``pointsman serve`` runs on). Their transports differ where the HTTP client leans on them:
pausing reads, how a reset or a TLS close is reported, when ``connection_lost`` comes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
