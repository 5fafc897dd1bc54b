"""The embedded default: what ``pointsman serve`` runs with no config file."""

from __future__ import annotations

from typing import Any

from classifiers.signals import PII_KINDS
from gateway.config import LOCAL_BACKEND, Config, parse_config

# Aliases of the local model: a fusion's candidates and a cascade's stages are distinct models, so
# the embedded default shows each workflow kind over the one model it has by giving it more names.
LOCAL_ALIASES = ("smollm2-135m-b", "smollm2-135m-c")

# Each workflow kind as a virtual model over the local model. They show the mechanics (sub-calls,
# escalation, fan-out, ratings, the record's tree), not a quality gain: every model here is the same
# 135M model. Small caps keep a try on 2 CPU cores to seconds.
EMBEDDED_WORKFLOWS: list[dict[str, Any]] = [
    {
        "name": "draft-retry",
        "kind": "cascade",
        "stages": [{"name": "draft", "model": "smollm2-135m"}, {"name": "retry", "model": "smollm2-135m-b"}],
        # exp(mean token logprob) of the draft: SmolLM2's confident answers score ~0.6-0.9.
        "confidence": {"source": "logprobs", "stat": "mean", "threshold": 0.7},
        "caps": {"max_steps": 3, "max_tokens": 1500, "max_seconds": 120},
    },
    {
        "name": "pair",
        "kind": "fusion",
        "candidates": ["smollm2-135m", "smollm2-135m-b"],
        "timeout": 60,
        "min_answers": 1,
        "combine": {"fuser": "smollm2-135m-c"},
        "caps": {"max_steps": 4, "max_tokens": 2500, "max_seconds": 180},
    },
    {
        "name": "best-of-2",
        "kind": "ratings",
        "candidates": ["smollm2-135m", "smollm2-135m-b"],
        # The shipped answer-confidence head rates each answer (no judge call: a 135M judge would
        # rarely follow a rating format).
        "head": {},
        "caps": {"max_steps": 3, "max_tokens": 1500, "max_seconds": 120},
    },
]


def embedded_default() -> Config:
    """A local SmolLM2 model behind the route ``auto``, decisions in ./pointsman.db, and one workflow
    of each kind (``cascade/draft-retry``, ``fusion/pair``, ``ratings/best-of-2``) over that model.

    ``auto`` runs the rules engine even with one model: jailbreak attempts are refused and PII is
    redacted before the prompt reaches the model.
    """
    return parse_config(
        {
            "local_model": {"enabled": True, "aliases": list(LOCAL_ALIASES)},
            "workflows": EMBEDDED_WORKFLOWS,
            "routes": [
                {
                    "name": "auto",
                    "policy": "rules",
                    "rules": [
                        {
                            "name": "block-jailbreak",
                            "priority": 100,
                            "when": {"signal": "jailbreak", "op": "ge", "value": 0.8},
                            "action": {"block": "This request was blocked by the gateway's policy.", "status": 403},
                        },
                        {
                            "name": "redact-pii",
                            "priority": 90,
                            "when": {"signal": "pii", "op": "truthy"},
                            "action": {"redact": list(PII_KINDS)},
                        },
                    ],
                    "model": "smollm2-135m",
                }
            ],
            "store": {"kind": "sqlite", "path": "pointsman.db"},
        },
        env={},
    )



def with_local_backend(config: Config, base_url: str, embedding_model: str | None = None) -> Config:
    """``config`` plus a backend ``local`` for the running embedded model at ``base_url``."""
    local = config.local_model
    models: list[dict[str, Any]] = [
        {"name": local.model_name, "tags": ["local", "cheap"], "context_window": local.n_ctx},
        *(
            {"name": alias, "upstream_name": local.model_name, "tags": ["local", "cheap"],
             "context_window": local.n_ctx}
            for alias in local.aliases
            if alias != local.model_name
        ),
    ]
    if embedding_model:
        models.append({"name": embedding_model, "upstream_name": local.model_name, "tags": ["local", "embedding"]})
    # Only what was set (defaults re-apply on parsing), by alias ("not", "lambda"), so the copy
    # validates exactly like the original.
    data: dict[str, Any] = config.model_dump(mode="python", exclude_unset=True, by_alias=True)
    data.setdefault("backends", [])
    data["backends"] = [
        *data["backends"],
        {
            "name": LOCAL_BACKEND,
            "base_url": base_url,
            "models": models,
            # CPU inference: allow a slow first token, keep a bounded total.
            "timeouts": {"connect": 2.0, "first_byte": 120.0, "total": 600.0, "idle": 60.0},
            "max_concurrency": 8,
            # llama.cpp's server answers GET /models only between generations, so an HTTP health
            # check would mark it down during every long answer; the child process is supervised
            # by LocalModelServer instead.
            "health": {"enabled": False},
        },
    ]
    return parse_config(data, env={})
