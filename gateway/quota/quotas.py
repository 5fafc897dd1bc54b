"""Rate limits and spend budgets of one request: reserve before the call, settle after it.

:class:`Quotas` turns the config (``auth.api_keys[].limits`` / ``.budgets``, ``limits.routes``) and a
planned request into buckets and spend lines, asks its :class:`QuotaStore` once, and either returns a
:class:`Hold` (to settle when the request is finished) or raises a 429 (``rate_limit_exceeded`` /
``budget_exceeded``, with ``Retry-After``). A store that cannot be asked is handled per
``shared_state.fail``: ``open`` serves the request unmetered, ``closed`` answers 503
``shared_state_unavailable``.

Estimates: prompt tokens are the request body's bytes / 4 (JSON included: a slight over-estimate),
completion tokens the request's ``max_tokens`` (``max_completion_tokens``) or
``limits.default_completion_tokens``. A workflow's cost is reserved as its ``caps.max_cost_usd`` or, without
that cap, as ``caps.max_steps`` (else 3) calls of the dearest configured model. Settlement uses the
decision record: real usage and cost when the upstream reported them, tokens counted in a stream
without a usage chunk (one per chunk of text), nothing for a request that failed before any answer.
"""

from __future__ import annotations

import asyncio
import calendar
import datetime as dt
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.config import Budget, Config, ModelConfig, RateLimits
from gateway.errors import BudgetExceededError, PointsmanError, RateLimitError, ServiceUnavailableError
from gateway.quota._types import NANO, WINDOW_MS, Bucket, Correction, QuotaStore, QuotaUnavailable, Spend, Verdict
from policies.workflows import AnyWorkflow
from store.records import DecisionRecord

log = logging.getLogger("pointsman.quota")

_DEFAULT_WORKFLOW_CALLS = 3
#: Settlements of a shared (Redis) store are summed per key and written together this many seconds
#: after the first of them: one round trip for many requests under load, instead of one each.
SETTLE_BATCH_S = 0.02


@dataclass(slots=True)
class Hold:
    """What one admitted request reserved, to be settled when it is finished."""

    token_buckets: list[Bucket]
    spends: list[Spend]
    prompt_estimate: int
    completion_estimate: int
    price_in: float  # USD per token of the model the plan starts with (estimates of an unknown usage)
    price_out: float
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class Quotas:
    """Every configured limit and budget, over one :class:`QuotaStore`."""

    def __init__(
        self,
        config: Config,
        store: QuotaStore,
        models: Mapping[str, ModelConfig],
        metrics: Any = None,
        *,
        settle_batch_s: float = 0.0,
    ) -> None:
        self.store = store
        self.settle_batch_s = settle_batch_s
        self._buckets_due: dict[tuple[str, float], int] = {}
        self._spends_due: dict[str, int] = {}
        self._flush: asyncio.TimerHandle | asyncio.Handle | None = None
        self._periods: dict[str, tuple[str, float]] = {}  # period -> (id, ends at) of the current one
        self.prefix = config.shared_state.key_prefix
        self.fail = config.shared_state.fail
        self.default_completion = config.limits.default_completion_tokens
        self.key_limits: dict[str, RateLimits] = {k.name: k.limits for k in config.auth.api_keys if k.limits}
        self.key_budgets: dict[str, tuple[Budget, ...]] = {k.name: k.budgets for k in config.auth.api_keys if k.budgets}
        self.route_limits = dict(config.limits.routes)
        self.models = dict(models)
        self.workflows: dict[str, AnyWorkflow] = {w.name: w for w in config.workflows}
        prices = [(m.input_cost_per_mtok, m.output_cost_per_mtok) for m in self.models.values()]
        self._dearest = max(prices, key=sum, default=(0.0, 0.0))
        self.metrics = metrics
        self._settling: set[asyncio.Task[None]] = set()

    @staticmethod
    def configured(config: Config) -> bool:
        """Whether ``config`` has any limit or budget (otherwise the gateway builds no :class:`Quotas`)."""
        return bool(config.limits.routes) or any(k.limits or k.budgets for k in config.auth.api_keys)

    async def reserve(
        self, tenant: str | None, requested: str, model: str, workflow: str | None, body: Mapping[str, Any], size: int,
    ) -> Hold | None:
        """Reserve the request's limits and budgets; ``None`` when none applies (or the store is down and
        ``fail`` is ``open``). Raises 429 when a limit or budget is exhausted, 503 when closed and down."""
        key_limits = self.key_limits.get(tenant) if tenant is not None else None
        route_limits = self.route_limits.get(requested)
        budgets = self.key_budgets.get(tenant, ()) if tenant is not None else ()
        if key_limits is None and route_limits is None and not budgets:
            return None
        prompt = max(size // 4, 1)
        completion = _max_tokens(body) or self.default_completion
        tokens = prompt + completion
        buckets: list[Bucket] = []
        token_buckets: list[Bucket] = []
        for scope, ident, limits in (("key", tenant, key_limits), ("route", requested, route_limits)):
            if limits is None:
                continue
            label = f"API key '{ident}'" if scope == "key" else f"model '{ident}'"
            if limits.requests_per_minute is not None:
                buckets.append(Bucket(f"{self.prefix}rl:{scope}:{ident}:req", limits.requests_per_minute, 1,
                                      "requests", label))
            if limits.tokens_per_minute is not None:
                limit = limits.tokens_per_minute
                # A request larger than a minute's worth could never pass: it takes the whole bucket.
                bucket = Bucket(f"{self.prefix}rl:{scope}:{ident}:tok", limit, min(tokens, limit), "tokens", label)
                buckets.append(bucket)
                token_buckets.append(bucket)
        price_in, price_out = self._prices(model)
        spends: list[Spend] = []
        if budgets:
            estimate = self._estimate_usd(workflow, price_in, price_out, prompt, completion)
            now = time.time()
            for budget in budgets:
                period_id, ends_at = self._period(budget.period, now)
                spends.append(Spend(
                    key=f"{self.prefix}budget:{tenant}:{budget.period}:{period_id}",
                    limit_nano=round(budget.usd * NANO), cost_nano=max(math.ceil(estimate * NANO), 0),
                    ttl_s=int(ends_at - now) + 86_400, period=budget.period, ends_at=ends_at,
                    scope=f"API key '{tenant}'",
                ))
        try:
            verdict = await self.store.reserve(buckets, spends)
        except QuotaUnavailable as exc:
            self._unavailable(exc, buckets, spends, requested)  # raises 503 when closed
            return None
        if not verdict.allowed:
            self._count(requested, _reason(verdict, buckets, spends))
            raise _refusal(verdict, buckets, spends)
        return Hold(token_buckets, spends, prompt, completion, price_in, price_out,
                    _headers(buckets, verdict.remaining))

    def settle(self, hold: Hold, record: DecisionRecord, streamed_chunks: int | None = None) -> None:
        """Correct the reservation by what the finished request used (in the background)."""
        answered = record.status is not None and record.status < 400 and record.model is not None
        prompt, completion = record.prompt_tokens, record.completion_tokens
        if not answered and record.cost_usd is None:
            prompt, completion = 0, 0  # failed before any answer: release the whole reservation
        else:
            if prompt is None:
                prompt = hold.prompt_estimate
            if completion is None:
                completion = streamed_chunks if streamed_chunks is not None else hold.completion_estimate
        cost = record.cost_usd
        if cost is None:
            cost = (prompt * hold.price_in + completion * hold.price_out) if answered else 0.0
        corrections = [
            Correction(b.key, b.interval_ms, min(prompt + completion, b.limit) - b.cost) for b in hold.token_buckets
        ]
        corrections = [c for c in corrections if c.delta]
        spends = [(s.key, round(cost * NANO) - s.cost_nano) for s in hold.spends]
        spends = [(k, d) for k, d in spends if d]
        if not corrections and not spends:
            return
        for fix in corrections:
            due = (fix.key, fix.interval_ms)
            self._buckets_due[due] = self._buckets_due.get(due, 0) + fix.delta
        for key, delta in spends:
            self._spends_due[key] = self._spends_due.get(key, 0) + delta
        if self._flush is None:
            loop = asyncio.get_running_loop()
            self._flush = (loop.call_later(self.settle_batch_s, self._write) if self.settle_batch_s > 0
                           else loop.call_soon(self._write))

    def _write(self) -> None:
        """Write the settlements summed since the last write (one store call)."""
        self._flush = None
        corrections = [Correction(key, interval, delta)
                       for (key, interval), delta in self._buckets_due.items() if delta]
        spends = [(key, delta) for key, delta in self._spends_due.items() if delta]
        self._buckets_due.clear()
        self._spends_due.clear()
        if corrections or spends:
            task = asyncio.ensure_future(self._settle(corrections, spends))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)

    async def close(self) -> None:
        """Write the settlements not written yet, wait (briefly) for them, then close the store."""
        if self._flush is not None:
            self._flush.cancel()
            self._write()
        if self._settling:
            await asyncio.wait(set(self._settling), timeout=2.0)
        await self.store.close()

    def _period(self, period: str, now: float) -> tuple[str, float]:
        current = self._periods.get(period)
        if current is None or now >= current[1]:
            current = _period(period, dt.datetime.fromtimestamp(now, dt.UTC))
            self._periods[period] = current
        return current

    async def _settle(self, corrections: Sequence[Correction], spends: Sequence[tuple[str, int]]) -> None:
        try:
            await self.store.settle(corrections, spends)
        except QuotaUnavailable:
            self._count_unavailable("settle")  # the reservation stands: over-counted, never under

    def _unavailable(
        self, exc: QuotaUnavailable, buckets: Sequence[Bucket], spends: Sequence[Spend], requested: str
    ) -> None:
        feature = None
        if spends and self.fail.budgets == "closed":
            feature, scope = "budgets", spends[0].scope
        elif buckets and self.fail.limits == "closed":
            feature, scope = "limits", buckets[0].scope
        # One store call asks for both; each feature it held falls back or refuses, and each is counted.
        if buckets:
            self._count_unavailable("limits")
        if spends:
            self._count_unavailable("budgets")
        if feature is None:
            return  # fail open: served unmetered
        self._count(requested, "shared_state_unavailable")
        raise ServiceUnavailableError(
            f"the {feature} of {scope} cannot be checked: the shared state store is unavailable "
            f"(shared_state.fail.{feature}: closed); retry shortly",
            code="shared_state_unavailable", headers={"Retry-After": "1"},
        ) from exc

    def _prices(self, model: str) -> tuple[float, float]:
        config = self.models.get(model)
        if config is None:
            return self._dearest[0] / 1e6, self._dearest[1] / 1e6
        return config.input_cost_per_mtok / 1e6, config.output_cost_per_mtok / 1e6

    def _estimate_usd(
        self, workflow: str | None, price_in: float, price_out: float, prompt: int, completion: int
    ) -> float:
        flow = self.workflows.get(workflow) if workflow is not None else None
        if flow is None:
            return prompt * price_in + completion * price_out
        if flow.caps.max_cost_usd is not None:
            return flow.caps.max_cost_usd
        calls = flow.caps.max_steps or _DEFAULT_WORKFLOW_CALLS
        return calls * (prompt * self._dearest[0] + completion * self._dearest[1]) / 1e6

    def _count(self, requested: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.quota_refused.labels(requested, reason).inc()

    def _count_unavailable(self, feature: str) -> None:
        if self.metrics is not None:
            self.metrics.shared_state_unavailable.labels(feature).inc()


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            n = body.get("n")
            return value * (n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 128 else 1)
    return None


def _period(period: str, now: dt.datetime) -> tuple[str, float]:
    """The UTC period ``now`` is in (``2025-01-31`` / ``2025-01``) and when it ends (epoch seconds)."""
    if period == "day":
        start = dt.datetime(now.year, now.month, now.day, tzinfo=dt.UTC)
        return start.strftime("%Y-%m-%d"), (start + dt.timedelta(days=1)).timestamp()
    days = calendar.monthrange(now.year, now.month)[1]
    start = dt.datetime(now.year, now.month, 1, tzinfo=dt.UTC)
    return start.strftime("%Y-%m"), (start + dt.timedelta(days=days)).timestamp()


def _reason(verdict: Verdict, buckets: Sequence[Bucket], spends: Sequence[Spend]) -> str:
    if verdict.refused < len(buckets):
        return f"rate_limit_{buckets[verdict.refused].unit}"
    return f"budget_{spends[verdict.refused - len(buckets)].period}"


def _refusal(verdict: Verdict, buckets: Sequence[Bucket], spends: Sequence[Spend]) -> PointsmanError:
    retry = max(math.ceil(verdict.retry_after_ms / 1000.0), 1)
    if verdict.refused < len(buckets):
        bucket = buckets[verdict.refused]
        what = "request" if bucket.unit == "requests" else f"request (~{bucket.cost} tokens)"
        # The store refused when this request's own interval would have pushed the bucket's TAT past the
        # window: retry_after = TAT + cost x interval - now - window. The bucket itself (nothing was taken)
        # is full again at its TAT, so the reset is TAT - now, never more than the window.
        reset_ms = verdict.retry_after_ms + WINDOW_MS - bucket.interval_ms * bucket.cost
        left = math.floor(max(WINDOW_MS - reset_ms, 0.0) / bucket.interval_ms)
        return RateLimitError(
            f"Rate limit reached for {bucket.scope}: {bucket.limit} {bucket.unit} per minute; "
            f"this {what} fits again in {retry}s",
            headers={"Retry-After": str(retry), **dict(_limit_headers(bucket, left, reset_ms))},
        )
    spend = spends[verdict.refused - len(buckets)]
    return BudgetExceededError(
        f"Budget exceeded for {spend.scope}: ${spend.limit_nano / NANO:g} per {spend.period} "
        f"(${verdict.spent_nano / NANO:.4f} spent or reserved, this request is estimated at "
        f"${spend.cost_nano / NANO:.4f}); the {spend.period} ends in {retry}s (UTC)",
        headers={"Retry-After": str(retry)},
    )


def _limit_headers(bucket: Bucket, remaining: int, reset_ms: float) -> list[tuple[str, str]]:
    kind = bucket.unit
    return [
        (f"x-ratelimit-limit-{kind}", str(bucket.limit)),
        (f"x-ratelimit-remaining-{kind}", str(max(remaining, 0))),
        (f"x-ratelimit-reset-{kind}", f"{max(reset_ms, 0.0) / 1000.0:.3f}s"),
    ]


def _headers(buckets: Sequence[Bucket], remaining: Sequence[tuple[int, float]]) -> list[tuple[bytes, bytes]]:
    """OpenAI's ``x-ratelimit-*`` headers for the tightest request and token bucket."""
    tightest: dict[str, tuple[Bucket, int, float]] = {}
    for bucket, (left, reset) in zip(buckets, remaining, strict=True):
        held = tightest.get(bucket.unit)
        if held is None or left < held[1]:
            tightest[bucket.unit] = (bucket, left, reset)
    return [
        (name.encode(), value.encode())
        for bucket, left, reset in tightest.values()
        for name, value in _limit_headers(bucket, left, reset)
    ]
