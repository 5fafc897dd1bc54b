"""Routing probes: a YAML file of conversations and the routing each must get, checked offline.

A probe names a prompt (or a whole conversation, with tools) and what the decision must be: the
model, the rule that decided, that it is blocked, or which PII kinds get redacted. ``pointsman
probe FILE [--config CONFIG]`` and the test suite run them without calling any backend, so a
policy or router change that breaks an expectation fails before it ships.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.config import Config, parse_config
from gateway.routing import RoutingBrain
from policies.brain import explain_request
from policies.textfile import read_utf8
from policies.yaml_file import load_yaml


@dataclass(slots=True, frozen=True)
class Probe:
    """One conversation and the routing it must get on ``route``."""

    name: str
    body: dict[str, Any]
    expect: dict[str, Any]
    route: str = "auto"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class ProbeResult:
    probe: Probe
    passed: bool
    failures: list[str]
    explanation: dict[str, Any]


def _read_yaml(path: str | Path) -> Any:
    """A probes file's YAML; ``ValueError`` naming the file when it cannot be read or parsed."""
    try:
        return load_yaml(read_utf8(path))
    except OSError as exc:
        raise ValueError(f"cannot read probes file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None


def load_probe_config(path: str | Path) -> Config | None:
    """The gateway config embedded in a probes file (its ``config:`` section), if it has one."""
    data = _read_yaml(path)
    section = data.get("config") if isinstance(data, dict) else None
    return parse_config(section) if section is not None else None


def load_probes(path: str | Path) -> list[Probe]:
    """Parse a probes file; errors name the probe index and the key."""
    data = _read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("probes"), list):
        raise ValueError(f"{path}: expected a mapping with a 'probes' list")
    probes = []
    for index, item in enumerate(data["probes"]):
        where = f"{path}: probes.{index}"
        if not isinstance(item, dict) or "expect" not in item:
            raise ValueError(f"{where}: each probe needs 'expect'")
        expect = item["expect"]
        if isinstance(expect, str):  # "expect: big-model" says which model it must get
            expect = {"model": expect}
        if not isinstance(expect, dict):
            raise ValueError(f"{where}.expect: expected a mapping like {{model: big-model}} or a model name")
        if "prompt" in item:
            if not isinstance(item["prompt"], str):
                raise ValueError(f"{where}.prompt: expected text, got {type(item['prompt']).__name__}")
            messages: list[Any] = [{"role": "user", "content": item["prompt"]}]
            if item.get("system"):
                messages.insert(0, {"role": "system", "content": item["system"]})
        elif isinstance(item.get("conversation"), list):
            messages = item["conversation"]
        else:
            raise ValueError(f"{where}: give 'prompt' or 'conversation'")
        route = str(item.get("route", "auto"))
        body: dict[str, Any] = {"model": route, "messages": messages}
        if item.get("tools"):
            body["tools"] = item["tools"]
        unknown = set(expect) - {"model", "rule", "blocked", "redact"}
        if unknown:
            raise ValueError(
                f"{where}.expect: unknown key(s) {', '.join(sorted(map(str, unknown)))} "
                "(expected model, rule, blocked or redact)"
            )
        probes.append(Probe(
            name=str(item.get("name", f"probe {index}")), body=body, expect=dict(expect),
            route=route, headers={str(k).lower(): str(v) for k, v in (item.get("headers") or {}).items()},
        ))
    return probes


async def run_probes(config: Config, probes: Sequence[Probe]) -> list[ProbeResult]:
    """Explain every probe with the config's routing brain and compare with its expectations."""
    brain = RoutingBrain(config)
    await brain.start()
    results = []
    try:
        for probe in probes:
            if probe.route not in brain.policies:
                results.append(ProbeResult(probe, False, [f"no route {probe.route!r}"], {}))
                continue
            explanation = await explain_request(
                brain, probe.route, probe.body, headers=probe.headers, request_id=f"probe:{probe.name}"
            )
            failures = _compare(probe.expect, explanation)
            results.append(ProbeResult(probe, not failures, failures, explanation))
    finally:
        await brain.close()
    return results


def _compare(expect: Mapping[str, Any], explanation: Mapping[str, Any]) -> list[str]:
    failures = []
    blocked = bool(explanation.get("blocked"))
    if "blocked" in expect and bool(expect["blocked"]) != blocked:
        failures.append(f"blocked: expected {expect['blocked']}, got {blocked}")
    if "model" in expect and explanation.get("model") != expect["model"]:
        failures.append(f"model: expected {expect['model']!r}, got {explanation.get('model')!r} "
                        f"({explanation.get('reason', '')})")
    if "rule" in expect:
        applied = [r["name"] for r in explanation.get("rules", []) if r.get("applied")]
        if expect["rule"] not in applied:
            failures.append(f"rule: expected {expect['rule']!r} to decide, applied: {applied}")
    if "redact" in expect:
        found = set(explanation.get("signals", {}).get("pii", {}).get("value") or [])
        missing = set(expect["redact"]) - found
        if missing or not explanation.get("redact"):
            failures.append(f"redact: expected {sorted(expect['redact'])} found and redacted, found {sorted(found)}")
    return failures
