"""Operator actions on a store, for ``pointsman forget``: delete a tenant's or a request's data,
delete conversation text past its retention."""

from __future__ import annotations

import logging
import time

from store.errors import StoreSchemaNewer
from store.recorder import describe_error
from store.schema import SCHEMA_VERSION
from store.url import masked_store_url, opened_store

logger = logging.getLogger(__name__)

#: Key prefix in :func:`forget`'s counts of a table VACUUMed after the deletion (PostgreSQL): ``vacuumed:<table>``.
VACUUMED = "vacuumed:"


async def forget(
    url: str,
    *,
    tenant: str | None = None,
    request_id: str | None = None,
    purge_expired: bool = False,
    now: float | None = None,
) -> dict[str, int]:
    """Open the existing store ``url`` names (migrating it), delete what was asked, close it.

    Returns rows deleted per table (``decisions``, ``feedback``, ``conversations``, ``subcalls``)
    when a tenant or request id is given, plus ``purged_text`` (conversations whose text was deleted) when
    ``purge_expired``, plus ``vacuumed:<table>`` (1) for each table VACUUMed once the deletion committed
    (PostgreSQL: :meth:`DecisionStore.reclaim_deleted`).

    Raises :class:`StoreSchemaNewer` (deleting nothing) for a store a newer release migrated: its newer
    steps may keep a tenant's data in tables this code does not know, and a forget that reports success
    while leaving them would be worse than one that refuses.
    """
    if tenant is None and request_id is None and not purge_expired:
        raise ValueError("nothing to do: give a tenant, a request id or purge_expired")
    async with opened_store(url) as store:
        if store.schema_version > SCHEMA_VERSION:
            raise StoreSchemaNewer(
                f"store {masked_store_url(url)} has schema version {store.schema_version}, newer than this "
                f"pointsman knows ({SCHEMA_VERSION}): it may keep data in tables this release cannot find; "
                "run forget with the release that migrated it"
            )
        counts: dict[str, int] = {}
        if tenant is not None or request_id is not None:
            counts.update(await store.forget(tenant=tenant, request_id=request_id))
        if purge_expired:
            counts["purged_text"] = await store.purge_expired_text(time.time() if now is None else now)
        if any(counts.values()):
            # The deletion committed: a failed VACUUM is reported, it does not undo or hide the deletion.
            try:
                vacuumed = await store.reclaim_deleted()
            except Exception as exc:
                logger.warning("the deleted rows are deleted, but VACUUM failed (%s): they stay in the tables' "
                               "pages until autovacuum runs", describe_error(exc))
                vacuumed = ()
            counts.update({f"{VACUUMED}{table}": 1 for table in vacuumed})
        return counts


def describe(counts: dict[str, int], *, tenant: str | None, request_id: str | None) -> list[str]:
    """Human-readable lines for the counts :func:`forget` returned."""
    lines = []
    if "decisions" in counts:
        who = f"tenant {tenant!r}" if tenant is not None else f"request {request_id!r}"
        lines.append(
            f"forgot {who}: deleted {counts['decisions']} decisions, {counts['feedback']} feedback rows, "
            f"{counts['conversations']} conversations, {counts.get('subcalls', 0)} workflow sub-calls"
        )
    if "purged_text" in counts:
        lines.append(f"purged the text of {counts['purged_text']} conversations past their retention")
    vacuumed = [key.removeprefix(VACUUMED) for key in counts if key.startswith(VACUUMED)]
    if vacuumed:
        lines.append(f"vacuumed {', '.join(vacuumed)}: the deleted row versions are gone from the tables "
                     "(not from the write-ahead log, backups or replicas: see README)")
    return lines
