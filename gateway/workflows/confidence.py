"""How sure a cascade stage is of its answer: a number in [0, 1], or None when it cannot be told.

Pure functions over OpenAI chat completions (dicts), except :class:`HeadScorer`, which wraps the
trained answer-confidence head and scores off the event loop.

- :func:`logprob_confidence`: from ``choices[0].logprobs.content``, over the tokens of the message's
  text only (a tool call's JSON tokens are excluded: how sure a model is of JSON syntax says nothing
  about the answer). ``mean``: exp(mean token logprob), the geometric mean of the token
  probabilities; ``min``: exp(min logprob), the probability of the least likely token; ``margin``:
  the mean over tokens of (top-1 probability - top-2 probability) from ``top_logprobs``.
- :func:`agreement`: the share of sampled answers that agree with the majority's normalised final
  answer (:func:`normalise_final`: the final number when there is one, else the text, lower-cased
  without punctuation).
- :func:`verifier_confidence`: P(yes) from a verifier's yes/no answer (from its first token's top
  logprobs when it returned them, else 1 or 0 from the text).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import orjson

log = logging.getLogger("pointsman.workflows")

Stat = Literal["mean", "min", "margin"]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_PUNCT = re.compile(r"[^\w\s]")
_YES = frozenset({"yes", "y", "true", "correct", "right"})
_NO = frozenset({"no", "n", "false", "incorrect", "wrong"})


def first_choice(completion: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``choices[0]`` of a chat completion, if it is an object."""
    choices = completion.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        return choices[0]
    return None


def message_text(completion: Mapping[str, Any]) -> str:
    """The first choice's text; a tool call is rendered as ``name(arguments)`` (its JSON canonical)."""
    choice = first_choice(completion)
    message = choice.get("message") if choice is not None else None
    if not isinstance(message, Mapping):
        return ""
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                text += f" {function.get('name')}({_canonical_json(function.get('arguments'))})"
    return text.strip()


def _canonical_json(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return orjson.dumps(orjson.loads(arguments), option=orjson.OPT_SORT_KEYS).decode()
        except orjson.JSONDecodeError:
            return arguments
    return str(arguments)


def _content_tokens(completion: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The logprob entries of the message's text tokens (tool-call tokens excluded), or None."""
    choice = first_choice(completion)
    if choice is None:
        return None
    logprobs = choice.get("logprobs")
    entries = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    if not isinstance(entries, list) or not entries:
        return None
    message = choice.get("message")
    content = message.get("content") if isinstance(message, Mapping) else None
    if not isinstance(content, str) or not content.strip():
        return None  # only a tool call (or nothing): no text whose tokens could be judged
    calls = message.get("tool_calls") if isinstance(message, Mapping) else None
    with_calls = isinstance(calls, list) and bool(calls)
    # Some servers (vLLM with a tool parser) return logprobs for every generated token, the tool
    # call's JSON included; keep the tokens that spell the text, which comes first. Without a tool
    # call every token is the text's: a token's spelling can be longer than what it adds to the text
    # (partial UTF-8 written as escaped bytes, "\\xf0\\x9f"), and counting it would cut the answer's
    # tail off. The text's length is counted in UTF-8 bytes, a token's from its ``bytes`` when given.
    size = len(content.encode("utf-8", "surrogatepass"))
    kept: list[Mapping[str, Any]] = []
    spelled = 0
    for entry in entries:
        if not isinstance(entry, Mapping) or (with_calls and spelled >= size):
            break
        kept.append(entry)
        spelled += _token_size(entry)
    return kept or None


def _token_size(entry: Mapping[str, Any]) -> int:
    """How many bytes of the text a logprob entry spells: its ``bytes`` (the token's UTF-8 bytes, in
    OpenAI's format), else its token's UTF-8 length."""
    raw = entry.get("bytes")
    if isinstance(raw, list) and raw:
        return len(raw)
    token = entry.get("token")
    return len(token.encode("utf-8", "surrogatepass")) if isinstance(token, str) else 1


#: How far above 0 a logprob may be and still be read (as 0: float rounding in the server). Beyond it
#: the value is no log-probability (a server sending probabilities, say): clipping it to 0 would read
#: every answer as certain and never escalate.
_LOGPROB_ROUNDING = 1e-3


def _logprob(entry: Mapping[str, Any]) -> float | None:
    value = entry.get("logprob")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    if value > _LOGPROB_ROUNDING:
        return None
    return min(float(value), 0.0)


def logprob_confidence(completion: Mapping[str, Any], stat: Stat = "mean") -> float | None:
    """Confidence from the answer's token logprobs (see the module docstring); None without them."""
    entries = _content_tokens(completion)
    if entries is None:
        return None
    if stat == "margin":
        margins = []
        for entry in entries:
            top = entry.get("top_logprobs")
            if not isinstance(top, list) or len(top) < 2:
                return None
            values = sorted((v for v in (_logprob(t) for t in top if isinstance(t, Mapping)) if v is not None),
                            reverse=True)
            if len(values) < 2:
                return None
            margins.append(math.exp(values[0]) - math.exp(values[1]))
        return _clip(sum(margins) / len(margins))
    logprobs = [_logprob(entry) for entry in entries]
    if any(value is None for value in logprobs):
        return None
    values = [v for v in logprobs if v is not None]
    if stat == "min":
        return _clip(math.exp(min(values)))
    return _clip(math.exp(sum(values) / len(values)))


def normalise_final(text: str) -> str:
    """What two answers must share to agree: the final number (``1,000.50`` -> ``1000.5``) when the
    text has one, else the text lower-cased, without punctuation, whitespace collapsed."""
    numbers = _NUMBER.findall(text)
    if numbers:
        raw = numbers[-1].replace(",", "")
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return "number:" + (str(int(value)) if value == int(value) else repr(value))
    return "text:" + " ".join(_PUNCT.sub(" ", text.lower()).split())


def agreement(texts: Sequence[str]) -> tuple[int, float] | None:
    """(index of the first answer of the majority, the majority's share) over sampled answers;
    None with fewer than two answers (one sample agrees with itself: that says nothing).

    An empty sample (no text, no tool call: a choice without a message, a null content) is no
    answer: it agrees with nothing, so blank samples never vote an empty answer in. When every
    sample is empty the share is 0 (the first sample is named, and it escalates)."""
    if len(texts) < 2:
        return None
    keys = [normalise_final(text) if text.strip() else None for text in texts]
    counts = Counter(key for key in keys if key is not None)
    if not counts:
        return 0, 0.0
    best = max(counts.values())
    # Ties go to the answer seen first: deterministic for the same samples.
    winner = next(key for key in keys if key is not None and counts[key] == best)
    return keys.index(winner), best / len(keys)


def verifier_confidence(completion: Mapping[str, Any]) -> float | None:
    """P(yes) from a verifier's answer: from the first token's top logprobs when there are yes/no
    tokens among them, else 1.0 / 0.0 from the answer's first word; None when it is neither."""
    choice = first_choice(completion)
    logprobs = choice.get("logprobs") if choice is not None else None
    entries = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    if isinstance(entries, list) and entries and isinstance(entries[0], Mapping):
        yes = no = 0.0
        top = entries[0].get("top_logprobs")
        candidates = top if isinstance(top, list) and top else [entries[0]]
        for candidate in candidates:
            if not isinstance(candidate, Mapping):
                continue
            word = _word(candidate.get("token"))
            value = _logprob(candidate)
            if value is None:
                continue
            if word in _YES:
                yes += math.exp(value)
            elif word in _NO:
                no += math.exp(value)
        if yes + no > 0:
            return _clip(yes / (yes + no))
    words = message_text(completion).split()
    first = _word(words[0]) if words else ""
    if first in _YES:
        return 1.0
    if first in _NO:
        return 0.0
    return None


def _module() -> Any:
    """``classifiers.answer_confidence``, imported when a cascade needs it (it loads an encoder)."""
    module = importlib.import_module("classifiers.answer_confidence")
    if not hasattr(module, "AnswerConfidence"):  # the package may not re-export it
        module = importlib.import_module("classifiers.answer_confidence.model")
    return module


def _word(token: Any) -> str:
    return _PUNCT.sub("", token).strip().lower() if isinstance(token, str) else ""


def _clip(value: float) -> float:
    return min(max(value, 0.0), 1.0)


class HeadScorer:
    """The trained answer-confidence head (``classifiers.answer_confidence``), loaded once.

    Imported lazily: a gateway whose workflows do not use ``source: head`` never loads it. Scoring
    embeds text (milliseconds), so it runs in a worker thread, never on the event loop.
    """

    def __init__(self, artifact: str | None) -> None:
        self.artifact = artifact
        self._head: Any = None

    def load(self) -> None:
        """Load the head (blocking: call it in a thread); raises when it cannot be loaded."""
        self._head = _module().AnswerConfidence.load(self.artifact)
        log.info("answer-confidence head loaded (encoder %s)", self._head.encoder_id)

    def check(self) -> None:
        """Raise ``FileNotFoundError`` (or ``ImportError``) now if :meth:`load` cannot find the
        artifact; loads nothing (a pre-flight before the gateway starts)."""
        module = _module()
        root = Path(self.artifact) if self.artifact is not None else None
        if root is None:
            defaults = getattr(module, "ARTIFACTS_DIR", None), getattr(module, "DEFAULT_ENCODER", None)
            if defaults[0] is None or defaults[1] is None:
                return  # no known default location: load() will say
            root = Path(defaults[0]) / str(defaults[1])
        if not (root / "manifest.json").is_file():
            raise FileNotFoundError(f"no answer-confidence artifact at {root} (manifest.json missing)")

    async def score(self, prompt: str, answer: str) -> float | None:
        """P(the answer is right) for (prompt, answer); None when the head fails or has no answer."""
        return (await self.score_many(prompt, [answer]))[0]

    async def score_many(self, prompt: str, answers: Sequence[str]) -> list[float | None]:
        """:meth:`score` for several answers to one prompt, in one encoder pass."""
        if self._head is None or not answers:
            return [None] * len(answers)
        try:
            values = await asyncio.to_thread(self._head.score_many, [(prompt, answer) for answer in answers])
        except Exception:  # a broken head must not fail the request: the answers count as unscored
            log.exception("the answer-confidence head failed to score an answer")
            return [None] * len(answers)
        return [
            _clip(float(value)) if answer.strip() and math.isfinite(float(value)) else None
            for answer, value in zip(answers, values, strict=True)
        ]
