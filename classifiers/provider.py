"""Computes the signals a route's policy asks for — only those, and concurrently.

The embedding-based signals (``difficulty``, ``domain``, per-model ``quality``) share one encoder
pass: the conversation is encoded once in the encoder's worker thread (micro-batched with concurrent
requests, cached by content) while the cheap rule-based signals run on the event loop. Everything
reads the whole request body, never just the last message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

from classifiers.batching import BatchingEncoder
from classifiers.conversation import conversation_text, remember_text, remembered_text
from classifiers.heads import Head, build_features, load_head
from classifiers.offload import ScanPool
from classifiers.registry import SHIPPED_ROUTERS_DIR, resolve_routers_dir
from classifiers.signals import Signal, SignalExtractor, build_signal

#: Where the shipped router artifacts live (``pointsman train`` writes here by default).
DEFAULT_ROUTERS_DIR = SHIPPED_ROUTERS_DIR
DIFFICULTY_ARTIFACT = "difficulty-gpt4-mixtral-{encoder}"
DOMAIN_ARTIFACT = "domain-{encoder}"
#: Difficulty heads per model pair (``pointsman train --data ...``): ``classifiers.registry.pair_artifact``.
PAIR_ARTIFACT_GLOB = "difficulty-*--*-{encoder}"
#: The per-model quality head (``pointsman train --quality <source>``); never shipped with the package.
QUALITY_ARTIFACT = "quality-{source}-{encoder}"
#: Signals computed from the request itself (rules, patterns, counts).
RULE_SIGNALS: tuple[str, ...] = ("pii", "jailbreak", "tools", "length")
#: Signals computed by trained heads on the conversation's embedding (when the head is there).
HEAD_SIGNALS: tuple[str, ...] = ("difficulty", "domain", "quality")
#: The catalogue: every built-in signal a provider can compute. Config validation takes its known
#: signals from here (a route's keyword lists are added per route), so a rule can only name a signal
#: something computes.
PROVIDED_SIGNALS: frozenset[str] = frozenset(RULE_SIGNALS + HEAD_SIGNALS)

#: Where a provider reads its heads from on each computation (a hot-reloadable router's current set).
HeadSource = Callable[[], Mapping[str, Head]]


class HasBody(Protocol):
    """The part of a request context the provider reads (``policies.RequestContext`` has it)."""

    @property
    def body(self) -> Mapping[str, Any]: ...


@dataclass(slots=True)
class RouterHeads:
    """The trained heads for one encoder: difficulty = P(strong needed), task domain, and per-model
    quality (a ``multilabel`` head whose labels are model names).

    ``pairs`` holds the difficulty heads trained for a model pair (``pointsman train --data``), keyed
    ``(strong, weak)`` by their manifest's ``model_pair``; only the routers directory's own, never the
    shipped prior (``difficulty``). ``version`` names what was loaded (``classifiers.registry``).
    """

    encoder: str
    difficulty: Head | None = None
    domain: Head | None = None
    quality: Head | None = None
    sources: dict[str, str] = field(default_factory=dict)
    root: Path = DEFAULT_ROUTERS_DIR
    pairs: dict[tuple[str, str], Head] = field(default_factory=dict)
    version: str = ""

    def by_signal(self) -> dict[str, Head]:
        heads = {"difficulty": self.difficulty, "domain": self.domain, "quality": self.quality}
        return {name: head for name, head in heads.items() if head is not None}


def load_router_heads(
    encoder: str, routers_dir: str | Path | None = None, *, other_encoders_ok: bool = False
) -> RouterHeads:
    """Load the difficulty, domain and quality heads trained for ``encoder`` (missing ones stay None).

    Each head is looked up in ``routers_dir`` first, then among the artifacts shipped with the package,
    so a directory holding only a quality head (``pointsman train --quality``) still routes on the
    shipped difficulty and domain heads. The quality head is the one directory
    ``quality-<source>-<encoder>`` of the first directory that has any; two there are ambiguous and
    raise ``ValueError``.

    ``routers_dir`` may be a router registry: its active version's directory is used (none active:
    the shipped artifacts). Pair heads (``difficulty-<strong>--<weak>-<encoder>``) come from that
    directory only and fill ``pairs``; two for the same pair raise ``ValueError``. A registry version trained
    for other encoders only (``pointsman train --encoders static`` served with ``minilm``) raises
    ``ValueError``: it has nothing for ``encoder``, and its routes would read the shipped heads under its
    version id. ``other_encoders_ok`` loads the shipped heads for it instead (the promotion gate's baseline).
    """
    resolved = resolve_routers_dir(routers_dir)
    roots = [resolved.directory]
    if DEFAULT_ROUTERS_DIR not in roots:
        roots.append(DEFAULT_ROUTERS_DIR)
    heads = RouterHeads(encoder=encoder, root=roots[0], version=resolved.version)
    directories: list[tuple[str, Path]] = []
    for attr, pattern in (("difficulty", DIFFICULTY_ARTIFACT), ("domain", DOMAIN_ARTIFACT)):
        found = [root / pattern.format(encoder=encoder) for root in roots]
        directories += [(attr, d) for d in found if (d / "manifest.json").exists()][:1]
    for root in roots:
        quality = sorted(
            d for d in root.glob(QUALITY_ARTIFACT.format(source="*", encoder=encoder)) if (d / "manifest.json").exists()
        )
        if len(quality) > 1:
            raise ValueError(
                f"{root}: more than one quality head for encoder {encoder!r} "
                f"({', '.join(d.name for d in quality)}); keep one per routers directory"
            )
        if quality:
            directories.append(("quality", quality[0]))
            break
    for attr, directory in directories:
        head = load_head(directory)
        _check_encoder(head, encoder, directory)
        if attr == "quality" and head.kind != "multilabel":
            raise ValueError(f"{directory}: a quality head must be of kind 'multilabel', not {head.kind!r}")
        setattr(heads, attr, head)
        heads.sources[attr] = str(directory)
    if roots[0] != DEFAULT_ROUTERS_DIR:
        heads.pairs = _load_pair_heads(roots[0], encoder, heads.sources)
        _check_listed_pairs(roots[0], encoder, heads.sources, other_encoders_ok=other_encoders_ok)
    return heads


def _check_listed_pairs(root: Path, encoder: str, sources: dict[str, str], *, other_encoders_ok: bool) -> None:
    """A registry version's ``version.json`` lists its pair heads: each must have loaded. A head directory
    that lost its manifest would otherwise be skipped, and its routes silently fall back to another head.
    So would every route of a version with pair heads for other encoders only (unless ``other_encoders_ok``)."""
    from classifiers.registry import VERSION_FILE, RegistryError, read_json_file

    try:
        record = read_json_file(root / VERSION_FILE)  # a RegistryError naming the file when it is not JSON
    except FileNotFoundError:  # a plain directory of heads: a pair head's name ends in its encoder
        found = {d.name.rsplit("-", 1)[-1] for d in root.glob("difficulty-*--*") if (d / "manifest.json").is_file()}
        if not other_encoders_ok:
            _check_trained_for(root, encoder, sorted(found), "its pair heads are")
        return
    listed = (record.get("pairs") or []) if isinstance(record, dict) else None
    if not isinstance(listed, list) or not all(isinstance(pair, dict) for pair in listed):
        raise RegistryError(f"{root / VERSION_FILE}: not a version record (an object whose pairs are a list of "
                            "objects); the file is corrupt")
    if not other_encoders_ok:
        trained = sorted({str(pair.get("encoder", "static")) for pair in listed})
        _check_trained_for(root, encoder, trained, "this version was trained")
    loaded = set(sources.values())
    for pair in listed:
        if pair.get("encoder", "static") != encoder:
            continue
        directory = root / str(pair.get("artifact"))
        if str(directory) not in loaded:
            raise ValueError(
                f"{directory}: {VERSION_FILE} lists this pair head ({pair.get('strong')} vs {pair.get('weak')}) but "
                "it is missing or has no manifest.json; the version is incomplete"
            )


def _check_trained_for(root: Path, encoder: str, trained: list[str], what: str) -> None:
    """``ValueError`` when ``root`` has pair heads (for the encoders ``trained``) but none for ``encoder``."""
    if trained and encoder not in trained:
        raise ValueError(
            f"{root}: {what} for encoder {', '.join(trained)}, not {encoder!r} (classifiers.encoder): it has no "
            f"pair head for {encoder!r}, so its routes would read the shipped GPT-4 vs Mixtral head. Set "
            f"classifiers.encoder: {trained[0]}, or train with --encoders {encoder}"
        )


def _load_pair_heads(root: Path, encoder: str, sources: dict[str, str]) -> dict[tuple[str, str], Head]:
    """Every ``difficulty-<strong>--<weak>-<encoder>`` head under ``root``, by its manifest's model pair."""
    pairs: dict[tuple[str, str], Head] = {}
    for directory in sorted(root.glob(PAIR_ARTIFACT_GLOB.format(encoder=encoder))):
        if not (directory / "manifest.json").exists():
            continue
        head = load_head(directory)
        _check_encoder(head, encoder, directory)
        pair = head.manifest.get("model_pair") or {}
        strong, weak = pair.get("strong"), pair.get("weak")
        if not isinstance(strong, str) or not isinstance(weak, str) or not strong or not weak:
            raise ValueError(f"{directory}: a pair difficulty head needs model_pair: {{strong, weak}} in its manifest")
        if (strong, weak) in pairs:
            raise ValueError(f"{root}: two difficulty heads for {strong} vs {weak} and encoder {encoder!r}")
        pairs[(strong, weak)] = head
        sources[f"difficulty[{strong}|{weak}]"] = str(directory)
    return pairs


class ClassifierSignalProvider:
    """A route's signal provider (implements ``policies.SignalProvider`` structurally).

    ``heads`` is a fixed :class:`RouterHeads`, or a :data:`HeadSource` the provider calls once per
    computation: a router that swaps versions while requests run (hot reload) hands each computation
    one consistent set, and a computation that started on the old set finishes on it.
    """

    def __init__(
        self,
        *,
        encoder: BatchingEncoder | None,
        heads: RouterHeads | HeadSource | None,
        extractors: Mapping[str, SignalExtractor],
        max_chars: int = 2000,
    ) -> None:
        self._encoder = encoder
        if heads is None or isinstance(heads, RouterHeads):
            fixed: Mapping[str, Head] = heads.by_signal() if heads is not None else {}
            self._heads: HeadSource = lambda: fixed
        else:
            self._heads = heads
        self._extractors = dict(extractors)
        self._max_chars = max_chars
        self._scan_pool: ScanPool | None = None

    @property
    def available(self) -> frozenset[str]:
        """Names of every signal this provider can compute."""
        heads = set(self._heads()) if self._encoder is not None else set()
        return frozenset(set(self._extractors) | heads)

    @property
    def head_signals(self) -> frozenset[str]:
        """The embedding-based signals this provider could compute once an encoder is attached."""
        return frozenset(self._heads())

    def attach_encoder(self, encoder: BatchingEncoder) -> None:
        """Give the provider the shared encoder (loaded only when some policy needs a head signal)."""
        self._encoder = encoder

    @property
    def rule_signals(self) -> frozenset[str]:
        """The rule signals (text scans, which long requests make slow) this provider computes."""
        return frozenset(self._extractors)

    def attach_scan_pool(self, pool: ScanPool) -> None:
        """Scan long requests' texts in ``pool``'s worker processes instead of on the event loop."""
        self._scan_pool = pool

    async def compute(self, names: set[str], ctx: HasBody) -> dict[str, Signal]:
        """The requested signals that this provider knows; unknown names are left out."""
        body = ctx.body
        heads = self._heads()  # once: the whole computation reads one router version
        head_names = [n for n in names if n in heads] if self._encoder is not None else []
        embedding_task: asyncio.Future[np.ndarray] | None = None
        out: dict[str, Signal] = {}
        extractors = [self._extractors[name] for name in names if name in self._extractors]
        pool = self._scan_pool
        offloaded = pool is not None and bool(extractors or head_names) and pool.offloads(body)
        text = remembered_text(body, self._max_chars) if head_names else None
        if head_names and text is None and offloaded:
            assert pool is not None
            # A long request: rendering its conversation walks every message, which would hold the event
            # loop for everyone else; the worker renders it with the rule scans, on the same parse.
            raw = getattr(ctx, "raw_body", None) or orjson.dumps(body)
            scanned, text = await pool.extract_and_render(extractors, raw, self._max_chars)
            remember_text(body, self._max_chars, text)
            out.update(scanned)
            extractors = []
        if head_names:
            if text is None:
                text = conversation_text(body, max_chars=self._max_chars)
            assert self._encoder is not None
            embedding_task = asyncio.ensure_future(self._encoder.encode(text))
        try:
            if extractors and offloaded:
                # A long request: its rule scans would hold the event loop for everyone else.
                assert pool is not None
                raw = getattr(ctx, "raw_body", None) or orjson.dumps(body)
                out.update(await pool.extract(extractors, raw))
            else:
                for extractor in extractors:
                    out[extractor.name] = extractor.extract(body)
        except BaseException:
            if embedding_task is not None:
                embedding_task.cancel()
            raise
        if embedding_task is not None:
            embedding = await embedding_task
            # One feature vector per schema (with or without the cheap text statistics), shared by
            # every head that reads it: difficulty, domain and quality all want the same one.
            features: dict[bool, np.ndarray] = {}
            for name in head_names:
                head = heads[name]
                cheap = bool(head.manifest.get("feature_schema", {}).get("cheap"))
                if cheap not in features:
                    features[cheap] = build_features(embedding[None, :], [text or ""] if cheap else None)
                out[name] = _head_signal(name, head, features[cheap])
        return out


def build_extractors(keyword_lists: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, SignalExtractor]:
    """The built-in rule signals plus one keyword signal per configured keyword list."""
    extractors: dict[str, SignalExtractor] = {name: build_signal(name) for name in RULE_SIGNALS}
    for name, params in (keyword_lists or {}).items():
        extractors[name] = build_signal("keywords", name=name, **dict(params))
    return extractors


def _head_signal(name: str, head: Head, features: np.ndarray) -> Signal:
    proba = head.predict_proba(features)[0]
    if head.kind == "multilabel":
        return _quality_signal(name, head, proba)
    if name == "difficulty":
        index = _positive_index(head.labels)
        p_strong = float(proba[index])
        detail: dict[str, Any] = {"head": head.kind, "label": head.labels[index]}
        if head.manifest.get("reversed_from"):  # a pair head read the other way round (classifiers.heads.reverse)
            detail["reversed_from"] = head.manifest["reversed_from"]
        return Signal(name="difficulty", value=p_strong, confidence=abs(p_strong - 0.5) * 2.0, detail=detail)
    best = int(np.argmax(proba))
    return Signal(
        name=name,
        value=head.labels[best],
        confidence=float(proba[best]),
        detail={"scores": {label: round(float(p), 4) for label, p in zip(head.labels, proba, strict=True)}},
    )


def _quality_signal(name: str, head: Head, proba: np.ndarray) -> Signal:
    """Per-label probabilities as a mapping ``{label: p}`` (labels are model names for the quality head).

    Confidence is the mean over labels of ``|p - 0.5| * 2`` (the ``difficulty`` signal's definition,
    averaged): 0 when every prediction is a coin flip, 1 when every one is certain. ``detail.spread``
    (max - min) says how much the predictions separate the models on this request.
    """
    best = int(np.argmax(proba))
    return Signal(
        name=name,
        value={label: round(float(p), 4) for label, p in zip(head.labels, proba, strict=True)},
        confidence=float(np.mean(np.abs(proba - 0.5)) * 2.0),
        detail={
            "head": head.kind,
            "artifact": str(head.manifest.get("name", "")),
            "best": head.labels[best],
            "spread": round(float(proba.max() - proba.min()), 4),
        },
    )


def _positive_index(labels: tuple[str, ...]) -> int:
    for index, label in enumerate(labels):
        if "strong" in label.lower() or label.lower() in ("1", "true", "yes"):
            return index
    return len(labels) - 1


def _check_encoder(head: Head, encoder: str, directory: Path) -> None:
    """Refuse a head trained on the other encoder's embeddings (the vectors would be meaningless)."""
    schema = head.manifest.get("feature_schema", {})
    trained_on = str(schema.get("embedding", {}).get("encoder") or head.manifest.get("encoder_id") or "")
    family = "static" if trained_on.startswith("minilm-static") else "minilm"
    if trained_on and family != encoder:
        raise ValueError(f"{directory}: head was trained on encoder {trained_on!r}, not {encoder!r}")
