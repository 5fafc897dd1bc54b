"""Loading an experiment from the store: its registered spec, its rows with feedback, its arm stops."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from evals.ab.data import ExperimentData, experiment_data
from store.base import DecisionStore
from store.url import open_store_url

T = TypeVar("T")


class UnknownExperiment(LookupError):
    """No experiment of that name is registered (and no request was recorded under it)."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        listed = ", ".join(known) if known else "none registered in this store"
        super().__init__(f"unknown experiment {name!r} (known experiments: {listed})")


async def load_experiment(
    store: DecisionStore,
    name: str,
    *,
    since: float | None = None,
    include_compared: bool = False,
    metric: str = "quality",
) -> ExperimentData:
    """Everything the report needs about experiment ``name`` from an opened store.

    An experiment the gateways never registered but that has recorded requests still loads (its
    arms then come from the data, without weights, so the sample-ratio check is skipped).
    """
    row = await store.fetch_experiment(name)
    requests = await store.experiment_requests(name, since=since)
    if row is None and not requests:
        known = [e.name for e in await store.list_experiments()]
        raise UnknownExperiment(name, known)
    stops = await store.experiment_stops(name)
    return experiment_data(
        name, row.route if row else "?", row.spec if row else {}, requests, stops,
        include_compared=include_compared, metric=metric,
    )


async def load_experiment_url(url: str, name: str, **kwargs: Any) -> ExperimentData:
    """Open the store ``url`` names, load experiment ``name`` (see :func:`load_experiment`), close it."""
    store = open_store_url(url)
    await store.open()
    try:
        return await load_experiment(store, name, **kwargs)
    finally:
        await store.close()


def run_sync(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, even when an event loop is already running
    (a test, a notebook): then in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    result: list[T] = []
    errors: list[BaseException] = []

    def runner() -> None:
        try:
            result.append(asyncio.run(factory()))
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=runner, name="pointsman-ab-load")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]
