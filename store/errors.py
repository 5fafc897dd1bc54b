"""The store's exception tree.

Driver exceptions (sqlite3, asyncpg, OSError) are what a store's methods raise on failure; the
components that promise callers something about durability translate them into these at their
boundary (:class:`store.feedback_writer.FeedbackWriter`), so callers depend on no driver.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of the store's own exceptions."""


class StoreUnavailable(StoreError):
    """The store could not durably write (or read) right now: the database is down, locked,
    read-only, full, or did not answer in time. Retrying later may succeed; nothing was acknowledged."""


class StoreSchemaNewer(StoreError):
    """The database was migrated by a newer release (a schema step this code does not know): a command
    that must find every row of a tenant (``pointsman forget``) could miss the tables that step added."""


class StoreNotFound(StoreError):
    """A command was pointed at a store that does not exist (a SQLite file that is not there): reading
    or deleting from it would create an empty database and report success on the wrong file."""


class RequestForgotten(StoreError):
    """The request was forgotten (``pointsman forget``): a tombstone covers it, and nothing about it is
    written any more. For the client it is a request id that is not known."""
