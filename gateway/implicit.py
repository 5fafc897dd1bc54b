"""Implicit feedback: what users' behaviour says about an answer, recorded without asking them.

Four signals, each a feedback row (``source: implicit``, score 0) on the request it judges:

* ``reask``: a new request of the same session arrives within the route's ``implicit.window``
  seconds of an answer, and its last user turn is at least ``implicit.similarity`` alike (Jaccard
  of word sets) to that answer's request's last user turn: the answer did not do. Turns of fewer
  than :data:`MIN_REASK_WORDS` distinct words never count ("ok", "yes" repeat without meaning it).
* ``regenerate``: the same conversation, up to and including the same last user turn, is sent
  again within the window: the user asked for another answer to the same turn.
* ``finish_length``: the answer stopped at the token limit (``finish_reason: "length"``).
* ``upstream_error``: the upstream failed (5xx, timeout, a stream cut short).

A session is the ``x-pointsman-session-id`` header (per tenant) or, without it, the conversation's
prefix: system prompt(s) and first user message, which every later turn repeats (the same rule as
session stickiness, ``policies/sticky.py``), with the body's ``user`` (OpenAI's end-user id) when it
has one. A first turn with neither a session id nor a ``user`` judges no earlier answer: the same
opening question from two end users of one API key (a popular prompt, an eval run twice, a batch job
resending its inputs) looks exactly like a regeneration, and would score every earlier answer to it
0. Its answer is still remembered, so a re-ask in the conversation's next turn is seen.

Memory is bounded: at most ``max_sessions`` sessions (least recently used evicted), a few recent
answers each, dropped once older than the window. No text is kept: only digests of the conversation
prefix and hashed words of the last user turn.
"""

from __future__ import annotations

import logging
import re
import string
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from classifiers.messages import SYSTEM_ROLES, iter_messages, message_list
from policies.config import ImplicitSettings
from store.recorder import DecisionRecorder
from store.records import DecisionRecord, FeedbackRecord

log = logging.getLogger("pointsman.implicit")

MIN_REASK_WORDS = 3
WORD_CHARS = 1000  # the similarity of two turns reads their beginnings: bounded work per request
DEFAULT_SETTINGS = ImplicitSettings()
# ASCII punctuation becomes a word break (a translate-and-split is faster than a regex scan).
_PUNCTUATION = str.maketrans(dict.fromkeys(string.punctuation, " "))
_FINISH_LENGTH = re.compile(rb'"finish_reason"\s*:\s*"length"')
SIGNALS = ("reask", "regenerate", "finish_length", "upstream_error")
_USER = frozenset({"user"})


def finished_by_length(body: bytes) -> bool:
    """Whether a non-streamed answer (any choice) stopped at the token limit."""
    return b'"length"' in body and _FINISH_LENGTH.search(body) is not None


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What implicit signals need of a request's conversation: digests, never text."""

    session: int  # digest of (tenant, session id or conversation prefix)
    turn: int  # digest of the messages up to and including the last user turn
    words: frozenset[int]  # hashed, normalised words of the last user turn
    judges: bool = True  # whether it may judge earlier answers (see the module docstring)


@dataclass(slots=True)
class _Answer:
    request_id: str
    tenant: str | None
    turn: int
    words: frozenset[int]
    answered_at: float  # wall-clock seconds
    issued_at: float  # the request's arrival (its decision's created_at): a tenant forgotten since covers it


def fingerprint(body: Mapping[str, Any], tenant: str | None, session_id: str | None) -> Fingerprint | None:
    """The request's fingerprint; None for a body with no user turn (nothing to re-ask)."""
    users = [index for index, _, _ in iter_messages(body, _USER)]
    messages = message_list(body)
    if not users or messages is None:
        return None
    first_user, last_user = users[0], users[-1]
    end_user = body.get("user")
    end_user = end_user if isinstance(end_user, str) else ""
    if session_id:
        key: Any = ["id", session_id]
        judges = True
    else:
        prefix = [m for index, _, m in iter_messages(body, SYSTEM_ROLES) if index < first_user]
        key = ["prefix", end_user, prefix, messages[first_user]]
        # Past the first turn the conversation carries an earlier answer: strangers rarely share that.
        judges = bool(end_user) or last_user != first_user
    session = _digest(orjson.dumps([tenant or "", key], option=orjson.OPT_SORT_KEYS))
    turn = _digest(orjson.dumps(messages[: last_user + 1], option=orjson.OPT_SORT_KEYS))
    return Fingerprint(session=session, turn=turn, words=_words(messages[last_user].get("content")), judges=judges)


def similarity(a: frozenset[int], b: frozenset[int]) -> float:
    """Jaccard similarity of two word sets (1.0 for two empty sets)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


class ImplicitSignals:
    """Tracks recent answers per session and records implicit feedback through ``recorder``.

    Use from the event loop only. ``settings`` maps a route to its ``implicit`` section; requests
    for a concrete model (no route) and routes not listed use the defaults.
    """

    def __init__(
        self,
        recorder: DecisionRecorder,
        settings: Mapping[str, ImplicitSettings] | None = None,
        *,
        max_sessions: int = 10_000,
        per_session: int = 4,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_sessions < 1 or per_session < 1:
            raise ValueError("max_sessions and per_session must be at least 1")
        self._recorder = recorder
        self._settings = dict(settings or {})
        self._max_sessions = max_sessions
        self._per_session = per_session
        self._clock = clock
        self._ttl = max([DEFAULT_SETTINGS.window, *(s.window for s in self._settings.values())])
        self._sessions: OrderedDict[int, deque[_Answer]] = OrderedDict()
        self.recorded: dict[str, int] = dict.fromkeys(SIGNALS, 0)

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def count_reask(self) -> int:
        return self.recorded["reask"]

    @property
    def count_regenerate(self) -> int:
        return self.recorded["regenerate"]

    @property
    def count_finish_length(self) -> int:
        return self.recorded["finish_length"]

    @property
    def count_upstream_error(self) -> int:
        return self.recorded["upstream_error"]

    def settings_for(self, route: str | None) -> ImplicitSettings:
        return self._settings.get(route or "", DEFAULT_SETTINGS)

    def finished(self, record: DecisionRecord, print_: Fingerprint | None, *, finish_length: bool = False) -> None:
        """A request is done (answered or not): record what it says about earlier answers and about
        itself, and remember it if it was answered. Never raises."""
        settings = self.settings_for(record.route)
        if not settings.enabled:
            return
        try:
            if print_ is not None and print_.judges:
                self._judge_earlier(record, print_, settings)
            if record.outcome == "ok" and record.status == 200:
                if finish_length:
                    self._record(record.request_id, record.tenant, record.created_at, "finish_length",
                                 {"model": record.model})
                if print_ is not None:
                    self._remember(record, print_)
            elif _upstream_failed(record):
                self._record(record.request_id, record.tenant, record.created_at, "upstream_error",
                             {"model": record.model, "error_type": record.error_type, "status": record.status})
        except Exception:  # feedback is best effort; the request is already served
            log.exception("implicit feedback for request %s failed", record.request_id)

    def _judge_earlier(self, record: DecisionRecord, print_: Fingerprint, settings: ImplicitSettings) -> None:
        answers = self._sessions.get(print_.session)
        if not answers:
            return
        arrived = record.created_at
        keep: deque[_Answer] = deque(maxlen=self._per_session)
        for answer in answers:
            waited = arrived - answer.answered_at
            if waited > self._ttl:
                continue  # expired: forget it
            if answer.tenant != record.tenant or waited < 0 or waited > settings.window:
                keep.append(answer)  # answered after this request arrived, or outside this route's window
                continue
            if answer.turn == print_.turn:
                self._record(answer.request_id, answer.tenant, answer.issued_at, "regenerate",
                             {"by": record.request_id, "seconds": round(waited, 3)})
                continue  # judged: it cannot be judged again
            alike = similarity(answer.words, print_.words)
            if alike >= settings.similarity and min(len(answer.words), len(print_.words)) >= MIN_REASK_WORDS:
                self._record(answer.request_id, answer.tenant, answer.issued_at, "reask",
                             {"by": record.request_id, "seconds": round(waited, 3), "similarity": round(alike, 3)})
                continue
            keep.append(answer)
        if keep:
            self._sessions[print_.session] = keep
        else:
            del self._sessions[print_.session]

    def _remember(self, record: DecisionRecord, print_: Fingerprint) -> None:
        answers = self._sessions.get(print_.session)
        if answers is None:
            answers = self._sessions[print_.session] = deque(maxlen=self._per_session)
        answers.append(_Answer(record.request_id, record.tenant, print_.turn, print_.words, self._clock(),
                               record.created_at))
        self._sessions.move_to_end(print_.session)
        self._evict()

    def _evict(self) -> None:
        """Drop the least recently used sessions beyond the cap, and expired ones at the old end."""
        while len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)
        cutoff = self._clock() - self._ttl
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if oldest and oldest[-1].answered_at > cutoff:
                break
            self._sessions.popitem(last=False)

    def _record(
        self, request_id: str, tenant: str | None, issued_at: float, signal: str, metadata: dict[str, Any]
    ) -> None:
        self.recorded[signal] += 1
        self._recorder.record_feedback(FeedbackRecord(
            request_id=request_id, score=0.0, metric=signal, source="implicit", model="", tenant=tenant,
            created_at=time.time(), metadata=metadata, issued_at=issued_at,
        ))


def _upstream_failed(record: DecisionRecord) -> bool:
    """An answer the upstream failed: 5xx or a timeout through the gateway, or a broken stream."""
    if record.outcome == "stream_error":
        return True
    if record.outcome != "error" or record.attempts == 0:
        return False  # refused before any upstream was asked (auth, limits, policy)
    return record.status >= 500 or record.status in (408, 504)


def _words(content: Any) -> frozenset[int]:
    """Hashes of the distinct words of a turn's first WORD_CHARS characters.

    Python's own string hash: fast, and salted per process, which is all an in-memory comparison
    needs (these hashes are never stored or compared across processes).
    """
    if isinstance(content, list):
        content = " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        )
    if not isinstance(content, str):
        return frozenset()
    return frozenset(map(hash, set(content[:WORD_CHARS].lower().translate(_PUNCTUATION).split())))


def _digest(data: bytes) -> int:
    """A 64-bit digest for in-memory equality (Python's salted SipHash: several times faster than a
    cryptographic hash, and nothing here is stored or compared across processes)."""
    return hash(data)
