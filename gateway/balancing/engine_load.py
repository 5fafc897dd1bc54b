"""The engines' own load, read from their Prometheus ``/metrics`` (vLLM, SGLang) with the health checks.

The gateway's view of a replica's load is its own requests in flight; other gateways (or clients
that bypass it) load the same engine. When ``balancing.engine_metrics.kind`` is set, each health check
also reads the engine's running and waiting requests and its KV-cache usage, and the replica's
``external_load`` becomes what the engine reports beyond this gateway's own requests at that moment.

What an engine reports is not trusted: a sample that is not a finite, non-negative number (``NaN``,
``+Inf``, ``-1``) is skipped, and a total that does not stay finite makes the whole reading unusable.
Load is compared between replicas, so one ``+Inf`` beside a ``-Inf`` (a NaN load) would otherwise break
every replica choice of the backend.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import NamedTuple

#: Metric names per engine kind: (running requests, waiting requests, KV-cache usage 0..1). Each is a
#: list of names because engines renamed them (vLLM: gpu_cache_usage_perc -> kv_cache_usage_perc).
METRIC_NAMES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "vllm": (
        ("vllm:num_requests_running",),
        ("vllm:num_requests_waiting",),
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ),
    "sglang": (("sglang:num_running_reqs",), ("sglang:num_queue_reqs",), ("sglang:token_usage",)),
}


class EngineLoad(NamedTuple):
    """What an engine reports: requests running and waiting, KV-cache usage (None when absent)."""

    running: float
    waiting: float
    kv_cache_usage: float | None


@lru_cache(maxsize=8)
def _sample_lines(kind: str) -> tuple[re.Pattern[str], dict[str, int]]:
    """A pattern for the wanted metrics' sample lines (name, optional labels, value) and each name's slot.

    The scan runs in the regex engine, not a Python loop per character: a 1 MiB body costs
    milliseconds of the event loop, whatever it holds. The labels run to the line's last ``}`` (a label
    value may hold one)."""
    names = METRIC_NAMES[kind]
    slots = {name: i for i, group in enumerate(names) for name in group}
    alternatives = "|".join(re.escape(name) for name in slots)
    pattern = re.compile(rf"^({alternatives})(?:\{{[^\n]*\}})?[ \t]+([^ \t\r\n]+)", re.MULTILINE)
    return pattern, slots


def parse_engine_metrics(text: str, kind: str) -> EngineLoad | None:
    """The load in a Prometheus text exposition, summed over label sets (one engine may serve several
    models); None when the running-requests metric is absent (not that engine, or not its metrics) or
    the numbers are unusable (see the module's docstring)."""
    pattern, slots = _sample_lines(kind)
    sums: list[float | None] = [None, None, None]
    for match in pattern.finditer(text):
        try:
            value = float(match.group(2))
        except ValueError:
            continue
        if not math.isfinite(value) or value < 0:
            continue
        slot = slots[match.group(1)]
        current = sums[slot]
        sums[slot] = value if current is None else (max(current, value) if slot == 2 else current + value)
    running, waiting, usage = sums
    if running is None or not all(math.isfinite(v) for v in (running, waiting or 0.0)):
        return None
    return EngineLoad(running, waiting or 0.0, usage)


def origin_of(base_url: str) -> str:
    """``scheme://host:port`` of a base URL (engines serve ``/metrics`` at the root, not under ``/v1``)."""
    scheme, _, rest = base_url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"
