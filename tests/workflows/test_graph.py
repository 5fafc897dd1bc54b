"""Graph workflows through the real gateway: templated steps in dependency order, parallel steps
bounded by the fan-out cap."""

from __future__ import annotations

from openai import OpenAI

from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.workflows.conftest import MESSAGES, key
from tests.workflows.helpers import extension, subcalls


def test_steps_run_in_order_with_their_templates(
    sdk: OpenAI, upstream: FakeUpstream, wf_gateway: GatewayProcess
) -> None:
    user = key()
    raw = sdk.chat.completions.with_raw_response.create(model="graph/dcr", messages=MESSAGES, user=user,
                                                         temperature=0.2)
    draft, critique = "ECHO: Say hello.", "ECHO: Critique [ECHO: Say hello.] of [Say hello.]"
    assert raw.parse().choices[0].message.content == f"ECHO: Revise [{draft}] given [{critique}]"
    assert raw.headers["x-pointsman-stage"] == "2:revise"
    bodies = [b for b in upstream.state.bodies if b.get("user") == user]
    assert [b["messages"] for b in bodies] == [
        MESSAGES,  # a step without a prompt gets the client's conversation
        [{"role": "user", "content": f"Critique [{draft}] of [Say hello.]"}],
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": f"Revise [{draft}] given [{critique}]"}],
    ]
    assert all(b["temperature"] == 0.2 for b in bodies)  # the client's sampling fields
    rows = subcalls(wf_gateway, raw.headers["x-pointsman-request-id"])
    assert [(r["idx"], r["step"], r["model"], r["outcome"]) for r in rows] == [
        (0, "draft", "echo", "ok"), (1, "critique", "echo", "ok"), (2, "revise", "echo", "ok")]


def test_independent_steps_run_in_parallel_up_to_max_fanout(sdk: OpenAI, upstream: FakeUpstream) -> None:
    user = key()
    completion = sdk.chat.completions.create(model="graph/wide", messages=MESSAGES, user=user)
    steps = extension(completion)["steps"]
    assert sorted(s["step"] for s in steps[:4]) == ["s0", "s1", "s2", "s3"] and steps[4]["step"] == "join"
    assert upstream.state.peak[user] == 2  # four ready steps, max_fanout 2: two at a time, never more
    assert completion.choices[0].message.content.count("slow answer") == 4
