"""Structural limits on a parsed request body: nesting depth and duplicate keys, checked once.

orjson parses strictly and fast but accepts up to 1024 levels of nesting and keeps the last of
duplicate keys. Both hurt a proxy: orjson itself refuses to *re-encode* more than 254 levels (every
routed request is re-encoded), recursive routing code fails further down, and a duplicate key means
the router reads one value while the untouched body goes upstream, where another parser may read the
other. So a body is checked here once, right after parsing, and refused with a 400.

The check walks the parsed body once (iteratively: no recursion to exhaust). Duplicate keys are found
without a second parse: every key/value pair in the raw text has exactly one ``:`` outside strings,
so ``raw.count(b":") - (colons inside parsed strings)`` is the number of pairs the client sent; if it
exceeds the keys the parsed objects hold, some object repeated a key. A ``\\u003a`` escape makes the
two counts differ by design, so bodies with ``\\u003`` in them take the slower exact path (the
standard library's parser with a pair hook), which also names the repeated key.

The walk is Python: ~0.3 s for a body of 240,000 tiny messages, during which the event loop would serve
no one else. A large body is checked in a scan worker (:func:`shape_problem`, which parses the bytes
itself) while the gateway parses it for its own use.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from gateway.errors import InvalidRequestError
from policies.echo import client_echo

#: The deepest nesting of JSON objects and arrays a request body may have (the body itself is
#: level 1). Real requests nest a few dozen levels at most, JSON-schema tool parameters included;
#: orjson re-encodes at most 254 levels, and routing code walks bodies, so deeper ones are refused.
MAX_JSON_DEPTH = 128

_ESCAPED_COLON_PREFIX = b"\\u003"  # \u003a / \u003A encode ":" inside a string


def check_json_shape(raw: bytes, body: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise a 400 :class:`InvalidRequestError` when ``body`` (parsed from ``raw``) nests deeper
    than ``max_depth`` or when one of its objects repeated a key in ``raw``."""
    pairs, string_colons, depth = _walk(body, max_depth)
    if depth > max_depth:
        raise InvalidRequestError(
            f"request body nests JSON objects/arrays more than {max_depth} levels deep; "
            f"the gateway's limit is {max_depth}",
            code="json_too_deep",
        )
    if _ESCAPED_COLON_PREFIX in raw or raw.count(b":") - string_colons != pairs:
        _find_duplicate_exactly(raw)


def shape_problem(raw: bytes) -> tuple[str, str | None] | None:
    """:func:`check_json_shape` of ``raw`` (a JSON object the caller has parsed already) as a value that
    crosses a process boundary: None if it is fine, else the 400's ``(message, code)``."""
    try:
        check_json_shape(raw, orjson.loads(raw))
    except InvalidRequestError as refused:
        return refused.message, refused.code
    return None


def _walk(body: Any, max_depth: int) -> tuple[int, int, int]:
    """(object keys, ``:`` characters inside keys and strings, deepest level seen), stopping as
    soon as a level deeper than ``max_depth`` is reached."""
    pairs = colons = deepest = 0
    stack: list[tuple[Any, int]] = [(body, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        if depth > deepest:
            deepest = depth
            if depth > max_depth:
                break
        if type(node) is dict:
            pairs += len(node)
            values = node.values()
            for key in node:
                colons += key.count(":")
        else:
            values = node
        below = depth + 1
        for value in values:
            kind = type(value)
            if kind is str:
                colons += value.count(":")
            elif kind is dict or kind is list:
                push((value, below))
    return pairs, colons, deepest


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise InvalidRequestError(
                    f"request body repeats the key {client_echo(key)} in one object; send each key once",
                    code="duplicate_key",
                )
            seen.add(key)
    return obj


def _find_duplicate_exactly(raw: bytes) -> None:
    # orjson has accepted the body, so it is valid UTF-8 JSON at most MAX_JSON_DEPTH deep; should
    # the standard parser still disagree with it, the body is refused rather than trusted.
    try:
        json.loads(raw, object_pairs_hook=_reject_duplicates)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequestError("request body is not valid JSON", code="invalid_json") from exc
