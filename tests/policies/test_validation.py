"""Bad policies fail at start-up with a message naming the key and saying what is wrong."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from policies import RouteConfig, SignalKind, SignalSpec, policy_problems, validate_policy
from tests.policies.helpers import MODELS, TAGS, route_config
from tests.policies.signals import KNOWN_SIGNALS

BASE = "name: auto\npolicy: rules\ncost_quality: {strong: big, weak: small}\n"


def problems(text: str, **kwargs: Any) -> list[str]:
    cfg = route_config(text)
    return policy_problems(cfg.name, cfg, KNOWN_SIGNALS, set(MODELS), TAGS, **kwargs)


def only(text: str, **kwargs: Any) -> str:
    found = problems(text, **kwargs)
    assert len(found) == 1, found
    return found[0]


def structural(data: str) -> list[str]:
    """Pydantic's errors as the gateway prints them: ``dotted.loc: message``."""
    with pytest.raises(ValidationError) as caught:
        RouteConfig.model_validate(yaml.safe_load(data))
    return [".".join(str(p) for p in e["loc"]) + ": " + e["msg"] for e in caught.value.errors()]


def rules(*items: str) -> str:
    return BASE + "rules:\n" + "".join(f"  - {item}\n" for item in items)


OK = "{name: ok, when: {signal: domain, op: eq, value: code}, action: {route: coder}}"


def test_a_valid_policy_passes() -> None:
    assert problems(rules(OK)) == []
    validate_policy("auto", route_config(rules(OK)), KNOWN_SIGNALS, set(MODELS), TAGS)  # does not raise


def test_unknown_signal_names_the_key_and_suggests() -> None:
    message = only(rules(OK, OK.replace("ok", "ok2"),
                         "{name: r, when: {all: [{signal: domian, op: eq, value: code}]}, action: {route: big}}"))
    assert message == (
        "routes.auto.rules.2.when.all.0.signal: unknown signal 'domian' (did you mean 'domain'?)"
    )


def test_unknown_signal_in_not_and_any() -> None:
    message = only(rules("{name: r, when: {any: [{not: {signal: toolz, op: truthy}}]}, action: {route: big}}"))
    assert message.startswith("routes.auto.rules.0.when.any.0.not.signal: unknown signal 'toolz'")


@pytest.mark.parametrize(
    ("text", "key", "model"),
    [
        (rules("{name: r, action: {route: gpt-9}}"), "rules.0.action.route", "gpt-9"),
        (rules("{name: r, action: {route: big, fallbacks: [ghost]}}"), "rules.0.action.fallbacks.0", "ghost"),
        ("name: auto\npolicy: rules\ncost_quality: {strong: huge, weak: small}\n", "cost_quality.strong", "huge"),
        ("name: auto\npolicy: rules\ncost_quality: {strong: big, weak: smol}\n", "cost_quality.weak", "smol"),
        ("name: auto\npolicy: rules\nmulti_model: {candidates: [tiny, nope]}\n", "multi_model.candidates.1", "nope"),
        (BASE + "fallbacks: [small, gone]\n", "fallbacks.1", "gone"),
        (BASE + "sticky: {order: [small, bigg]}\n", "sticky.order.1", "bigg"),
        ("name: auto\npolicy: rules\nmodel: nobody\n", "model", "nobody"),
    ],
)
def test_missing_models_are_named(text: str, key: str, model: str) -> None:
    message = only(text)
    assert message.startswith(f"routes.auto.{key}: unknown model {model!r}")


def test_empty_in_set_is_rejected_by_the_schema() -> None:
    errors = structural(rules("{name: r, when: {all: [{signal: domain, op: in, value: []}]}, action: {route: big}}"))
    assert len(errors) == 1
    assert errors[0].startswith("rules.0.when.all.0: ") and "empty list" in errors[0]


@pytest.mark.parametrize(
    ("condition", "key", "words"),
    [
        ("{signal: jailbreak, op: gt, value: 1.5}", "value", "outside [0, 1]"),
        ("{signal: domain.confidence, op: lt, value: -0.2}", "value", "outside [0, 1]"),
        ("{signal: difficulty, op: contains, value: x}", "op", "not valid for 'difficulty' (probability)"),
        ("{signal: tools, op: gt, value: 0}", "op", "not valid for 'tools' (bool)"),
        ("{signal: domain, op: ge, value: 1}", "op", "not valid for 'domain' (label)"),
        ("{signal: tools, op: eq, value: 1}", "value", "compare it with true or false"),
        ("{signal: length, op: eq, value: long}", "value", "compare it with a number"),
    ],
)
def test_conditions_that_do_not_fit_the_signal_type(condition: str, key: str, words: str) -> None:
    message = only(rules(f"{{name: r, when: {condition}, action: {{route: big}}}}"))
    assert message.startswith(f"routes.auto.rules.0.when.{key}: ") and words in message


@pytest.mark.parametrize(
    "conditions",
    [
        "[{signal: difficulty, op: gt, value: 0.8}, {signal: difficulty, op: lt, value: 0.2}]",
        "[{signal: difficulty, op: ge, value: 0.5}, {signal: difficulty, op: lt, value: 0.5}]",
        "[{signal: length, op: eq, value: 10}, {signal: length, op: gt, value: 10}]",
        "[{signal: domain, op: eq, value: code}, {signal: domain, op: eq, value: math}]",
        "[{signal: domain, op: in, value: [code]}, {signal: domain, op: in, value: [math, chat]}]",
        "[{signal: domain, op: in, value: [code]}, {signal: domain, op: not_in, value: [code]}]",
        "[{signal: domain, op: eq, value: code}, {signal: domain, op: ne, value: code}]",
    ],
)
def test_contradictory_comparisons_inside_all(conditions: str) -> None:
    message = only(rules(f"{{name: r, when: {{all: {conditions}}}, action: {{route: big}}}}"))
    assert message.startswith("routes.auto.rules.0.when.all: impossible condition on ")
    assert "can never all hold" in message


@pytest.mark.parametrize(
    "condition",
    [
        "{any: [{signal: difficulty, op: gt, value: 0.8}, {signal: difficulty, op: lt, value: 0.2}]}",
        "{all: [{signal: difficulty, op: ge, value: 0.5}, {signal: difficulty, op: le, value: 0.5}]}",
        "{all: [{signal: pii, op: in, value: [email]}, {signal: pii, op: in, value: [phone]}]}",
        "{all: [{signal: domain, op: in, value: [code, math]}, {signal: domain, op: ne, value: code}]}",
    ],
)
def test_satisfiable_combinations_are_accepted(condition: str) -> None:
    assert problems(rules(f"{{name: r, when: {condition}, action: {{route: big}}}}")) == []


def test_threshold_and_target_share_together() -> None:
    errors = structural(
        "name: auto\npolicy: rules\n"
        "cost_quality: {strong: big, weak: small, threshold: 0.4, target_strong_share: 0.3}\n"
    )
    assert errors == ["cost_quality: Value error, set either threshold or target_strong_share, not both"]


@pytest.mark.parametrize(
    ("data", "start"),
    [
        ("name: auto\npolicy: rules\ncost_quality: {strong: big, weak: small, threshold: 1.2}\n",
         "cost_quality.threshold: "),
        ("name: auto\npolicy: rules\ncost_quality: {strong: big, weak: small, target_strong_share: -1}\n",
         "cost_quality.target_strong_share: "),
        ("name: auto\npolicy: rules\ncost_quality: {strong: big, weak: big}\n", "cost_quality: "),
        ("name: auto\npolicy: rules\nrules: []\n", ": Value error, policy rules needs a default decision"),
        ("name: auto\npolicy: rules\nmodel: small\ncost_quality: {strong: big, weak: small}\n",
         ": Value error, set only one default decision"),
        ("name: auto\npolicy: static\nmodel: small\nrules: []\n",
         ": Value error, rules: only allowed with policy: rules (this route says policy: static)"),
        (BASE + "rules:\n  - {name: a, action: {route: big}}\n  - {name: a, action: {route: small}}\n",
         ": Value error, rules: two rules are named 'a'"),
        (rules("{name: r, when: {signal: x, op: gt}, action: {route: big}}"), "rules.0.when: "),
        (rules("{name: r, when: {signal: x, op: truthy, value: 1}, action: {route: big}}"), "rules.0.when: "),
        (rules("{name: r, when: {signal: x, op: between, value: 1}, action: {route: big}}"), "rules.0.when.op: "),
        (rules("{name: r, when: {signal: x, op: truthy, all: []}, action: {route: big}}"), "rules.0.when: "),
        (rules("{name: r, action: {route: big, block: nope}}"), "rules.0.action: "),
        (rules("{name: r, action: {redact: [email], status: 400}}"), "rules.0.action: "),
        (rules("{name: r, action: {route: big}, priorty: 3}"), "rules.0.priorty: "),
        (BASE + "signals:\n  keywords:\n    k: {patterns: ['(unclosed']}\n", "signals.keywords.k: "),
        ("name: auto\npolicy: rules\nmulti_model: {candidates: [tiny], lambda: -1}\n", "multi_model.lambda: "),
    ],
)
def test_structural_errors_name_their_key(data: str, start: str) -> None:
    errors = structural(data)
    assert any(e.startswith(start) for e in errors), errors


def test_a_route_without_policy_takes_the_one_its_keys_imply() -> None:
    assert route_config("name: auto\ncost_quality: {strong: big, weak: small, target_strong_share: 0.3}\n").policy == (
        "rules"
    )
    assert route_config("name: auto\nmodel: small\nrules: []\n").policy == "rules"
    assert problems("name: auto\ncost_quality: {strong: big, weak: small}\n") == []
    assert route_config("name: auto\nmulti_model: {candidates: [tiny, big]}\n").policy == "rules"
    assert route_config("name: auto\nmodel: small\nfallbacks: [big]\n").policy == "static"


def test_cost_quality_signal_must_be_a_score() -> None:
    message = only("name: auto\npolicy: rules\ncost_quality: {signal: domain, strong: big, weak: small}\n")
    assert message.startswith("routes.auto.cost_quality.signal: 'domain' is a label signal")
    message = only("name: auto\npolicy: rules\ncost_quality: {signal: dificulty, strong: big, weak: small}\n")
    assert message.startswith("routes.auto.cost_quality.signal: unknown signal 'dificulty'")


def test_multi_model_checks() -> None:
    assert only("name: auto\npolicy: rules\nmulti_model: {candidates: [tiny], quality_signal: difficulty}\n") \
        .startswith("routes.auto.multi_model.quality_signal: 'difficulty' is a probability signal")
    assert only("name: auto\npolicy: rules\nmulti_model: {candidates: [tiny, coder], require_tags: [tools]}\n") \
        .startswith("routes.auto.multi_model.require_tags: no candidate has all of ['tools']")
    assert only("name: auto\npolicy: rules\nmulti_model: {candidates: [tiny], costs: {big: 1}}\n") \
        .startswith("routes.auto.multi_model.costs.big: 'big' is not one of the candidates")


def test_tier_needs_cost_quality() -> None:
    message = only("name: auto\npolicy: rules\nmodel: small\nrules:\n  - {name: r, action: {tier: strong}}\n")
    assert message.startswith("routes.auto.rules.0.action.tier: tier needs a cost_quality section")


def test_rules_after_an_unconditional_route_can_never_run() -> None:
    message = only(rules("{name: catch-all, priority: 10, action: {route: big}}", "{name: later, priority: 1, "
                         "when: {signal: tools, op: truthy}, action: {route: small}}"))
    assert message.startswith("routes.auto.rules.1: rule 'later' can never run: rule 'catch-all' (rules.0)")
    # An unconditional *redact* is fine: it does not stop evaluation.
    assert problems(rules("{name: always-redact, priority: 10, action: {redact: [email]}}", OK)) == []


def test_signal_settings_and_keyword_signals() -> None:
    # Built-in signals take no settings (they were once accepted and never read): a rule selects values.
    for text in ("signals:\n  pii: {kinds: [email]}\n", "signals:\n  pi: {kinds: [email]}\n"):
        assert any(
            "built-in signals take no settings here" in line and "when: {signal: pi" in line
            for line in structural(BASE + text)
        )
    assert only(BASE + "signals:\n  keywords:\n    domain: {keywords: [x]}\n").startswith(
        "routes.auto.signals.keywords.domain: 'domain' is already a built-in signal"
    )
    keywords = BASE + "signals:\n  keywords:\n    urgent: {keywords: [asap]}\nrules:\n"
    assert problems(keywords + "  - {name: r, when: {signal: urgent, op: contains, value: asap}, "
                    "action: {route: big}}\n") == []
    assert only(keywords + "  - {name: r, when: {signal: urgent, op: contains, value: asp}, "
                "action: {route: big}}\n").startswith(
        "routes.auto.rules.0.when.value: 'asp' is not a value of 'urgent' (did you mean 'asap'?)"
    )


def test_declared_signal_specs_close_labels_and_fields() -> None:
    specs = {
        "domain": SignalSpec(SignalKind.LABEL, labels=frozenset({"code", "math", "chat"})),
        "pii": SignalSpec(SignalKind.LABELS, labels=frozenset({"email", "phone", "iban"})),
        "difficulty": SignalSpec(SignalKind.MAPPING, fields={"gpt4": SignalSpec(SignalKind.PROBABILITY)}),
    }
    text = rules(
        "{name: a, when: {signal: domain, op: in, value: [code, cdoe]}, action: {route: big}}",
        "{name: b, when: {signal: difficulty.gpt5, op: gt, value: 0.5}, action: {route: big}}",
        "{name: c, when: {signal: difficulty.gpt4, op: gt, value: 0.5}, action: {route: big}}",
        "{name: d, when: {signal: pii, op: truthy}, action: {redact: [email, ibn]}}",
    )
    found = problems(text.replace("{strong: big", "{signal: difficulty.gpt4, strong: big"), signal_specs=specs)
    assert found == [
        "routes.auto.rules.0.when.value: 'cdoe' is not a value of 'domain' (did you mean 'code'?); "
        "known: ['chat', 'code', 'math']",
        "routes.auto.rules.1.when.signal: signal 'difficulty' has no field 'gpt5'",
        "routes.auto.rules.3.action.redact.1: unknown PII kind 'ibn' (did you mean 'iban'?); "
        "known: ['email', 'iban', 'phone']",
    ]


def test_every_problem_is_reported_at_once() -> None:
    cfg = route_config(rules(
        "{name: a, when: {signal: domian, op: truthy}, action: {route: gpt-9}}",
        "{name: b, when: {signal: jailbreak, op: gt, value: 2}, action: {block: denied}}",
    ))
    with pytest.raises(ValueError, match=r"(?s)rules\.0\.when\.signal.*rules\.0\.action\.route.*rules\.1\.when\.value"):
        validate_policy("auto", cfg, KNOWN_SIGNALS, set(MODELS), TAGS)


def test_static_routes_check_only_their_models() -> None:
    assert problems("name: auto\nmodel: small\nfallbacks: [big]\n") == []
    assert only("name: auto\nmodel: small\nfallbacks: [bog]\n").startswith(
        "routes.auto.fallbacks.0: unknown model 'bog' (did you mean 'big'?)"
    )


def test_quality_models_must_name_candidates() -> None:
    text = "name: auto\npolicy: rules\nmulti_model: {candidates: [tiny], quality_models: {big: gpt-4}}\n"
    assert only(text).startswith("routes.auto.multi_model.quality_models.big: 'big' is not one of the candidates")
    assert any("quality label of 'tiny' is empty" in e for e in structural(
        "name: auto\npolicy: rules\nmulti_model: {candidates: [tiny], quality_models: {tiny: ' '}}\n"))


def test_candidates_the_quality_signal_cannot_score_are_named() -> None:
    # With the quality head's labels declared (the gateway does this from the trained artifact), every
    # candidate must be scored: under its own name or through quality_models.
    specs = {"quality": SignalSpec(SignalKind.MAPPING, labels=frozenset({"gpt-4-1106-preview", "claude-v1", "tiny"}))}
    text = ("name: auto\npolicy: rules\nmulti_model: {candidates: [tiny, small, big], "
            "quality_models: {big: gpt-4-1106-previw}}\n")
    found = problems(text, signal_specs=specs)
    assert found == [
        "routes.auto.multi_model.candidates.1: 'small' is not a model of the quality signal; "
        "map it with multi_model.quality_models: {small: <label>}; known: ['claude-v1', 'gpt-4-1106-preview', 'tiny']",
        "routes.auto.multi_model.quality_models.big: 'gpt-4-1106-previw' is not a model of the quality signal "
        "(did you mean 'gpt-4-1106-preview'?); known: ['claude-v1', 'gpt-4-1106-preview', 'tiny']",
    ]
    fixed = text.replace("previw}", "preview, small: claude-v1}")
    assert problems(fixed, signal_specs=specs) == []
    # Without declared labels (config-time validation, before any head is loaded) nothing is assumed.
    assert problems(text) == []


def test_the_signal_catalogue_declares_a_type_for_every_provided_signal() -> None:
    # One catalogue: what the provider computes is what validation accepts, and each has a type.
    from classifiers.provider import PROVIDED_SIGNALS, build_extractors
    from policies import DEFAULT_SIGNAL_SPECS

    assert set(DEFAULT_SIGNAL_SPECS) == set(PROVIDED_SIGNALS)
    assert set(build_extractors()) <= set(PROVIDED_SIGNALS)
