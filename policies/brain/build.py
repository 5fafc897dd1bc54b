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
import dataclasses
import functools
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from classifiers.batching import BatchingEncoder
from classifiers.encoders import load_encoder
from classifiers.heads import Head
from classifiers.offload import ScanPool
from classifiers.provider import ClassifierSignalProvider, HeadSource, RouterHeads, build_extractors
from classifiers.registry import RouterRegistry, active_marker, has_heads, is_registry, is_version_id
from policies.base import Policy
from policies.brain.active import ActiveRouter
from policies.brain.config import RoutingConfig, RoutingConfigError
from policies.brain.heads import RouteNeeds, RouterVersion, load_router_version
from policies.config import RouteConfig
from policies.experiments.arms import ArmPolicy, FixedModelPolicy, heads_key
from policies.experiments.config import ArmConfig, ArmPolicyError, ExperimentConfig, arm_route
from policies.knob import CostQualityKnob, distribution_seed
from policies.rules import RulePolicy
from policies.signals import signal_name
from policies.static import StaticPolicy

log = logging.getLogger("pointsman.routing")


class Brain:
    """Every route's policy, plus the encoder, heads and text-scan workers they share.

    ``sticky=False`` drops the routes' session stickiness and ``explore=False`` their exploration
    (offline replay is stateless and deterministic). ``routers_dir`` overrides
    ``classifiers.routers_dir``. ``watch=True`` polls a registry ``routers_dir`` (or one not there yet)
    for promotions every ``classifiers.reload_interval`` seconds once started. ``historic_scores`` seeds
    target-share knobs.
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
        self._sticky, self._explore = sticky, explore
        # Rule policies on the active router's heads, by the name their heads are chosen under (a
        # route's name; an experiment arm's heads_key): the knobs a promotion recalibrates.
        self._on_active: dict[str, RulePolicy] = {}
        needs: list[RouteNeeds] = []
        self._workflows = workflows = config.workflow_models()
        workflow_of = {model: name for name, model in workflows.items()}
        for route in config.routes:
            if route.policy == "static":
                assert route.model is not None  # enforced by config validation
                self.policies[route.name] = StaticPolicy(
                    route.name, route.model, route.fallbacks, workflow=workflow_of.get(route.model)
                )
                continue
            policy, need = self._rule_policy(route.name, route, functools.partial(self._heads_for, route.name),
                                             historic_scores=(historic_scores or {}).get(route.name, ()))
            needs.append(need)
            self.policies[route.name] = self._on_active[route.name] = policy
        # Experiments: every arm's policy (the control's is its route's own).
        self.arms: dict[str, dict[str, ArmPolicy]] = {}
        self._arm_keys: dict[str, str] = {}  # heads_key -> "experiments.<name>.arms.<arm>.policy" (for errors)
        self._fixed_versions: list[RouterVersion] = []  # router_version arms' heads
        for experiment in config.experiments:
            self.arms[experiment.name] = {
                arm.name: self._arm_policy(experiment, arm, needs) for arm in experiment.arms
            }
        self._needs = tuple(needs)
        # The marker before the version: a promotion in between is then seen by the first poll.
        self._marker = active_marker(self.routers_dir) if watch else None
        self.router = ActiveRouter(self.load_router())
        self.router.on_swap(self._recalibrate)
        self.router.on_swap(lambda _old, new: _log_reversed_heads(new))
        for key, policy in self._on_active.items():
            _seed_knob(policy, self.router.current.heads_for(key))
        # Some route or arm reads a head signal, or a route's semantic cache embeds last turns.
        self.needs_encoder = any(self.router.current.routes.values()) or any(
            any(version.routes.values()) for version in self._fixed_versions
        ) or any(route.cache is not None and route.cache.mode == "semantic" for route in config.routes)
        # A registry is watched for promotions; so is a routers_dir that is missing or empty at start-up
        # (the shipped heads serve until `pointsman train --out` makes a registry of it, then its first
        # version does). A plain directory of heads is not: a retrain into it rewrites it in place.
        self._watch = watch and settings.reload_interval > 0 and bool(self.routers_dir) and (
            is_registry(self.routers_dir) or not has_heads(Path(str(self.routers_dir)))
        )
        self._watcher: asyncio.Task[None] | None = None
        # Long requests' rule scans and redactions run in worker processes, off the event loop.
        self.scan_pool: ScanPool | None = None
        arm_routes = [policy.config for policy in self._on_active.values()]
        if settings.scan_workers != 0 and (self._scanning or _redacting([*config.routes, *arm_routes])):
            self.scan_pool = ScanPool(
                settings.scan_workers,
                inline_chars=settings.scan_inline_chars,
                queue_limit=settings.scan_queue_limit,
                timeout=settings.scan_timeout,
            )

    def _rule_policy(
        self, name: str, route: RouteConfig, heads: HeadSource, *, historic_scores: Iterable[float] = (),
        heads_name: str | None = None,
    ) -> tuple[RulePolicy, RouteNeeds]:
        """A ``policy: rules`` policy for ``route`` whose provider reads ``heads``, and what it needs
        of a router version (``heads_name``: the name its heads are chosen under, default ``name``)."""
        if not self._sticky and route.sticky is not None:
            route = route.model_copy(update={"sticky": None})
        keywords = {kw: spec.model_dump() for kw, spec in route.signals.keywords.items()}
        extractors = build_extractors(keywords)
        provider = ClassifierSignalProvider(encoder=None, heads=heads, extractors=extractors)
        policy = RulePolicy(
            name, route, provider, self.config.models,
            historic_scores=historic_scores, explore=self._explore, workflows=self._workflows,
        )
        keyed = route if heads_name is None else route.model_copy(update={"name": heads_name})
        self._providers[heads_name or name] = provider
        if policy.needed_signals & provider.rule_signals:
            self._scanning.append(provider)
        return policy, RouteNeeds(keyed, frozenset(policy.needed_signals - set(extractors)))

    def _arm_policy(self, experiment: ExperimentConfig, arm: ArmConfig, needs: list[RouteNeeds]) -> ArmPolicy:
        """The policy ``arm`` decides with (see :mod:`policies.experiments.arms`)."""
        route = self.config.route(experiment.route)
        where = f"experiments.{experiment.name}.arms.{arm.name}"
        name = experiment.name
        if arm.control and arm.kind == "route":
            return ArmPolicy(name, arm.name, self.policies[route.name], arm.kind)
        if arm.model is not None:
            workflow = {model: wf for wf, model in self._workflows.items()}.get(arm.model)
            fixed = FixedModelPolicy(route.name, name, arm.name, arm.model, route.fallbacks, workflow=workflow)
            return ArmPolicy(name, arm.name, fixed, arm.kind)
        try:
            variant = arm_route(route, arm)
        except ArmPolicyError as exc:  # checked with the config; here for a RoutingConfig built by hand
            raise RoutingConfigError("\n".join(exc.lines(f"{where}.policy"))) from exc
        key = heads_key(route.name, name, arm.name)
        if variant.policy == "static":
            assert variant.model is not None
            workflow = {model: wf for wf, model in self._workflows.items()}.get(variant.model)
            return ArmPolicy(name, arm.name, StaticPolicy(route.name, variant.model, variant.fallbacks,
                                                          workflow=workflow), arm.kind)
        if arm.router_version is None:
            self._arm_keys[key] = f"{where}.policy"
            policy, need = self._rule_policy(route.name, variant, functools.partial(self._heads_for, key),
                                             heads_name=key)
            needs.append(need)
            self._on_active[key] = policy
            return ArmPolicy(name, arm.name, policy, arm.kind)
        # A router version: the route's policy over that version's heads, loaded once (versions never change).
        holder: list[RouterVersion] = []
        pinned, need = self._rule_policy(route.name, variant, lambda: holder[0].heads_for(key), heads_name=key)
        version = self._load_version(arm.router_version, need, f"{where}.router_version")
        holder.append(version)
        self._fixed_versions.append(version)
        _seed_knob(pinned, version.heads_for(key))
        return ArmPolicy(name, arm.name, pinned, arm.kind, router_version=arm.router_version)

    def _load_version(self, version: str, need: RouteNeeds, where: str) -> RouterVersion:
        """One version of the ``classifiers.routers_dir`` registry, its heads chosen for ``need``."""
        if not is_registry(self.routers_dir):
            raise RoutingConfigError(
                f"{where}: classifiers.routers_dir ({self.routers_dir or 'not set'}) is not a router registry; "
                "a router_version arm names a version of one (pointsman train --out REGISTRY)"
            )
        assert self.routers_dir is not None
        try:
            directory = RouterRegistry(self.routers_dir).version_dir(version)
        except KeyError as exc:
            raise RoutingConfigError(f"{where}: {exc.args[0]}") from exc
        try:
            loaded = load_router_version(self.config.classifiers.encoder, directory, (need,))
        except RoutingConfigError as exc:
            raise RoutingConfigError(_rename(str(exc), need.route.name, f"{where} {version}")) from exc
        return dataclasses.replace(loaded, version=version)

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
        try:
            return load_router_version(self.config.classifiers.encoder, self.routers_dir, self._needs)
        except RoutingConfigError as exc:
            message = str(exc)
            for key, where in self._arm_keys.items():  # an arm's problems under the arm's own key
                message = _rename(message, key, where)
            raise RoutingConfigError(message) from exc

    def reload_router(self) -> RouterVersion:
        """:meth:`load_router` for the registry watcher, refusing to leave a registry version for the
        shipped heads.

        Once a registry version serves, ``routers_dir`` resolving to the shipped heads means the registry is
        gone or lost its active version (``registry.json`` or ``active.json`` deleted, the directory moved
        or unmounted): no ``pointsman`` command does that, so it is a broken registry, and the version
        serving now keeps serving (the watcher logs this error and counts a failed reload). A restart
        serves what is on disk.
        """
        version = self.load_router()
        serving = self.router.current
        if is_version_id(serving.version) and not is_version_id(version.version):
            if is_registry(self.routers_dir):
                why = "has no active version (active.json is missing)"
            else:
                why = "is no longer a router registry (no registry.json there)"
            raise RoutingConfigError(
                f"classifiers.routers_dir {self.routers_dir} {why}; keeping router version {serving.version} "
                "rather than falling back to the shipped heads"
            )
        return version

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
        requests). The new knob starts from the new head's recorded score distribution (heads trained
        by ``pointsman train``); without one it uses ``1 - target`` until ``min_samples`` scores arrive.
        """
        for name, policy in self._on_active.items():
            knob, cq = policy.knob, policy.config.cost_quality
            if knob is None or cq is None or knob.target_share is None:
                continue
            signal = signal_name(cq.signal)
            if old.heads_for(name).get(signal) is new.heads_for(name).get(signal):
                continue  # the knob does not score with a head of the router
            policy.knob = CostQualityKnob(target_share=knob.target_share, window=cq.window, min_samples=cq.min_samples)
            _seed_knob(policy, new.heads_for(name))
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
                self.router.watch(functools.partial(active_marker, self.routers_dir), self.reload_router, interval,
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
            _summary(self.router.current.heads.sources),
        )
        _log_reversed_heads(self.router.current)

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


def _rename(message: str, key: str, where: str) -> str:
    """A problem found under ``routes.<key>`` said under ``where`` (an arm's own config key)."""
    return message.replace(f"routes.{key}:", f"{where}:").replace(f"routes.{key}.", f"{where}.")


def _redacting(routes: Iterable[RouteConfig]) -> bool:
    return any(rule.action.kind == "redact" for route in routes for rule in route.rules)


def _summary(sources: Iterable[str], listed: int = 8) -> str:
    """Head names for a log line: a registry with many models has dozens of pair heads."""
    names = list(sources)
    if not names:
        return "none"
    more = f", and {len(names) - listed} more" if len(names) > listed else ""
    return ", ".join(names[:listed]) + more


def _log_reversed_heads(version: RouterVersion) -> None:
    """Say which routes read a pair head the other way round (:mod:`classifiers.heads.reverse`)."""
    for route, heads in version.routes.items():
        difficulty = heads.get("difficulty")
        if difficulty is not None and difficulty.manifest.get("reversed_from"):
            pair = difficulty.manifest["model_pair"]
            log.info("route %s: strong %s vs weak %s reads the pair head %s reversed (trained the other way "
                     "round: that data gave the higher mean quality to %s)", route, pair["strong"], pair["weak"],
                     difficulty.manifest["reversed_from"], pair["weak"])


def _seed_knob(policy: RulePolicy, heads: Mapping[str, Head]) -> None:
    """Give a target-share knob with too few scores of its own the spread its head's scores took over
    the labelled prompts it was trained on (``score_quantiles`` in the manifest, written by ``pointsman
    train``), so the target share holds from the first request instead of after ``min_samples``
    requests at ``1 - target``. The seed is the oldest part of the window: live scores replace it."""
    knob, cq = policy.knob, policy.config.cost_quality
    if knob is None or cq is None or knob.target_share is None or knob.samples >= knob.min_samples:
        return
    head = heads.get(signal_name(cq.signal))
    recorded = head.manifest.get("score_quantiles") if head is not None else None
    quantiles = recorded.get("values") if isinstance(recorded, Mapping) else None
    if not isinstance(quantiles, list):
        return
    seed = distribution_seed(quantiles, min(knob.window, max(len(quantiles), knob.min_samples)))
    if seed:
        knob.replace([*seed, *knob.scores()])
