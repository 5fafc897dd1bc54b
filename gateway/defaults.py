"""The embedded default: what ``pointsman serve`` runs with no config file."""

from __future__ import annotations

from typing import Any

from classifiers.signals import PII_KINDS
from gateway.config import Config, parse_config


def embedded_default() -> Config:
    """A local SmolLM2 model behind the route ``auto``, decisions in ./pointsman.db.

    ``auto`` runs the rules engine even with one model: jailbreak attempts are refused and PII is
    redacted before the prompt reaches the model.
    """
    return parse_config(
        {
            "local_model": {"enabled": True},
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
        {"name": local.model_name, "tags": ["local", "cheap"], "context_window": local.n_ctx}
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
            "name": "local",
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
