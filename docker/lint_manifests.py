"""Consistency checks for docker/: the gateway configs validate, and the deployment files agree with them.

Schema validation of compose.yaml and the Kubernetes manifests is left to their own tools (docker compose
config, kubernetes-validate; see lint.sh). This script checks what those tools cannot see: that every
config parses through ``gateway.config``, that every ``${VAR}`` a config requires is provided by the
environment that runs it, that probes hit the gateway's endpoints, and that shutdown grace periods
outlast the config's drain timeout. Run from the repository root; exits 1 listing every problem.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

from gateway.config import Config, load_config, parse_config
from gateway.defaults import with_local_backend
from gateway.errors import ConfigError

DOCKER = Path(__file__).resolve().parent
CONFIG_MOUNT = "/etc/pointsman/config.yaml"

# Stand-ins for the secrets a config requires; they only need to pass validation.
PLACEHOLDERS = {
    "POINTSMAN_PG_DSN": "postgresql://lint:lint@127.0.0.1:5432/lint",
    "POINTSMAN_API_KEY_SHA256": "0" * 64,
}

_REQUIRED_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # ${VAR} without a :-default
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def required_vars(config_text: str) -> set[str]:
    """Environment variables the config needs that have no default."""
    return set(_REQUIRED_VAR.findall(config_text))


def placeholder_env(config_text: str, where: str, problems: list[str]) -> dict[str, str]:
    """The placeholder environment for a config, reporting required variables with no placeholder."""
    missing = required_vars(config_text) - PLACEHOLDERS.keys()
    for name in sorted(missing):
        problems.append(f"{where}: requires ${{{name}}}; add a placeholder to PLACEHOLDERS in {__file__}")
    return dict(PLACEHOLDERS)


def dig(mapping: dict[str, Any], *keys: str) -> Any:
    """``mapping[k1][k2]...``, or None where a level is missing."""
    value: Any = mapping
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def duration_seconds(value: str | int | float) -> float:
    """A compose duration (``30s``, ``1m30s``) or a bare number of seconds."""
    if isinstance(value, int | float):
        return float(value)
    parts = _DURATION_PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"not a duration: {value!r}")
    return sum(float(number) * _SECONDS[unit] for number, unit in parts)


def as_served(config: Config) -> Config:
    """What ``pointsman serve`` runs: with the embedded model's backend added, which can still clash."""
    if config.local_model.enabled:
        with_local_backend(config, "http://127.0.0.1:1/v1")
    return config


def check_example_config(problems: list[str]) -> tuple[Config | None, str]:
    """Validate config.example.yaml through the gateway's own loader."""
    path = DOCKER / "config.example.yaml"
    text = path.read_text(encoding="utf-8")
    env = placeholder_env(text, path.name, problems)
    try:
        return as_served(load_config(path, env=env)), text
    except ConfigError as exc:
        problems.append(f"{path.name}: {exc}")
        return None, text


def check_compose(config: Config | None, config_text: str, problems: list[str]) -> None:
    """compose.yaml runs the example config with everything it needs."""
    where = "compose.yaml"
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text(encoding="utf-8"))
    services: dict[str, Any] = compose.get("services") or {}
    for name, image in (("postgres", "postgres:16"), ("redis", "redis:7")):
        service = services.get(name)
        if service is None:
            problems.append(f"{where}: no {name} service")
            continue
        if not str(service.get("image", "")).startswith(image):
            problems.append(f"{where}: services.{name}.image should be {image}")
        if "healthcheck" not in service:
            problems.append(f"{where}: services.{name} has no healthcheck")
    gateway = services.get("pointsman")
    if gateway is None:
        problems.append(f"{where}: no pointsman service")
        return
    mounts = [str(v).split(":") for v in gateway.get("volumes", [])]
    if not any(m[0] == "./config.example.yaml" and m[1] == CONFIG_MOUNT for m in mounts if len(m) >= 2):
        problems.append(f"{where}: pointsman does not mount ./config.example.yaml at {CONFIG_MOUNT}")
    check_args(gateway.get("command") or [], f"{where}: services.pointsman.command", problems)
    environment = gateway.get("environment") or {}
    names = set(environment) if isinstance(environment, dict) else {e.split("=")[0] for e in environment}
    for var in sorted(required_vars(config_text) - names):
        problems.append(f"{where}: services.pointsman.environment lacks {var}, which the config requires")
    for dependency in ("postgres", "redis"):
        condition = dig(gateway, "depends_on", dependency, "condition")
        if condition != "service_healthy":
            problems.append(f"{where}: pointsman should wait for {dependency} with condition service_healthy")
    if config is not None:
        grace = duration_seconds(gateway.get("stop_grace_period", "10s"))
        if grace <= config.server.drain_timeout:
            problems.append(
                f"{where}: stop_grace_period {grace:g}s must exceed server.drain_timeout "
                f"{config.server.drain_timeout:g}s, or docker kills requests that are still draining"
            )


def check_args(args: list[str], where: str, problems: list[str]) -> None:
    """The gateway is started with ``serve --config`` on the mounted file, listening on all interfaces."""
    if args[:1] != ["serve"] or CONFIG_MOUNT not in args or "0.0.0.0" not in args:
        problems.append(f"{where}: expected serve --config {CONFIG_MOUNT} --host 0.0.0.0, got {args}")


def check_k8s(problems: list[str]) -> None:
    """The Deployment, Service and ConfigMap agree with each other and with the gateway."""
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted((DOCKER / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc:
                continue
            if not (doc.get("apiVersion") and doc.get("kind")):
                problems.append(f"k8s/{path.name}: a document without apiVersion/kind")
                continue
            if doc["kind"] != "Kustomization" and not (doc.get("metadata") or {}).get("name"):
                problems.append(f"k8s/{path.name}: {doc['kind']} without metadata.name")
            docs[doc["kind"]] = doc
    missing = {"ConfigMap", "Deployment", "Service"} - docs.keys()
    if missing:
        problems.append(f"k8s: missing {', '.join(sorted(missing))}")
        return
    config_map, deployment, service = docs["ConfigMap"], docs["Deployment"], docs["Service"]

    config_text = (config_map.get("data") or {}).get("config.yaml", "")
    config: Config | None = None
    try:
        env = placeholder_env(config_text, "k8s ConfigMap config.yaml", problems)
        config = as_served(parse_config(yaml.safe_load(config_text), env=env))
    except (ConfigError, yaml.YAMLError) as exc:
        problems.append(f"k8s ConfigMap config.yaml: {exc}")

    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    where = f"k8s Deployment {container['name']}"
    check_args(container.get("args") or [], f"{where} args", problems)
    for var in sorted(required_vars(config_text) - {e["name"] for e in container.get("env", [])}):
        problems.append(f"{where}: env lacks {var}, which the config requires")

    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    for probe, endpoint in (("readinessProbe", "/ready"), ("livenessProbe", "/health")):
        http = dig(container, probe, "httpGet") or {}
        if http.get("path") != endpoint or http.get("port") not in {*ports, *ports.values()}:
            problems.append(f"{where}: {probe} should GET {endpoint} on a container port, got {http}")

    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    config_dir, map_name = str(Path(CONFIG_MOUNT).parent), config_map["metadata"]["name"]
    config_volumes = [n for n, v in volumes.items() if (v.get("configMap") or {}).get("name") == map_name]
    if not any(mounts.get(n, "").rstrip("/") == config_dir for n in config_volumes):
        problems.append(f"{where}: ConfigMap {map_name} is not mounted at {config_dir}")

    command = dig(container, "lifecycle", "preStop", "exec", "command") or []
    if command[:1] != ["sleep"] or len(command) != 2:
        problems.append(f"{where}: preStop should be exec [sleep, N], got {command}")
    elif config is not None:
        sleep = float(command[1])
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        if grace <= sleep + config.server.drain_timeout:
            problems.append(
                f"{where}: terminationGracePeriodSeconds {grace:g} must exceed preStop sleep {sleep:g} + "
                f"server.drain_timeout {config.server.drain_timeout:g}"
            )

    labels = pod["metadata"].get("labels") or {}
    selector = service["spec"].get("selector") or {}
    if not selector or any(labels.get(k) != v for k, v in selector.items()):
        problems.append(f"k8s Service: selector {selector} does not match the pod labels {labels}")
    for port in service["spec"].get("ports", []):
        if port.get("targetPort") not in {*ports, *ports.values()}:
            problems.append(f"k8s Service: targetPort {port.get('targetPort')} is not a container port")


def main() -> int:
    """Run every check and print what is wrong."""
    problems: list[str] = []
    config, config_text = check_example_config(problems)
    check_compose(config, config_text, problems)
    check_k8s(problems)
    for problem in problems:
        print(f"docker/{problem}", file=sys.stderr)
    if problems:
        return 1
    print("configs validate; compose.yaml and k8s/ agree with them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
