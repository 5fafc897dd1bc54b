"""Every route's policy built from a :class:`RoutingConfig`, with the encoder and heads they share.

Static routes get a :class:`StaticPolicy`. ``policy: rules`` routes get a :class:`RulePolicy` whose
signal provider computes rule signals (PII, jailbreak, tools, length, keyword lists) and, when a rule,
the cost–quality knob or the multi-model choice asks for them, the trained heads' signals
(difficulty, domain, per-model quality) over one shared, micro-batched, cached encoder. The encoder
is only loaded when some policy needs it, so a brain without such routes never imports torch.

The heads come from one router version (:mod:`policies.brain.heads`), held by an
:class:`ActiveRouter` that a registry promotion swaps without a restart when the brain watches it.
The gateway serves with this brain (adding what only serving needs: Redis-shared sessions) and
``pointsman eval`` replays with it, so both decide with the same code.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from classifiers.batching import BatchingEncoder
from classifiers.encoders import load_encoder
from classifiers.heads import Head
from classifiers.offload import ScanPool
from classifiers.provider import ClassifierSignalProvider, RouterHeads, build_extractors
from classifiers.registry import active_marker, is_registry
from policies.base import Policy
from policies.brain.active import ActiveRouter
from policies.brain.config import RoutingConfig
from policies.brain.heads import RouteNeeds, RouterVersion, load_router_version
from policies.config import RouteConfig
from policies.knob import CostQualityKnob
from policies.rules import RulePolicy
from policies.signals import signal_name
from policies.static import StaticPolicy

log = logging.getLogger("pointsman.routing")


class Brain:
    """Every route's policy, plus the encoder, heads and text-scan workers they share.

    ``sticky=False`` drops the routes' session stickiness and ``explore=False`` their exploration
    (offline replay is stateless and deterministic). ``routers_dir`` overrides
    ``classifiers.routers_dir``. ``watch=True`` polls a registry ``routers_dir`` for promotions every
    ``classifiers.reload_interval`` seconds once started. ``historic_scores`` seeds target-share knobs.
    Raises :class:`~policies.brain.config.RoutingConfigError` naming the key when a route cannot be served.
    """

    def __init__(
        self,
        config: RoutingConfig,
        *,
        historic_scores: Mapping[str, Iterable[float]] | None = None,
        sticky: bool = True,
        explore: bool = True,
        routers_dir: str | Path | None = None,
        watch: bool = False,
    ) -> None:
        self.config = config
        settings = config.classifiers
        self.routers_dir = str(routers_dir) if routers_dir is not None else settings.routers_dir
        self.encoder: BatchingEncoder | None = None
        self.policies: dict[str, Policy] = {}
        self._providers: dict[str, ClassifierSignalProvider] = {}
        self._scanning: list[ClassifierSignalProvider] = []  # of the routes that run rule signals
        needs: list[RouteNeeds] = []
        workflows = config.workflow_models()
        workflow_of = {model: name for name, model in workflows.items()}
        for route in config.routes:
            if route.policy == "static":
                assert route.model is not None  # enforced by config validation
                self.policies[route.name] = StaticPolicy(
                    route.name, route.model, route.fallbacks, workflow=workflow_of.get(route.model)
                )
                continue
            if not sticky and route.sticky is not None:
                route = route.model_copy(update={"sticky": None})
            keywords = {name: spec.model_dump() for name, spec in route.signals.keywords.items()}
            extractors = build_extractors(keywords)
            provider = ClassifierSignalProvider(
                encoder=None, heads=functools.partial(self._heads_for, route.name), extractors=extractors
            )
            policy = RulePolicy(
                route.name, route, provider, config.models,
                historic_scores=(historic_scores or {}).get(route.name, ()), explore=explore, workflows=workflows,
            )
            needs.append(RouteNeeds(route, frozenset(policy.needed_signals - set(extractors))))
            self.policies[route.name] = policy
            self._providers[route.name] = provider
            if policy.needed_signals & provider.rule_signals:
                self._scanning.append(provider)
        self._needs = tuple(needs)
        # The marker before the version: a promotion in between is then seen by the first poll.
        self._marker = active_marker(self.routers_dir) if watch else None
        self.router = ActiveRouter(self.load_router())
        self.router.on_swap(self._recalibrate)
        self.needs_encoder = any(self.router.current.routes.values())  # some route reads a head signal
        self._watch = watch and is_registry(self.routers_dir) and settings.reload_interval > 0
        self._watcher: asyncio.Task[None] | None = None
        # Long requests' rule scans and redactions run in worker processes, off the event loop.
        self.scan_pool: ScanPool | None = None
        if settings.scan_workers != 0 and (self._scanning or _redacting(config.routes)):
            self.scan_pool = ScanPool(
                settings.scan_workers,
                inline_chars=settings.scan_inline_chars,
                queue_limit=settings.scan_queue_limit,
                timeout=settings.scan_timeout,
            )

    @property
    def router_version(self) -> str:
        """The active router version (registry version id, ``dir-…`` or ``bundled-…``)."""
        return self.router.version

    @property
    def heads(self) -> RouterHeads:
        """Every head of the active router version (a route reads its own choice: :meth:`RouterVersion.heads_for`)."""
        return self.router.current.heads

    def load_router(self) -> RouterVersion:
        """Load the router version ``routers_dir`` resolves to now, checked against every route (blocking:
        call it in a thread on a running loop)."""
        return load_router_version(self.config.classifiers.encoder, self.routers_dir, self._needs)

    def policy(self, route: str) -> Policy:
        """The policy of ``route`` (``KeyError`` naming the configured routes otherwise)."""
        try:
            return self.policies[route]
        except KeyError:
            known = ", ".join(self.policies) or "none"
            raise KeyError(f"no route {route!r} in the config (routes: {known})") from None

    def _heads_for(self, route: str) -> Mapping[str, Head]:
        return self.router.heads_for(route)

    def _recalibrate(self, old: RouterVersion, new: RouterVersion) -> None:
        """Empty the calibration window of every target-share knob that scores with a head.

        The window holds the old version's scores; a new head scores on its own scale, and a threshold
        read from the old scores would miss the target share until the window refilled (thousands of
        requests). Emptied, the knob uses ``1 - target`` until ``min_samples`` new scores arrive.
        """
        for name, policy in self.policies.items():
            if not isinstance(policy, RulePolicy):
                continue
            knob, cq = policy.knob, policy.config.cost_quality
            if knob is None or cq is None or knob.target_share is None:
                continue
            signal = signal_name(cq.signal)
            if old.heads_for(name).get(signal) is new.heads_for(name).get(signal):
                continue  # the knob does not score with a head of the router
            policy.knob = CostQualityKnob(target_share=knob.target_share, window=cq.window, min_samples=cq.min_samples)
            log.info("route %s: knob recalibrates on router %s (target strong share %g)", name, new.version,
                     knob.target_share)

    async def start(self) -> None:
        """Start the text-scan workers if some route scans text, load the encoder (in a thread: it may
        take seconds) if some policy needs head signals, and start watching the registry."""
        if self.scan_pool is not None:
            await self.scan_pool.start()
            for provider in self._scanning:
                provider.attach_scan_pool(self.scan_pool)
        if self.needs_encoder:
            await self._load_encoder()
        if self._watch:
            assert self._marker is not None
            interval = self.config.classifiers.reload_interval
            self._watcher = asyncio.create_task(
                self.router.watch(functools.partial(active_marker, self.routers_dir), self.load_router, interval,
                                  seen=self._marker),
                name="pointsman-router-watch",
            )
            log.info("watching router registry %s every %gs (active version %s)", self.routers_dir, interval,
                     self.router_version)

    async def _load_encoder(self) -> None:
        settings = self.config.classifiers
        encoder = await asyncio.to_thread(
            load_encoder,
            settings.encoder,
            threads=settings.encoder_threads,
            dtype=settings.minilm_dtype,
            runtime=settings.minilm_runtime,
        )
        self.encoder = BatchingEncoder(encoder, cache_size=settings.cache_size, max_batch=settings.max_batch)
        self.encoder.start()
        # Warm-up: the first forward pass pays one-off costs (allocations, lazy init) that no
        # client request should see.
        await self.encoder.encode("warm-up")
        for provider in self._providers.values():
            provider.attach_encoder(self.encoder)
        log.info(
            "routing encoder %s loaded (%s; router %s, heads: %s)",
            encoder.id,
            getattr(encoder, "runtime", "in-process"),
            self.router_version,
            ", ".join(self.router.current.heads.sources) or "none",
        )

    async def close(self) -> None:
        """Stop watching, release the encoder's workers and the text-scan workers."""
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
        if self.encoder is not None:
            await self.encoder.close()
            self.encoder = None
        if self.scan_pool is not None:
            await self.scan_pool.close()


def build_brain(
    config: RoutingConfig,
    *,
    sticky: bool = True,
    explore: bool = True,
    routers_dir: str | Path | None = None,
    watch: bool = False,
    historic_scores: Mapping[str, Iterable[float]] | None = None,
) -> Brain:
    """Every route's policy for ``config`` (see :class:`Brain`; offline replay passes
    ``sticky=False, explore=False``). Call ``await brain.start()`` before deciding and ``close()`` after."""
    return Brain(config, historic_scores=historic_scores, sticky=sticky, explore=explore,
                 routers_dir=routers_dir, watch=watch)


def knob_windows(routes: Iterable[RouteConfig]) -> dict[str, int]:
    """Routes whose cost–quality knob calibrates from recent traffic, and how many scores it keeps."""
    return {
        route.name: route.cost_quality.window
        for route in routes
        if route.cost_quality is not None and route.cost_quality.target_strong_share is not None
    }


def _redacting(routes: Iterable[RouteConfig]) -> bool:
    return any(rule.action.kind == "redact" for route in routes for rule in route.rules)
