"""A request's "the client is gone" signal, raised by the HTTP front and awaited by nothing.

The front (:mod:`gateway.http_protocol`) puts a :class:`ClientGone` into every request's ASGI scope
under :data:`SCOPE_KEY` and fires it when the connection is lost. Work that must stop when its client
leaves (an upstream call, a workflow) registers a callback for the time it runs. It replaces a watcher
task per request that awaited ``receive()`` for ``http.disconnect`` (a task created, cancelled and
awaited each time: ~6 us of the event loop per request); under another server, without the key, the
service still watches that way.
"""

from __future__ import annotations

from collections.abc import Callable

SCOPE_KEY = "pointsman.client_gone"


class ClientGone:
    """Fired once when the request's client disconnects; callbacks added later run at once."""

    __slots__ = ("_callbacks", "gone")

    def __init__(self) -> None:
        self.gone = False
        self._callbacks: list[Callable[[], None]] = []

    def add(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the client goes (now, if it already has)."""
        if self.gone:
            callback()
        else:
            self._callbacks.append(callback)

    def remove(self, callback: Callable[[], None]) -> None:
        """Forget ``callback`` (no-op if it ran or was never added)."""
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def fire(self) -> None:
        """The client is gone: run every callback once (idempotent)."""
        if self.gone:
            return
        self.gone = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
