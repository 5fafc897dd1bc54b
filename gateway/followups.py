"""What the gateway does around a served request for the eval loop, kept out of the proxy service.

:class:`Followups` owns the three pieces: conversation capture before forwarding
(``gateway/capture.py``), implicit feedback when a request is done (``gateway/implicit.py``) and
counterfactual comparisons after the answer is complete (``gateway/compare.py``). The service
calls it at three points and hands it a :class:`Served` it fills in along the way.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from classifiers.batching import BatchingEncoder
from gateway.capture import ConversationCapture
from gateway.compare import CompareRunner, answer_text
from gateway.config import Config
from gateway.forward import Forwarder
from gateway.implicit import Fingerprint, ImplicitSignals, fingerprint, finished_by_length
from gateway.pool import BackendPool
from gateway.protocol import CHAT
from gateway.trace import RequestTrace
from gateway.usage import SSEUsageScanner
from store.recorder import DecisionRecorder
from store.records import DecisionRecord

log = logging.getLogger("pointsman.followups")
#: Larger requests are not tracked for re-asks and regenerations: hashing them would hold the event
#: loop (a megabyte of conversation takes about a millisecond), and they are rarely re-asked verbatim.
MAX_FINGERPRINT_BYTES = 256 * 1024


@dataclass(slots=True)
class Served:
    """One request as the follow-ups see it, filled in by the service as it goes."""

    trace: RequestTrace  # the request's running state (its record is built when it is finished)
    decided: Mapping[str, Any] | None = None  # the body as the client sent it (what the policy read)
    forwarded: Mapping[str, Any] | None = None  # the body sent upstream (redacted, gateway fields dropped)
    size: int = 0  # bytes of the request body
    fingerprint: Fingerprint | None = None


class Followups:
    """Conversation capture, implicit feedback and comparisons for one gateway."""

    def __init__(
        self,
        config: Config,
        forwarder: Forwarder,
        pool: BackendPool,
        recorder: DecisionRecorder,
        encoder: Callable[[], BatchingEncoder | None] = lambda: None,
    ) -> None:
        routes = config.routes
        self._encoder = encoder
        self.compare = CompareRunner(config, forwarder, pool, recorder)
        self.implicit = ImplicitSignals(recorder, {route.name: route.implicit for route in routes})
        self.capture = ConversationCapture({route.name: route.record for route in routes}, lambda: self._encoder())

    def set_encoder(self, encoder: Callable[[], BatchingEncoder | None]) -> None:
        """Where the routing encoder comes from (the routing brain loads it at start-up)."""
        self._encoder = encoder

    # --- before forwarding -------------------------------------------------------------------------

    async def decided(self, served: Served, signals: Mapping[str, Any]) -> None:
        """The request is decided and about to be forwarded: fingerprint it, capture its conversation."""
        trace, body = served.trace, served.decided
        if body is None or trace.endpoint != CHAT.name:
            return
        # Marked now, whether or not a bound later skips the comparison: its judge feedback and the
        # extra call's spend are for learning, so A/B reports leave such requests out by default.
        trace.compared = trace.decision.get("workflow") is None and self.compare.sampled(trace)
        if self.implicit.settings_for(trace.route).enabled and served.size <= MAX_FINGERPRINT_BYTES:
            served.fingerprint = fingerprint(body, trace.tenant, trace.session_id)
        if self.capture.wants(trace.route, signals):
            try:
                await self.capture.attach(trace, body, served.forwarded or body)
            except Exception:  # the record goes without its conversation; the request goes on
                log.exception("could not capture the conversation of request %s", trace.request_id)

    def stream_scanner(self, served: Served) -> SSEUsageScanner:
        """The usage scanner for a streamed answer; it also keeps the text when it will be compared."""
        return SSEUsageScanner(collect_text=self.compare.sampled(served.trace))

    # --- after the answer ----------------------------------------------------------------------------

    def completed(
        self, served: Served, record: DecisionRecord, answer: bytes
    ) -> Callable[[], Awaitable[None]] | None:
        """A non-streamed request is done (``record`` is its decision record, its response has left
        the gateway): record implicit feedback now; return what starts the comparison, if there is one."""
        ok = record.status == 200 and record.outcome == "ok"
        self.implicit.finished(record, served.fingerprint, finish_length=ok and finished_by_length(answer))
        # A workflow's answer is not compared: its decision was a workflow, not a candidate model.
        if not ok or served.forwarded is None or record.workflow is not None or not self.compare.sampled(record):
            return None
        body = served.forwarded

        async def launch() -> None:
            self.compare.launch(record, body, answer_text(answer))

        return launch

    def failed(self, served: Served, record: DecisionRecord) -> None:
        """A request ended without an upstream answer to pass on (refused, failed, disconnected)."""
        self.implicit.finished(record, served.fingerprint)

    def streamed(self, served: Served, record: DecisionRecord, scanner: SSEUsageScanner) -> None:
        """A streamed answer's last byte was sent (``record`` is its decision record): implicit
        feedback, then the comparison."""
        self.implicit.finished(record, served.fingerprint, finish_length=scanner.finish_length)
        if served.forwarded is not None and scanner.text is not None:
            # The scanner keeps the first choice's content deltas only: an answer that also called a
            # tool (or refused) would be judged without its calls against the other candidates' whole
            # answers (theirs are not streamed, calls rendered), a loss it did not earn. Not compared.
            self.compare.launch(record, served.forwarded, None if scanner.other_deltas else scanner.text)

    async def close(self) -> None:
        """Cancel the comparisons still running (at shutdown, before the recorder flushes)."""
        await self.compare.close()
