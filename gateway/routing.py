"""Builds each route's policy from the config and owns the shared routing-brain resources.

Static routes get a :class:`StaticPolicy`. ``policy: rules`` routes get a :class:`RulePolicy`
whose signal provider computes rule signals (PII, jailbreak, tools, length, keyword lists) and,
when a rule, the cost–quality knob or the multi-model choice asks for them, the trained heads'
signals (difficulty, domain, per-model quality) over one shared, micro-batched, cached encoder.
The encoder is only loaded when some policy needs it, so a gateway without such routes never imports torch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from classifiers.batching import BatchingEncoder
from classifiers.encoders import load_encoder
from classifiers.offload import ScanPool
from classifiers.provider import ClassifierSignalProvider, RouterHeads, build_extractors, load_router_heads
from gateway.config import Config
from gateway.errors import ConfigError
from gateway.shared_state import SharedState
from policies import Policy, StaticPolicy
from policies.config import RouteConfig
from policies.rules import RulePolicy
from policies.signals import signal_name
from policies.utility import ModelInfo
from policies.validation import quality_label_problems

log = logging.getLogger("pointsman.routing")


class RoutingBrain:
    """Every route's policy, plus the encoder and heads they share."""

    def __init__(self, config: Config, historic_scores: Mapping[str, Iterable[float]] | None = None) -> None:
        self.config = config
        self.encoder: BatchingEncoder | None = None
        settings = config.classifiers
        try:
            self.heads: RouterHeads = load_router_heads(settings.encoder, settings.routers_dir)
        except ValueError as exc:  # an unusable artifact (wrong encoder, bad hash, two quality heads)
            raise ConfigError(f"classifiers.routers_dir: {exc}") from exc
        models = _model_infos(config)
        self.policies: dict[str, Policy] = {}
        self._providers: dict[str, ClassifierSignalProvider] = {}
        self._scanning: list[ClassifierSignalProvider] = []  # of the routes that run rule signals
        self.needs_encoder = False  # whether some policy uses a head signal (difficulty, domain)
        for route in config.routes:
            if route.policy == "static":
                assert route.model is not None  # enforced by config validation
                self.policies[route.name] = StaticPolicy(route.name, route.model, route.fallbacks)
                continue
            keywords = {name: spec.model_dump() for name, spec in route.signals.keywords.items()}
            provider = ClassifierSignalProvider(encoder=None, heads=self.heads, extractors=build_extractors(keywords))
            policy = RulePolicy(
                route.name, route, provider, models,
                historic_scores=(historic_scores or {}).get(route.name, ()),
            )
            missing = set(policy.needed_signals) - provider.available - provider.head_signals
            problems = self._quality_problems(route, missing)
            missing -= {signal_name(route.multi_model.quality_signal)} if route.multi_model else set()
            if missing:
                problems.insert(0, (
                    f"routes.{route.name}: signal(s) {', '.join(sorted(missing))} cannot be computed "
                    f"(no trained head for encoder {settings.encoder!r} in the router artifacts)"
                ))
            if problems:
                raise ConfigError("\n  ".join(problems))
            self.policies[route.name] = policy
            self._providers[route.name] = provider
            self.needs_encoder |= bool(set(policy.needed_signals) & provider.head_signals)
            if set(policy.needed_signals) & provider.rule_signals:
                self._scanning.append(provider)
        # Sticky routes keep their sessions in Redis when replicas must share them.
        self._sticky_routes = {
            name: policy for name, policy in self.policies.items()
            if isinstance(policy, RulePolicy) and policy.sessions is not None
        }
        self.shared_state: SharedState | None = None
        if config.shared_state.kind == "redis" and self._sticky_routes:
            self.shared_state = SharedState(config.shared_state)
        # Long requests' rule scans and redactions run in worker processes, off the event loop.
        self.scan_pool: ScanPool | None = None
        if settings.scan_workers != 0 and (self._scanning or self._redacting(config)):
            self.scan_pool = ScanPool(
                settings.scan_workers,
                inline_chars=settings.scan_inline_chars,
                queue_limit=settings.scan_queue_limit,
                timeout=settings.scan_timeout,
            )

    def _quality_problems(self, route: RouteConfig, missing: set[str]) -> list[str]:
        """A ``multi_model`` route's quality signal: computable, and scoring every candidate."""
        mm = route.multi_model
        if mm is None:
            return []
        name = signal_name(mm.quality_signal)
        root = f"routes.{route.name}"
        encoder = self.config.classifiers.encoder
        if name in missing:
            if name != "quality":
                return [f"{root}.multi_model.quality_signal: signal {name!r} cannot be computed"]
            return [
                f"{root}.multi_model.quality_signal: signal 'quality' cannot be computed: no quality head for encoder "
                f"{encoder!r} (quality-<source>-{encoder}/) in {self.heads.root} (classifiers.routers_dir). "
                f"Train one with `pointsman train --quality routerbench --encoders {encoder} --out DIR` "
                "and set classifiers.routers_dir: DIR"
            ]
        head = self.heads.quality
        if name != "quality" or head is None:
            return []
        source = f"the quality head {head.manifest.get('name', self.heads.sources.get('quality'))}"
        return [f"{root}.{key}: {message}" for key, message in quality_label_problems(mm, head.labels, source)]

    @staticmethod
    def _redacting(config: Config) -> bool:
        return any(rule.action.kind == "redact" for route in config.routes for rule in route.rules)

    async def start(self) -> None:
        """Start the text-scan workers if some route scans text; connect the shared session store if
        configured; load the encoder (in a thread: it may take seconds) if some policy needs head
        signals."""
        if self.scan_pool is not None:
            await self.scan_pool.start()
            for provider in self._scanning:
                provider.attach_scan_pool(self.scan_pool)
        if self.shared_state is not None:
            await self.shared_state.start()
            for policy in self._sticky_routes.values():
                sticky = policy.config.sticky
                assert sticky is not None  # a policy only has sessions when its route is sticky
                policy.use_session_store(self.shared_state.session_store(sticky.ttl))
            log.info("session stickiness shared through Redis for route(s) %s", ", ".join(self._sticky_routes))
        if not self.needs_encoder:
            return
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
            "routing encoder %s loaded (%s; heads: %s)",
            encoder.id,
            getattr(encoder, "runtime", "in-process"),
            ", ".join(self.heads.sources) or "none",
        )

    async def close(self) -> None:
        """Release the encoder's workers, the Redis connection and the text-scan workers."""
        if self.encoder is not None:
            await self.encoder.close()
            self.encoder = None
        if self.shared_state is not None:
            await self.shared_state.close()
        if self.scan_pool is not None:
            await self.scan_pool.close()

    @staticmethod
    def knob_windows_of(config: Config) -> dict[str, int]:
        """Routes whose cost–quality knob calibrates from recent traffic, and how many scores it keeps."""
        return {
            route.name: route.cost_quality.window
            for route in config.routes
            if route.cost_quality is not None and route.cost_quality.target_strong_share is not None
        }


def historic_knob_scores(records: Iterable[Any], routes: Mapping[str, int]) -> dict[str, list[float]]:
    """Scores the knob logged for ``routes`` in past decision records (newest last, per window)."""
    scores: dict[str, list[float]] = {name: [] for name in routes}
    for record in records:
        if record.route not in scores:
            continue
        score = (record.decision or {}).get("details", {}).get("score")
        if isinstance(score, (int, float)):
            scores[record.route].append(float(score))
    return {name: values[-routes[name]:] for name, values in scores.items()}


def _model_infos(config: Config) -> dict[str, ModelInfo]:
    infos = {
        m.name: ModelInfo(
            name=m.name, input_cost_per_mtok=m.input_cost_per_mtok, output_cost_per_mtok=m.output_cost_per_mtok,
            context_window=m.context_window, tags=frozenset(m.tags),
        )
        for backend in config.backends
        for m in backend.models
    }
    local = config.local_model
    if local.enabled and local.model_name not in infos:
        infos[local.model_name] = ModelInfo(
            name=local.model_name, context_window=local.n_ctx, tags=frozenset({"local", "cheap"})
        )
    return infos
