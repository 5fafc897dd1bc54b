"""Store URLs: one string that names a decision store, for command lines (``--store``,
``--data logs:URL``).

==============================  ==========================================
``sqlite:///abs/path.db``       SQLite file at ``/abs/path.db``
``sqlite://relative.db``        SQLite file relative to the working directory
``path/to/file.db``             a bare path: SQLite
``postgresql://...``            PostgreSQL DSN (``postgres://`` too), passed to asyncpg as is
==============================  ==========================================
"""

from __future__ import annotations

from store.base import DecisionStore
from store.postgres import PostgresDecisionStore
from store.sqlite import SQLiteDecisionStore


def open_store_url(url: str) -> DecisionStore:
    """The store ``url`` names, not yet connected (``await store.open()`` connects and migrates)."""
    if not url:
        raise ValueError("empty store URL; expected sqlite:///path.db, a file path or postgresql://...")
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresDecisionStore(url)
    if url.startswith("sqlite://"):
        path = url.removeprefix("sqlite://")  # "/abs/path.db" or "relative.db"
        if not path:
            raise ValueError(f"store URL {url!r} names no file; expected sqlite:///abs/path.db or sqlite://rel.db")
        return SQLiteDecisionStore(path)
    if "://" in url:
        scheme = url.split("://", 1)[0]
        raise ValueError(f"unknown store URL scheme {scheme!r}; expected sqlite://, postgresql:// or a file path")
    return SQLiteDecisionStore(url)
