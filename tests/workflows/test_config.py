"""Workflow configs are validated at start-up with errors naming the key, by the gateway and by the
routing config that offline evaluation reads (no HTTP server)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gateway.config import parse_config
from gateway.errors import ConfigError
from gateway.workflows import preflight
from policies.brain import RoutingConfigError, parse_routing_config
from policies.workflows import CascadeWorkflow, GraphWorkflow

BASE: dict[str, Any] = {
    "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "models": [
        {"name": "small"}, {"name": "big"}, {"name": "judge"}]}],
    "workflows": [
        {"name": "fast", "kind": "cascade", "stages": ["small", "big"],
         "confidence": {"source": "logprobs", "threshold": 0.7}},
        {"name": "mix", "kind": "fusion", "candidates": ["small", "big"], "combine": {"judge": "judge"}},
        {"name": "rate", "kind": "ratings", "candidates": ["small", "big"], "judge": "judge"},
        {"name": "dcr", "kind": "graph", "output": "revise", "steps": [
            {"name": "draft", "model": "small"},
            {"name": "revise", "model": "big", "after": ["draft"], "prompt": "{input}: improve {draft}"}]},
    ],
    "routes": [
        {"name": "auto", "model": "cascade/fast"},
        {"name": "smart", "policy": "rules", "rules": [
            {"name": "tools", "when": {"signal": "tools", "op": "truthy"}, "action": {"workflow": "rate"}}],
         "cost_quality": {"strong": "big", "weak": "small", "middle": {"band": [0.3, 0.7], "workflow": "fast"}}},
    ],
}

Change = Callable[[dict[str, Any]], None]


def problem(change: Change) -> str:
    config = copy.deepcopy(BASE)
    change(config)
    with pytest.raises(ConfigError) as info:
        parse_config(config)
    return str(info.value)


def test_a_valid_workflow_config() -> None:
    config = parse_config(BASE)
    cascade, *_, graph = config.workflows
    assert isinstance(cascade, CascadeWorkflow) and cascade.model_name == "cascade/fast"
    assert [stage.label for stage in cascade.stages] == ["small", "big"]
    assert cascade.caps.max_steps == 16 and cascade.caps.max_cost_usd is None
    assert isinstance(graph, GraphWorkflow) and graph.output == "revise"
    assert config.routing().workflow_models() == {
        "fast": "cascade/fast", "mix": "fusion/mix", "rate": "ratings/rate", "dcr": "graph/dcr"}
    assert config.workflow_limits.max_concurrent_subcalls == 64


def test_offline_evaluation_reads_the_same_workflows() -> None:
    routing = parse_routing_config(BASE)
    assert [w.model_name for w in routing.workflows] == ["cascade/fast", "fusion/mix", "ratings/rate", "graph/dcr"]
    broken = copy.deepcopy(BASE)
    broken["workflows"][0]["stages"] = ["small", "huge"]
    with pytest.raises(RoutingConfigError, match=r"workflows\.fast\.stages\.1\.model: unknown model 'huge'"):
        parse_routing_config(broken)


@pytest.mark.parametrize(("change", "expected"), [
    (lambda c: c["workflows"][0].update(stages=["small", "huge"]),
     "workflows.fast.stages.1.model: unknown model 'huge'"),
    (lambda c: c["workflows"][0].update(stages=["small"]), "workflows.0.stages: Tuple should have at least 2 items"),
    (lambda c: c["workflows"][0]["confidence"].update(threshold=1.5), "workflows.0.confidence.threshold: Input should"),
    (lambda c: c["workflows"][0]["confidence"].update(source="vibes"),
     "workflows.0.confidence.source: Input should be"),
    (lambda c: c["workflows"][0]["confidence"].update(samples=5),
     "workflows.0.confidence.samples: only used with source agreement, not logprobs"),
    (lambda c: c["workflows"][0]["confidence"].update(source="verifier"), "workflows.0.confidence.verifier: source"),
    (lambda c: c["workflows"][0]["confidence"].update(source="verifier", verifier={"model": "ghost"}),
     "workflows.fast.confidence.verifier.model: unknown model 'ghost'"),
    (lambda c: c["workflows"][0]["confidence"].update(source="verifier", verifier={"model": "judge", "prompt": "ok?"}),
     "the prompt needs the placeholder(s) {answer}"),
    (lambda c: c["workflows"][0].update(kind="pipeline"), "workflows.0: Input tag 'pipeline' found using 'kind'"),
    (lambda c: c["workflows"][0].update(colour="red"), "workflows.0.colour: unknown key"),
    (lambda c: c["workflows"][0].update(caps={"max_stepz": 3}), "workflows.0.caps.max_stepz: unknown key"),
    (lambda c: c["workflows"][1].update(min_answers=3), "workflows.1.min_answers: 3 is more than the 2 candidates"),
    (lambda c: c["workflows"][1].update(combine={"fuser": "big", "judge": "judge"}), "workflows.1.combine: combine is"),
    (lambda c: c["workflows"][1].update(combine={"fuser": "big", "prompt": "no refs"}),
     "workflows.1.combine.prompt: the prompt needs the placeholder(s) {references}"),
    (lambda c: c["workflows"][2].update(candidates=["small", "small"]), "workflows.2.candidates: 'small' listed twice"),
    (lambda c: c["workflows"][2].update(head={}), "workflows.2: a ratings workflow scores with exactly one of judge"),
    (lambda c: c["workflows"][2].update(judge=None, head={}, mode="pairwise"), "workflows.2.mode: only go with judge"),
    (lambda c: c["workflows"][2].update(caps={"max_steps": 3}),
     "workflows.2.caps.max_steps: this workflow makes at least 4 sub-calls, more than max_steps 3"),
    (lambda c: c["workflows"][3]["steps"][1].update(prompt="{draft} {critique}"),
     "workflows.3.steps.1.prompt: unknown placeholder(s) {critique}"),
    (lambda c: c["workflows"][3]["steps"][0].update(after=["revise"]), "wait for each other (a cycle)"),
    (lambda c: c["workflows"][3]["steps"][1].update(after=["plan"]),
     "workflows.3.steps.1.after.0: unknown step 'plan'"),
    (lambda c: c["workflows"][3].update(output="publish"), "workflows.3.output: unknown step 'publish'"),
    (lambda c: c["workflows"][3]["steps"].append({"name": "aside", "model": "small"}),
     "workflows.3.steps: 'aside' do(es) not lead to the output 'revise'"),
    (lambda c: c["workflows"][3]["steps"][1].update(prompt="{draft:>10}"), "is not a plain name"),
    (lambda c: c["workflows"].append(dict(c["workflows"][0])), "workflows: two workflows are named 'fast'"),
    (lambda c: c["routes"][0].update(model="cascade/slow"),
     "routes.auto.model: unknown model or workflow 'cascade/slow'"),
    (lambda c: c["routes"][0].update(fallbacks=["small"]), "routes.auto.fallbacks: 'cascade/fast' is a workflow"),
    (lambda c: c["routes"][1]["rules"][0]["action"].update(workflow="rated"),
     "routes.smart.rules.0.action.workflow: unknown workflow 'rated' (did you mean 'rate'?)"),
    (lambda c: c["routes"][1]["rules"][0]["action"].update(route="big"), "an action is exactly one of"),
    (lambda c: c["routes"][1]["cost_quality"]["middle"].update(band=[0.7, 0.3]), "band [0.7, 0.3] must satisfy"),
    (lambda c: c["routes"][1]["cost_quality"]["middle"].update(workflow="ghost"),
     "routes.smart.cost_quality.middle.workflow: unknown workflow 'ghost'"),
    (lambda c: c["routes"].append({"name": "cascade/fast", "model": "small"}),
     "routes.cascade/fast: a route may not share its name with a workflow's model"),
    (lambda c: c.update(workflow_limits={"max_concurrent_subcalls": 0}),
     "workflow_limits.max_concurrent_subcalls: Input should be greater than or equal to 1"),
])
def test_problems_name_the_key(change: Change, expected: str) -> None:
    assert expected in problem(change)


def test_a_missing_head_artifact_fails_before_start(tmp_path: Any) -> None:
    config = copy.deepcopy(BASE)
    config["workflows"][0]["confidence"] = {"source": "head", "threshold": 0.5, "artifact": str(tmp_path / "none")}
    with pytest.raises(ConfigError, match=r"workflows\.fast\.confidence\.artifact: no answer-confidence artifact"):
        preflight(parse_config(config))
    preflight(parse_config(BASE))  # nothing to check without a head
