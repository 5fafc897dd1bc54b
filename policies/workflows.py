"""In-layer micro-workflows, as written in the config file: cascade, fusion, ratings and small graphs.

A workflow answers one chat request with several bounded sub-calls instead of one. It is served as
a virtual model ``<kind>/<name>`` (``cascade/fast-then-strong``), which a client may request by
name, a static route may name as its ``model``, a rule may choose (``action: {workflow: name}``)
and the cost-quality knob may choose for the scores in its middle band::

    workflows:
      - name: fast-then-strong
        kind: cascade                       # the cheap model answers; escalate when unsure
        stages: [small-model, big-model]
        confidence: {source: logprobs, threshold: 0.75, stat: mean}
        caps: {max_steps: 4, max_seconds: 60, max_cost_usd: 0.05}
      - name: panel
        kind: fusion                        # fan out, then synthesise (or judge: pick the best)
        candidates: [model-a, model-b, model-c]
        timeout: 20
        combine: {fuser: big-model}
      - name: rated
        kind: ratings                       # fan out, score every answer, return the best
        candidates: [model-a, model-b]
        judge: judge-model
      - name: draft-critique-revise
        kind: graph                         # a bounded DAG of templated steps
        steps:
          - {name: draft, model: small-model}                       # no prompt: the conversation
          - {name: critique, model: big-model, after: [draft],
             prompt: "Point out mistakes in this answer to '{input}':\n{draft}"}
          - {name: revise, model: small-model, after: [draft, critique],
             prompt: "Question: {input}\nDraft: {draft}\nCritique: {critique}\nWrite the final answer."}
        output: revise

This module is the schema only (pydantic, unknown keys are errors, messages name the key) plus the
cross-checks against the configured models; the gateway executes workflows (``gateway/workflows``)
and offline evaluation can read them without any HTTP server.
"""

from __future__ import annotations

import re
import string
from collections.abc import Collection, Iterable
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from policies.strict_model import StrictModel

WORKFLOW_KINDS: tuple[str, ...] = ("cascade", "fusion", "ratings", "graph")
_NAME = r"^[A-Za-z0-9_][\w.-]*$"
_STEP_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # a step's answer is the template placeholder {name}

#: Placeholders every graph step prompt may use besides the names of the steps before it.
GRAPH_FIELDS: tuple[str, ...] = ("conversation", "input")
#: (placeholders a prompt may use, the ones it must) for a verifier's or a scoring judge's prompt ...
ANSWER_FIELDS: tuple[tuple[str, ...], tuple[str, ...]] = (("conversation", "answer"), ("answer",))
#: ... a pairwise judge's (route comparisons' fields) ...
PAIRWISE_FIELDS: tuple[tuple[str, ...], tuple[str, ...]] = (
    ("conversation", "answer_a", "answer_b"), ("answer_a", "answer_b"))
#: ... and a fuser's system prompt.
FUSER_FIELDS: tuple[tuple[str, ...], tuple[str, ...]] = (("references",), ("references",))


_Strict = StrictModel  # unknown keys, non-finite numbers and bools-for-numbers are errors


def template_fields(text: str) -> list[str]:
    """The ``{placeholders}`` of a ``str.format`` template; ``ValueError`` when it is not one."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"not a valid template (use {{{{ and }}}} for literal braces): {exc}") from exc
    fields = []
    for _literal, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field or not re.match(_STEP_NAME, field) or spec or conversion:
            raise ValueError(f"placeholder {{{field}}} is not a plain name (use {{{{ and }}}} for literal braces)")
        fields.append(field)
    return fields


def check_template(text: str, required: Iterable[str], allowed: Iterable[str] | None = None) -> str:
    """``text`` when it has every ``required`` placeholder and (given ``allowed``) no other."""
    fields = template_fields(text)
    missing = [name for name in required if name not in fields]
    if missing:
        raise ValueError(f"the prompt needs the placeholder(s) {', '.join('{' + m + '}' for m in missing)}")
    if allowed is not None:
        known = set(allowed)
        unknown = sorted({f for f in fields if f not in known})
        if unknown:
            raise ValueError(
                f"unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}; "
                f"known: {', '.join('{' + k + '}' for k in sorted(known))}"
            )
    return text


class Caps(_Strict):
    """Hard bounds on one run of a workflow.

    ``max_steps``: sub-calls (every model call: stages, samples, candidates, judges, verifiers,
    fusers, graph steps). ``max_fanout``: sub-calls of one run in flight at once (more wait their
    turn). ``max_tokens``: prompt + completion tokens summed over the sub-calls (each call's
    ``max_tokens`` is also bounded by what is left). ``max_seconds``: wall time until the final
    answer starts. ``max_cost_usd``: from the configured prices, estimated before each call and
    settled from its usage. A cap that is reached ends the workflow with its best answer so far.
    """

    max_steps: int = Field(default=16, ge=1, le=1024)
    max_fanout: int = Field(default=4, ge=1, le=256)
    max_tokens: int | None = Field(default=None, ge=1)
    max_seconds: float = Field(default=120.0, gt=0)
    max_cost_usd: float | None = Field(default=None, gt=0)


class Verifier(_Strict):
    """A model asked, with a templated question, whether an answer is right (yes or no)."""

    model: str = Field(min_length=1)
    prompt: str | None = Field(default=None, min_length=1)

    @field_validator("prompt")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        return None if value is None else check_template(value, ANSWER_FIELDS[1], ANSWER_FIELDS[0])


ConfidenceSource = Literal["logprobs", "agreement", "head", "verifier"]
_SOURCE_OPTIONS: dict[str, tuple[str, ...]] = {
    "logprobs": ("stat",),
    "agreement": ("samples", "temperature", "use_n"),
    "head": ("artifact",),
    "verifier": ("verifier",),
}


class Confidence(_Strict):
    """How sure a cascade is of a stage's answer, in [0, 1]; below ``threshold`` it escalates.

    ``logprobs``: from the answer's token log-probabilities (the gateway asks for them when the
    client did not, and strips them again). ``stat``: ``mean`` (exp of the mean token logprob: the
    geometric-mean token probability), ``min`` (exp of the least likely token's logprob) or
    ``margin`` (mean over tokens of top-1 minus top-2 probability). Tool-call tokens are excluded.
    ``agreement``: ``samples`` answers at ``temperature`` (one call with ``n`` when ``use_n`` and the
    backend returns that many choices, the rest as parallel calls); the share agreeing with the
    majority on the normalised final answer (its final number, else its text).
    ``head``: a trained answer-confidence head (``artifact``: its directory; default the shipped one).
    ``verifier``: a model answers a yes/no question about the answer (its logprobs give P(yes)).
    An answer with no usable confidence escalates unless ``on_missing: accept``.
    """

    source: ConfidenceSource
    threshold: float = Field(ge=0.0, le=1.0)
    stat: Literal["mean", "min", "margin"] = "mean"
    samples: int = Field(default=3, ge=2, le=16)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    use_n: bool = True
    artifact: str | None = Field(default=None, min_length=1)
    verifier: Verifier | None = None
    on_missing: Literal["escalate", "accept"] = "escalate"

    @model_validator(mode="after")
    def _options_match_source(self) -> Confidence:
        for source, options in _SOURCE_OPTIONS.items():
            if source == self.source:
                continue
            stray = [o for o in options if o in self.model_fields_set]
            if stray:
                raise ValueError(f"{', '.join(stray)}: only used with source {source}, not {self.source}")
        if self.source == "verifier" and self.verifier is None:
            raise ValueError("verifier: source verifier needs {model, prompt?}")
        return self


class Stage(_Strict):
    """A cascade stage: a model (``name`` defaults to the model's name)."""

    model: str = Field(min_length=1)
    name: str | None = Field(default=None, pattern=_NAME)

    @property
    def label(self) -> str:
        return self.name or self.model


class _WorkflowBase(_Strict):
    kind: str
    name: str = Field(pattern=_NAME, description="the workflow's name; it is served as the model <kind>/<name>")
    caps: Caps = Caps()
    description: str | None = None

    @property
    def model_name(self) -> str:
        """The virtual model clients and routes name this workflow by: ``<kind>/<name>``."""
        return f"{self.kind}/{self.name}"


class CascadeWorkflow(_WorkflowBase):
    """The first stage answers; while its confidence is below the threshold, the next one does.

    Every stage but the last is buffered and checked; the last one answers as it is (streamed live
    when the client streams).
    """

    kind: Literal["cascade"]
    stages: tuple[Stage, ...] = Field(min_length=2)
    confidence: Confidence

    @field_validator("stages", mode="before")
    @classmethod
    def _plain_names(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [{"model": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("stages")
    @classmethod
    def _distinct_labels(cls, value: tuple[Stage, ...]) -> tuple[Stage, ...]:
        labels = [stage.label for stage in value]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise ValueError(f"stage name(s) {', '.join(map(repr, repeated))} used twice; give the stages names")
        return value


class Combine(_Strict):
    """How a fusion turns its candidates' answers into one: exactly one of ``fuser`` (a model that
    writes one answer from the candidates' answers, mixture-of-agents style; ``prompt`` is its
    system prompt, with ``{references}``) or ``judge`` (a model that picks the best answer:
    ``mode: scored`` rates each, ``pairwise`` compares each pair in both orders; ``prompt`` with
    ``{conversation}`` and ``{answer}``, or ``{answer_a}`` and ``{answer_b}``)."""

    fuser: str | None = Field(default=None, min_length=1)
    judge: str | None = Field(default=None, min_length=1)
    mode: Literal["scored", "pairwise"] = "scored"
    prompt: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_way(self) -> Combine:
        if (self.fuser is None) == (self.judge is None):
            raise ValueError("combine is exactly one of {fuser: model} or {judge: model, mode: scored|pairwise}")
        if self.fuser is not None and "mode" in self.model_fields_set:
            raise ValueError("mode: only goes with judge")
        if self.prompt is not None:
            allowed, required = FUSER_FIELDS if self.fuser else (
                PAIRWISE_FIELDS if self.mode == "pairwise" else ANSWER_FIELDS)
            try:
                check_template(self.prompt, required, allowed)
            except ValueError as exc:
                raise ValueError(f"prompt: {exc}") from exc
        return self


def _distinct(value: tuple[str, ...]) -> tuple[str, ...]:
    repeated = sorted({name for name in value if value.count(name) > 1})
    if repeated:
        raise ValueError(f"{', '.join(map(repr, repeated))} listed twice")
    return value


class _FanOut(_WorkflowBase):
    candidates: tuple[str, ...] = Field(min_length=2)
    timeout: float = Field(default=60.0, gt=0, description="seconds each candidate may take; then it is skipped")
    min_answers: int = Field(default=1, ge=1)

    @field_validator("candidates")
    @classmethod
    def _distinct_candidates(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _distinct(value)

    @model_validator(mode="after")
    def _enough_candidates(self) -> _FanOut:
        if self.min_answers > len(self.candidates):
            raise ValueError(f"min_answers: {self.min_answers} is more than the {len(self.candidates)} candidates")
        return self


class FusionWorkflow(_FanOut):
    """Every candidate answers in parallel (each within ``timeout``; failures are skipped), then
    ``combine`` makes one answer of at least ``min_answers`` of them."""

    kind: Literal["fusion"]
    combine: Combine

    @model_validator(mode="after")
    def _fits_steps(self) -> FusionWorkflow:
        n = len(self.candidates)
        judge = self.combine.judge is not None
        needed = n + ((n * (n - 1) if self.combine.mode == "pairwise" else n) if judge else 1)
        _fits(self.caps, needed)
        return self


class AnswerHead(_Strict):
    """A trained answer-confidence head as a scorer (``artifact``: its directory; default the
    shipped one): P(the answer is good | the conversation, the answer)."""

    artifact: str | None = Field(default=None, min_length=1)


class RatingsWorkflow(_FanOut):
    """Every candidate answers in parallel, then exactly one of: the ``judge`` model scores every
    answer (``scored``) or every pair in both orders (``pairwise``), or the trained ``head`` scores
    every answer (no sub-call). The best answer is returned with all the ratings, and the ratings
    are stored as feedback (``source: judge``)."""

    kind: Literal["ratings"]
    judge: str | None = Field(default=None, min_length=1)
    head: AnswerHead | None = None
    mode: Literal["scored", "pairwise"] = "scored"
    prompt: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _prompt_and_steps(self) -> RatingsWorkflow:
        if (self.judge is None) == (self.head is None):
            raise ValueError("a ratings workflow scores with exactly one of judge: <model> or head: {artifact?}")
        if self.head is not None:
            stray = [key for key in ("mode", "prompt") if key in self.model_fields_set]
            if stray:
                raise ValueError(f"{', '.join(stray)}: only go with judge")
            _fits(self.caps, len(self.candidates))
            return self
        if self.prompt is not None:
            allowed, required = PAIRWISE_FIELDS if self.mode == "pairwise" else ANSWER_FIELDS
            try:
                check_template(self.prompt, required, allowed)
            except ValueError as exc:
                raise ValueError(f"prompt: {exc}") from exc
        n = len(self.candidates)
        _fits(self.caps, n + (n * (n - 1) if self.mode == "pairwise" else n))
        return self


class GraphStep(_Strict):
    """One step of a graph workflow: ``model`` answers ``prompt`` (a template of ``{conversation}``,
    ``{input}`` — the last user message — and ``{<step>}``, the answer of a step it comes after; no
    prompt: the client's conversation itself), with an optional ``system`` message, once every step
    in ``after`` has answered."""

    name: str = Field(pattern=_STEP_NAME)
    model: str = Field(min_length=1)
    prompt: str | None = Field(default=None, min_length=1)
    system: str | None = Field(default=None, min_length=1)
    after: tuple[str, ...] = ()
    max_tokens: int | None = Field(default=None, ge=1)

    @field_validator("after")
    @classmethod
    def _distinct_after(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _distinct(value)


class GraphWorkflow(_WorkflowBase):
    """A bounded DAG of steps; independent steps run in parallel (up to ``caps.max_fanout``) and the
    answer of ``output`` is the workflow's answer. Every step must lead to ``output``."""

    kind: Literal["graph"]
    steps: tuple[GraphStep, ...] = Field(min_length=1)
    output: str = Field(pattern=_STEP_NAME)

    @model_validator(mode="after")
    def _dag(self) -> GraphWorkflow:
        names = [step.name for step in self.steps]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"steps: step name(s) {', '.join(map(repr, repeated))} used twice")
        if any(name in GRAPH_FIELDS for name in names):
            raise ValueError(f"steps: {', '.join(GRAPH_FIELDS)} are placeholders, not step names")
        known = set(names)
        for i, step in enumerate(self.steps):
            for j, parent in enumerate(step.after):
                if parent not in known:
                    raise ValueError(f"steps.{i}.after.{j}: unknown step {parent!r}")
                if parent == step.name:
                    raise ValueError(f"steps.{i}.after.{j}: step {step.name!r} comes after itself")
        order = topological_order(self.steps)  # raises on a cycle
        ancestors = graph_ancestors(self.steps, order)
        for i, step in enumerate(self.steps):
            if step.prompt is None:
                continue
            try:
                check_template(step.prompt, (), (*GRAPH_FIELDS, *sorted(ancestors[step.name])))
            except ValueError as exc:
                raise ValueError(f"steps.{i}.prompt: {exc} (a step's answer is usable only in steps after it)") from exc
        if self.output not in known:
            raise ValueError(f"output: unknown step {self.output!r}")
        unused = [name for name in names if name != self.output and name not in ancestors[self.output]]
        if unused:
            raise ValueError(f"steps: {', '.join(map(repr, unused))} do(es) not lead to the output {self.output!r}")
        _fits(self.caps, len(self.steps))
        return self


def _fits(caps: Caps, needed: int) -> None:
    if needed > caps.max_steps:
        raise ValueError(
            f"caps.max_steps: this workflow makes at least {needed} sub-calls, more than max_steps {caps.max_steps}"
        )


def topological_order(steps: Iterable[GraphStep]) -> list[str]:
    """Step names with every step after the steps it comes after; ``ValueError`` naming a cycle."""
    steps = list(steps)
    after = {step.name: set(step.after) for step in steps}
    order: list[str] = []
    done: set[str] = set()
    while len(order) < len(steps):
        ready = [s.name for s in steps if s.name not in done and after[s.name] <= done]
        if not ready:
            cycle = sorted(name for name in after if name not in done)
            raise ValueError(f"steps: the steps {', '.join(map(repr, cycle))} wait for each other (a cycle)")
        order.extend(ready)
        done.update(ready)
    return order


def graph_ancestors(steps: Iterable[GraphStep], order: Iterable[str]) -> dict[str, set[str]]:
    """Every step's transitive predecessors (``order`` must be topological)."""
    by_name = {step.name: step for step in steps}
    ancestors: dict[str, set[str]] = {}
    for name in order:
        found: set[str] = set()
        for parent in by_name[name].after:
            found |= {parent, *ancestors[parent]}
        ancestors[name] = found
    return ancestors


WorkflowConfig = Annotated[
    CascadeWorkflow | FusionWorkflow | RatingsWorkflow | GraphWorkflow, Field(discriminator="kind")
]
AnyWorkflow = CascadeWorkflow | FusionWorkflow | RatingsWorkflow | GraphWorkflow


class WorkflowLimits(_Strict):
    """Process-wide bounds on workflows: at most ``max_concurrent_subcalls`` workflow sub-calls
    in flight in one gateway process (a workflow waits for a slot, up to its ``max_seconds``)."""

    max_concurrent_subcalls: int = Field(default=64, ge=1)


def model_references(workflow: AnyWorkflow) -> list[tuple[str, str]]:
    """Every model a workflow calls, as (key path below the workflow, model name)."""
    refs: list[tuple[str, str]] = []
    if isinstance(workflow, CascadeWorkflow):
        refs += [(f"stages.{i}.model", stage.model) for i, stage in enumerate(workflow.stages)]
        if workflow.confidence.verifier is not None:
            refs.append(("confidence.verifier.model", workflow.confidence.verifier.model))
    elif isinstance(workflow, FusionWorkflow | RatingsWorkflow):
        refs += [(f"candidates.{i}", name) for i, name in enumerate(workflow.candidates)]
        if isinstance(workflow, FusionWorkflow):
            combine = workflow.combine
            refs.append(("combine.fuser", combine.fuser) if combine.fuser else ("combine.judge", combine.judge or ""))
        elif workflow.judge is not None:
            refs.append(("judge", workflow.judge))
    else:
        refs += [(f"steps.{i}.model", step.model) for i, step in enumerate(workflow.steps)]
    return refs


def workflow_models(workflows: Iterable[AnyWorkflow]) -> dict[str, str]:
    """Workflow name -> the virtual model it is served as."""
    return {workflow.name: workflow.model_name for workflow in workflows}


def workflow_problems(workflows: Iterable[AnyWorkflow], models: Collection[str]) -> list[str]:
    """Cross-checks of the workflows against the configured models, as ``key.path: message`` lines:
    names used twice, unknown models, a virtual model name that is also a model's name."""
    problems: list[str] = []
    seen: set[str] = set()
    for workflow in workflows:
        root = f"workflows.{workflow.name}"
        if workflow.name in seen:
            problems.append(f"workflows: two workflows are named {workflow.name!r}")
        seen.add(workflow.name)
        if workflow.model_name in models:
            problems.append(f"{root}: its model name {workflow.model_name!r} is already a configured model")
        for path, model in model_references(workflow):
            if model not in models:
                problems.append(f"{root}.{path}: unknown model {model!r}")
    return problems


def describe_location(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pydantic error location without the discriminator tag pydantic inserts after a workflow's
    index (``workflows.0.cascade.stages`` -> ``workflows.0.stages``)."""
    if len(loc) > 2 and loc[0] == "workflows" and loc[2] in WORKFLOW_KINDS:
        return (*loc[:2], *loc[3:])
    return loc
