"""Counterfactual comparisons: the answers the decision did not serve, scored by a judge model.

The decision log only shows the outcome of the model that answered. A route with ``compare:`` also
asks, for a sampled ``share`` of its requests, the decision's other candidate(s) (the knob's other
model, the other ``multi_model`` candidates) with the same, already redacted body, and a judge model
compares each pair twice, in both orders, so a judge that favours the first (or second) answer
cancels out: win 1, tie 0.5, loss 0, averaged over the two orders. The scores become feedback rows
(``source: judge``, ``metric: quality``, one per model) through the decision recorder.

It all happens after the served answer is complete and off the request path: nothing here may
delay or fail a client's request. Every comparison is bounded (``max_concurrency`` in flight per
route, ``budget_usd_per_hour`` over a rolling hour, estimated from the configured prices); what is
over a bound is skipped and counted, never queued. Served requests come first: while they keep the
event loop's thread busy (:class:`LoopLoad`), a comparison waits (in flight, up to ``MAX_DEFER``
seconds) before making its calls, so a CPU-bound gateway runs few comparisons and skips the rest.
:meth:`CompareRunner.close` cancels whatever is still running (the gateway calls it on shutdown,
before the recorder flushes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from classifiers.messages import content_texts, iter_messages, message_list, tool_calls_of
from classifiers.offload import with_model_first
from gateway.completion_bounds import output_ceiling, requested_completion, with_max_tokens
from gateway.config import Config
from gateway.errors import PointsmanError
from gateway.forward import Completed, Forwarder
from gateway.pool import BackendPool
from gateway.protocol import CHAT
from gateway.trace import RequestTrace
from gateway.usage import cost_usd
from policies.config import Compare
from policies.explore import sampled
from store.outcomes import JUDGE_SOURCE, QUALITY_METRIC
from store.recorder import DecisionRecorder
from store.records import DecisionRecord, FeedbackRecord

log = logging.getLogger("pointsman.compare")

COMPARE_PURPOSE = "compare"  # salt of the sampling hash: independent of exploration's
HOUR = 3600.0
#: A comparison waits while the event loop's thread is busier than this (share of a core; a gateway
#: serving flat out from a zero-latency upstream measured ~0.7, at 16 x 50 ms requests ~0.4) ...
BUSY_LOAD = 0.6
#: ... for at most this long (seconds), then runs anyway.
MAX_DEFER = 10.0
#: Caps on what the judge reads: the conversation's most recent part, each answer's beginning.
TRANSCRIPT_CHARS = 12_000
MESSAGE_CHARS = 4_000
ANSWER_CHARS = 6_000
# Under a budget, the other candidate may write at most this many times the served answer's tokens,
# at least COMPARE_MIN_COMPLETION (about what the judge reads of an answer: ANSWER_CHARS), at most
# what the client asked: what the call can cost is then known before it is made, and the budget holds.
# An answer cut there is not judged (it would lose for being cut, or be a reasoning model's thought).
COMPARE_LENGTH_FACTOR = 4
COMPARE_MIN_COMPLETION = 1536

DEFAULT_JUDGE_PROMPT = """\
Please act as an impartial judge and evaluate the quality of the answers two AI assistants gave \
to the conversation below. Choose the assistant that follows the user's instructions and answers \
the user's last message better; consider helpfulness, correctness, relevance, depth and clarity. \
Do not let the order of the answers, their length or the assistants' names influence you. \
Output only your verdict: "[[A]]" if assistant A is better, "[[B]]" if assistant B is better, \
"[[tie]]" if they are equally good.

[Conversation]
{conversation}

[Assistant A's answer]
{answer_a}
[End of assistant A's answer]

[Assistant B's answer]
{answer_b}
[End of assistant B's answer]"""

OUTCOMES = (
    "started", "deferred", "judged", "skipped_concurrency", "skipped_budget", "skipped_no_answer",
    "candidate_error", "candidate_truncated",
    "judge_error", "unparseable", "cancelled", "failed",
)

# --- verdicts ------------------------------------------------------------------------------------

_BRACKETED = re.compile(r"\[\[\s*(a|b|c|tie)\s*\]\]", re.IGNORECASE)
_BARE = re.compile(
    r"^\W*(?:(?:assistant|answer|response)\s+)?(a|b|tie|tied|draw|equal)\W*$", re.IGNORECASE
)
# In prose only a capital A or B counts ("a" is an article); the keywords are case-insensitive.
_LABELLED = re.compile(
    r"\b(?i:verdict|winner|better|decision)\b(?:\s+(?i:answer|response|one))?\W{0,4}(?:(?i:is)\W{0,3})?"
    r"(?:(?i:assistant|answer|response)\s+)?\[?(A|B|(?i:tie|tied|draw))\b"
)
# An answer that starts with its winner says so with a word of winning: "A is worse", "B is wrong" and
# "B is not better than A" name the loser (or nothing): unparseable, not a win for the one named first.
_LEADING = re.compile(
    r"^\W*(?:(?i:assistant|answer|response)\s+)?(A|B)\b(?:'s(?:\s+(?i:answer|response))?)?\s+"
    r"(?i:wins|won|(?:is|was)\s+(?:(?:clearly|much|slightly|far|definitely)\s+)?(?:the\s+)?"
    r"(?:better|best|superior|preferable|preferred|stronger)(?:\s+(?:one|answer|response))?\b)"
)
_TIES = frozenset({"c", "tie", "tied", "draw", "equal"})


def parse_verdict(text: str) -> str | None:
    """``"A"``, ``"B"`` or ``"tie"`` from a judge's answer; ``None`` when it cannot be told.

    Accepted, in this order: the bracketed form the prompt asks for (``[[A]]``, ``[[tie]]``, and
    MT-Bench's ``[[C]]`` for a tie) when only one distinct verdict is bracketed; an answer that is
    just the verdict (``B``, ``"Tie."``, ``Assistant A``); one that starts with it (``A is better``);
    the last labelled verdict in prose
    (``Verdict: A``, ``the better answer is B``). Anything else (two different bracketed verdicts,
    a free-text essay) is unparseable: better no feedback than a wrong one.
    """
    bracketed = {_normal(m) for m in _BRACKETED.findall(text)}
    if len(bracketed) == 1:
        return bracketed.pop()
    if len(bracketed) > 1:
        return None
    bare = _BARE.match(text.strip())
    if bare:
        return _normal(bare.group(1))
    leading = _LEADING.match(text.strip())
    if leading:
        return _normal(leading.group(1))
    labelled = _LABELLED.findall(text)
    return _normal(labelled[-1]) if labelled else None


def _normal(token: str) -> str:
    lowered = token.lower()
    return "tie" if lowered in _TIES else lowered.upper()


def pair_scores(first: str, second: str) -> float:
    """The score of the model that was answer A in the first order and answer B in the second."""
    points = {"A": 1.0, "tie": 0.5, "B": 0.0}
    return (points[first] + (1.0 - points[second])) / 2.0


# --- what the judge reads ------------------------------------------------------------------------


def _message_text(message: Mapping[str, Any]) -> str:
    """One message as the judge reads it: its text parts (other parts as markers), then its calls."""
    text = " ".join(part for _, part in content_texts(message.get("content"), markers=True))
    for _, function in tool_calls_of(message):
        text += f" [call {function.get('name')}({str(function.get('arguments', ''))[:200]})]"
    return text.strip()


def transcript(body: Mapping[str, Any], max_chars: int = TRANSCRIPT_CHARS) -> str:
    """The conversation as ``role: text`` lines; the most recent part when it is long."""
    if message_list(body) is None:
        return " ".join(text for _, text in content_texts(body.get("prompt"), markers=True))[-max_chars:]
    lines = []
    for _, role, message in iter_messages(body):
        text = _message_text(message)
        if len(text) > MESSAGE_CHARS:
            text = text[: MESSAGE_CHARS // 2] + " […] " + text[-MESSAGE_CHARS // 2 :]
        lines.append(f"{role or 'user'}: {text}")
    joined = "\n".join(lines)
    return joined if len(joined) <= max_chars else "[…]\n" + joined[-max_chars:]


def _first_choice(body: bytes) -> Mapping[str, Any] | None:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    choices = parsed.get("choices") if isinstance(parsed, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    return choices[0]


def answer_text(body: bytes) -> str | None:
    """The first choice's text (tool calls rendered) of a non-streamed chat answer; None if absent."""
    choice = _first_choice(body)
    if choice is None:
        return None
    message = choice.get("message")
    if not isinstance(message, Mapping):
        return None
    text = _message_text(message)
    return text or None


# --- bounds --------------------------------------------------------------------------------------


class LoopLoad:
    """How busy the event loop's thread is: the share of wall time it spent on the CPU recently.

    Sampled every ``interval`` seconds from the thread's own CPU clock (so other processes on the
    machine, and the encoder's worker threads, do not count); :attr:`recent` is the mean over the
    last ``window`` samples (half a second by default); :attr:`quiet` is set while it is at most ``busy``.
    """

    def __init__(self, busy: float = BUSY_LOAD, interval: float = 0.05, window: int = 10) -> None:
        self.busy = busy
        self.interval = interval
        self._samples: deque[float] = deque(maxlen=window)
        self._task: asyncio.Task[None] | None = None
        self.quiet = asyncio.Event()
        self.quiet.set()

    @property
    def recent(self) -> float:
        return sum(self._samples) / len(self._samples) if self._samples else 0.0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="pointsman-loop-load")

    async def _run(self) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        while True:
            await asyncio.sleep(self.interval)
            now_wall, now_cpu = time.perf_counter(), time.thread_time()
            load = (now_cpu - cpu) / max(now_wall - wall, 1e-6)
            wall, cpu = now_wall, now_cpu
            self._samples.append(load)
            if self.recent <= self.busy:
                self.quiet.set()
            else:
                self.quiet.clear()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class RollingSpend:
    """Money committed over the last hour: reservations made at launch, settled to the real cost.

    A running total is kept so that asking costs O(1) however many comparisons the hour held. Only the
    last hour's reservations are held: each reservation forgets the older ones, so a route without a
    budget (nothing asks for the total) on a gateway nobody scrapes does not keep every one since start.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: deque[_Spend] = deque()  # oldest first
        self._total = 0.0

    def __len__(self) -> int:
        """Reservations held (those of the last hour, and older ones until the next reserve or total)."""
        return len(self._entries)

    def total(self) -> float:
        self._expire(self._clock())
        return max(self._total, 0.0)

    def _expire(self, now: float) -> None:
        cutoff = now - HOUR
        while self._entries and self._entries[0].when <= cutoff:
            gone = self._entries.popleft()
            gone.counted = False
            self._total -= gone.usd
        if not self._entries:
            self._total = 0.0  # no float drift left over from an empty window

    def reserve(self, usd: float) -> _Spend:
        now = self._clock()
        self._expire(now)
        entry = _Spend(now, usd)
        self._entries.append(entry)
        self._total += usd
        return entry

    def settle(self, entry: _Spend, usd: float) -> None:
        """Replace a reservation's estimate with what was really spent."""
        if entry.counted:
            self._total += usd - entry.usd
        entry.usd = usd


@dataclass(slots=True)
class _Spend:
    when: float
    usd: float
    counted: bool = True  # still inside the rolling hour's total


@dataclass
class RouteComparisons:
    """One route's comparison settings, bounds and counters."""

    route: str
    settings: Compare
    candidates: tuple[str, ...]
    spend: RollingSpend
    in_flight: int = 0
    cost_usd: float = 0.0
    counts: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True, frozen=True)
class _Sizes:
    """A served request's sizes in tokens, for a comparison's bounds and estimate (read once)."""

    transcript: int  # the conversation as the judge reads it
    prompt: int  # the served call's prompt (its usage; else the transcript's estimate)
    completion: int  # the served answer (its usage; else an estimate from its text)
    judged_answer: int  # the served answer as the judge reads it (cut at ANSWER_CHARS)

    @classmethod
    def of(cls, record: DecisionRecord, body: Mapping[str, Any], answer: str) -> _Sizes:
        conversation = _tokens(transcript(body))
        return cls(
            transcript=conversation,
            prompt=record.prompt_tokens or conversation,  # 0 is no count (a cache answered: no model call)
            completion=record.completion_tokens or _tokens(answer),
            judged_answer=_tokens(answer[:ANSWER_CHARS]),
        )


@dataclass(slots=True)
class _Call:
    """One upstream answer a comparison obtained."""

    model: str
    text: str | None
    cost: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    truncated: bool = False  # cut by the comparison's own completion bound (not by the client's)


class CompareRunner:
    """Launches, bounds, runs and cancels the comparisons of every route that has ``compare:``."""

    def __init__(
        self,
        config: Config,
        forwarder: Forwarder,
        pool: BackendPool,
        recorder: DecisionRecorder,
        *,
        clock: Callable[[], float] = time.monotonic,
        busy_load: float = BUSY_LOAD,
        max_defer: float = MAX_DEFER,
    ) -> None:
        self._forwarder = forwarder
        self._pool = pool
        self._recorder = recorder
        self.routes: dict[str, RouteComparisons] = {
            route.name: RouteComparisons(route.name, route.compare, route.comparison_candidates(), RollingSpend(clock))
            for route in config.routes
            if route.compare is not None
        }
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.load = LoopLoad(busy_load)
        self.max_defer = max_defer

    # --- request path (cheap, synchronous, never raises) -------------------------------------------

    def sampled(self, record: DecisionRecord | RequestTrace) -> bool:
        """Whether this request is one its route compares (decided by a hash of its id)."""
        state = self.routes.get(record.route or "")
        return (
            state is not None
            and record.endpoint == CHAT.name
            and sampled(record.request_id, state.settings.share, COMPARE_PURPOSE)
        )

    def launch(self, record: DecisionRecord, body: Mapping[str, Any], answer: str | None) -> None:
        """Start the comparison of a served answer, unless a bound says skip (counted)."""
        try:
            self._launch(record, body, answer)
        except Exception:  # a comparison must never fail the request that triggered it
            log.exception("could not start a comparison for request %s", record.request_id)

    def _launch(self, record: DecisionRecord, body: Mapping[str, Any], answer: str | None) -> None:
        if self._closed or record.status != 200 or record.outcome != "ok" or not self.sampled(record):
            return
        state = self.routes[record.route or ""]
        served = record.model or ""
        others = [m for m in state.candidates if m != served and self._pool.get(m) is not None]
        if served not in state.candidates or not others:
            return  # served by a fallback outside the decision: nothing to compare it with
        if not answer:
            state.counts["skipped_no_answer"] += 1
            return
        self.load.start()  # on the first comparison: a gateway that compares nothing runs no timer
        if state.in_flight >= state.settings.max_concurrency:
            state.counts["skipped_concurrency"] += 1
            return
        budget = state.settings.budget_usd_per_hour
        sizes = _Sizes.of(record, body, answer)
        bounds = self._completion_bounds(sizes, body, others, bounded=budget is not None)
        estimate = self._estimate(sizes, bounds, state.settings)
        if budget is not None and state.spend.total() + estimate > budget:
            state.counts["skipped_budget"] += 1
            return
        reservation = state.spend.reserve(estimate)
        state.in_flight += 1
        state.counts["started"] += 1
        request = _comparison_body(body)
        task = asyncio.get_running_loop().create_task(
            self._run(state, record, request, served, answer, bounds, reservation),
            name=f"pointsman-compare-{record.request_id}",
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- lifecycle ----------------------------------------------------------------------------------

    async def close(self) -> None:
        """Start no more comparisons and cancel the running ones (their upstream calls stop)."""
        self._closed = True
        await self.load.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- one comparison -----------------------------------------------------------------------------

    async def _run(
        self,
        state: RouteComparisons,
        record: DecisionRecord,
        body: dict[str, Any],
        served: str,
        answer: str,
        bounds: Mapping[str, int | None],
        reservation: _Spend,
    ) -> None:
        spent = 0.0
        try:
            await self._wait_for_spare_time(state)
            calls = await asyncio.gather(*(self._ask(record, body, model, bound) for model, bound in bounds.items()))
            spent += sum(call.cost for call in calls)
            conversation = transcript(body)
            served_scores: list[float] = []
            pairs: list[dict[str, Any]] = []
            # Written together once every pair is judged: a comparison cancelled (at shutdown) or failed
            # half-way leaves no row, never an opponent's score without the served model's.
            rows: list[tuple[str, float, dict[str, Any]]] = []
            for call in calls:
                if call.text is None:
                    state.counts["candidate_error"] += 1
                    continue
                if call.truncated:
                    state.counts["candidate_truncated"] += 1
                    continue
                first, second = await asyncio.gather(
                    self._judge(record, state.settings, conversation, answer, call.text),
                    self._judge(record, state.settings, conversation, call.text, answer),
                )
                spent += first.cost + second.cost
                if first.text is None or second.text is None:
                    state.counts["judge_error"] += 1
                    continue
                verdicts = (parse_verdict(first.text), parse_verdict(second.text))
                if verdicts[0] is None or verdicts[1] is None:
                    state.counts["unparseable"] += 1
                    continue
                score = pair_scores(verdicts[0], verdicts[1])
                served_scores.append(score)
                pair = {"models": [served, call.model], "verdicts": list(verdicts)}
                pairs.append(pair)
                rows.append((call.model, 1.0 - score, {
                    "judge": state.settings.judge, "opponent": served, "served": False,
                    "orders": [[served, call.model], [call.model, served]], "verdicts": list(verdicts),
                    "prompt_tokens": call.prompt_tokens, "completion_tokens": call.completion_tokens,
                    "cost_usd": call.cost,
                }))
            if served_scores:
                rows.append((served, sum(served_scores) / len(served_scores), {
                    "judge": state.settings.judge, "served": True,
                    "opponents": [p["models"][1] for p in pairs], "pairs": pairs,
                }))
                # Together or not at all: one model's score without the other's is a wrong label.
                self._recorder.record_feedback(tuple(self._feedback(record, *row) for row in rows))
                state.counts["judged"] += 1
        except asyncio.CancelledError:
            state.counts["cancelled"] += 1
            raise
        except Exception:
            state.counts["failed"] += 1
            log.exception("comparison for request %s failed", record.request_id)
        finally:
            state.in_flight -= 1
            state.cost_usd += spent
            # What the calls really cost replaces the estimate (an unanswered call costs nothing).
            state.spend.settle(reservation, spent)

    async def _wait_for_spare_time(self, state: RouteComparisons) -> None:
        """Served requests come first: while they keep the event loop saturated, wait (up to
        ``max_defer`` seconds, still counted in flight, so a saturated gateway starts few comparisons
        and skips the rest as over max_concurrency)."""
        if self.load.quiet.is_set():
            return
        state.counts["deferred"] += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.max_defer):
                await self.load.quiet.wait()

    async def _ask(self, record: DecisionRecord, body: Mapping[str, Any], model: str, bound: int | None) -> _Call:
        """The other candidate's answer to the same request (no fallbacks: it must be that model),
        written in at most ``bound`` tokens (None: as the client asked)."""
        completed = await self._call(record, model, with_max_tokens(dict(body), bound))
        if completed is None:
            return _Call(model, None, 0.0)
        ok = completed.status == 200
        asked = requested_completion(body)
        choice = _first_choice(completed.body) if ok else None
        cut = (
            bound is not None and choice is not None and choice.get("finish_reason") == "length"
            and (asked is None or bound < asked)
        )
        return _Call(
            model, answer_text(completed.body) if ok else None, _cost(completed),
            completed.prompt_tokens, completed.completion_tokens, truncated=cut,
        )

    async def _judge(
        self, record: DecisionRecord, settings: Compare, conversation: str, answer_a: str, answer_b: str
    ) -> _Call:
        prompt = (settings.prompt or DEFAULT_JUDGE_PROMPT).format(
            conversation=conversation, answer_a=answer_a[:ANSWER_CHARS], answer_b=answer_b[:ANSWER_CHARS]
        )
        body = {
            "model": settings.judge,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": settings.judge_max_tokens,
            "stream": False,
        }
        completed = await self._call(record, settings.judge, body)
        if completed is None or completed.status != 200:
            return _Call(settings.judge, None, _cost(completed) if completed else 0.0)
        return _Call(settings.judge, answer_text(completed.body) or "", _cost(completed))

    async def _call(self, record: DecisionRecord, model: str, body: Mapping[str, Any]) -> Completed | None:
        """One non-streamed call through the gateway's forwarding path (retries, breaker, metrics)."""
        trace = RequestTrace(
            request_id=f"{record.request_id}:compare:{model}", endpoint=CHAT.name, route=record.route,
            requested_model=model, tenant=record.tenant,
        )
        request = {**body, "model": model}
        try:
            result = await self._forwarder.forward(
                path=CHAT.path, body=request, raw_body=with_model_first(request), candidates=(model,),
                stream=False, trace=trace,
            )
        except PointsmanError as error:
            log.info("comparison call to %s for request %s failed: %s", model, record.request_id, error.error_type)
            return None
        assert isinstance(result, Completed)  # stream=False
        return result

    @staticmethod
    def _feedback(record: DecisionRecord, model: str, score: float, metadata: dict[str, Any]) -> FeedbackRecord:
        return FeedbackRecord(
            request_id=record.request_id, score=score, metric=QUALITY_METRIC, source=JUDGE_SOURCE, model=model,
            tenant=record.tenant, created_at=time.time(), metadata=metadata, issued_at=record.created_at,
        )

    # --- cost estimate ------------------------------------------------------------------------------

    def _completion_bounds(
        self, sizes: _Sizes, body: Mapping[str, Any], others: Sequence[str], *, bounded: bool
    ) -> dict[str, int | None]:
        """Each other candidate's completion bound when ``bounded`` (a budget is set; else None, as the
        client asked): COMPARE_LENGTH_FACTOR times the served answer (at least COMPARE_MIN_COMPLETION),
        within what the client asked and what the model can write."""
        if not bounded:
            return dict.fromkeys(others)
        bound = max(COMPARE_MIN_COMPLETION, COMPARE_LENGTH_FACTOR * sizes.completion)
        asked = requested_completion(body)
        if asked is not None:
            bound = min(bound, asked)
        bounds: dict[str, int | None] = {}
        for model in others:
            target = self._pool.get(model)
            ceiling = output_ceiling(target.model, sizes.prompt) if target is not None else None
            bounds[model] = bound if ceiling is None else min(bound, ceiling)
        return bounds

    def _estimate(self, sizes: _Sizes, bounds: Mapping[str, int | None], settings: Compare) -> float:
        """What a comparison can cost, from the served call's usage and the configured prices.

        Each other candidate: the served prompt in, its completion bound out (the call is made with
        that bound, so it cannot write more; with no bound, the served answer's size). The judge,
        twice per pair: the transcript, the served answer and the other answer (cut at ANSWER_CHARS)
        in, at most ``judge_max_tokens`` out.
        """
        total = 0.0
        for model, bound in bounds.items():
            completion = sizes.completion if bound is None else bound
            total += self._price(model, sizes.prompt, completion)
            other = min(completion, ANSWER_CHARS // 4 + 1)
            judge_prompt = _tokens(DEFAULT_JUDGE_PROMPT) + sizes.transcript + sizes.judged_answer + other
            total += 2 * self._price(settings.judge, judge_prompt, settings.judge_max_tokens)
        return total

    def _price(self, model: str, prompt_tokens: int, completion_tokens: int) -> float:
        target = self._pool.get(model)
        return 0.0 if target is None else cost_usd(target.model, prompt_tokens, completion_tokens) or 0.0

    # --- metrics --------------------------------------------------------------------------------------

    def collector(self) -> Collector:
        """A Prometheus collector of every route's comparison counters, in-flight count and spend."""
        return _CompareCollector(self.routes.values(), self.load)


def _comparison_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The served request as the other candidates get it: one non-streamed choice."""
    return {k: v for k, v in body.items() if k not in ("stream", "stream_options", "n")} | {"stream": False}


def _cost(completed: Completed | None) -> float:
    if completed is None:
        return 0.0
    return cost_usd(completed.target.model, completed.prompt_tokens, completed.completion_tokens) or 0.0


def _tokens(text: str) -> int:
    """A rough token count (4 characters a token) for cost estimates only."""
    return len(text) // 4 + 1


class _CompareCollector(Collector):
    def __init__(self, routes: Iterable[RouteComparisons], load: LoopLoad) -> None:
        self._routes = list(routes)
        self._load = load

    def collect(self) -> Iterable[Metric]:
        outcomes = CounterMetricFamily(
            "pointsman_comparisons",
            "Comparisons by route and outcome: started, judged, skipped (concurrency, budget, no answer), "
            "errors, unparseable verdicts, cancelled at shutdown.",
            labels=("route", "outcome"),
        )
        in_flight = GaugeMetricFamily("pointsman_comparisons_in_flight", "Comparisons running now.", labels=("route",))
        spend = GaugeMetricFamily(
            "pointsman_comparisons_spend_usd_last_hour",
            "Comparison spend committed over the last hour (estimates until calls finish).", labels=("route",),
        )
        cost = CounterMetricFamily(
            "pointsman_comparisons_cost_usd", "What comparison calls cost (configured prices).", labels=("route",)
        )
        load = GaugeMetricFamily(
            "pointsman_event_loop_load",
            "Share of a core the event loop's thread used over the last 0.5 s; comparisons wait while it is high.",
        )
        load.add_metric((), self._load.recent)
        for state in self._routes:
            for outcome in OUTCOMES:
                outcomes.add_metric((state.route, outcome), state.counts[outcome])
            in_flight.add_metric((state.route,), state.in_flight)
            spend.add_metric((state.route,), state.spend.total())
            cost.add_metric((state.route,), state.cost_usd)
        yield from (outcomes, in_flight, spend, cost, load)

