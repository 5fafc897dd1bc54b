"""Cache keys: what a cached answer is scoped by, as digests (never text).

A request's **scope** is everything that may change its answer: the tenant, the route, the model the
plan chose, the endpoint and every field of the (already redacted) body except the ones that only
change how the answer is delivered (``stream``, ``stream_options``) or who asked (``user``, unless the
route sets ``per_user``). The conversation, system prompt, tools, tool_choice, response_format and every
sampling parameter are in it, whatever their names, so an unknown new field also separates entries.

* ``exact``: a digest of the whole scope (the last user turn included).
* ``bucket``: (semantic mode) a digest of the scope with the last user turn's content left out; entries
  of one bucket are compared by the embedding of their last user turn.
* ``guard``: (semantic mode) a digest of what an encoder barely sees in the last user turn but what
  changes its answer: numbers with the signs and units around them, and negations (:func:`guard_tokens`).
  A semantic hit needs the same guard.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from classifiers.messages import last_user_index
from gateway.cache.guard_words import GUARD_WORDS, NUMBER_WORDS
from policies.config import CacheSettings

#: Fields that change how an answer is delivered, not what it is.
DELIVERY_FIELDS = frozenset({"stream", "stream_options"})

# --- the semantic guard ---------------------------------------------------------------------------------
# Encoders barely see digits and signs: the static encoder scores "What is 12+4?" and "What is 12-4?" 1.0
# alike, "Is 10 > 5?" and "Is 10 < 5?" 0.999, and "Which foods are safe for dogs?" and "... not safe ..."
# 0.986. A semantic hit therefore also needs the same guard: the tokens below, in order, plus the number
# of negations. Texts are read after NFKC (fullwidth digits, "½" -> 1/2) with the math signs spelled one
# way (× -> *, ÷ -> /, − and – -> -, ≤ -> <=, ≥ -> >=, ≠ -> !=, ** -> ^, superscripts -> ^digits).

#: Bumped whenever the guard's rule changes: an item stored under another rule has another digest, so it
#: never matches semantically (a miss until it expires, never a wrong hit).
_GUARD_RULE = b"guard-7"
_SUPERSCRIPTS = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻", "0123456789+-", strict=True))
_SUPERSCRIPT_RUN = re.compile("[" + "".join(_SUPERSCRIPTS) + "]+")
_SIGN_SPELLINGS = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-", "·": "*", "⋅": "*", "⁄": "/",
                                 "∕": "/", "≤": "<=", "≥": ">=", "≠": "!="})
_GUARD_TOKEN = re.compile(
    r"(?P<number>\d+(?:[.,]\d+)*|(?<![\w.])\.\d+)"  # 12, 3.5, 1,000 and .5 (".5" is not "5"; "v.5" is)
    r"|(?P<word>°?[^\W\d_]+(?:['’][^\W\d_]+)*)"  # letters (°C, isn't)
    r"|(?P<sign>\*\*|!=|[-+*/^<>=%!$€£¥°&|~])"
    r"|(?P<gap>[ \t]+)"
    r"|(?P<other>.)",
    re.DOTALL,
)
#: Negations: they flip an answer while moving an embedding by a hair (0.97-0.99 alike). "n't" counts too,
#: with or without its apostrophe.
NEGATIONS = frozenset({
    "not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor", "without", "cannot",
    "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "werent", "cant", "couldnt", "wont", "wouldnt",
    "shouldnt", "hasnt", "havent", "hadnt", "mustnt", "neednt", "aint",
})
#: Short words after a number that are not its unit ("7 a prime", "3 of them", "10 is"): left out, or a
#: paraphrase that adds or drops one would miss. Negations are counted apart, never as units.
UNIT_STOPWORDS = frozenset({
    "a", "an", "the", "and", "or", "but", "if", "so", "as", "at", "by", "for", "in", "of", "off", "on",
    "out", "to", "up", "via", "is", "am", "are", "was", "be", "do", "did", "has", "had", "it", "its", "i", "we",
    "you", "he", "she", "my", "our", "his", "her", "me", "us", "yes", "can", "may", "who", "how", "why", "all",
    "any", "too",
})
_UNIT_MAX_LETTERS = 3  # "C", "km", "mph", "°F"; longer words after a number are the encoder's to see
_DEGREES = frozenset({"degree", "degrees"})  # "30 degrees C" reads as "30° C": the C is the unit


def guard_tokens(text: str) -> tuple[list[str], list[str], int]:
    """What a semantic hit must share with the stored entry: ``(tokens, words, negations)``.

    The tokens, in order, are

    * every number (``12``, ``3.5``, ``1,000``, ``.5``; spelled out, as in "two" or "twelve", the number it
      names: :data:`~gateway.cache.guard_words.NUMBER_WORDS`);
    * every sign ``+ - * / ^ < > = % $ € £ ¥ ° & | ~`` (and ``!=``; ``!`` only glued to a number: 5!),
      wherever it stands: a leading minus (-7), an operator (12-4, 5 & 3), a comparison (10 > 5), a sign
      between letters (x < y). Except a hyphen, slash or ampersand between two words of two or more letters,
      spaced or not: "and/or", "TCP/IP", "state-of-the-art", "Paris - the guide", "salt & pepper" are
      spelling (but e-mail, x-axis, a/b, x & y keep theirs);
    * a number's unit, case-folded: letters glued to a number on either side (30C, 5km, 2nd, 12x4, GPT4)
      or a word of at most three letters one space after it, its ° or the word "degrees" (30 C, 5 km, 2 x 3,
      30° F, 30 degrees F), unless it is a function word (:data:`UNIT_STOPWORDS`).

    ``words`` are the spelled-out units, currencies and languages
    (:data:`~gateway.cache.guard_words.GUARD_WORDS`) anywhere else, as their short forms ("kilometers" ->
    km, "Celsius" -> c, "French"; right after a number they are its unit, a token), in order among
    themselves: "Celsius to Fahrenheit" is
    not "Fahrenheit to Celsius", but "in Python, is 0.1 + 0.2 ..." is "is 0.1 + 0.2 ... in Python".

    ``negations`` counts the words of :data:`NEGATIONS` and the words ending in ``n't``: as many negations,
    in any place ("Why isn't it working?" = "Why is it not working?").
    """
    text = _SUPERSCRIPT_RUN.sub(lambda m: "^" + "".join(_SUPERSCRIPTS[c] for c in m.group()), text)
    text = unicodedata.normalize("NFKC", text).translate(_SIGN_SPELLINGS)
    parts = [(m.lastgroup or "other", m.group()) for m in _GUARD_TOKEN.finditer(text)]
    # Numbers spelled out are numbers ("two plus three" = "2 plus 3"), units after them included.
    parts = [("number", NUMBER_WORDS[value.casefold()]) if kind == "word" and value.casefold() in NUMBER_WORDS
             else (kind, value) for kind, value in parts]
    tokens: list[str] = []
    words: list[str] = []
    negations = 0
    for i, (kind, value) in enumerate(parts):
        before = parts[i - 1] if i > 0 else ("", "")
        after = parts[i + 1] if i + 1 < len(parts) else ("", "")
        if kind == "number":
            tokens.append(value)
        elif kind == "sign":
            if value == "**":
                tokens.append("^")
            elif value == "!":
                if before[0] == "number":  # a factorial; elsewhere an exclamation mark
                    tokens.append(value)
            elif not (value in "-/&" and _joins_words(parts, i)):
                tokens.append(value)
        elif kind == "word":
            word = value.casefold().replace("’", "'")
            if word in NEGATIONS or word.endswith("n't"):
                negations += 1
                continue
            glued = before[0] == "number" or after[0] == "number"
            # One space after a number, or after its degree sign or word: "30 C", "30° C", "30 degrees C".
            spaced = before[0] == "gap" and i > 1 and (
                parts[i - 2][0] == "number" or parts[i - 2][1] == "°" or parts[i - 2][1].casefold() in _DEGREES
            )
            if word in GUARD_WORDS:  # spelled out: a number's unit like its short form ("5 kilometers" = "5 km")
                (tokens if glued or spaced else words).append(GUARD_WORDS[word])
            elif glued or (spaced and len(word.lstrip("°")) <= _UNIT_MAX_LETTERS and word not in UNIT_STOPWORDS):
                tokens.append(word)
    return tokens, words, negations


def _joins_words(parts: list[tuple[str, str]], i: int) -> bool:
    """Whether the hyphen, slash or ampersand ``parts[i]`` stands between two words of two or more letters
    (spaces around it or not): "and/or", "TCP/IP", "Paris - the guide", "salt & pepper" are spelling and
    punctuation, not arithmetic."""
    # A gap is a whole run of spaces, so the nearest other part is one or two places away.
    before = next((parts[j] for j in (i - 1, i - 2) if j >= 0 and parts[j][0] != "gap"), ("", ""))
    after = next((parts[j] for j in (i + 1, i + 2) if j < len(parts) and parts[j][0] != "gap"), ("", ""))
    return before[0] == after[0] == "word" and len(before[1]) > 1 and len(after[1]) > 1


def guard_digest(text: str) -> str:
    """The digest of :func:`guard_tokens` (16 hex), which a semantic hit must share with the entry."""
    tokens, words, negations = guard_tokens(text)
    payload = b"\x1f".join(
        [_GUARD_RULE, *(t.encode() for t in tokens), b"\x1e", *(w.encode() for w in words), b"neg=%d" % negations]
    )
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class CacheKeys:
    """The digests of one request's scope (hex, 32 characters)."""

    exact: str
    tenant: str  # digest of the tenant alone (16 hex): Redis key names carry it, so a tenant can be forgotten
    bucket: str | None = None  # semantic mode, when the last user turn is plain text of at most max_chars
    text: str | None = None  # that last user turn (for the encoder; stored only with store_text)

    @property
    def guard(self) -> str:
        """:func:`guard_digest` of the last user turn (a semantic hit needs the same one); computed when
        asked, since an exact hit never needs it."""
        return guard_digest(self.text) if self.text is not None else ""


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def tenant_digest(tenant: str | None) -> str:
    """The digest of a tenant (``""`` when auth is off) as Redis key names carry it."""
    return hashlib.blake2b((tenant or "").encode(), digest_size=8).hexdigest()


def bypass_reason(body: Mapping[str, Any], settings: CacheSettings) -> str | None:
    """Why this request is not cached at all (None: it is)."""
    n = body.get("n")
    if n is not None and n != 1:
        return "n"  # several choices: a replay of one stored set would defeat asking for samples
    if not settings.sampled:
        temperature = body.get("temperature")
        if temperature is None or (isinstance(temperature, int | float) and temperature > 0):
            return "sampled"
    return None


def last_user_text(body: Mapping[str, Any]) -> tuple[int, str | None]:
    """(position, text) of the last user message; text None when its content is not plain text
    (images, audio, files: only an exact match may hit then)."""
    index = last_user_index(body)
    if index < 0:
        return index, None
    content = body["messages"][index].get("content")
    if isinstance(content, str):
        return index, content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type") in ("text", "input_text") and isinstance(
                part.get("text"), str
            ):
                texts.append(part["text"])
            else:
                return index, None
        return index, "\n".join(texts)
    return index, None


def cache_keys(
    *, tenant: str | None, route: str, model: str, endpoint: str, body: Mapping[str, Any], settings: CacheSettings,
    encoder: str = "",
) -> CacheKeys:
    """The request's keys (``encoder``: the id of the encoder whose embeddings a bucket holds).

    Raises ``TypeError``/``orjson.JSONEncodeError`` on a body orjson cannot serialise canonically (the
    caller bypasses the cache then)."""
    scope = {
        k: v for k, v in body.items()
        if k not in DELIVERY_FIELDS and (k != "user" or settings.per_user)
    }
    head = orjson.dumps([tenant or "", route, model, endpoint])
    exact = _digest(head, orjson.dumps(scope, option=orjson.OPT_SORT_KEYS))
    tenant_key = tenant_digest(tenant)
    if settings.mode != "semantic":
        return CacheKeys(exact=exact, tenant=tenant_key)
    index, text = last_user_text(scope)
    if text is None or not text.strip() or len(text) > settings.max_chars:
        return CacheKeys(exact=exact, tenant=tenant_key)
    messages = list(scope["messages"])
    messages[index] = {**messages[index], "content": None}
    rest = orjson.dumps({**scope, "messages": messages}, option=orjson.OPT_SORT_KEYS)
    bucket = _digest(head, b"bucket", encoder.encode(), rest)
    return CacheKeys(exact=exact, tenant=tenant_key, bucket=bucket, text=text)
