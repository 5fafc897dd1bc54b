"""One router version: the trained heads a registry version (or a directory) holds, chosen per route.

A route reads at most one head per signal. Which difficulty head it reads depends on its
``cost_quality`` models: with per-pair difficulty heads in the routers directory (``pointsman train``
on a labelled file), a route uses the head trained for *its* strong and weak models — their names, or
the names ``cost_quality.difficulty_models`` maps them to — or, when the route names them the other
way round from training (which picks the higher mean quality as strong), that head read reversed: the
same ranking negated, with the reverse direction's own calibration. A head trained for another pair would
rank prompts by the wrong models' gap, so when the directory has pair heads and none matches the
route is refused, naming ``routes.<name>.cost_quality``. With no pair heads at all (the shipped
priors), the shipped GPT-4 vs Mixtral difficulty head serves every pair, as it always did.

Everything here is checked when a version is loaded, so a version that cannot serve every route is
refused whole: at start-up that is a configuration error; on a hot reload the old version stays.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from classifiers.heads import Head
from classifiers.heads.reverse import reversed_pair_head, reversible
from classifiers.provider import HEAD_SIGNALS, RouterHeads, load_router_heads
from policies.brain.config import RoutingConfigError
from policies.config import RouteConfig
from policies.signals import signal_name
from policies.validation import quality_label_problems


@dataclass(frozen=True, slots=True)
class RouterVersion:
    """The heads of one router version and, per route, the head each of its signals reads.

    ``version`` is the registry version id (``v0003-1a2b3c4d``), ``dir-<sha>`` for a plain directory
    or ``bundled-<sha>`` for the shipped artifacts: what ``/v1/route``, the ``x-pointsman-router``
    header and every decision record report.
    """

    version: str
    directory: Path
    heads: RouterHeads
    routes: Mapping[str, Mapping[str, Head]] = field(default_factory=dict)

    def heads_for(self, route: str) -> Mapping[str, Head]:
        """The heads route ``route`` reads, by signal name (empty for a route that reads none)."""
        return self.routes.get(route, {})


@dataclass(frozen=True, slots=True)
class RouteNeeds:
    """What a route asks of a router version: the head signals it uses (beyond its rule signals)."""

    route: RouteConfig
    head_signals: frozenset[str]


def load_router_version(
    encoder: str, routers_dir: str | Path | None, needs: Collection[RouteNeeds]
) -> RouterVersion:
    """Resolve ``routers_dir`` (a registry: its active version), load its heads for ``encoder`` and
    choose each route's heads; raises :class:`RoutingConfigError` naming the key when one cannot be
    served (an unusable artifact, a missing head, no difficulty head for a route's model pair)."""
    try:
        heads = load_router_heads(encoder, routers_dir)  # resolves a registry to its active version, once
    except (ValueError, OSError, KeyError) as exc:  # wrong encoder, bad hash, two quality heads, unreadable
        raise RoutingConfigError(f"classifiers.routers_dir: {exc}") from exc
    problems: list[str] = []
    routes: dict[str, Mapping[str, Head]] = {}
    for need in needs:
        chosen, found = route_heads(need, heads, heads.root, encoder)
        problems += found
        routes[need.route.name] = chosen
    if problems:
        raise RoutingConfigError("\n  ".join(problems))
    return RouterVersion(version=heads.version, directory=heads.root, heads=heads, routes=routes)


def route_heads(
    need: RouteNeeds, heads: RouterHeads, directory: Path, encoder: str
) -> tuple[dict[str, Head], list[str]]:
    """The heads a route reads, by signal, and the problems found choosing them."""
    route = need.route
    available = heads.by_signal()
    problems: list[str] = []
    root = f"routes.{route.name}"
    cq = route.cost_quality
    if cq is not None and signal_name(cq.signal) == "difficulty":
        head, problem = pair_head(cq.strong, cq.weak, dict(cq.difficulty_models), heads, directory, encoder)
        if problem:
            problems.append(f"{root}.cost_quality: {problem}")
        elif head is not None:
            available["difficulty"] = head
    missing = set(need.head_signals) - set(available)
    mm = route.multi_model
    quality_signal = signal_name(mm.quality_signal) if mm is not None else None
    if mm is not None and quality_signal in missing:
        missing.discard(quality_signal)  # said here, with how to get one
        if quality_signal != "quality":
            problems.append(f"{root}.multi_model.quality_signal: signal {quality_signal!r} cannot be computed")
        else:
            problems.append(
                f"{root}.multi_model.quality_signal: signal 'quality' cannot be computed: no quality head for "
                f"encoder {encoder!r} (quality-<source>-{encoder}/) in {directory} (classifiers.routers_dir). "
                f"Train one with `pointsman train --quality routerbench --encoders {encoder} --out DIR` "
                "and set classifiers.routers_dir: DIR"
            )
    elif mm is not None and quality_signal == "quality" and heads.quality is not None:
        quality = heads.quality
        source = f"the quality head {quality.manifest.get('name', heads.sources.get('quality'))}"
        problems += [f"{root}.{key}: {message}" for key, message in quality_label_problems(mm, quality.labels, source)]
    if missing:
        problems.insert(0, (
            f"{root}: signal(s) {', '.join(sorted(missing))} cannot be computed "
            f"(no trained head for encoder {encoder!r} in the router artifacts)"
        ))
    return {name: head for name, head in available.items() if name in need.head_signals}, problems


def pair_head(
    strong: str, weak: str, names: Mapping[str, str], heads: RouterHeads, directory: Path, encoder: str
) -> tuple[Head | None, str | None]:
    """The difficulty head for ``strong`` vs ``weak`` (each renamed through ``names`` first).

    Returns ``(head, None)`` for a matching pair head, or the head trained for ``weak`` vs ``strong``
    read reversed (:func:`classifiers.heads.reverse.reversed_pair_head`: its manifest's
    ``reversed_from`` names it), ``(None, None)`` when the directory has no pair heads of its own (the
    shipped difficulty head then serves), ``(None, problem)`` otherwise.
    """
    pair = (names.get(strong, strong), names.get(weak, weak))
    pairs = dict(heads.pairs)
    if pair in pairs:
        return pairs[pair], None
    trained = sorted(pairs)  # the routers directory's own: the shipped prior is never among them
    if not trained:
        return None, None
    if pair[::-1] in pairs and reversible(pairs[pair[::-1]]):
        return reversed_pair_head(pairs[pair[::-1]]), None
    listed = "; ".join(f"strong {s!r}, weak {w!r}" for s, w in trained)
    renamed = ""
    if pair != (strong, weak):
        renamed = f" (as difficulty_models names them: strong {pair[0]!r}, weak {pair[1]!r})"
    reverse = (
        " (a head exists for the reverse pair, trained before heads recorded how to read them reversed: "
        "retrain it, or swap strong and weak)"
        if pair[::-1] in pairs
        else ""
    )
    return None, (
        f"no difficulty head for strong {strong!r}, weak {weak!r}{renamed} among the pair heads for encoder "
        f"{encoder!r} in {directory} (classifiers.routers_dir): {listed}{reverse}. Map the configured models "
        f"to the trained ones with cost_quality.difficulty_models: "
        f"{{{strong}: <trained strong>, {weak}: <trained weak>}}, or train this pair: "
        f"`pointsman train --data file:LABELS --strong {strong} --weak {weak} --encoders {encoder} --out DIR`"
    )


__all__ = ["HEAD_SIGNALS", "RouteNeeds", "RouterVersion", "load_router_version", "pair_head", "route_heads"]
