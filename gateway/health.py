"""Active health checks: each replica is probed on its own schedule while the gateway runs.

A replica is marked down after ``unhealthy_after`` failed probes and up after ``healthy_after``
passing ones. A passing probe of a healthy replica also returns it to service if its breaker had
ejected it (Envoy's ``successful_active_health_check_uneject_host``): traffic resumes as soon as
the upstream answers again, not after the breaker's cooldown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.balancing.engine_load import origin_of, parse_engine_metrics
from gateway.pool import BackendPool, Replica
from gateway.upstream import UpstreamClient, UpstreamFailure

log = logging.getLogger("pointsman.health")


class HealthChecker:
    """Marks replicas down after ``unhealthy_after`` failed probes and up after ``healthy_after`` good ones."""

    def __init__(self, pool: BackendPool, client: UpstreamClient) -> None:
        self._pool = pool
        self._client = client
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for replica in self._pool.replicas():
            if replica.backend.config.health.enabled:
                self._tasks.append(asyncio.create_task(self._run(replica), name=f"health:{replica.base_url}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def check_once(self, replica: Replica) -> bool:
        """Probe one replica now and update its state; returns whether the probe passed."""
        settings = replica.backend.config.health
        headers = {"Authorization": replica.backend.auth_header} if replica.backend.auth_header else {}
        try:
            status = await self._client.get_status(replica.request_url + settings.path, headers, settings.timeout)
            passed = status < 500
        except UpstreamFailure:
            passed = False
        self._note(replica, passed)
        return passed

    def _note(self, replica: Replica, passed: bool) -> None:
        """Count one probe's result and mark the replica up or down when its run is long enough."""
        settings = replica.backend.config.health
        if passed:
            replica.consecutive_health_failures = 0
            replica.consecutive_health_successes += 1
            if not replica.healthy and replica.consecutive_health_successes >= settings.healthy_after:
                replica.healthy = True
                log.info("replica %s of backend %s is healthy again", replica.base_url, replica.backend.name)
            if replica.healthy:
                replica.breaker.return_to_service()
        else:
            replica.consecutive_health_successes = 0
            replica.consecutive_health_failures += 1
            if replica.healthy and replica.consecutive_health_failures >= settings.unhealthy_after:
                replica.healthy = False
                replica.backend.lost(replica)
                log.warning("replica %s of backend %s failed health checks", replica.base_url, replica.backend.name)

    async def read_engine_load(self, replica: Replica) -> bool:
        """Read the engine's own load into ``replica`` (``balancing.engine_metrics``); False when it
        could not be read (the replica then counts only this gateway's requests)."""
        settings = replica.backend.config.balancing.engine_metrics
        headers = {"Authorization": replica.backend.auth_header} if replica.backend.auth_header else {}
        ours = replica.outstanding  # before the await: what this gateway had in flight as the engine counted
        load = None
        try:
            status, body = await self._client.get(
                origin_of(replica.request_url) + settings.path, headers, replica.backend.config.health.timeout
            )
            if status == 200:
                load = parse_engine_metrics(body.decode("utf-8", "replace"), settings.kind)
        except UpstreamFailure:
            pass
        if load is None:
            replica.external_load, replica.kv_cache_usage = 0.0, None
            return False
        replica.external_load = max(load.running + load.waiting - ours, 0.0)
        replica.kv_cache_usage = load.kv_cache_usage
        return True

    async def _run(self, replica: Replica) -> None:
        interval = replica.backend.config.health.interval
        engine = replica.backend.config.balancing.engine_metrics.kind != "none"
        raised = False  # the last round raised: logged once per run of such rounds
        while True:
            try:
                if await self.check_once(replica) and engine:
                    await self.read_engine_load(replica)
                raised = False
            except Exception:
                # Not a failed probe (those are UpstreamFailure) but one that could not be made: the
                # loop must go on, or the replica's state would freeze as it is (up, for ever).
                if not raised:
                    log.exception("health check of replica %s of backend %s raised", replica.base_url,
                                  replica.backend.name)
                raised = True
                self._note(replica, False)
            await asyncio.sleep(interval)
