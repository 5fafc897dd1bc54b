"""Conversation capture: what a decision record keeps of its conversation for retraining.

A route's ``record`` section (``{embedding: true, text: false, text_retention_days: 30}``) decides.
When the route's policy encoded the conversation (a head signal such as ``difficulty`` was
computed), the record gets a :class:`~store.records.ConversationRecord` with that embedding as
float32 bytes and the encoder's id. Re-encoding costs nothing: the batching encoder caches vectors
by text, and the text is rendered exactly as the signal provider rendered it. The messages
themselves (as sent upstream, so redacted when the policy redacted) are kept only when the route
opts in with ``text: true``, with an expiry after which the store deletes them. Never logged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import orjson

from classifiers.batching import BatchingEncoder
from classifiers.conversation import conversation_text
from classifiers.provider import HEAD_SIGNALS
from gateway.trace import RequestTrace
from policies.config import RecordSettings
from store.records import ConversationRecord

DAY = 86_400.0
#: The provider renders conversations with this budget (``ClassifierSignalProvider(max_chars=...)``);
#: the same text is what makes the capture a cache hit.
PROVIDER_MAX_CHARS = 2000


class ConversationCapture:
    """Attaches conversations to decision records for the routes that keep them."""

    def __init__(
        self,
        settings: Mapping[str, RecordSettings],
        encoder: Callable[[], BatchingEncoder | None],
        *,
        max_chars: int = PROVIDER_MAX_CHARS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = {name: s for name, s in settings.items() if s.embedding or s.text}
        self._encoder = encoder
        self._max_chars = max_chars
        self._clock = clock

    def wants(self, route: str | None, signals: Mapping[str, Any]) -> bool:
        """Whether this request's record keeps its conversation: its route opts in and its policy
        computed an embedding-based signal."""
        return route in self._settings and any(name in signals for name in HEAD_SIGNALS)

    async def attach(
        self, trace: RequestTrace, decided: Mapping[str, Any], forwarded: Mapping[str, Any]
    ) -> None:
        """Set ``trace.conversation``: ``decided`` is the body the policy encoded, ``forwarded`` the
        body sent upstream (its messages are the text kept, when kept)."""
        settings = self._settings[trace.route or ""]
        encoder = self._encoder()
        embedding: bytes | None = None
        encoder_id: str | None = None
        if settings.embedding and encoder is not None:
            vector = await encoder.encode(conversation_text(decided, max_chars=self._max_chars))
            embedding = np.asarray(vector, dtype="<f4").tobytes()
            encoder_id = encoder.id
        text: str | None = None
        expires_at: float | None = None
        now = self._clock()
        if settings.text:
            content = forwarded.get("messages", forwarded.get("prompt"))
            text = orjson.dumps(content).decode()
            expires_at = now + settings.text_retention_days * DAY
        if embedding is None and text is None:
            return
        trace.conversation = ConversationRecord(
            request_id=trace.request_id, created_at=now, tenant=trace.tenant, encoder_id=encoder_id,
            embedding=embedding, text=text, expires_at=expires_at,
        )
