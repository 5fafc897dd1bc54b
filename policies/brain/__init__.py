"""Building a route's policies from a config, below the HTTP layer.

Why here: a route's policy needs the config's routing sections, the trained heads of one router
version, the shared encoder and the signal extractors — ``policies`` on top of ``classifiers``. The
gateway serves with it and ``pointsman eval`` replays with it; ``evals`` must not import ``gateway``,
so the building lives in ``policies`` (which may depend on ``classifiers``: gateway → policies →
classifiers). It is a subpackage, imported only by those who build, so the rest of ``policies`` stays
free of encoders and artifacts and ``import policies`` stays light.

- :mod:`.config`: :class:`RoutingConfig`, the routing part of a config file
  (:func:`load_routing_config`), and the schema pieces it shares with ``gateway.config``.
- :mod:`.heads`: one router version, its heads chosen per route (per-pair difficulty heads).
- :mod:`.active`: the active version, pinned per request, swapped on a registry promotion.
- :mod:`.build`: :class:`Brain` / :func:`build_brain`, every route's policy.
- :mod:`.explain`: the one context + explanation helper for ``/v1/route``, ``pointsman route``,
  probes and replay.
"""

from policies.brain.active import ActiveRouter
from policies.brain.build import Brain, build_brain, knob_windows
from policies.brain.config import (
    ClassifiersConfig,
    RoutingConfig,
    RoutingConfigError,
    load_routing_config,
    parse_routing_config,
)
from policies.brain.explain import decide_request, explain_policy, explain_request, request_context
from policies.brain.heads import RouterVersion

__all__ = [
    "ActiveRouter",
    "Brain",
    "ClassifiersConfig",
    "RouterVersion",
    "RoutingConfig",
    "RoutingConfigError",
    "build_brain",
    "decide_request",
    "explain_policy",
    "explain_request",
    "knob_windows",
    "load_routing_config",
    "parse_routing_config",
    "request_context",
]
