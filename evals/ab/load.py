"""Loading an experiment from the store: its registered spec, its rows with feedback, its arm stops."""

from __future__ import annotations

from typing import Any

from evals.ab.data import ExperimentData, experiment_data
from store.base import DecisionStore
from store.url import opened_store


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
    async with opened_store(url) as store:
        return await load_experiment(store, name, **kwargs)
