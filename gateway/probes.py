"""Routing probes: a YAML file of conversations and the routing each must get, checked offline.

A probe names a prompt (or a whole conversation, with tools) and what the decision must be: the
model, the rule that decided, that it is blocked, or which PII kinds get redacted. ``pointsman
probe FILE [--config CONFIG]`` and the test suite run them without calling any backend, so a
policy or router change that breaks an expectation fails before it ships.

A probe passes only for the right reason, so the file is checked strictly before anything runs
(:class:`ProbeFileError`, one line naming the file, the probe and the key):

* keys: a probe takes ``name``, ``prompt`` (with an optional ``system``) or ``conversation``,
  ``tools``, ``route``, ``headers`` and ``expect``; anything else is refused with a did-you-mean
  (a ``header:`` typo would otherwise run the probe without its headers); names are unique;
* the request: it must be one the gateway accepts (the gateway's own request validation); header
  values are text (or numbers), and an ``x-pointsman-threshold`` must be one the gateway takes;
* ``expect``: at least one of ``model``, ``rule``, ``blocked`` (a real boolean: ``'false'`` is
  text) and ``redact`` (a list of PII kinds; one kind may be written alone, ``redact: email``;
  ``[]`` means nothing may be redacted, a non-empty list that at least those kinds are);
* against the config (:func:`check_probes`, at the start of :func:`run_probes`): the route exists,
  the model is one of the config's models, the rule is one of the route's rules, the PII kinds are ones a
  redact rule of the route removes and ``blocked: true`` is on a route with a block rule. A probe
  that could only ever fail is a mistake in the file, not a routing regression.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from classifiers.messages import iter_message_texts
from classifiers.signals.pii import PII_KINDS, find_pii
from gateway.config import Config, parse_config
from gateway.errors import ConfigError, PointsmanError
from gateway.protocol import CHAT, parse_request
from gateway.routing import offline_brain
from policies.base import PolicyError
from policies.brain import explain_request
from policies.knob import threshold_override
from policies.textfile import read_utf8
from policies.workflows import workflow_models
from policies.yaml_file import load_yaml

#: Top-level keys of a probes file.
FILE_KEYS = ("config", "probes")
#: Keys of one probe.
PROBE_KEYS = ("name", "prompt", "system", "conversation", "tools", "route", "headers", "expect")
#: What a probe may expect.
EXPECT_KEYS = ("model", "rule", "blocked", "redact")

# RFC 9110 token characters: what an HTTP header name may hold.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class ProbeFileError(ConfigError, ValueError):
    """A probes file that cannot be checked; the message is one line naming the file, probe and key.

    A :class:`ValueError` (what reading a probes file always raised) and a :class:`ConfigError`
    (what callers of :func:`run_probes` report as a bad file), so each existing handler treats it
    as a bad file (``pointsman probe`` exits 2) rather than as a failed probe or a crash.
    """


@dataclass(slots=True, frozen=True)
class Probe:
    """One conversation and the routing it must get on ``route``."""

    name: str
    body: dict[str, Any]
    expect: dict[str, Any]
    route: str = "auto"
    headers: dict[str, str] = field(default_factory=dict)
    where: str = ""  # "FILE: probes.N", for messages about this probe


@dataclass(slots=True)
class ProbeResult:
    """A probe's verdict: ``failures`` says what differed from its expectations (empty when it passed)."""

    probe: Probe
    passed: bool
    failures: list[str]
    explanation: dict[str, Any]


def _read_yaml(path: str | Path) -> Any:
    """A probes file's YAML; ``ValueError`` naming the file when it cannot be read or parsed."""
    try:
        return load_yaml(read_utf8(path))
    except OSError as exc:
        raise ProbeFileError(f"cannot read probes file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ProbeFileError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: where and what (PyYAML's own text spans lines, with a source excerpt)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or not problem:
        return " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context})" if context else "")


def load_probe_config(path: str | Path) -> Config | None:
    """The gateway config embedded in a probes file (its ``config:`` section), if it has one."""
    data = _read_yaml(path)
    section = data.get("config") if isinstance(data, dict) else None
    if section is None:
        return None
    try:
        return parse_config(section)
    except ConfigError as exc:  # the config's own message names the key, not the probes file it is in
        raise ConfigError(f"{path}: config section: {exc}") from None


def load_probes(path: str | Path) -> list[Probe]:
    """Parse a probes file; :class:`ProbeFileError` (a ``ValueError``) naming the probe index and the key."""
    data = _read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("probes"), list):
        raise ProbeFileError(f"{path}: expected a mapping with a 'probes' list")
    _refuse_unknown(data, FILE_KEYS, f"{path}")
    if not data["probes"]:
        raise ProbeFileError(f"{path}: probes: the list is empty (a probes file must check something)")
    probes: list[Probe] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(data["probes"]):
        probe = _load_probe(item, index, f"{path}: probes.{index}")
        if probe.name in seen:  # results are reported by name: two alike could not be told apart
            raise ProbeFileError(
                f"{probe.where}.name: {probe.name!r} is also the name of probes.{seen[probe.name]} "
                "(probe names must be unique)"
            )
        seen[probe.name] = index
        probes.append(probe)
    return probes


def _load_probe(item: Any, index: int, where: str) -> Probe:
    """One probe of the file, checked as described in the module docstring."""
    if not isinstance(item, dict) or "expect" not in item:
        raise ProbeFileError(f"{where}: each probe needs 'expect'")
    _refuse_unknown(item, PROBE_KEYS, where)
    name = item.get("name", f"probe {index}")
    if not isinstance(name, str) or not name.strip():
        raise ProbeFileError(f"{where}.name: expected text, got {_shown(name)}")
    expect = _load_expect(item["expect"], f"{where}.expect")
    has_prompt, has_conversation = "prompt" in item, "conversation" in item
    if has_prompt and has_conversation:
        raise ProbeFileError(f"{where}: give 'prompt' or 'conversation', not both")
    if has_prompt:
        if not isinstance(item["prompt"], str):
            raise ProbeFileError(f"{where}.prompt: expected text, got {type(item['prompt']).__name__}")
        messages: Any = [{"role": "user", "content": item["prompt"]}]
        system = item.get("system")
        if system is not None and not isinstance(system, str):
            raise ProbeFileError(f"{where}.system: expected text, got {type(system).__name__}")
        if system:
            messages.insert(0, {"role": "system", "content": system})
    elif has_conversation:
        if "system" in item:  # it was silently dropped: the probe ran without the system prompt it names
            raise ProbeFileError(
                f"{where}.system: only goes with 'prompt'; put a system message first in the conversation"
            )
        messages = item["conversation"]  # its shape is checked as the gateway checks a request, below
    else:
        raise ProbeFileError(f"{where}: give 'prompt' or 'conversation'")
    route = item.get("route", "auto")
    if not isinstance(route, str) or not route:
        raise ProbeFileError(f"{where}.route: expected a route name, got {_shown(route)}")
    body: dict[str, Any] = {"model": route, "messages": messages}
    if item.get("tools") is not None:
        body["tools"] = item["tools"]
    return Probe(
        name=name, body=_as_request(body, where, "conversation" if has_conversation else "prompt"),
        expect=expect, route=route, headers=_load_headers(item.get("headers"), f"{where}.headers"), where=where,
    )


def _as_request(body: dict[str, Any], where: str, messages_key: str) -> dict[str, Any]:
    """``body`` as the gateway would read it from the wire: JSON, then the gateway's own request
    validation. A conversation the gateway answers with a 400 must not pass a probe."""
    try:
        # allow_nan=False: YAML's .nan would be sent as NaN, which no JSON parser of the gateway takes.
        raw = json.dumps(body, allow_nan=False, ensure_ascii=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:  # a YAML date, set or binary has no JSON form
        raise ProbeFileError(f"{where}: not a JSON request: {exc}") from None
    try:
        return parse_request(raw, CHAT)
    except PointsmanError as exc:
        key = "tools" if exc.param == "tools" else messages_key
        raise ProbeFileError(f"{where}.{key}: the gateway would refuse this request: {exc.message}") from None


def _load_headers(raw: Any, where: str) -> dict[str, str]:
    """A probe's request headers: names lower-cased, values text (a YAML number is taken as its text)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ProbeFileError(
            f"{where}: expected a mapping of header names to values, like {{x-pointsman-threshold: '0.3'}}, "
            f"got {_shown(raw)}"
        )
    headers: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise ProbeFileError(f"{where}: {name!r} is not a header name")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            # YAML reads yes/no/true/false/null as non-text: a header would carry "True" or "None".
            raise ProbeFileError(f"{where}.{name}: expected text (quote it), got {_shown(value)}")
        if name.lower() in headers:
            raise ProbeFileError(f"{where}: {name!r} is given twice (header names ignore case)")
        headers[name.lower()] = value if isinstance(value, str) else str(value)
    try:
        threshold_override(headers)  # the gateway's own check: it answers a malformed override with a 400
    except PolicyError as exc:
        raise ProbeFileError(f"{where}: {exc.message}") from None
    return headers


def _load_expect(raw: Any, where: str) -> dict[str, Any]:
    """A probe's ``expect``: a model name, or a mapping of at least one of :data:`EXPECT_KEYS`."""
    expect = {"model": raw} if isinstance(raw, str) else raw  # "expect: big-model" names the model it must get
    if not isinstance(expect, dict):
        raise ProbeFileError(f"{where}: expected a mapping like {{model: big-model}} or a model name")
    unknown = set(expect) - set(EXPECT_KEYS)
    if unknown:
        raise ProbeFileError(
            f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))} "
            f"(expected model, rule, blocked or redact){_did_you_mean(unknown, EXPECT_KEYS)}"
        )
    if not expect:  # it passed whatever the routing did
        raise ProbeFileError(f"{where}: expects nothing; give at least one of model, rule, blocked or redact")
    out: dict[str, Any] = {}
    for key in ("model", "rule"):
        if key in expect:
            value = expect[key]
            if not isinstance(value, str) or not value.strip():
                raise ProbeFileError(f"{where}.{key}: expected a {key} name, got {_shown(value)}")
            out[key] = value
    if "blocked" in expect:
        value = expect["blocked"]
        if not isinstance(value, bool):  # bool('false') is True: a quoted false expected a block
            raise ProbeFileError(f"{where}.blocked: expected true or false (unquoted), got {_shown(value)}")
        out["blocked"] = value
    if "redact" in expect:
        out["redact"] = _load_redact(expect["redact"], f"{where}.redact")
    if out.get("blocked") is True and "model" in out:
        raise ProbeFileError(f"{where}: blocked: true and model {out['model']!r} contradict (a blocked request "
                             "gets no model)")
    if out.get("blocked") is True and out.get("redact"):
        raise ProbeFileError(f"{where}: blocked: true and redact {out['redact']} contradict (a blocked request is "
                             "never forwarded, so nothing is redacted)")
    return out


def _load_redact(value: Any, where: str) -> list[str]:
    """``redact``: a list of PII kinds, or one kind written alone (a one-item list, not its letters)."""
    kinds = [value] if isinstance(value, str) else value
    if not isinstance(kinds, list) or not all(isinstance(kind, str) for kind in kinds):
        raise ProbeFileError(
            f"{where}: expected a list of PII kinds like [email, credit_card] ([] for none), got {_shown(value)}"
        )
    unknown = [kind for kind in kinds if kind not in PII_KINDS]
    if unknown:
        raise ProbeFileError(
            f"{where}: unknown PII kind(s) {', '.join(unknown)} (known: {', '.join(PII_KINDS)})"
            f"{_did_you_mean(unknown, PII_KINDS)}"
        )
    return list(dict.fromkeys(kinds))


def check_probes(config: Config, probes: Sequence[Probe]) -> None:
    """:class:`ProbeFileError` when a probe names what ``config`` does not have: its route, the model,
    the rule, a PII kind no redact rule of the route removes, or a block on a route that never blocks.
    Such a probe could only ever fail, and it would fail as a routing regression."""
    routes = {route.name: route for route in config.routes}
    models = set(config.model_tags()) | set(workflow_models(config.workflows).values())
    for probe in probes:
        where = probe.where or f"probe {probe.name!r}"
        route = routes.get(probe.route)
        if route is None:
            raise ProbeFileError(
                f"{where}.route: no route {probe.route!r} in the config (routes: {', '.join(routes) or 'none'})"
                f"{_did_you_mean([probe.route], routes)}"
            )
        expect = probe.expect
        model = expect.get("model")
        if model is not None and model not in models:
            raise ProbeFileError(
                f"{where}.expect.model: {model!r} is not a model of the config (models: {', '.join(sorted(models))})"
                f"{_did_you_mean([model], models)}"
            )
        rules = route.rules if route.policy == "rules" else ()
        rule = expect.get("rule")
        if rule is not None and rule not in {r.name for r in rules}:
            names = [r.name for r in rules]
            raise ProbeFileError(
                f"{where}.expect.rule: route {route.name!r} has no rule {rule!r} "
                f"(its rules: {', '.join(names) or 'none'}){_did_you_mean([rule], names)}"
            )
        redactable = {kind for r in rules for kind in r.action.redact or ()}
        missing = [kind for kind in expect.get("redact", ()) if kind not in redactable]
        if missing:
            raise ProbeFileError(
                f"{where}.expect.redact: no rule of route {route.name!r} redacts {', '.join(missing)} "
                f"(its redact rules remove: {', '.join(sorted(redactable)) or 'nothing'})"
            )
        if expect.get("blocked") is True and not any(r.action.block is not None for r in rules):
            raise ProbeFileError(f"{where}.expect.blocked: route {route.name!r} has no block rule, so it never blocks")


async def run_probes(config: Config, probes: Sequence[Probe]) -> list[ProbeResult]:
    """Explain every probe with the config's routing brain, offline (:func:`gateway.routing.offline_brain`:
    no Redis, session stickiness not applied), and compare with its expectations.

    Raises :class:`ProbeFileError` (a :class:`ConfigError`) before any probe runs when a probe does not
    fit the config (:func:`check_probes`), and naming the probe when the gateway would refuse its
    request (a malformed header the file check could not see): neither is a failed expectation.
    """
    check_probes(config, probes)
    brain = offline_brain(config)  # no Redis, stickiness off: as pointsman route explains
    await brain.start()
    results = []
    try:
        for probe in probes:
            try:
                explanation = await explain_request(
                    brain, probe.route, probe.body, headers=probe.headers, request_id=f"probe:{probe.name}"
                )
            except PolicyError as exc:
                where = probe.where or f"probe {probe.name!r}"
                raise ProbeFileError(
                    f"{where}: the gateway would refuse this request ({exc.status}): {exc.message}"
                ) from None
            failures = _compare(probe.expect, explanation, probe.body)
            results.append(ProbeResult(probe, not failures, failures, explanation))
    finally:
        await brain.close()
    return results


def _compare(expect: Mapping[str, Any], explanation: Mapping[str, Any], body: Mapping[str, Any]) -> list[str]:
    """What differs between ``expect`` and the decision ``explanation`` for ``body`` (empty: it passed)."""
    failures = []
    error = explanation.get("error")
    if error:  # e.g. no eligible model: the gateway answers an error, whatever else the probe expects
        failures.append(f"error: the gateway would refuse the request ({error.get('status')}): {error.get('message')}")
    blocked = bool(explanation.get("blocked"))
    if "blocked" in expect and expect["blocked"] is not blocked:
        failures.append(f"blocked: expected {expect['blocked']}, got {blocked} ({explanation.get('reason', '')})")
    if "model" in expect and explanation.get("model") != expect["model"]:
        failures.append(f"model: expected {expect['model']!r}, got {explanation.get('model')!r} "
                        f"({explanation.get('reason', '')})")
    if "rule" in expect:
        applied = [r["name"] for r in explanation.get("rules", []) if r.get("applied")]
        if expect["rule"] not in applied:
            failures.append(f"rule: expected {expect['rule']!r} to decide, applied: {applied}")
    if "redact" in expect:
        # A refused request is never forwarded: nothing of it is redacted.
        kinds = [] if blocked or error else list(explanation.get("redact") or ())
        redacted = _redacted_kinds(body, kinds)
        wanted = set(expect["redact"])
        if (wanted - redacted) if wanted else redacted:
            found = _redacted_kinds(body, None)
            failures.append(
                f"redact: expected {sorted(wanted) if wanted else 'nothing'} redacted, got "
                f"{sorted(redacted) if redacted else 'nothing'} (PII found: {sorted(found) if found else 'none'}; "
                f"the applied rules redact: {', '.join(kinds) or 'nothing'})"
            )
    return failures


def _redacted_kinds(body: Mapping[str, Any], kinds: Sequence[str] | None) -> set[str]:
    """The PII kinds redacting ``kinds`` removes from ``body`` (``None``: every kind found). The
    redactor's own scan over the texts it rewrites, so a probe passes only when the request sent
    upstream really lost that text (the ``pii`` signal is not computed when no rule reads it)."""
    if kinds is not None and not kinds:
        return set()
    return {finding.kind for piece in iter_message_texts(body, prompt=False) for finding in find_pii(piece.text, kinds)}


def _refuse_unknown(mapping: Mapping[Any, Any], allowed: Sequence[str], where: str) -> None:
    """:class:`ProbeFileError` naming the keys of ``mapping`` that are not ``allowed``, with a did-you-mean."""
    unknown = [str(key) for key in mapping if key not in allowed]
    if unknown:
        raise ProbeFileError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))} (expected {', '.join(allowed)})"
            f"{_did_you_mean(unknown, allowed)}"
        )


def _did_you_mean(unknown: Iterable[str], known: Collection[str]) -> str:
    """``"; did you mean 'headers'?"`` for the unknown names that are close to a known one, else ``""``."""
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, list(known), n=1)
        if close:
            hints.append((name, close[0]))
    if not hints:
        return ""
    if len(hints) == 1:
        return f"; did you mean {hints[0][1]!r}?"
    return "; did you mean " + ", ".join(f"{guess!r} for {name!r}" for name, guess in hints) + "?"


def _shown(value: Any) -> str:
    """A YAML value for a message: its type, and its text when short (``str 'false'``, ``list [1, 2]``)."""
    text = repr(value)
    return type(value).__name__ + (f" {text}" if len(text) <= 40 else "")
