"""The gateway's routing brain: :class:`policies.brain.Brain` plus what only serving needs.

Building every route's policy from the config lives below the gateway (``policies.brain``), so
``pointsman eval`` replays a route with the code that serves it. This wrapper adds the parts that
belong to serving many replicas — session stickiness shared through Redis — and translates the
brain's :class:`RoutingConfigError` into the gateway's :class:`ConfigError` at this one boundary.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.config import Config
from gateway.errors import ConfigError
from gateway.redis_failures import stop_task
from gateway.shared_state import RedisKnobWindow, RedisSessionStore, SharedState
from policies.brain import Brain, RoutingConfigError, build_brain, knob_windows
from policies.rules import RulePolicy

log = logging.getLogger("pointsman.routing")


class RoutingBrain(Brain):
    """Every route's policy, plus the encoder and heads they share and, when ``shared_state`` is
    Redis, the sticky routes' shared session store. ``watch=True`` (serving) picks up registry
    promotions without a restart."""

    def __init__(
        self,
        config: Config,
        historic_scores: Mapping[str, Iterable[float]] | None = None,
        *,
        watch: bool = False,
    ) -> None:
        try:
            super().__init__(config.routing(), historic_scores=historic_scores, watch=watch)
        except RoutingConfigError as exc:
            raise ConfigError(str(exc)) from exc
        self.gateway_config = config
        # Sticky routes keep their sessions in Redis when replicas must share them.
        self._sticky_routes = {
            name: policy for name, policy in self.policies.items()
            if isinstance(policy, RulePolicy) and policy.sessions is not None
        }
        # Experiment arms with their own sticky policy (the control's is its route's): their sessions are
        # kept apart from the route's, under their own key prefix.
        self._sticky_arms = {
            f"{experiment}:{arm}": held.policy
            for experiment, arms in self.arms.items() for arm, held in arms.items()
            if isinstance(held.policy, RulePolicy) and held.policy.sessions is not None
            and held.policy not in self._sticky_routes.values()
        }
        # Target-share knobs calibrate on one window shared by every replica (routes only, not arms).
        self._shared_knobs = {
            name: policy for name, policy in self.policies.items()
            if isinstance(policy, RulePolicy) and policy.knob is not None and policy.knob.target_share is not None
        }
        self.knob_windows: dict[str, RedisKnobWindow] = {}
        self._knob_tasks: list[asyncio.Task[None]] = []
        self.shared_state: SharedState | None = None
        quotas = bool(config.limits.routes) or any(k.limits or k.budgets for k in config.auth.api_keys)
        hints = any(b.balancing.shares_hints for b in config.backends)  # replica affinity across gateways
        if config.shared_state.kind == "redis" and (
            self._sticky_routes or self._sticky_arms or self._shared_knobs or quotas or hints
        ):
            self.shared_state = SharedState(config.shared_state)

    async def start(self) -> None:
        """Connect the shared session store if configured, then start the brain (scan workers,
        encoder, registry watch)."""
        if self.shared_state is not None:
            await self.shared_state.start()
            for policy in self._sticky_routes.values():
                sticky = policy.config.sticky
                assert sticky is not None  # a policy only has sessions when its route is sticky
                policy.use_session_store(self.shared_state.session_store(sticky.ttl))
            for key, policy in self._sticky_arms.items():
                sticky = policy.config.sticky
                assert sticky is not None
                prefix = f"{self.shared_state.config.key_prefix}arm:{key}:"
                policy.use_session_store(RedisSessionStore(self.shared_state.client, prefix, sticky.ttl))
            if self._sticky_routes:
                log.info("session stickiness shared through Redis for route(s) %s", ", ".join(self._sticky_routes))
            await self._share_knobs(self.shared_state)
        await super().start()

    async def _share_knobs(self, shared: SharedState) -> None:
        """Calibrate every target-share knob on its route's window in Redis (one sync now, then in the
        background every ``shared_state.knob_sync_interval`` seconds)."""
        for name, policy in self._shared_knobs.items():
            window = RedisKnobWindow(shared.client, shared.config.key_prefix, name, policy,
                                     lambda: self.router.version)
            self.knob_windows[name] = window
            await window.sync()
            self._knob_tasks.append(asyncio.create_task(window.run(shared.config.knob_sync_interval),
                                                        name=f"pointsman-knob-sync-{name}"))
        if self._shared_knobs:
            log.info("knob windows shared through Redis for route(s) %s", ", ".join(self._shared_knobs))

    async def close(self) -> None:
        """Release the brain's workers and the Redis connection."""
        for window in self.knob_windows.values():
            window.stop()
        for task in self._knob_tasks:
            await stop_task(task)
        self._knob_tasks.clear()
        await super().close()
        if self.shared_state is not None:
            await self.shared_state.close()

    @staticmethod
    def knob_windows_of(config: Config) -> dict[str, int]:
        """Routes whose cost–quality knob calibrates from recent traffic, and how many scores it keeps."""
        return knob_windows(config.routes)


def offline_brain(config: Config) -> Brain:
    """The routing brain of an offline explanation (``pointsman route``, ``pointsman probe``): every route's
    policy and the heads they read, with no shared state. Nothing connects to Redis, so an explanation works where the
    gateways' Redis is out of reach, and session stickiness is off, as ``pointsman eval`` replays: a prompt
    is decided as a conversation's first turn (a live session's pin is serving state, not the routing
    decision this explains). Raises :class:`ConfigError` as :class:`RoutingBrain` does."""
    try:
        return build_brain(config.routing(), sticky=False)
    except RoutingConfigError as exc:
        raise ConfigError(str(exc)) from exc


def sticky_routes(config: Config) -> list[str]:
    """The routes whose session stickiness an offline explanation leaves out (see :func:`offline_brain`)."""
    return [route.name for route in config.routes if route.sticky is not None and route.sticky.enabled]


def historic_knob_scores(
    records: Iterable[Any], routes: Mapping[str, int], version: str | None = None
) -> dict[str, list[float]]:
    """Scores the knob logged for ``routes`` in past decision records (newest last, per window).

    With ``version``, only the scores of that router version count (and those of records written
    before versions were recorded): another version's head scores on its own scale.
    """
    scores: dict[str, list[float]] = {name: [] for name in routes}
    for record in records:
        if record.route not in scores:
            continue
        if version is not None and getattr(record, "router_version", None) not in (None, version):
            continue
        score = (record.decision or {}).get("details", {}).get("score")
        if isinstance(score, (int, float)):
            scores[record.route].append(float(score))
    return {name: values[-routes[name]:] for name, values in scores.items()}
