"""Fixtures of the cache tests (the shared ``upstream`` fake is in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cache.helpers import PairedUpstream


@pytest.fixture(scope="session")
def paired() -> Iterator[PairedUpstream]:
    """An upstream that holds ``pair-`` requests until both of a pair are in flight."""
    fake = PairedUpstream().start()
    yield fake
    fake.stop()
