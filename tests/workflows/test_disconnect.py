"""A client that goes away cancels every in-flight sub-call of its workflow: the upstream sees each
connection dropped, and the record says the client left."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually
from tests.workflows.conftest import MESSAGES
from tests.workflows.helpers import record, subcalls

HUNG = ("hang:stuck", "hang:stuck-2", "hang:stuck-3")


@pytest.mark.parametrize("stream", [False, True])
def test_a_disconnect_cancels_every_subcall(wf_gateway: GatewayProcess, upstream: FakeUpstream, stream: bool) -> None:
    before = {model: upstream.state.disconnects[model] for model in HUNG}
    earlier = {r["request_id"] for r in wf_gateway.decisions() if r["requested_model"] == "fusion/hung"}
    seen = sum(n for (model, _), n in upstream.state.requests.items() if model in HUNG)
    body = {"model": "fusion/hung", "messages": MESSAGES, "stream": stream}
    with pytest.raises(httpx.ReadTimeout):
        # All three candidates are in flight (they never answer) when the client gives up.
        httpx.post(f"{wf_gateway.base_url}/chat/completions", json=body, timeout=httpx.Timeout(5, read=1.5))
    assert sum(n for (model, _), n in upstream.state.requests.items() if model in HUNG) == seen + 3
    eventually(lambda: all(upstream.state.disconnects[m] > before[m] for m in HUNG),
               "the upstream saw every sub-call's connection dropped")

    def this_request() -> list[str]:  # its record, once the batch writer has flushed it
        return [r["request_id"] for r in wf_gateway.decisions()
                if r["requested_model"] == "fusion/hung" and r["request_id"] not in earlier]

    eventually(lambda: len(this_request()) == 1, "the request's decision record was written")
    [request_id] = this_request()
    row = record(wf_gateway, request_id)
    assert row["status"] == 499 and row["outcome"] == "client_disconnected"
    assert [r["outcome"] for r in subcalls(wf_gateway, request_id)] == ["cancelled"] * 3
