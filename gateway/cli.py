"""The ``pointsman`` command line: ``serve``, ``check-config``, ``hash-key``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import logging.handlers
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.applications import Starlette

from gateway.app import create_app
from gateway.auth import hash_key
from gateway.config import Config, load_config, local_model_conflicts
from gateway.defaults import embedded_default, with_local_backend
from gateway.errors import ConfigError
from gateway.http_protocol import protocol_for
from gateway.logs import configure as configure_logging
from gateway.tracing import preflight as tracing_preflight
from gateway.workflows import preflight as workflow_preflight
from policies.base import PolicyError

if TYPE_CHECKING:
    from gateway.routing import RoutingBrain

log = logging.getLogger("pointsman")


class _DrainingServer(uvicorn.Server):
    """uvicorn, plus a drain a load balancer can see.

    On SIGTERM/SIGINT uvicorn closes its listener and every idle keep-alive connection at once: a
    readiness probe or a request sent at that moment meets a refused or reset connection, which a
    client cannot tell from a crash (was its POST processed?). So the first signal only marks the
    gateway draining, with the listener still open: ``/ready`` answers 503 and new proxied requests
    503 "shutting down" (``Retry-After``), on open and new connections alike, while the requests in
    flight at the signal finish, for at most ``timeout_graceful_shutdown`` (``server.drain_timeout``).
    Then uvicorn's own shutdown runs (listener and idle connections closed, what still runs waited
    for until the same deadline) and the lifespan flushes the decision log. A second signal starts
    that shutdown at once; a further SIGINT force-quits, as in uvicorn.
    """

    def __init__(self, config: uvicorn.Config, app: Starlette) -> None:
        super().__init__(config)
        self._app = app
        self._drain_deadline: float | None = None  # monotonic; set by the first signal
        self._draining: set[asyncio.Task[None]] = set()  # uvicorn's request tasks running at the signal

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        service = getattr(self._app.state, "service", None)
        if service is not None:
            service.draining = True
        if self._drain_deadline is None:
            # Only the requests running now are waited for: the ones that arrive later are refused at
            # once (503), so they never hold the drain open. on_tick ends it.
            self._drain_deadline = time.monotonic() + (self.config.timeout_graceful_shutdown or 0)
            self._draining = set(self.server_state.tasks)
            return
        # A second signal: stop waiting. uvicorn's graceful wait gets no time, and whatever still runs is
        # cancelled now (uvicorn's wait may already have started with the drain's remaining time). Done
        # on the loop: a signal handler may interrupt the loop's own bookkeeping.
        self.config.timeout_graceful_shutdown = 0
        with contextlib.suppress(RuntimeError):  # no loop running (shutting down already)
            loop = asyncio.get_event_loop()
            loop.call_soon_threadsafe(self._cancel_requests)
        super().handle_exit(sig, frame)
        # uvicorn re-raises captured signals after serve() returns, which would kill the process
        # with SIGTERM's default action (exit -15) and skip our cleanup (the local model child).
        # A drained shutdown is a clean exit.
        if hasattr(self, "_captured_signals"):
            self._captured_signals.clear()

    def _cancel_requests(self) -> None:
        for task in list(self.server_state.tasks):
            task.cancel(msg="a second shutdown signal: not waiting for requests to finish")

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's 0.1 s tick; while draining, it ends the drain once its requests are done or time is up."""
        if self._drain_deadline is not None and not self.should_exit:
            self._draining = {task for task in self._draining if not task.done()}
            left = self._drain_deadline - time.monotonic()
            if not self._draining or left <= 0:
                # uvicorn's graceful wait gets what is left of the drain, not a second drain_timeout.
                self.config.timeout_graceful_shutdown = max(0, int(left + 0.999))
                self.should_exit = True
        return await super().on_tick(counter)


def raise_open_file_limit() -> int:
    """Raise the soft limit on open files to the hard limit, as Go's runtime does for every program; returns it.

    Each client connection, upstream connection and worker pipe is a file descriptor. Many systems
    still start processes with a soft limit of 1024, which a few hundred idle client connections plus
    the upstream pools exhaust: accept() then fails and /health with it.
    """
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def offline_preflight(config: Config) -> RoutingBrain:
    """What ``serve`` and ``check-config`` refuse before connecting to anything (:class:`ConfigError`):
    every route's signals computable from the trained heads it would load (missing head, wrong encoder,
    a multi_model candidate the quality head cannot score), a cascade's answer-confidence artifact, the
    embedded model's conflicts, tracing's imports (the otel extra), and a Redis URL redis-py can read.
    Builds no encoder and starts nothing; returns the routing brain it built."""
    from gateway.routing import RoutingBrain

    brain = RoutingBrain(config)
    workflow_preflight(config)
    local_model_conflicts(config)
    tracing_preflight(config.tracing)
    if config.shared_state.kind == "redis":  # redis-py reads the URL's options (connects nothing)
        from gateway.shared_state import redis_client

        redis_client(config.shared_state.url, config.shared_state.timeout, decode=False)
    return brain


async def serve(config: Config) -> None:
    """Run the gateway (and the embedded local model, if enabled) until SIGINT/SIGTERM."""

    raise_open_file_limit()

    # Pre-flight: what fails with a clean message before any child process or socket exists, then
    # what needs a connection.
    brain = offline_preflight(config)
    await store_preflight(config)  # an unreachable database or an unwritable file: one line, not a traceback
    if brain.shared_state is not None:  # Redis down or a wrong URL: say so now, not in a traceback
        await brain.shared_state.start()
        await brain.shared_state.close()
    local = None
    if config.local_model.enabled:
        from gateway.local_model import LocalModelServer

        local = LocalModelServer(config.local_model, embeddings=config.local_model.embeddings,
                                 include_prompts=config.logging.include_prompts)
        log.info("starting the embedded local model %s ...", config.local_model.model_name)
        base_url = await local.start()
        config = with_local_backend(config, base_url, local.embedding_model_name)
    try:
        app = create_app(config)
        app.state.local_model = local  # readiness counts the embedded model's replica only while it runs
        server = _DrainingServer(
            uvicorn.Config(
                app,
                host=config.server.host,
                port=config.server.port,
                # httptools, with head size and time limits, and a write timeout for clients that stop reading
                http=protocol_for(config.server.header_timeout, config.server.write_timeout),
                timeout_keep_alive=config.server.keep_alive_timeout,  # type: ignore[arg-type]
                limit_concurrency=None,  # see README "Configuration": at the limit /health would answer 503 too
                loop="none",
                lifespan="on",
                access_log=False,
                server_header=False,
                date_header=False,
                timeout_graceful_shutdown=int(config.server.drain_timeout + 0.999),
                log_level=config.logging.level,
                # JSON logs: uvicorn's own lines go through the root handler (gateway.logs), not its
                # text handler, so every stderr line is one JSON object.
                log_config=None if config.logging.format == "json" else uvicorn.config.LOGGING_CONFIG,
            ),
            app,
        )
        await server.serve()
    finally:
        if local is not None:
            await local.stop()


async def store_preflight(config: Config) -> None:
    """Open the decision store once before serving: :class:`ConfigError` naming it when it cannot be."""
    from store import StoreError, open_store
    from store.url import check_store

    settings = config.store
    name = settings.path
    if settings.kind == "postgres" and settings.dsn:  # a URL is printed with its password masked; else not at all
        name = settings.dsn if "://" in settings.dsn else "store.dsn"
    try:
        await check_store(open_store(settings.kind, settings.path, settings.dsn), name)
    except StoreError as exc:
        raise ConfigError(f"store: cannot open the decision store: {exc}") from None


async def explain_route(
    config: Config, route: str, prompt: str, system: str | None, headers: dict[str, str]
) -> dict[str, Any]:
    """The routing decision for one prompt on ``route``, computed offline (no backend call, no shared
    state: session stickiness is not applied, see :func:`gateway.routing.offline_brain`)."""
    from gateway.direct import direct_plans, explain_direct
    from gateway.routing import offline_brain
    from policies.brain import explain_request

    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    body = {"model": route, "messages": messages}
    brain = offline_brain(config)
    direct = direct_plans(config).get(route)
    if route not in brain.policies and direct is None:
        raise ConfigError(f"no route {route!r} in the config (routes: {', '.join(brain.policies) or 'none'})")
    await brain.start()
    try:
        if direct is not None:  # a model or workflow named directly: what POST /v1/route answers for it
            return explain_direct(direct, brain.router)
        return await explain_request(brain, route, body, headers=headers, request_id="cli")
    finally:
        await brain.close()


def _probe(path: str, config_path: str | None) -> int:
    from gateway.probes import load_probe_config, load_probes, run_probes

    try:
        config = load_config(config_path) if config_path else load_probe_config(path) or embedded_default()
        probes = load_probes(path)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"pointsman: {exc}", file=sys.stderr)
        return 2
    try:
        results = asyncio.run(run_probes(config, probes))
    except ConfigError as exc:
        print(f"pointsman: {exc}", file=sys.stderr)
        return 2
    for result in results:
        status = "PASS" if result.passed else "FAIL"
        print(f"{status}  {result.probe.name}" + "".join(f"\n      {f}" for f in result.failures))
    failed = sum(not r.passed for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _port(text: str) -> int:
    """``--port`` (argparse ``type``): 0 to 65535, as ``server.port`` is checked in a config file. The
    override is applied to the parsed config, around that check: 70000 served on port 4464 (the OS
    takes the port modulo 65536) while the log said 70000."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is outside 0 to 65535")
    return port


def _split_header(text: str) -> tuple[str, str]:
    """``--header NAME:VALUE`` (argparse ``type``): a usage error without the colon or a name."""
    name, colon, value = text.partition(":")
    if not colon or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME:VALUE (e.g. x-pointsman-threshold:0.3)")
    return name.strip().lower(), value.strip()


def _run(coro_factory: object) -> None:
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        runner = asyncio.Runner()
    with runner:
        runner.run(coro_factory)  # type: ignore[arg-type]


def _forget(args: argparse.Namespace) -> int:
    """``pointsman forget``: delete a tenant's or a request's stored data, or expired text."""
    from store.admin import describe, forget

    try:
        counts = asyncio.run(forget(
            args.store, tenant=args.tenant, request_id=args.request_id, purge_expired=args.purge_expired
        ))
    except Exception as exc:  # unreachable database, bad URL: one line, no traceback
        print(f"pointsman forget: {exc}", file=sys.stderr)
        return 2
    print("\n".join(describe(counts, tenant=args.tenant, request_id=args.request_id)))
    if args.cache_redis and args.tenant is not None:
        return _forget_cached(args.cache_redis, args.cache_prefix, args.tenant)
    return 0


def _forget_cached(url: str, prefix: str, tenant: str) -> int:
    """Delete a tenant's response-cache entries from the Redis the gateways share."""
    from gateway.cache.redis import connect, forget_tenant

    async def run() -> int:
        client = connect(url, 5.0)
        try:
            return await forget_tenant(client, prefix, tenant)
        finally:
            await client.aclose()

    try:
        deleted = asyncio.run(run())
    except Exception as exc:  # unreachable Redis, bad URL: one line, no traceback
        print(f"pointsman: forget failed for the response cache: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(f"response cache: {deleted} entries and buckets of tenant {tenant!r} deleted")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pointsman", description="Semantic model-router gateway.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="run the gateway (no --config: embedded local model)")
    p_serve.add_argument("--config", help="YAML config file")
    p_serve.add_argument("--host", help="bind address (overrides server.host)")
    p_serve.add_argument("--port", type=_port, help="port (overrides server.port), 0 to 65535")
    p_check = sub.add_parser("check-config", help="validate a config file and exit")
    p_check.add_argument("config", nargs="?", help="YAML config file")
    p_check.add_argument("--config", dest="config_flag", metavar="CONFIG", help="the same, as other commands take it")
    p_hash = sub.add_parser("hash-key", help="print the sha256 to put in auth.api_keys for a client key")
    p_hash.add_argument("key", help="the key, or - to read it from stdin")
    p_route = sub.add_parser("route", help="explain how a prompt would be routed (no backend is called)")
    p_route.add_argument("prompt", help="the last user message (use - to read it from stdin)")
    p_route.add_argument("--config", help="YAML config file (default: the embedded default)")
    p_route.add_argument("--route", default="auto",
                         help="route to ask, or a model or workflow name (its fixed plan); default: auto")
    p_route.add_argument("--system", help="a system prompt to include in the conversation")
    p_route.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", type=_split_header,
                         help="request header, e.g. x-pointsman-threshold:0.3 (repeatable)")
    p_probe = sub.add_parser("probe", help="check a routing probes file (expected routes) offline")
    p_probe.add_argument("file", help="probes YAML (may embed its own config: section)")
    p_probe.add_argument("--config", help="gateway config (default: the probes file's config section)")
    p_forget = sub.add_parser("forget", help="delete a tenant's or a request's stored data (decisions, "
                              "feedback, conversations), or conversation text past its retention")
    p_forget.add_argument("--store", required=True, metavar="URL",
                          help="sqlite:///abs/path.db, sqlite://rel.db, a file path, or postgresql://...")
    who = p_forget.add_mutually_exclusive_group()
    who.add_argument("--tenant", help="forget everything stored for this tenant (API key name)")
    who.add_argument("--request-id", help="forget everything stored for this request id")
    p_forget.add_argument("--purge-expired", action="store_true",
                          help="delete conversation text whose retention period has ended")
    p_forget.add_argument("--cache-redis", metavar="URL",
                          help="with --tenant: also delete the tenant's response-cache entries in this Redis")
    p_forget.add_argument("--cache-prefix", default="pointsman:",
                          help="the gateways' shared_state.key_prefix (default pointsman:)")
    sub.add_parser("train", add_help=False,
                   help="train router heads: from labelled data (--data bundled|logs:URL|file:PATH --out REGISTRY) "
                        "into a registry version, or rebuild the shipped artifacts (see --help)")
    sub.add_parser("promote", add_help=False,
                   help="promote a registry version if it beats the active router on held-out data (see --help)")
    sub.add_parser("registry", add_help=False,
                   help="a router registry: registry list --registry DIR (versions, active, verdicts); "
                        "registry prune --registry DIR --keep N (delete old versions)")
    sub.add_parser("train-answer-confidence", add_help=False,
                   help="train the answer-confidence head a cascade's confidence.source: head scores with "
                        "(GSM8K answers; see --help)")
    sub.add_parser("eval", add_help=False,
                   help="replay a route's policy over labelled data (--config FILE --route auto --data SOURCE) and "
                        "report APGR, CPT, frontier, AIQ, calibration against baselines (see --help)")
    sub.add_parser("ab", add_help=False,
                   help="A/B experiments: ab report EXPERIMENT --store URL writes per-arm quality, cost, latency "
                        "and a verdict with always-valid statistics (see ab report --help)")
    args, rest = parser.parse_known_args(argv)
    if args.command == "ab":
        from evals.ab.cli import main as ab_main

        return ab_main(rest)
    if args.command == "eval":
        from evals.report_cli import main as eval_main

        return eval_main(rest)
    if args.command == "train":
        from evals.train import main as train_main

        return train_main(rest)
    if args.command == "train-answer-confidence":
        from evals.train_answer_confidence import main as train_answer_confidence_main

        return train_answer_confidence_main(rest)
    if args.command == "promote":
        from evals.promote import main as promote_main

        return promote_main(rest)
    if args.command == "registry":
        from evals.registry_cli import main as registry_main

        return registry_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "check-config":
        if args.config and args.config_flag and args.config != args.config_flag:
            sub.choices["check-config"].error("give the config file once (FILE or --config FILE)")
        args.config = args.config or args.config_flag
        if not args.config:
            sub.choices["check-config"].error("give the config file (FILE or --config FILE)")
    if args.command == "forget":
        if args.tenant is None and args.request_id is None and not args.purge_expired:
            p_forget.error("give --tenant, --request-id or --purge-expired")
        if args.cache_redis and args.tenant is None:  # cache keys carry a tenant's digest, no request id
            p_forget.error("--cache-redis deletes a tenant's response-cache entries: it needs --tenant (with "
                           "--request-id or --purge-expired the cache is not touched: its entries end with their TTL)")
        return _forget(args)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    early: logging.handlers.MemoryHandler | None = None
    if args.command == "serve":
        # What is logged while the config is read (its warnings) waits for the format the config asks
        # for (JSON lines); if it cannot be read, the text handler above writes it.
        early = logging.handlers.MemoryHandler(capacity=1 << 30, flushLevel=logging.CRITICAL + 1)
        root = logging.getLogger()
        early.setTarget(root.handlers[0] if root.handlers else logging.StreamHandler())
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.addHandler(early)
    if args.command == "hash-key":
        # Stripped as the gateway strips the bearer token it hashes: a pasted key's stray space or
        # newline made a digest no request matched, and an empty key one no request can present.
        key = (sys.stdin.readline() if args.key == "-" else args.key).strip()
        if not key:
            p_hash.error("the key is empty (an unset variable piped into 'hash-key -'?): no request could present it")
        print(hash_key(key))
        return 0
    if args.command == "probe":
        return _probe(args.file, args.config)
    try:
        config = load_config(args.config) if getattr(args, "config", None) else embedded_default()
    except ConfigError as exc:
        if early is not None:
            early.flush()  # the warnings read before the failure, as text
        print(f"pointsman: {exc}", file=sys.stderr)
        return 2
    if args.command == "route":
        from gateway.routing import sticky_routes

        prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
        headers = dict(args.header)
        try:
            explanation = asyncio.run(explain_route(config, args.route, prompt, args.system, headers))
        except (ConfigError, KeyError, PolicyError) as exc:  # a request the gateway would answer 4xx
            print(f"pointsman: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
            return 2
        print(json.dumps(explanation, indent=2, default=str))
        if args.route in sticky_routes(config):  # on stderr: stdout stays the explanation's JSON
            print(f"pointsman route: route {args.route}: session stickiness is not applied offline (the prompt is "
                  "decided as a conversation's first turn, as pointsman eval replays it)", file=sys.stderr)
        if explanation.get("blocked"):
            return 3
        error = explanation.get("error")
        if error:  # e.g. no eligible model: the gateway would refuse it (4xx), as a malformed header (exit 2)
            print(f"pointsman: {error.get('message')}", file=sys.stderr)
            return 2
        return 0
    if args.command == "check-config":
        try:
            offline_preflight(config)  # serve's own pre-flight, up to what needs a connection
        except ConfigError as exc:
            print(f"pointsman: {exc}", file=sys.stderr)
            return 2
        count = len(config.experiments)
        experiments = f", {count} experiment{'s' if count > 1 else ''}" if count else ""
        print(f"{args.config}: ok ({len(config.backends)} backends, {len(config.routes)} routes{experiments})")
        return 0
    handler = configure_logging(config.logging)  # text or JSON lines, request ids, credentials masked
    if early is not None:  # the config's own warnings, in that format
        level = logging.getLogger().level
        for record in early.buffer:
            if record.levelno >= level:
                handler.handle(record)
        early.buffer.clear()
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        config = config.model_copy(update={"server": config.server.model_copy(update=overrides)})
    try:
        _run(serve(config))
    except ConfigError as exc:
        if config.logging.format == "json":  # stderr is JSON lines from here on: this one too
            log.error("%s", exc)
        else:
            print(f"pointsman: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
