"""The ``pointsman`` command line: ``serve``, ``check-config``, ``hash-key``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from types import FrameType

import uvicorn
from fastapi import FastAPI

from gateway.app import create_app
from gateway.auth import hash_key
from gateway.config import Config, load_config
from gateway.defaults import embedded_default, with_local_backend
from gateway.errors import ConfigError

log = logging.getLogger("pointsman")


class _DrainingServer(uvicorn.Server):
    """uvicorn, plus: flip readiness to 503 the moment SIGTERM/SIGINT arrives, before draining."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        service = getattr(self._app.state, "service", None)
        if service is not None:
            service.draining = True
        super().handle_exit(sig, frame)
        # uvicorn re-raises captured signals after serve() returns, which would kill the process
        # with SIGTERM's default action (exit -15) and skip our cleanup (the local model child).
        # A drained shutdown is a clean exit.
        if hasattr(self, "_captured_signals"):
            self._captured_signals.clear()


async def serve(config: Config) -> None:
    """Run the gateway (and the embedded local model, if enabled) until SIGINT/SIGTERM."""
    local = None
    if config.local_model.enabled:
        from gateway.local_model import LocalModelServer

        local = LocalModelServer(config.local_model, embeddings=config.local_model.embeddings)
        log.info("starting the embedded local model %s ...", config.local_model.model_name)
        base_url = await local.start()
        config = with_local_backend(config, base_url, local.embedding_model_name)
    try:
        app = create_app(config)
        server = _DrainingServer(
            uvicorn.Config(
                app,
                host=config.server.host,
                port=config.server.port,
                http="httptools",
                loop="none",
                lifespan="on",
                access_log=False,
                server_header=False,
                date_header=False,
                timeout_graceful_shutdown=int(config.server.drain_timeout + 0.999),
                log_level="info",
            ),
            app,
        )
        await server.serve()
    finally:
        if local is not None:
            await local.stop()


def _run(coro_factory: object) -> None:
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        runner = asyncio.Runner()
    with runner:
        runner.run(coro_factory)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pointsman", description="Semantic model-router gateway.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="run the gateway (no --config: embedded local model)")
    p_serve.add_argument("--config", help="YAML config file")
    p_serve.add_argument("--host", help="bind address (overrides server.host)")
    p_serve.add_argument("--port", type=int, help="port (overrides server.port)")
    p_check = sub.add_parser("check-config", help="validate a config file and exit")
    p_check.add_argument("config")
    p_hash = sub.add_parser("hash-key", help="print the sha256 to put in auth.api_keys for a client key")
    p_hash.add_argument("key", help="the key, or - to read it from stdin")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "hash-key":
        key = sys.stdin.readline().strip() if args.key == "-" else args.key
        print(hash_key(key))
        return 0
    try:
        config = load_config(args.config) if getattr(args, "config", None) else embedded_default()
    except ConfigError as exc:
        print(f"pointsman: {exc}", file=sys.stderr)
        return 2
    if args.command == "check-config":
        print(f"{args.config}: ok ({len(config.backends)} backends, {len(config.routes)} routes)")
        return 0
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        config = config.model_copy(update={"server": config.server.model_copy(update=overrides)})
    try:
        _run(serve(config))
    except ConfigError as exc:
        print(f"pointsman: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
