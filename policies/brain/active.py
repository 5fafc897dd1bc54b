"""The router version serving now, swapped atomically when a registry promotes another.

Every route's signal provider reads its heads through :meth:`ActiveRouter.heads_for`, once per
computation, so one request never mixes two versions' heads. A request that must also *report* the
version that decided it (the decision record, ``x-pointsman-router``, ``/v1/route``) pins one with
:meth:`ActiveRouter.pin`: inside the ``with`` block (and in tasks started from it) every read sees
that version, even if a promotion swaps the active one meanwhile. Pinning uses a context variable
because the policy interface (``decide(ctx)``) has no place for it, and should not: policies do not
know about router versions.

:meth:`ActiveRouter.watch` is the hot reload: it polls a cheap marker of the registry's active
version, loads a changed version in a worker thread (never on the event loop), and swaps it in with
one assignment. A version that fails to load is logged and counted; the old one keeps serving. Every
gateway replica runs its own watcher on the shared registry directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar

from classifiers.heads import Head
from policies.brain.heads import RouterVersion

log = logging.getLogger("pointsman.routing")


class ActiveRouter:
    """Holds the current :class:`RouterVersion`; counts reloads for ``/metrics``."""

    def __init__(self, current: RouterVersion) -> None:
        self._current = current
        # One variable per router: two brains in one process (tests, eval of two versions) never see
        # each other's pins.
        self._pinned: ContextVar[RouterVersion | None] = ContextVar(f"pointsman-router-{id(self)}", default=None)
        self._listeners: list[Callable[[RouterVersion, RouterVersion], None]] = []
        self.reloads = 0  # versions swapped in since start
        self.reload_failures = 0  # changed versions that failed to load (the old one kept serving)
        self.last_error: str | None = None

    @property
    def current(self) -> RouterVersion:
        """The active version (new requests start on it)."""
        return self._current

    @property
    def version(self) -> str:
        """The active version's id."""
        return self._current.version

    def snapshot(self) -> RouterVersion:
        """The version pinned for this request, else the active one."""
        return self._pinned.get() or self._current

    def heads_for(self, route: str) -> Mapping[str, Head]:
        """The heads ``route`` reads in :meth:`snapshot` (a provider calls this once per computation)."""
        return self.snapshot().heads_for(route)

    @contextlib.contextmanager
    def pin(self) -> Iterator[RouterVersion]:
        """Decide everything inside the block on one version, and say which."""
        pinned = self.snapshot()
        token = self._pinned.set(pinned)
        try:
            yield pinned
        finally:
            self._pinned.reset(token)

    def on_swap(self, listener: Callable[[RouterVersion, RouterVersion], None]) -> None:
        """Call ``listener(old, new)`` right after each swap (on the event loop)."""
        self._listeners.append(listener)

    def swap(self, version: RouterVersion) -> None:
        """Make ``version`` active. Requests already pinned or computing finish on the old one."""
        old, self._current = self._current, version
        self.reloads += 1
        log.info("router version %s is now active (was %s; heads from %s)", version.version, old.version,
                 version.directory)
        for listener in self._listeners:
            listener(old, version)

    async def watch(
        self, marker: Callable[[], str], load: Callable[[], RouterVersion], interval: float, *, seen: str | None = None
    ) -> None:
        """Poll ``marker()`` every ``interval`` seconds; when it changes, ``load()`` (in a thread) and swap.

        ``seen`` is the marker read before the active version was loaded (default: read now). Runs until
        cancelled. ``load`` raising keeps the active version and waits for the next change: a version's
        artifacts never change, so retrying the same one would fail the same way.
        """
        if seen is None:
            seen = await asyncio.to_thread(_safe, marker)
        while True:
            await asyncio.sleep(interval)
            now = await asyncio.to_thread(_safe, marker)
            if now is None or now == seen:
                continue
            seen = now
            try:
                version = await asyncio.to_thread(load)
            except Exception as exc:
                self.reload_failures += 1
                self.last_error = str(exc)
                log.error("router reload failed; version %s keeps serving: %s", self.version, exc)
                continue
            if version.version != self.version:
                self.swap(version)


def _safe(marker: Callable[[], str]) -> str | None:
    """The marker, or None when it cannot be read right now (a registry on a flaky mount)."""
    try:
        return marker()
    except OSError as exc:
        log.warning("cannot read the router registry's active version: %s", exc)
        return None
