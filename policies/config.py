"""The declarative policy of a route, as written in the config file.

A route either sends everything to one model (``policy: static``) or decides per request
(``policy: rules``)::

    routes:
      - name: auto
        policy: rules
        signals:
          keywords:                       # each list defines a signal named by its key
            urgent: {keywords: [asap, urgent]}
        rules:                            # highest priority first; ties keep file order
          - name: block-jailbreak
            priority: 100
            when: {signal: jailbreak, op: ge, value: 0.8}
            action: {block: "This request was blocked by policy.", status: 403}
          - name: redact-pii
            priority: 90
            when: {signal: pii, op: truthy}
            action: {redact: [email, phone, credit_card]}     # not terminal: later rules still run
          - name: code-to-coder
            priority: 50
            when: {all: [{signal: domain, op: in, value: [code]}, {not: {signal: tools, op: truthy}}]}
            action: {route: coder-model}  # or {workflow: name}: a workflow answers (policies/workflows.py)
        cost_quality:                     # the default when no routing rule matched …
          signal: difficulty
          strong: big-model
          weak: small-model
          threshold: 0.5                  # … or target_strong_share: 0.3 (calibrated)
          middle: {band: [0.35, 0.65], workflow: fast-then-strong}   # optional: the uncertain middle
        sticky: {ttl: 1800, escalate: true}
        fallbacks: [small-model]
        compare: {share: 0.05, judge: judge-model, max_concurrency: 4, budget_usd_per_hour: 2}
        explore: {epsilon: 0.05}          # logged propensities for off-policy evaluation
        record: {embedding: true, text: false, text_retention_days: 30}
        cache: {mode: semantic, similarity: 0.95, ttl: 3600}   # opt-in response cache (gateway/cache/)

Structural errors (unknown keys, wrong types, an operator without its value …) are raised by
pydantic with the key path; cross-checks against the rest of the config (unknown signals and
models, impossible conditions) are done by :func:`policies.validation.validate_policy`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from classifiers.signals.keywords import compile_pattern
from policies.strict_model import StrictModel

Op = Literal["gt", "ge", "lt", "le", "eq", "ne", "in", "not_in", "contains", "truthy"]
_NUMERIC_OPS = frozenset({"gt", "ge", "lt", "le"})
_SET_OPS = frozenset({"in", "not_in"})
_PATH = r"^[A-Za-z_][\w-]*(\.[\w-]+)*$"
_NAME = r"^[A-Za-z0-9_][\w.:-]*$"
#: The longest TTL a cache entry or a sticky session may have (Redis refuses expiries far beyond it).
YEAR_SECONDS = 365 * 24 * 3600.0


class _Strict(StrictModel):
    """Unknown keys are errors: a typo in a policy must never be silently ignored."""

    model_config = ConfigDict(populate_by_name=True)  # the rest comes from StrictModel


class Condition(_Strict):
    """One node of a condition tree: exactly one of ``all``, ``any``, ``not`` or a comparison.

    A comparison is ``{signal, op, value}``: ``signal`` is a signal name or a dotted path into it
    (``domain.confidence``); ``value`` is a number for ``gt/ge/lt/le``, a non-empty list for
    ``in/not_in``, a scalar for ``eq/ne/contains`` and absent for ``truthy``. On list-valued
    signals (PII kinds, keywords matched) ``in`` means "any element is in the list" and
    ``not_in`` "none is".
    """

    all: tuple[Condition, ...] | None = None
    any: tuple[Condition, ...] | None = None
    not_: Condition | None = Field(default=None, alias="not")
    signal: str | None = Field(default=None, pattern=_PATH)
    op: Op | None = None
    value: Any = None

    @model_validator(mode="after")
    def _one_form(self) -> Condition:
        forms = [k for k in ("all", "any", "not_", "signal") if getattr(self, k) is not None]
        if len(forms) != 1:
            raise ValueError("a condition is exactly one of: all, any, not, or {signal, op, value}")
        if self.signal is None:
            if self.op is not None or "value" in self.model_fields_set:
                raise ValueError("op and value belong to a {signal, op, value} comparison")
            group = self.all if self.all is not None else self.any
            if group is not None and not group:
                raise ValueError("all/any needs at least one condition")
            return self
        if self.op is None:
            raise ValueError("a comparison needs an op (gt, ge, lt, le, eq, ne, in, not_in, contains, truthy)")
        has_value = "value" in self.model_fields_set
        if self.op == "truthy":
            if has_value:
                raise ValueError("op truthy takes no value")
        elif not has_value:
            raise ValueError(f"op {self.op} needs a value")
        elif self.op in _NUMERIC_OPS:
            if isinstance(self.value, bool) or not isinstance(self.value, int | float):
                raise ValueError(f"op {self.op} needs a number, got {self.value!r}")
        elif self.op in _SET_OPS:
            if not isinstance(self.value, list | tuple):
                raise ValueError(f"op {self.op} needs a list of values, got {self.value!r}")
            if not self.value:
                raise ValueError(f"op {self.op} with an empty list can never be decided: give at least one value")
            if any(isinstance(v, list | tuple | dict) for v in self.value):
                raise ValueError(f"op {self.op} needs a list of plain values")
        elif isinstance(self.value, list | tuple | dict):
            raise ValueError(f"op {self.op} needs a single value, got {self.value!r}")
        return self


class Action(_Strict):
    """What a matching rule does: exactly one of ``route``, ``tier``, ``workflow``, ``block`` or ``redact``.

    ``route`` sends the request to a model (then ``fallbacks``); ``tier`` sends it to the
    ``cost_quality`` knob's ``strong`` or ``weak`` model; ``workflow`` has the named workflow
    (``workflows:``) answer it; ``block`` rejects it with that message and
    ``status`` (403 by default, or 400); ``redact`` lists PII kinds the gateway removes from the
    body before forwarding and, unlike the others, lets later rules run.
    """

    route: str | None = Field(default=None, min_length=1)
    tier: Literal["strong", "weak"] | None = None
    workflow: str | None = Field(default=None, min_length=1)
    fallbacks: tuple[str, ...] = ()
    block: str | None = Field(default=None, min_length=1)
    status: Literal[400, 403] = 403
    redact: tuple[str, ...] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_kind(self) -> Action:
        kinds = [k for k in ("route", "tier", "workflow", "block", "redact") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("an action is exactly one of: route, tier, workflow, block, redact")
        if self.fallbacks and self.kind not in ("route", "tier"):
            raise ValueError("fallbacks only go with route or tier")
        if "status" in self.model_fields_set and self.kind != "block":
            raise ValueError("status only goes with block")
        return self

    @property
    def kind(self) -> str:
        """``route``, ``tier``, ``workflow``, ``block`` or ``redact``."""
        for key in ("route", "tier", "workflow", "block"):
            if getattr(self, key) is not None:
                return key
        return "redact"

    @property
    def terminal(self) -> bool:
        """Whether the rule ends rule evaluation (everything but ``redact``)."""
        return self.kind != "redact"


class Rule(_Strict):
    """``when`` the condition holds (always, if omitted), apply ``action``.

    Rules run from the highest ``priority`` down (ties in file order) until a terminal action.
    """

    name: str = Field(pattern=_NAME)
    priority: int = 0
    when: Condition | None = None
    action: Action
    description: str | None = None


class MiddleBand(_Strict):
    """The knob's uncertain middle: a score in ``band`` ``[lo, hi)`` is answered by ``workflow``
    (a cascade, typically: route first, escalate the uncertain middle after the answer)."""

    band: tuple[float, float]
    workflow: str = Field(min_length=1)

    @field_validator("band")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        lo, hi = value
        if not 0.0 <= lo < hi <= 1.0:
            raise ValueError(f"band [{lo}, {hi}] must satisfy 0 <= lo < hi <= 1")
        return value

    def holds(self, score: float) -> bool:
        """Whether ``score`` falls in the band."""
        return self.band[0] <= score < self.band[1]


class CostQuality(_Strict):
    """The cost-quality knob: ``strong`` when the score reaches the threshold, else ``weak``.

    The score is ``signal`` (default ``difficulty``: the probability that the strong model is
    needed). Either a fixed ``threshold`` (default 0.5), or ``target_strong_share``: the threshold
    is recalibrated continuously so that this share of the last ``window`` decisions goes to the
    strong model. The window starts as the head's recorded score spread when its manifest has one
    (``score_quantiles``: heads ``pointsman train`` wrote), else the threshold is ``1 - target``
    until ``min_samples`` scores are known.

    When the routers directory holds difficulty heads trained per model pair, the route reads the
    one trained for its ``strong`` and ``weak`` models; ``difficulty_models`` maps a configured
    model to the name it was trained under (``{gpt-4o: gpt-4-1106-preview}``), a model not listed
    is looked up by its own name.

    ``middle: {band: [lo, hi], workflow: name}``: a score in ``[lo, hi)`` goes to that workflow
    instead (neither stickiness nor exploration applies to it).
    """

    signal: str = Field(default="difficulty", pattern=_PATH)
    strong: str = Field(min_length=1)
    weak: str = Field(min_length=1)
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    target_strong_share: float | None = Field(default=None, ge=0.0, le=1.0)
    window: int = Field(default=2000, ge=1)
    min_samples: int = Field(default=50, ge=1)
    difficulty_models: dict[str, str] = Field(default_factory=dict)
    middle: MiddleBand | None = None

    @model_validator(mode="after")
    def _one_knob(self) -> CostQuality:
        if self.threshold is not None and self.target_strong_share is not None:
            raise ValueError("set either threshold or target_strong_share, not both")
        if self.strong == self.weak:
            raise ValueError(f"strong and weak are the same model {self.strong!r}")
        if self.target_strong_share is None and {"window", "min_samples"} & self.model_fields_set:
            raise ValueError("window and min_samples only apply with target_strong_share")
        if self.min_samples > self.window:  # the window never holds that many scores: never calibrated
            raise ValueError(
                f"min_samples ({self.min_samples}) is larger than window ({self.window}): the knob would never "
                "calibrate; lower min_samples or widen the window"
            )
        for model, trained in self.difficulty_models.items():
            if model not in (self.strong, self.weak):
                raise ValueError(
                    f"difficulty_models: {model!r} is neither the strong ({self.strong!r}) nor the weak "
                    f"({self.weak!r}) model"
                )
            if not trained.strip():
                raise ValueError(f"difficulty_models: the trained name of {model!r} is empty")
        return self


class MultiModel(_Strict):
    """Pick, among eligible ``candidates``, the model maximising quality - λ · normalised cost.

    Quality is the predicted quality per model, read from ``quality_signal`` (a mapping model →
    [0, 1]; the built-in ``quality`` signal comes from the trained quality head, whose keys are the
    model names of its training data). ``quality_models`` maps a candidate to the key it is scored
    under (``{claude-3-haiku: claude-instant-v1}``); a candidate not listed is looked up by its own
    name. Cost is the model's input + output price per million tokens (or ``costs``), divided by
    the largest candidate cost. A model is eligible when its context window holds the estimated
    request, it has the ``tools`` tag if the request offers tools, and it has every tag in
    ``require_tags``.
    """

    lambda_: float = Field(default=0.5, ge=0.0, alias="lambda")
    candidates: tuple[str, ...] = Field(min_length=1)
    quality_signal: str = Field(default="quality", pattern=_PATH)
    quality_models: dict[str, str] = Field(default_factory=dict)
    costs: dict[str, float] = Field(default_factory=dict)
    require_tags: tuple[str, ...] = ()

    @field_validator("candidates")
    @classmethod
    def _distinct(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("candidates are listed twice")
        return value

    @field_validator("quality_models")
    @classmethod
    def _labels_named(cls, value: dict[str, str]) -> dict[str, str]:
        for model, label in value.items():
            if not label.strip():
                raise ValueError(f"quality label of {model!r} is empty")
        return value

    def quality_key(self, candidate: str) -> str:
        """The key ``candidate`` is scored under in the quality signal's mapping."""
        return self.quality_models.get(candidate, candidate)

    @field_validator("costs")
    @classmethod
    def _non_negative(cls, value: dict[str, float]) -> dict[str, float]:
        for model, cost in value.items():
            if cost < 0:
                raise ValueError(f"cost of {model!r} is negative")
        return value


class Sticky(_Strict):
    """Session stickiness: a conversation stays on the model its first default decision chose.

    The session is the ``x-pointsman-session-id`` header, else a hash of the conversation prefix
    (system prompt + first user message). With ``escalate`` a later decision for a *stronger*
    model moves the session there (strength: ``order``, weakest first; else the knob's weak <
    strong; else price). Sessions expire after ``ttl`` seconds unused; at most ``max_sessions``.
    """

    enabled: bool = True
    ttl: float = Field(default=1800.0, gt=0, le=YEAR_SECONDS)
    escalate: bool = True
    max_sessions: int = Field(default=100_000, ge=1)
    order: tuple[str, ...] = ()


class KeywordList(_Strict):
    """A keyword signal: which of these keywords / regexes occur in the request.

    Its value is the list of matched keywords then patterns (falsy when none matched).
    """

    keywords: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    case_sensitive: bool = False
    scope: Literal["all", "user", "last_user", "system"] = "all"

    @model_validator(mode="after")
    def _something_to_match(self) -> KeywordList:
        if not any(k.strip() for k in self.keywords) and not self.patterns:
            raise ValueError("a keyword list needs at least one keyword or pattern")
        for index, pattern in enumerate(self.patterns):
            try:
                compile_pattern(pattern)  # the engine keyword signals run patterns with
            except ValueError as exc:
                raise ValueError(f"patterns.{index}: {pattern!r} is not a valid regex: {exc}") from exc
        return self

    @property
    def labels(self) -> frozenset[str]:
        """Every value the signal can report."""
        return frozenset((*self.keywords, *self.patterns))


class SignalSettings(_Strict):
    """Signals a route defines: ``keywords`` defines keyword signals by name.

    Built-in signals (``pii``, ``domain``, ...) take no settings: a rule says which of their values
    matter (``when: {signal: pii, op: contains, value: email}``).
    """

    keywords: dict[str, KeywordList] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _only_keywords(cls, data: Any) -> Any:
        # These keys were once accepted "for the signal provider", which never read them: a route
        # with signals: {pii: {kinds: [email]}} still routed on phone numbers.
        if isinstance(data, Mapping):
            for name in data:
                if name != "keywords":
                    raise ValueError(
                        f"{name}: built-in signals take no settings here (only signals.keywords defines signals); "
                        f"to act on some of a signal's values write a rule, e.g. when: {{signal: {name}, op: contains, "
                        "value: ...}"
                    )
        return data

    @field_validator("keywords")
    @classmethod
    def _names(cls, value: dict[str, KeywordList]) -> dict[str, KeywordList]:
        for name in value:
            if not re.match(r"^[A-Za-z_][\w-]*$", name):
                raise ValueError(f"{name!r} is not a valid signal name (letters, digits, _ and -)")
        return value


#: Placeholders a custom judge prompt must contain (see :class:`Compare`).
JUDGE_PROMPT_FIELDS: tuple[str, ...] = ("conversation", "answer_a", "answer_b")


class Compare(_Strict):
    """Counterfactual comparisons: for ``share`` of requests, also ask the decision's other model(s).

    After the served answer is complete (never delaying the client, never for blocked requests or
    error answers), the gateway sends the same, already redacted body to the other candidate(s) of
    the decision (the knob's other model; the other ``multi_model`` candidates), and the ``judge``
    model (a configured model name) scores each pair in both orders to cancel position bias (win 1,
    tie 0.5, loss 0, averaged) into feedback with ``source: judge``. At most ``max_concurrency``
    comparisons run at once and at most ``budget_usd_per_hour`` is spent on them over any rolling
    hour (estimated from the configured prices; ``null``: no cap); requests over either are skipped
    and counted. Served requests come first: while they keep the gateway's event loop busy, a
    comparison waits (in flight) before calling anyone. ``prompt`` replaces the judge's prompt: a
    text with ``{conversation}``, ``{answer_a}`` and ``{answer_b}``. ``judge_max_tokens`` bounds each verdict
    (and is priced into the budget's estimate).
    """

    share: float = Field(ge=0.0, le=1.0)
    judge: str = Field(min_length=1)
    max_concurrency: int = Field(default=4, ge=1)
    budget_usd_per_hour: float | None = Field(default=None, ge=0.0)
    prompt: str | None = Field(default=None, min_length=1)
    # The verdict is one letter; a reasoning model (o4-mini) spends its hidden reasoning tokens out of this
    # bound too, and with the default has none left for the letter: give it a few thousand.
    judge_max_tokens: int = Field(default=32, ge=1, le=100_000)

    @field_validator("prompt")
    @classmethod
    def _placeholders(cls, value: str | None) -> str | None:
        if value is None:
            return value
        missing = [name for name in JUDGE_PROMPT_FIELDS if "{" + name + "}" not in value]
        if missing:
            raise ValueError(f"the judge prompt needs the placeholder(s) {', '.join('{' + m + '}' for m in missing)}")
        try:
            value.format(**{name: "" for name in JUDGE_PROMPT_FIELDS})
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"the judge prompt is not a valid template (use {{{{ and }}}} for braces): {exc}") from exc
        return value


class Explore(_Strict):
    """Exploration for off-policy evaluation: a share ``epsilon`` of the knob's decisions is made
    uniformly at random between the strong and the weak model (decided by a hash of the request
    id, so it is reproducible). The served model's probability under the policy (``1 - epsilon/2``
    for the knob's choice, ``epsilon/2`` for the other) is logged as the decision's propensity, so
    offline evaluation can use inverse-propensity estimates. Rule-forced routes and blocks are
    never explored; offline replay turns exploration off."""

    epsilon: float = Field(ge=0.0, le=1.0)


class RecordSettings(_Strict):
    """What the decision log keeps of a request's conversation, for retraining.

    ``embedding``: the conversation's embedding (with the encoder's id), kept when the route's policy
    encoded it anyway (a knob or a head signal). ``text``: the messages themselves (JSON), only when
    the operator opts in, deleted ``text_retention_days`` after the request. Never written to logs.
    """

    embedding: bool = True
    text: bool = False
    text_retention_days: float = Field(default=30.0, gt=0.0, le=36_500)


class ImplicitSettings(_Strict):
    """Implicit feedback the gateway records by itself (``source: implicit``, score 0 for the
    request judged): a ``reask`` (a new request of the same session within ``window`` seconds of an
    answer whose last user turn is at least ``similarity`` alike, as word sets), a ``regenerate``
    (the same conversation re-sent up to the same last user turn), ``finish_length`` (the answer
    was cut at the token limit) and ``upstream_error``. Only hashes of the text are kept in memory.
    """

    enabled: bool = True
    window: float = Field(default=300.0, gt=0.0)
    similarity: float = Field(default=0.8, gt=0.0, le=1.0)


class CacheSettings(_Strict):
    """The route's response cache (``gateway/cache/``): an answer served again without an upstream call.

    ``mode: exact`` hits only a byte-identical request (after block and redact rules; canonical JSON);
    ``semantic`` also hits when the last user turn's embedding (the routing encoder's) is at least
    ``similarity`` alike to a cached one's whose scope is identical, with the same guard in it (numbers with the
    signs and units around them, spelled-out units and languages, negations: ``gateway.cache.key.guard_tokens``).
    The scope (never crossed) is the tenant, the route, the chosen model and every request field but
    ``stream``, ``stream_options`` and ``user`` (``per_user: true`` adds ``user``): the whole
    conversation before the last user turn, system prompt, tools, tool_choice, response_format and
    every sampling parameter (temperature, top_p, max_tokens, seed, stop, n, penalties, logprobs …).
    Entries live ``ttl`` seconds (at most the route's ``record.text_retention_days``); the in-memory
    store keeps at most ``max_entries`` per route, a semantic scope at most ``bucket_size`` entries.
    Last user turns longer than ``max_chars`` are matched exactly only. ``store_text`` also keeps the
    last user turn's text in the entry (never by default). ``sampled: false`` bypasses requests that
    sample (``temperature`` absent or > 0); by default they get a replay of the first answer stored.
    """

    mode: Literal["exact", "semantic"] = "exact"
    similarity: float = Field(default=0.95, gt=0.0, le=1.0)
    ttl: float = Field(default=3600.0, gt=0.0, le=YEAR_SECONDS)
    max_entries: int = Field(default=10_000, ge=1)
    bucket_size: int = Field(default=32, ge=1, le=1024)
    max_chars: int = Field(default=2000, ge=1)
    store_text: bool = False
    sampled: bool = True
    per_user: bool = False

    @model_validator(mode="after")
    def _semantic_only(self) -> CacheSettings:
        if self.mode == "exact":
            extra = [k for k in ("similarity", "bucket_size", "max_chars") if k in self.model_fields_set]
            if extra:
                raise ValueError(f"{', '.join(extra)}: only apply with mode: semantic")
        return self


# The keys only a rules route reads; one of them without a policy key makes the route a rules route.
_RULES_ONLY_KEYS = ("signals", "rules", "cost_quality", "multi_model", "sticky", "compare", "explore")


class RouteConfig(_Strict):
    """A virtual model (``auto`` …) and the policy that decides its requests.

    ``policy: static`` sends every request to ``model``, then ``fallbacks``; ``model`` may be a
    workflow's virtual model (``cascade/<name>`` …), which takes no fallbacks.
    ``policy: rules`` evaluates ``rules``, then the default decision: exactly one of
    ``cost_quality``, ``multi_model`` or ``model``; ``sticky`` keeps conversations on one model.
    Without ``policy``, a route that sets any key only ``rules`` reads is a ``rules`` route, and
    otherwise a ``static`` one.
    """

    name: str = Field(min_length=1)
    policy: Literal["static", "rules"] = "static"
    model: str | None = Field(default=None, min_length=1)
    fallbacks: tuple[str, ...] = ()
    signals: SignalSettings = Field(default_factory=SignalSettings)
    rules: tuple[Rule, ...] = ()
    cost_quality: CostQuality | None = None
    multi_model: MultiModel | None = None
    sticky: Sticky | None = None
    compare: Compare | None = None
    explore: Explore | None = None
    record: RecordSettings = Field(default_factory=RecordSettings)
    implicit: ImplicitSettings = Field(default_factory=ImplicitSettings)
    cache: CacheSettings | None = None

    @model_validator(mode="before")
    @classmethod
    def _implied_policy(cls, data: Any) -> Any:
        # A route that names cost_quality (or rules, ...) means policy: rules; asking the user to
        # spell out what the keys already say only produced an error on the way to the first eval.
        if isinstance(data, Mapping) and "policy" not in data and any(k in data for k in _RULES_ONLY_KEYS):
            return {**data, "policy": "rules"}
        return data

    @model_validator(mode="after")
    def _cache_retention(self) -> RouteConfig:
        if self.cache is not None and self.cache.ttl > self.record.text_retention_days * 86400:
            raise ValueError(
                f"cache.ttl: {self.cache.ttl:g} s is longer than record.text_retention_days "
                f"({self.record.text_retention_days:g} days): cached answers follow the conversation retention"
            )
        return self

    @model_validator(mode="after")
    def _shape(self) -> RouteConfig:
        if self.policy == "static":
            extra = [key for key in _RULES_ONLY_KEYS if key in self.model_fields_set]
            if extra:
                raise ValueError(
                    f"{', '.join(extra)}: only allowed with policy: rules (this route says policy: static)"
                )
            if self.model is None:
                raise ValueError("model: a static route needs a model")
            return self
        defaults = [k for k in ("model", "cost_quality", "multi_model") if getattr(self, k) is not None]
        if not defaults:
            raise ValueError(
                "policy rules needs a default decision for requests no rule routes: "
                "set cost_quality, multi_model or model"
            )
        if len(defaults) > 1:
            raise ValueError(f"set only one default decision, not {' and '.join(defaults)}")
        names = [rule.name for rule in self.rules]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"rules: two rules are named {name!r}")
        if self.compare is not None and self.cost_quality is None and self.multi_model is None:
            raise ValueError("compare: needs cost_quality or multi_model (the other candidates to compare with)")
        if self.explore is not None and self.cost_quality is None:
            raise ValueError("explore: needs cost_quality (exploration picks between its strong and weak models)")
        return self

    def comparison_candidates(self) -> tuple[str, ...]:
        """The models a comparison may ask: the knob's pair, or the multi-model candidates."""
        if self.cost_quality is not None:
            return (self.cost_quality.strong, self.cost_quality.weak)
        if self.multi_model is not None:
            return self.multi_model.candidates
        return ()
