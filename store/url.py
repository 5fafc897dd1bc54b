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

import re
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from store.base import DecisionStore
from store.errors import StoreNotFound, StoreUnavailable
from store.postgres import PostgresDecisionStore
from store.sqlite import SQLiteDecisionStore


def open_store_url(url: str, *, existing: bool = False) -> DecisionStore:
    """The store ``url`` names, not yet connected (``await store.open()`` connects and migrates).

    ``existing=True`` (commands that read or delete an operator's data: ``pointsman forget``,
    ``--data logs:``, ``pointsman ab``) raises :class:`StoreNotFound` for a SQLite file that is not
    there, instead of creating an empty database: a mistyped path must not "forget" nothing and say
    it succeeded. (A PostgreSQL database that does not exist already fails to connect.)
    """
    if not url:
        raise ValueError("empty store URL; expected sqlite:///path.db, a file path or postgresql://...")
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresDecisionStore(url)
    if url.startswith("sqlite://"):
        path = url.removeprefix("sqlite://")  # "/abs/path.db" or "relative.db"
        if not path:
            raise ValueError(f"store URL {url!r} names no file; expected sqlite:///abs/path.db or sqlite://rel.db")
    elif "://" in url:
        scheme = url.split("://", 1)[0]
        raise ValueError(f"unknown store URL scheme {scheme!r}; expected sqlite://, postgresql:// or a file path")
    else:
        path = url
    if existing and path != ":memory:" and not Path(path).is_file():
        raise StoreNotFound(
            f"no SQLite database at {Path(path).absolute()} (from {url!r}); give the path the gateway's "
            "store.path names (sqlite:///abs/path.db has three slashes)"
        )
    return SQLiteDecisionStore(path)


@asynccontextmanager
async def opened_store(url: str) -> AsyncIterator[DecisionStore]:
    """The existing store ``url`` names, open for a command (``pointsman forget``, ``--data logs:``,
    ``pointsman ab``), closed afterwards.

    Raises :class:`StoreNotFound` for a SQLite file that is not there, ``ValueError`` for a URL that
    names no store, and :class:`StoreUnavailable` naming the store (password masked) when the driver
    fails (unreachable server, not a database file, ...), so commands print one line, not a traceback.
    """
    store = open_store_url(url, existing=True)
    await _open(store, url)
    try:
        yield store
    except _DRIVER_ERRORS as exc:  # only the drivers' failures: a bug in the caller stays a bug
        raise _unavailable(url, exc) from exc
    finally:
        await store.close()


async def check_store(store: DecisionStore, name: str) -> None:
    """Open ``store`` (connect and migrate) and close it again; :class:`StoreUnavailable` naming ``name``
    (a password in it masked) when the driver fails: a gateway's start-up check, so an unreachable
    database or an unwritable file is one line before serving rather than a traceback from inside it."""
    try:
        await _open(store, name)
    finally:
        await store.close()


async def _open(store: DecisionStore, name: str) -> None:
    """``store.open()``, a driver's failure translated into :class:`StoreUnavailable` naming ``name``."""
    try:
        await store.open()
    except _DRIVER_ERRORS as exc:
        raise _unavailable(name, exc) from exc
    except ValueError as exc:
        if not isinstance(store, PostgresDecisionStore):
            raise
        # asyncpg could not parse the DSN; its message quotes pieces of it (a password's among them).
        raise StoreUnavailable(f"store {masked_store_url(name)}: cannot parse the URL ({type(exc).__name__})"
                               f"{_ENCODE_HINT}") from exc


# What the drivers raise when a database cannot be reached or read (the store's methods raise these).
_DRIVER_ERRORS = (OSError, TimeoutError, sqlite3.Error, asyncpg.PostgresError, asyncpg.InterfaceError)


def masked_store_url(url: str) -> str:
    """``url`` with a password in it replaced by ``***`` (for messages and logs): the one in its user
    part and a ``password=`` query parameter, which asyncpg (like libpq) accepts as well."""
    if "://" not in url:
        return url
    unparsed = _unparsed_password(url)
    if unparsed is not None:
        return url[: unparsed.start("pw")] + "***" + url[unparsed.end("pw") :]
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL": nothing to show but the scheme
        return url.split("://", 1)[0] + "://***"
    masked = parts
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[1]
        masked = masked._replace(netloc=f"{parts.username or ''}:***@{host}")
    if parts.query:
        masked = masked._replace(query=_QUERY_PASSWORD.sub(r"\1=***", parts.query))
    # Unchanged when there is nothing to mask: urlunsplit would rewrite sqlite:///pointsman.db (an empty
    # host) as sqlite:/pointsman.db, a URL no store opens, into version.json and every message.
    return url if masked == parts else urlunsplit(masked)


_QUERY_PASSWORD = re.compile(r"(?<![^&;])(password)=[^&;]*", re.IGNORECASE)
# A password holding an unencoded "/", "?" or "#": URL parsing (asyncpg's too) ends the host there and
# sees no password at all (postgresql://u:ab/cd@h/db reads as host "u", port "ab"). The password runs
# from the user's ":" to the "@" the host follows.
_UNPARSED_PASSWORD = re.compile(r"[a-z][a-z0-9+.\-]*://[^:/?#@]*:(?P<pw>.*?[/?#].*?)@[^@/?#]*(?:[/?#]|$)", re.I | re.S)
# ... unless that "@" is inside a query parameter's value (postgresql://h:5432/db?user=me@corp).
_QUERY_VALUE = re.compile(r"\?(?:[^&=]*&)*[^&=]*=[^&]*$")


def _unparsed_password(url: str) -> re.Match[str] | None:
    """The match of a password URL parsing cannot see in ``url`` (group ``pw``), or None."""
    unparsed = _UNPARSED_PASSWORD.match(url)
    return None if unparsed is None or _QUERY_VALUE.search(unparsed["pw"]) else unparsed


_ENCODE_HINT = "; percent-encode a user name or password holding / ? # @ : (%2F %3F %23 %40 %3A)"


def _unavailable(url: str, exc: Exception) -> StoreUnavailable:
    if _unparsed_password(url) is not None:
        # The driver took the user name for the host and the password's start for the port: its message
        # ("Connect call failed ('127.0.0.1', 12)") can quote them.
        return StoreUnavailable(f"store {masked_store_url(url)}: {type(exc).__name__}{_ENCODE_HINT}")
    return StoreUnavailable(f"store {masked_store_url(url)}: {type(exc).__name__}: {exc}")
