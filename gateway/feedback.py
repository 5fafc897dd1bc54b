"""``POST /v1/feedback``: attach an outcome to a request id, acknowledged only once it is durable.

Body: ``request_id``; exactly one of ``score`` (a number in [0, 1]), ``thumbs`` ("up"/"down" or
true/false) or ``label`` (mapped to a score by ``feedback.labels``); optional ``metric`` (default
``quality``), ``comment``, ``source`` (user, judge, rule, import; default user) and ``model`` (for
comparisons: the model the feedback is about; default the model that answered, stored by name; a
configured model or the one that answered, else 400). One row per (request id, metric, source,
model): a repeat replaces it and answers the same ``id``.

Tenant scoping: the caller's API key must belong to the tenant the request was served for. A
request id of another tenant is a 404 exactly like one that was never issued, in its body and in its
timing, so ids cannot be probed across tenants. An id is known when this process issued it recently
(:class:`IssuedIds`, filled as the decision record is handed to the recorder: the record may not be
flushed yet) or when its decision is in the store; otherwise the store is asked once more after the
flush interval (another replica may not have flushed it yet) before the answer is 404. Every 404
takes that wait, whoever owns the id.

The gateway's own judges (route comparisons, ratings workflows) write ``source: judge`` rows under
``quality`` on the requests they judge. A client's judge feedback is kept apart from them: on such a
request a client's ``judge`` row under ``quality`` is a 400 (it would replace the gateway's verdict);
everywhere else clients post ``judge`` freely.

An id ``pointsman forget`` deleted (the request, or its tenant's requests issued until then) is a 404 too,
though this process may still remember it: the store's tombstone keeps the write from happening.

The 200 is sent only after the row committed (:class:`store.FeedbackWriter`); when the store cannot
write, the answer is 503 with ``Retry-After``, never a 200 for feedback that was not stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter
from starlette.requests import Request
from starlette.responses import Response

from gateway.config import Config, FeedbackConfig
from gateway.errors import InvalidRequestError, PointsmanError, ServiceUnavailableError
from gateway.metrics import Metrics
from gateway.protocol import ClientDisconnected, decode_body, read_body
from gateway.responses import error_response, json_response
from policies.echo import client_echo
from store import DecisionRecord, DecisionStore, FeedbackRecord, FeedbackWriter, RequestForgotten, StoreUnavailable
from store.deadline import within
from store.outcomes import JUDGE_SOURCE, QUALITY_METRIC  # what the gateway's own judges write

if TYPE_CHECKING:
    from gateway.service import ProxyService

#: Sources a client may send; "implicit" is reserved for signals the gateway records itself.
CLIENT_SOURCES: tuple[str, ...] = ("user", "judge", "rule", "import")
FIELDS = frozenset({"request_id", "score", "thumbs", "label", "metric", "comment", "source", "model"})
MAX_REQUEST_ID_CHARS = 128
MAX_MODEL_CHARS = 256
_METRIC = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,63}")
_THUMBS = {"up": 1.0, "down": 0.0, True: 1.0, False: 0.0}
#: At most this many model names are listed in a 400 for an unknown ``model``.
MAX_MODELS_LISTED = 20
#: Seconds a client is told to wait before retrying when the store cannot write.
RETRY_AFTER = "1"


@dataclass(slots=True, frozen=True)
class Issued:
    """What the gateway knows of a request id it issued: whose it is and, when known, its answer."""

    tenant: str | None
    model: str = ""  # the model that answered ("" when none did)
    judged: bool = False  # the gateway writes its own judge rows on it (a comparison, a ratings workflow)
    issued_at: float | None = None  # the decision's created_at: a tenant forgotten since covers the request

    @classmethod
    def of(cls, record: DecisionRecord) -> Issued:
        """The entry for a decision record (from this process or from the store)."""
        return cls(record.tenant, record.model or "", gateway_judges(record), record.created_at)


def gateway_judges(record: DecisionRecord) -> bool:
    """Whether the gateway itself writes ``judge`` feedback on this request: it was sampled for a
    route comparison, or a ratings workflow answered it (its judge's scores are stored)."""
    return record.compared or (record.workflow or {}).get("kind") == "ratings"


class IssuedIds:
    """The last ``capacity`` request ids this process answered, with their tenant and answer
    (FIFO-bounded: the oldest are long flushed to the store by the time they are evicted)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[str, Issued] = OrderedDict()

    def remember(self, record: DecisionRecord) -> None:
        """Remember a finished request with its tenant and answer; O(1), for the request path."""
        if self.capacity <= 0:
            return
        self._ids[record.request_id] = Issued.of(record)
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def lookup(self, request_id: str) -> Issued | None:
        """The entry if the id is remembered, else None."""
        return self._ids.get(request_id)

    def __len__(self) -> int:
        return len(self._ids)


@dataclass(slots=True, frozen=True)
class FeedbackInput:
    """A validated feedback body."""

    request_id: str
    score: float
    metric: str
    source: str
    model: str | None  # None: not given (the model that answered)
    label: str | None
    comment: str | None
    kind: str  # "score", "thumbs" or "label": what the client sent


def parse_feedback(body: dict[str, Any], config: FeedbackConfig) -> FeedbackInput:
    """Validate a feedback body; every refusal is a 400 naming the offending ``param``."""
    for key in body:
        if key not in FIELDS:
            raise InvalidRequestError(
                f"unknown field {client_echo(key)}; expected {', '.join(sorted(FIELDS))}", param=key
            )
    request_id = body.get("request_id")
    if not isinstance(request_id, str) or not request_id or len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidRequestError(
            f"'request_id' is required: the x-pointsman-request-id of the answer (a string of at most "
            f"{MAX_REQUEST_ID_CHARS} characters)",
            param="request_id",
        )
    given = [name for name in ("score", "thumbs", "label") if body.get(name) is not None]
    if len(given) != 1:
        raise InvalidRequestError(
            "send exactly one of 'score' (0 to 1), 'thumbs' (up/down) or 'label'"
            + (f"; got {' and '.join(given)}" if given else ""),
            param=given[1] if len(given) > 1 else "score",
        )
    kind = given[0]
    label: str | None = None
    if kind == "score":
        score = _score(body["score"])
    elif kind == "thumbs":
        thumbs = body["thumbs"]
        key = thumbs.lower() if isinstance(thumbs, str) else thumbs
        if not isinstance(key, str | bool) or key not in _THUMBS:
            raise InvalidRequestError(
                f"'thumbs' must be \"up\", \"down\", true or false, not {client_echo(thumbs)}", param="thumbs"
            )
        score = _THUMBS[key]
        label = "up" if score == 1.0 else "down"
    else:
        label = body["label"]
        if not isinstance(label, str) or label not in config.labels:
            known = ", ".join(repr(k) for k in config.labels) or "none are configured (feedback.labels)"
            raise InvalidRequestError(f"unknown label {client_echo(label)}; known labels: {known}", param="label")
        score = float(config.labels[label])
    # Only an absent field (or null) takes the default: "" or 0 are values, and refused below.
    metric = _given(body, "metric", "quality")
    if not isinstance(metric, str) or not _METRIC.fullmatch(metric):
        raise InvalidRequestError(
            f"'metric' must be a short identifier (a letter, then letters, digits, _ . : -; at most 64), "
            f"not {client_echo(metric)}",
            param="metric",
        )
    source = _given(body, "source", "user")
    if source not in CLIENT_SOURCES:
        raise InvalidRequestError(
            f"'source' must be one of {', '.join(CLIENT_SOURCES)}, not {client_echo(source)}", param="source"
        )
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > MAX_MODEL_CHARS):
        raise InvalidRequestError(f"'model' must be a model name of at most {MAX_MODEL_CHARS} characters",
                                  param="model")
    comment = body.get("comment")
    if comment is not None and (not isinstance(comment, str) or len(comment) > config.max_comment_chars):
        raise InvalidRequestError(
            f"'comment' must be a string of at most {config.max_comment_chars} characters", param="comment"
        )
    # "" is how rows about the served answer were keyed before the default was its name: the same default.
    return FeedbackInput(request_id, score, metric, source, model or None, label, comment or None, kind)


def _given(body: dict[str, Any], key: str, default: str) -> Any:
    value = body.get(key)
    return default if value is None else value


def _score(value: Any) -> float:
    # bool is an int in Python, but true is not a score a client means.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"'score' must be a number from 0 to 1, not {client_echo(value)}", param="score")
    if not 0.0 <= value <= 1.0:
        raise InvalidRequestError(f"'score' must be from 0 to 1; got {value!r}", param="score")
    return float(value)


def feedback_id(request_id: str, metric: str, source: str, model: str) -> str:
    """The id of the feedback row a key names: the same for every repeat (idempotent answers)."""
    digest = hashlib.sha256("\x1f".join((request_id, metric, source, model)).encode()).hexdigest()
    return "fb-" + digest[:32]


def _not_found(request_id: str) -> PointsmanError:
    return PointsmanError(
        f"no request {client_echo(request_id, 48)} was served for this API key",
        status=404, error_type="invalid_request_error", code="request_not_found", param="request_id",
    )


def _unavailable(what: str) -> ServiceUnavailableError:
    return ServiceUnavailableError(
        f"the feedback store is unavailable ({what}); nothing was stored, retry shortly",
        code="store_unavailable", headers={"Retry-After": RETRY_AFTER},
    )


class FeedbackService:
    """Serves ``POST /v1/feedback`` for one gateway process."""

    def __init__(
        self, config: Config, service: ProxyService, store: DecisionStore, writer: FeedbackWriter, metrics: Metrics
    ) -> None:
        self.config = config
        self.service = service
        self.store = store
        self.writer = writer
        self.models = frozenset(service.pool.models)
        feedback = config.feedback
        self.recheck_after = (
            feedback.recheck_after if feedback.recheck_after is not None else config.store.flush_interval + 0.2
        )
        self.outcomes = Counter(
            "pointsman_feedback", "Feedback requests by outcome: accepted (stored), invalid (400), "
            "not_found (404), unauthorized (401), unavailable (503: the store could not write).",
            ("outcome",), registry=metrics.registry,
        )
        self._accepted = self.outcomes.labels("accepted")  # bound once: the hot path's counter
        metrics.watch_attributes(writer, {
            "pointsman_feedback_pending": ("pending", "Feedback writes waiting for their commit."),
        })
        metrics.watch_counts(writer, {
            "pointsman_feedback_written": ("written", "Feedback rows committed since start."),
            "pointsman_feedback_failed": ("failed", "Feedback writes answered 503 (store unavailable)."),
            "pointsman_feedback_batches": ("batches", "Feedback transactions committed since start."),
        })

    async def handle(self, request: Request) -> Response:
        """Validate, check the request id belongs to the caller's tenant, store durably, answer."""
        try:
            tenant = self.service.authenticate(request)
            server = self.config.server
            raw = await read_body(
                request.receive, request.headers.get("content-length"), server.max_body_bytes, server.body_timeout
            )
            given = parse_feedback(decode_body(raw), self.config.feedback)
            issued = await self._issued_to(given.request_id, tenant)
            model = self._model(given, issued)
            item = FeedbackRecord(
                request_id=given.request_id, score=given.score, metric=given.metric, source=given.source,
                model=model, label=given.label, comment=given.comment, tenant=tenant,
                created_at=time.time(), metadata={"input": given.kind}, issued_at=issued.issued_at,
            )
            try:
                await self.writer.submit(item)
            except StoreUnavailable as exc:
                raise _unavailable(str(exc)) from exc
            except RequestForgotten as exc:
                # pointsman forget (another process) deleted it since this process issued it: the id it
                # still remembers is not known any more, and the write left nothing behind.
                raise _not_found(given.request_id) from exc
        except PointsmanError as error:
            self.outcomes.labels(_outcome(error)).inc()
            return error_response(error)
        except ClientDisconnected:
            return Response(status_code=499)
        self._accepted.inc()
        return json_response({
            "object": "feedback",
            "id": feedback_id(item.request_id, item.metric, item.source, item.model),
            "request_id": item.request_id,
            "metric": item.metric,
            "score": item.score,
            "source": item.source,
            "model": item.model or None,
            "label": item.label,
            "comment": item.comment,
            "created_at": int(item.created_at),
        })

    def _model(self, given: FeedbackInput, issued: Issued) -> str:
        """The ``model`` the row is keyed by: the one given (a configured model, or the one that
        answered), else the one that answered. 400 for any other, and for a ``judge`` row that would
        replace the gateway's own verdict."""
        served = issued.model  # "" when no model answered
        model = given.model or served
        if given.model is not None and model not in self.models and model != served:
            known = sorted(self.models)
            listed = ", ".join(known[:MAX_MODELS_LISTED]) + (", ..." if len(known) > MAX_MODELS_LISTED else "")
            raise InvalidRequestError(
                f"unknown model {client_echo(given.model)}: 'model' names the model the feedback is about, one of "
                f"the configured models ({listed}); leave it out for the model that answered",
                param="model",
            )
        if given.source == JUDGE_SOURCE and given.metric == QUALITY_METRIC and issued.judged:
            raise InvalidRequestError(
                f"the gateway judges this request itself (a comparison or a ratings workflow): its 'judge' "
                f"feedback under '{QUALITY_METRIC}' is the gateway's verdict and cannot be replaced; "
                f"send a judge's score under another metric, or as source 'rule' or 'import'",
                param="source",
            )
        return model

    async def _issued_to(self, request_id: str, tenant: str | None) -> Issued:
        """What is known of ``request_id`` when it was served for ``tenant``; 404 otherwise (never
        revealing whether another tenant owns it), 503 when the store cannot be read.

        A 404 costs the same whatever the reason: the same store reads and the same wait, for an id
        of another tenant (here or in the store), of a request refused before its tenant was known
        (a 401) and for one never issued. Only the caller's own ids can answer sooner.
        """
        remembered = self.service.issued.lookup(request_id)
        if remembered is not None and remembered.tenant == tenant:
            return remembered  # the hot path: answered a moment ago, no store read
        # Asked even when this process knows the id as another tenant's: a 404 must not be quicker.
        stored = await self._stored(request_id)
        if stored is not None and stored.tenant == tenant:
            return stored
        # Another replica may have served it and not flushed its decision yet.
        await asyncio.sleep(self.recheck_after)
        stored = await self._stored(request_id)
        if stored is not None and stored.tenant == tenant:
            return stored
        raise _not_found(request_id)

    async def _stored(self, request_id: str) -> Issued | None:
        try:
            # Bounded like the write: a database that stopped answering (a network partition) would
            # otherwise hold the request for the driver's own timeouts, a minute or more.
            record = await within(self.store.fetch(request_id), self.writer.write_timeout)
        except Exception as exc:  # a driver error or the timeout: the store cannot answer, which is not a 404
            raise _unavailable(type(exc).__name__) from exc
        return None if record is None else Issued.of(record)


def _outcome(error: PointsmanError) -> str:
    if error.status == 404:
        return "not_found"
    if error.status == 401:
        return "unauthorized"
    if error.status >= 500:
        return "unavailable"
    return "invalid"
