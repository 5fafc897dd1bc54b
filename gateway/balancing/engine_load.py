"""The engines' own load, read from their Prometheus ``/metrics`` (vLLM, SGLang) with the health checks.

The gateway's view of a replica's load is its own requests in flight; other gateways (or clients
that bypass it) load the same engine. When ``balancing.engine_metrics.kind`` is set, each health check
also reads the engine's running and waiting requests and its KV-cache usage, and the replica's
``external_load`` becomes what the engine reports beyond this gateway's own requests at that moment.
"""

from __future__ import annotations

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


def parse_engine_metrics(text: str, kind: str) -> EngineLoad | None:
    """The load in a Prometheus text exposition, summed over label sets (one engine may serve several
    models); None when the running-requests metric is absent (not that engine, or not its metrics)."""
    running_names, waiting_names, usage_names = METRIC_NAMES[kind]
    wanted = {name: i for i, names in enumerate((running_names, waiting_names, usage_names)) for name in names}
    sums: list[float | None] = [None, None, None]
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = len(line) - 1
        for i, char in enumerate(line):
            if char in "{ ":
                name_end = i
                break
        slot = wanted.get(line[:name_end])
        if slot is None:
            continue
        rest = line.rsplit("}", 1)[-1] if line[name_end] == "{" else line[name_end:]
        try:
            value = float(rest.split()[0])  # "value [timestamp]"
        except (ValueError, IndexError):
            continue
        if value != value:  # NaN
            continue
        current = sums[slot]
        sums[slot] = value if current is None else (max(current, value) if slot == 2 else current + value)
    if sums[0] is None:
        return None
    return EngineLoad(sums[0], sums[1] or 0.0, sums[2])


def origin_of(base_url: str) -> str:
    """``scheme://host:port`` of a base URL (engines serve ``/metrics`` at the root, not under ``/v1``)."""
    scheme, _, rest = base_url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"
