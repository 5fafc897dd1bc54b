"""A cached answer served again: as the JSON body it was, or as the SSE stream a streaming client
expects (``gateway/workflows/sse.py``: role chunk, content, finish chunk, the usage chunk when the
client asked for ``stream_options.include_usage``, then ``data: [DONE]``).

The replay gets a fresh ``id`` and ``created``; its ``usage`` is the original answer's (zeros when a
stored stream carried none). The decision record of a hit counts no tokens and no cost: no upstream
was called.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.cache.entry import CachedAnswer
from gateway.workflows.sse import render

JSON = "application/json"
SSE = "text/event-stream"


def replay(answer: CachedAnswer, request_id: str, body: Mapping[str, Any]) -> tuple[bytes, str]:
    """(bytes, content type) of ``answer`` for a request whose (forwarded) body is ``body``."""
    completion = {**answer.completion, "id": f"chatcmpl-{request_id}", "created": int(time.time())}
    if not body.get("stream"):
        return orjson.dumps(completion), JSON
    options = body.get("stream_options")
    include_usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
    if include_usage and not isinstance(completion.get("usage"), Mapping):
        completion["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    return render(completion, include_usage=include_usage), SSE
