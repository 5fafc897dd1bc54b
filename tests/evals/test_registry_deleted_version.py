"""A running gateway whose active registry version is deleted from disk (``rm -rf`` of its directory):
the watcher notices on its next poll, logs an error naming the missing file and counts a failed reload,
and the version already loaded keeps serving. It went unnoticed until a restart, which then failed."""

from __future__ import annotations

import shutil
from pathlib import Path

from classifiers.registry import RouterRegistry
from tests.fakes.routers import add_version
from tests.fakes.upstream import FakeUpstream
from tests.gateway.test_hot_reload import STRONG, WEAK, dry_run, gateway_config, metric, serve
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually


def _failed_reloads(gateway: GatewayProcess) -> float:
    return metric(gateway, r'pointsman_router_reloads_total\{result="failed"\}') or 0.0


def test_deleting_the_active_version_is_an_error_at_once_and_the_loaded_version_keeps_serving(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    serving = add_version(registry, STRONG)  # the first version becomes active
    # Added before the deletion: one added after would reuse the deleted id (numbered after the newest left).
    newer = add_version(registry, WEAK)
    missing = registry.version_dir(serving) / "version.json"
    (tmp_path / "gw").mkdir()
    gateway = GatewayProcess(gateway_config(upstream, registry.root), tmp_path / "gw").start()
    try:
        assert (dry_run(gateway)["router_version"], _failed_reloads(gateway)) == (serving, 0.0)
        shutil.rmtree(registry.version_dir(serving))

        eventually(lambda: _failed_reloads(gateway) == 1.0, "the watcher notices the deleted version", timeout=30)
        errors = [line for line in gateway.log().splitlines() if "router reload failed" in line]
        assert len(errors) == 1 and str(missing) in errors[0], gateway.log()
        assert f"names version {serving}, which is not in the registry" in errors[0]
        after = dry_run(gateway)
        assert (after["router_version"], after["model"]) == (serving, "big")
        assert serve(gateway)[:2] == ("big", serving)
        assert metric(gateway, rf'pointsman_router_info\{{version="{serving}"\}}') == 1.0

        # The operator makes another version active: the watcher follows it, with no further failure.
        registry.promote(newer, {"decision": "promoted", "forced": True, "reason": "test"})
        eventually(lambda: dry_run(gateway)["router_version"] == newer, "the newly promoted version serves")
        assert serve(gateway)[:2] == ("small", newer)
        assert _failed_reloads(gateway) == 1.0
    finally:
        assert gateway.terminate() == 0
