"""``pointsman promote VERSION --registry DIR --data HELDOUT [--margin 0]``: the promotion gate.

The candidate version and the router serving now (the registry's active version; with none active,
the shipped artifacts) score the same held-out labelled prompts. For every pair head of the candidate
(per encoder it was trained for), the baseline is the active router's head for that pair, or its
generic difficulty head when it has none for the pair (what a route would fall back to). The figure is
APGR on the prompts labelled for both models of the pair and scorable by both heads; the test is a
paired bootstrap of the APGR difference (the same resampled prompts for both routers, seeded, at
least 1,000 resamples). The version is promoted only when, for every judged pair, the lower end of
the 95% CI of ``APGR(candidate) - APGR(active)`` exceeds ``--margin``.

Which pairs are judged: every pair head of the candidate, or those named with ``--pair STRONG,WEAK``
(the pairs the operator's routes use; model names may hold commas and spaces, so the comma that splits
the value into a pair of the version is the one used, :func:`split_pair`, or the value is a JSON list
of the two names). A pair whose two models the held-out prompts cannot tell apart
(their mean quality gap's 95% interval reaches zero, :class:`evals.metrics.QualityGap`) is reported but
not judged: APGR divides by that gap, so its interval spans several units and no candidate could ever
clear it; one near-tie among the pairs of a multi-model file would otherwise block every promotion.
Nor is a pair whose *weak* model does better on the held-out prompts (the interval lies below zero):
APGR then divides by a negative gap and a better ranking scores lower. Nor is a pair with fewer than
``MIN_HELDOUT_ROWS`` held-out prompts labelled for both its models (a multi-model version's pairs the
held-out file does not cover): each such pair is shown with its count; when that is every pair, the
held-out data is wrong for this version (a usage error, nothing written). With no pair left to judge the
version is refused.

Held-out data must not be training data. A version records which requests it was trained on
(:mod:`evals.trained_rows`: hashes, no text); the gate leaves out every held-out request the candidate
or the active version was trained on, says how many, and records the counts in the verdict; where the
active version has no head for a pair and the shipped head stands in for it, that pair's comparison
also leaves out the shipped head's training prompts. So
``--data logs:STORE`` after training grades the routers on the traffic logged since (and on what
``--holdout`` kept out), and a gate on the very file the candidate learnt from is refused. ``--holdout
FRACTION`` keeps only the held-out part of each source (``evals.holdout``: the part ``pointsman train
--holdout FRACTION`` left out). For a version that recorded no training requests (trained before this
was recorded) the check is by source: a ``--data`` source it was trained on is refused unless it was
trained with ``--holdout`` and the gate's fraction is at most that one.

The verdict and its numbers are written into the registry either way (``verdicts.json`` of the
version; on promotion also ``active.json``). Exit code: 0 promoted, 1 refused, 2 usage error.

``--force --reason TEXT`` makes a version active without the gate: the operator's way back when a
promoted version misbehaves live (a rollback: ``active.json``'s ``previous`` names the version to go
back to) or to pin one on other evidence (an A/B experiment). It is recorded like any verdict, as
``forced`` with the reason and the user, and every gateway replica serving the registry picks it up like
a promotion.

Exit 1 means only "refused by the gate": every other failure (a read-only or corrupt registry, bad
options, unreadable data) is one line naming the file or option and exit 2, never a traceback. A registry
the verdict could not be written into is refused before the held-out data is even read.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.heads import Head, load_head
from classifiers.heads.reverse import reversed_pair_head, reversible
from classifiers.registry import (
    SHIPPED_ROUTERS_DIR,
    ResolvedRouters,
    RouterRegistry,
    VersionInfo,
    is_registry,
    operator_name,
    resolve_routers_dir,
)
from evals.holdout import holdout_fraction, split_sources
from evals.labelled import DataError, LabelledRequest, LoadedSource, load_source
from evals.metrics import QualityGap, ResampledApgr, quality_gap, resample_counts
from evals.registry_cli import corrupt_file, error_line, int_at_least, os_error_line, unwritable
from evals.retrain import Embedded, embed_rows, head_features, row_key, safe_apgr
from evals.trained_rows import (
    TrainedRows,
    key_hashes,
    load_trained_rows,
    resolved_training_rows,
    router_training_rows,
    trained_mask,
)

Log = Callable[[str], None]
MIN_RESAMPLES = 1000
DEFAULT_RESAMPLES = 2000
#: Fewer held-out prompts than this for a pair cannot support a verdict.
MIN_HELDOUT_ROWS = 10


class GateError(ValueError):
    """The gate cannot be run as asked (unknown version, no usable held-out prompts): a usage error."""


@dataclass
class Comparison:
    """One pair's figures on the held-out prompts."""

    strong: str
    weak: str
    encoder: str
    rows: int  # held-out rows labelled for both models and scorable by both heads
    prompts: int  # the distinct prompts among them: what the bootstrap resamples, and the minimum counts
    apgr_candidate: float
    apgr_active: float
    diff: float
    ci_low: float
    ci_high: float
    candidate_ci: tuple[float, float]
    active_ci: tuple[float, float]
    baseline_head: str
    resamples_used: int
    gap: QualityGap
    passed: bool = False
    #: Held-out requests left out of this pair only: the shipped head the active version falls back to
    #: for it was trained on them.
    excluded_fallback_rows: int = 0

    @property
    def too_few_rows(self) -> bool:
        """Fewer held-out prompts labelled for both models (and scorable by both heads) than a verdict
        needs. Prompts, not rows: a prompt judged many times is still one prompt's evidence."""
        return self.prompts < MIN_HELDOUT_ROWS

    @property
    def judged(self) -> bool:
        """Whether this pair counts in the verdict: enough held-out prompts are labelled for it, and they
        tell its two models apart, the strong one ahead (with the weak one ahead the APGR difference
        reads upside down)."""
        return not self.too_few_rows and not self.gap.unresolved and not self.gap.inverted

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready numbers."""
        return {
            "strong": self.strong,
            "weak": self.weak,
            "encoder": self.encoder,
            "rows": self.rows,
            "prompts": self.prompts,
            "apgr_candidate": _r(self.apgr_candidate),
            "apgr_active": _r(self.apgr_active),
            "apgr_diff": _r(self.diff),
            "apgr_diff_ci95": [_r(self.ci_low), _r(self.ci_high)],
            "apgr_candidate_ci95": [_r(v) for v in self.candidate_ci],
            "apgr_active_ci95": [_r(v) for v in self.active_ci],
            "baseline_head": self.baseline_head,
            "resamples_used": self.resamples_used,
            "quality_gap": {"value": _r(self.gap.value), "ci95": [_r(self.gap.lo), _r(self.gap.hi)]},
            "judged": self.judged,
            "passed": self.passed,
            "excluded_fallback_training_rows": self.excluded_fallback_rows,
        }


@dataclass
class Verdict:
    """The gate's decision and everything it was based on."""

    version: str
    against: str
    promoted: bool
    margin: float
    resamples: int
    seed: int
    data: list[dict[str, Any]]
    comparisons: list[Comparison] = field(default_factory=list)
    not_gated: list[dict[str, str]] = field(default_factory=list)
    reason: str = ""
    #: Held-out requests left out because a router was trained on them: {"candidate": n, "active": m}.
    excluded: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """What goes into the registry."""
        return {
            "decision": "promoted" if self.promoted else "refused",
            "version": self.version,
            "against": self.against,
            "margin": self.margin,
            "test": "paired bootstrap of the APGR difference over held-out prompts, 95% percentile CI; "
            "promote when the CI's lower end exceeds the margin for every judged pair (a pair whose models' "
            "mean quality gap has a 95% interval reaching zero, or below it, is not judged)",
            "resamples": self.resamples,
            "seed": self.seed,
            "data": self.data,
            "excluded_training_rows": self.excluded,
            "comparisons": [c.as_dict() for c in self.comparisons],
            "not_gated": self.not_gated,
            "reason": self.reason,
        }


def _r(v: float) -> float | None:
    return None if not np.isfinite(v) else round(float(v), 4)


def paired_bootstrap(
    new: np.ndarray,
    old: np.ndarray,
    strong: np.ndarray,
    weak: np.ndarray,
    *,
    resamples: int,
    seed: int,
    groups: Sequence[object] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """APGR of ``new`` and of ``old`` on the same ``resamples`` bootstrap resamples of the prompts.

    ``groups`` (each row's prompt) resamples whole prompts, so a held-out file judging one prompt several
    times does not narrow the interval the gate reads. Resamples on which APGR is undefined (the two
    models tie on average) come back as NaN.
    """

    fast_new, fast_old = ResampledApgr(new, strong, weak), ResampledApgr(old, strong, weak)
    values: list[tuple[float, float]] = [  # bootstrap()'s draws, each read as row counts by both
        (fast_new.apgr(counts), fast_old.apgr(counts))
        for counts in resample_counts(len(new), resamples, seed, groups=groups)
    ]
    pairs = np.array(values, dtype=float).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def _percentiles(values: np.ndarray) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return float("nan"), float("nan")
    return float(np.percentile(finite, 2.5)), float(np.percentile(finite, 97.5))


def _baseline_head(heads: Any, strong: str, weak: str) -> tuple[Head | None, str, bool]:
    """The active router's head for the pair, its name, and whether it is the shipped difficulty head
    (the fallback of a registry version without a head of its own for the pair).

    As a gateway reads it (``policies.brain.heads.pair_head``): the head trained for the pair, else the one
    trained for it the other way round read reversed, else the shipped head."""
    head = heads.pairs.get((strong, weak))
    if head is not None:
        return head, str(head.manifest.get("name", f"{strong} vs {weak}")), False
    other = heads.pairs.get((weak, strong))
    if other is not None and reversible(other):
        return reversed_pair_head(other), f"{other.manifest.get('name', f'{weak} vs {strong}')} (reversed)", False
    if heads.difficulty is not None:
        source = heads.sources.get("difficulty")
        shipped = source is not None and Path(source).resolve().parent == SHIPPED_ROUTERS_DIR
        return heads.difficulty, str(heads.difficulty.manifest.get("name", "difficulty")), shipped
    return None, "none", False


def compare_pair(
    candidate: Head,
    baseline: Head,
    baseline_name: str,
    data: Embedded,
    strong: str,
    weak: str,
    encoder: str,
    *,
    margin: float,
    resamples: int,
    seed: int,
) -> Comparison:
    """Both heads on the held-out prompts labelled for the pair; paired bootstrap of the difference."""
    labelled = np.array([r.labelled_for(strong, weak) for r in data.rows], dtype=bool)
    sub = data.subset(np.flatnonzero(labelled))
    x_new, ok_new = head_features(candidate, sub)
    x_old, ok_old = head_features(baseline, sub)
    both = ok_new & ok_old
    # Rows each head can score, restricted to the rows both can (the comparison must be paired).
    s_new = candidate.predict_proba(x_new)[:, 1][both[ok_new]]
    s_old = baseline.predict_proba(x_old)[:, 1][both[ok_old]]
    rows = [r for r, keep in zip(sub.rows, both, strict=True) if keep]
    qs = np.array([r.qualities[strong] for r in rows], dtype=np.float64)
    qw = np.array([r.qualities[weak] for r in rows], dtype=np.float64)
    groups = [row_key(r) for r in rows]
    prompts = len(set(groups))
    if prompts < MIN_HELDOUT_ROWS:
        # Not enough to judge: reported, like a pair whose models the prompts cannot tell apart.
        nan = float("nan")
        return Comparison(
            strong=strong, weak=weak, encoder=encoder, rows=len(rows), prompts=prompts, apgr_candidate=nan,
            apgr_active=nan,
            diff=nan, ci_low=nan, ci_high=nan, candidate_ci=(nan, nan), active_ci=(nan, nan),
            baseline_head=baseline_name, resamples_used=0, gap=quality_gap(qs, qw),
        )
    apgr_new, apgr_old = safe_apgr(s_new, qs, qw), safe_apgr(s_old, qs, qw)
    boot_new, boot_old = paired_bootstrap(
        s_new, s_old, qs, qw, resamples=resamples, seed=seed, groups=groups
    )
    diffs = boot_new - boot_old
    lo, hi = _percentiles(diffs)
    comparison = Comparison(
        strong=strong,
        weak=weak,
        encoder=encoder,
        rows=len(rows),
        prompts=prompts,
        apgr_candidate=apgr_new,
        apgr_active=apgr_old,
        diff=apgr_new - apgr_old,
        ci_low=lo,
        ci_high=hi,
        candidate_ci=_percentiles(boot_new),
        active_ci=_percentiles(boot_old),
        baseline_head=baseline_name,
        resamples_used=int(np.isfinite(diffs).sum()),
        gap=quality_gap(qs, qw),
    )
    comparison.passed = bool(np.isfinite(lo) and lo > margin)
    return comparison


def run_gate(
    registry_dir: Path,
    version: str,
    sources: Sequence[str],
    *,
    margin: float = 0.0,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    progress: bool = True,
    log: Log = print,
    pairs: Sequence[tuple[str, str] | str] | None = None,
    holdout: float | None = None,
) -> Verdict:
    """Compare ``version`` with the active router, write the verdict into the registry, return it.

    ``pairs``: gate only these (strong, weak) pairs (either order), each a tuple or a ``--pair`` value
    (:func:`split_pair`); ``None``: every pair of the version.
    Raises :class:`GateError` / :class:`evals.labelled.DataError` for usage errors (nothing written).
    """
    from classifiers.provider import load_router_heads
    from evals.embeddings import get_encoder

    if resamples < MIN_RESAMPLES:
        raise GateError(f"--resamples must be at least {MIN_RESAMPLES}")
    if not math.isfinite(margin):
        # NaN compares false both ways and -inf passes anything; neither is strict JSON in the verdict.
        raise GateError(f"--margin {margin}: give a finite number")
    if seed < 0:
        raise GateError(f"--seed {seed}: give a whole number >= 0")
    registry, info = _inactive_version(registry_dir, version)
    _check_writable(registry_dir, info, "the gate records its verdict there")
    _check_loads(info)
    baseline = resolve_routers_dir(registry_dir)
    if not info.pairs:
        raise GateError(f"{version} has no pair difficulty head to compare")
    gated = _select_pairs(info.pairs, pairs, version)
    loaded: list[LoadedSource] = [load_source(spec) for spec in sources]
    candidate_rows = _trained_rows(info)
    if candidate_rows is None:  # a version from before row membership was recorded: judge by source
        _check_not_training_data(info, loaded, holdout)
    if holdout is not None:
        loaded = split_sources(loaded, holdout, "heldout")
    from_registry = baseline.directory != SHIPPED_ROUTERS_DIR
    rows, excluded = _leave_out_training_rows(
        [r for src in loaded for r in src.rows], candidate_rows, _baseline_trained_rows(baseline)
    )
    log(
        f"promotion gate: {version} against {baseline.version} on {len(rows)} held-out requests "
        f"({', '.join(src.spec for src in loaded)}), {resamples} paired bootstrap resamples, margin {margin:g}"
    )
    if excluded["candidate"] or excluded["active"]:
        log(f"  left out {excluded['candidate']} requests {version} was trained on and {excluded['active']} the "
            f"active version was trained on")
    if from_registry and not excluded["active_recorded"]:
        log(f"  note: {baseline.version} recorded no training requests (trained before they were recorded): any of "
            "its own training rows among these stay in and flatter it")
    verdict = Verdict(version, baseline.version, False, margin, resamples, seed, [s.describe() for s in loaded],
                      excluded=excluded)
    for pair in info.pairs:
        if pair not in gated:
            verdict.not_gated.append({"strong": pair["strong"], "weak": pair["weak"],
                                      "encoder": pair.get("encoder", "static")})
            log(f"  {pair['strong']} (strong) vs {pair['weak']} (weak) [{pair.get('encoder', 'static')}]: "
                "not gated (not named by --pair)")
    shipped_training_rows = functools.cache(lambda: router_training_rows(None))  # read once, if a pair needs it
    for encoder_name in sorted({p.get("encoder", "static") for p in gated}):
        encoder = get_encoder(encoder_name)
        data = embed_rows(rows, encoder, progress=progress)
        if data.dropped:
            log(f"  {data.dropped} held-out requests have neither text nor a {encoder.id} embedding: left out")
        # An active version without heads for this encoder: the shipped ones stand in as the baseline.
        active_heads = load_router_heads(encoder_name, registry_dir, other_encoders_ok=True)
        without_shipped: tuple[Embedded, int] | None = None  # computed once, for the pairs that need it
        for pair in gated:
            if pair.get("encoder", "static") != encoder_name:
                continue
            strong, weak = pair["strong"], pair["weak"]
            candidate = load_head(info.path / pair["artifact"])
            base, base_name, base_shipped = _baseline_head(active_heads, strong, weak)
            if base is None:
                raise GateError(f"the active router has no difficulty head for encoder {encoder_name}")
            pair_data, fallback_excluded = data, 0
            if base_shipped and from_registry:
                # The active version has no head for this pair, so the shipped one stands in for it: it
                # must not be graded on the prompts it learnt from either.
                if without_shipped is None:
                    without_shipped = _without_shipped_training_rows(data, shipped_training_rows())
                pair_data, fallback_excluded = without_shipped
            comparison = compare_pair(
                candidate, base, base_name, pair_data, strong, weak, encoder_name,
                margin=margin, resamples=resamples, seed=seed,
            )
            comparison.excluded_fallback_rows = fallback_excluded
            verdict.comparisons.append(comparison)
            log(_comparison_line(comparison))
    if verdict.comparisons and all(c.too_few_rows for c in verdict.comparisons):
        # The held-out data does not cover any pair gated: a usage error, not a verdict to record.
        raise GateError("; ".join(
            f"{c.strong} vs {c.weak} [{c.encoder}]: {_held_out(c)} labelled for both models and scorable by both "
            f"routers; need at least {MIN_HELDOUT_ROWS} prompts" for c in verdict.comparisons
        ))
    judged = [c for c in verdict.comparisons if c.judged]
    verdict.promoted = bool(judged) and all(c.passed for c in judged)
    failing = [c for c in judged if not c.passed]
    if not judged:
        verdict.reason = (
            "no pair could be judged: on these held-out prompts no pair's strong model beats its weak one in "
            "mean quality with a 95% interval that excludes zero, or too few are labelled for both of its models "
            "(label more held-out requests, or name the pairs your routes use with --pair)"
        )
    elif verdict.promoted:
        verdict.reason = "every judged pair's 95% CI lower end of the APGR difference exceeds the margin " + ", ".join(
            f"{c.strong} vs {c.weak} [{c.encoder}]: {_r(c.ci_low)} > {margin:g}" for c in judged
        )
    else:
        verdict.reason = "95% CI lower end of the APGR difference not above the margin for " + ", ".join(
            f"{c.strong} vs {c.weak} [{c.encoder}]: {_r(c.ci_low)} <= {margin:g}" for c in failing
        )
    # The version the numbers are against must still be active when the promotion is written: checked
    # under the registry's lock, so another promotion made meanwhile is never silently replaced.
    if verdict.promoted and registry.promote_over(version, verdict.as_dict(), baseline.version if from_registry
                                                  else None):
        return verdict
    if verdict.promoted:
        verdict.promoted = False
        current = resolve_routers_dir(registry_dir).version
        verdict.reason = f"the active version changed during the gate ({baseline.version} -> {current}); run it again"
    registry.record_verdict(version, verdict.as_dict())
    return verdict


def _inactive_version(registry_dir: Path, version: str) -> tuple[RouterRegistry, VersionInfo]:
    """The registry and ``version``'s info, for promoting it; :class:`GateError` for a directory that is
    not a registry, an unknown version or the active one."""
    if not is_registry(registry_dir):
        raise GateError(f"{registry_dir} is not a router registry (no registry.json)")
    registry = RouterRegistry(registry_dir)
    try:
        info = registry.info(version)
    except KeyError as exc:
        raise GateError(str(exc.args[0])) from None
    if registry.active_version() == version:
        raise GateError(f"{version} is already the active version of {registry_dir}")
    return registry, info


def _check_writable(registry_dir: Path, info: VersionInfo, why: str) -> None:
    """:class:`GateError` when the registry could not record a verdict (read-only file system, no
    permission): checked before the gate's minutes of work, which would otherwise end in a traceback."""
    problem = unwritable(registry_dir, info.path)
    if problem:
        raise GateError(f"--registry {registry_dir}: cannot write to it: {problem} ({why})")


def _check_loads(info: VersionInfo) -> None:
    """:class:`GateError` unless every head of ``info``'s version loads the way a gateway loads it (weights
    matching their manifest's sha256, every pair head ``version.json`` lists present), for each encoder.

    The gate scores only the pair heads it judges, and ``--force`` scores none, yet every head goes live:
    a version with a truncated or missing head would be made active, running gateways would log a failed
    reload and every gateway (re)started on the registry would refuse to start."""
    from classifiers.provider import load_router_heads

    for encoder in sorted({*info.encoders, *(p.get("encoder", "static") for p in info.pairs)}):
        try:
            load_router_heads(encoder, info.path)
        except (ValueError, OSError, KeyError) as exc:
            problem = os_error_line(exc) if isinstance(exc, OSError) else " ".join(str(exc).split())
            raise GateError(
                f"{info.version} cannot be made active: its {encoder} heads do not load, so no gateway could "
                f"serve it: {problem}"
            ) from None


def _trained_rows(info: VersionInfo) -> TrainedRows | None:
    """The hashes of the requests ``info``'s version was trained on; None if it did not record them."""
    try:
        return load_trained_rows(info.path, info.raw.get("trained_rows"))
    except (OSError, ValueError) as exc:
        raise GateError(f"{info.version}: cannot read the record of its training requests: {exc}") from None


def _baseline_trained_rows(baseline: ResolvedRouters) -> TrainedRows | None:
    """The hashes of the requests the active router (a registry version, or the shipped fallback) was
    trained on; None if it did not record them."""
    try:
        found = resolved_training_rows(baseline)
    except (OSError, ValueError) as exc:
        raise GateError(f"{baseline.version}: cannot read the record of its training requests: {exc}") from None
    return None if found is None else found[1]


def _without_shipped_training_rows(
    data: Embedded, shipped: tuple[str, TrainedRows] | None
) -> tuple[Embedded, int]:
    """``data`` without the requests the shipped heads were trained on (``shipped``:
    :func:`router_training_rows` of the shipped heads), and how many those were."""
    if shipped is None:
        return data, 0
    trained = trained_mask(data.rows, shipped[1])
    if not trained.any():
        return data, 0
    return data.subset(np.flatnonzero(~trained)), int(trained.sum())


def _leave_out_training_rows(
    rows: list[LabelledRequest], candidate: TrainedRows | None, active: TrainedRows | None
) -> tuple[list[LabelledRequest], dict[str, Any]]:
    """``rows`` without those either router was trained on, and how many each accounted for."""
    hashed: dict[bool, np.ndarray] = {}  # each row hashed once per scheme, whichever record asks

    def trained(record: TrainedRows | None) -> np.ndarray:
        if record is None:
            return np.zeros(len(rows), dtype=bool)
        if record.normalised not in hashed:
            hashed[record.normalised] = key_hashes(rows, normalised=record.normalised)
        return record.contains_hashes(hashed[record.normalised])

    in_candidate, in_active = trained(candidate), trained(active)
    kept = [r for r, drop in zip(rows, in_candidate | in_active, strict=True) if not drop]
    excluded = {
        "candidate": int(in_candidate.sum()),
        "active": int(in_active.sum()),
        "active_recorded": active is not None,
    }
    if rows and not kept:
        raise GateError(
            f"all {len(rows)} held-out requests were training data of the candidate ({excluded['candidate']}) or "
            f"the active version ({excluded['active']}); gate on requests neither was trained on (pointsman train "
            "--holdout FRACTION keeps a part out, as does new traffic logged after training)"
        )
    return kept, excluded


def _check_not_training_data(info: VersionInfo, loaded: Sequence[LoadedSource], holdout: float | None) -> None:
    """For a candidate that recorded no training requests: refuse held-out data that is a source it was
    trained on (see the module docstring)."""
    trained_on = {str(d.get("source")) for d in info.data}
    recorded = (info.raw.get("holdout") or {}).get("fraction")
    for src in loaded:
        if src.spec not in trained_on:
            continue
        if recorded is None:
            raise GateError(
                f"--data {src.spec}: {info.version} was trained on all of it (no --holdout); gate it on other "
                "held-out data, or train with --holdout FRACTION and gate with the same"
            )
        if holdout is None or holdout > recorded:
            raise GateError(
                f"--data {src.spec}: {info.version} was trained on it with --holdout {recorded:g}; add "
                f"--holdout {recorded:g} (or less) so the gate reads only the part training left out"
            )


def _prompts(c: Comparison) -> str:
    """``37 prompts`` or, when some were judged more than once, ``37 prompts (47 rows)``."""
    return f"{c.prompts} prompts" + (f" ({c.rows} rows)" if c.rows != c.prompts else "")


def _held_out(c: Comparison) -> str:
    """``5 held-out prompts (15 rows)``: what a pair was (not) judged on."""
    return f"{c.prompts} held-out prompts" + (f" ({c.rows} rows)" if c.rows != c.prompts else "")


def _comparison_line(c: Comparison) -> str:
    fallback = ""
    if c.excluded_fallback_rows:
        fallback = (
            f"\n    left out {c.excluded_fallback_rows} more requests for this pair: the active version has no "
            f"head for it, and the shipped one standing in ({c.baseline_head}) was trained on them"
        )
    if c.too_few_rows:
        return (
            f"  {c.strong} (strong) vs {c.weak} (weak) [{c.encoder}]: not judged: {_held_out(c)} labelled for "
            f"both models and scorable by both routers, need at least {MIN_HELDOUT_ROWS} prompts{fallback}"
        )
    line = (
        f"  {c.strong} (strong) vs {c.weak} (weak) [{c.encoder}], {_prompts(c)}: APGR {c.apgr_candidate:.3f} "
        f"(candidate) vs {c.apgr_active:.3f} (active, {c.baseline_head}); difference {c.diff:+.3f} "
        f"[95% CI {c.ci_low:+.3f} to {c.ci_high:+.3f}]"
    )
    if c.gap.inverted:
        line += (
            f"\n    not judged: on these prompts the weak model does better on average (strong minus weak "
            f"{c.gap.value:+.3f} [95% CI {c.gap.lo:+.3f}, {c.gap.hi:+.3f}]), so APGR divides by a negative gap "
            "and its difference reads upside down"
        )
    elif not c.judged:
        line += (
            f"\n    not judged: the models' mean quality gap on these prompts is {c.gap.value:+.3f} "
            f"[95% CI {c.gap.lo:+.3f}, {c.gap.hi:+.3f}], too close to zero for APGR to decide anything"
        )
    return line + fallback


def _select_pairs(
    trained: Sequence[dict[str, Any]], wanted: Sequence[tuple[str, str] | str] | None, version: str
) -> list[dict[str, Any]]:
    """The version's pair entries to gate: all of them, or those ``wanted`` names (either order).

    Each of ``wanted`` is a (strong, weak) tuple or a ``--pair`` value, split by :func:`split_pair`."""
    if wanted is None:
        return list(trained)
    chosen: list[dict[str, Any]] = []
    for item in wanted:
        a, b = split_pair(item, trained, version) if isinstance(item, str) else item
        match = [p for p in trained if {p["strong"], p["weak"]} == {a, b}]
        if not match:
            raise GateError(f"--pair {_pair_text(a, b)}: {version} has no head for that pair (it has: "
                            f"{_pairs_text(trained)})")
        chosen.extend(p for p in match if p not in chosen)
    return chosen


def pair_arg(value: str) -> str:
    """argparse ``type`` of ``--pair``: ``STRONG,WEAK`` or a JSON list ``["STRONG", "WEAK"]``, checked for
    form only; which comma splits it is decided against the version's pairs (:func:`split_pair`)."""
    listed = _json_pair(value)
    if listed is not None:
        return value
    if "," not in value or not value.strip(", "):
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected STRONG,WEAK (two different model names) or [\"STRONG\", \"WEAK\"]"
        )
    return value


def _json_pair(value: str) -> tuple[str, str] | None:
    """``value`` as a JSON list of two different model names, or None when it is not one."""
    if not value.lstrip().startswith("["):
        return None
    try:
        raw = json.loads(value)
    except ValueError:
        return None  # a model name that starts with "[": read as STRONG,WEAK
    if not (isinstance(raw, list) and len(raw) == 2 and all(isinstance(m, str) and m for m in raw)) or (
        raw[0] == raw[1]
    ):
        raise argparse.ArgumentTypeError(f"{value!r}: a JSON --pair is a list of two different model names")
    return raw[0], raw[1]


def split_pair(value: str, trained: Sequence[dict[str, Any]], version: str) -> tuple[str, str]:
    """The two model names a ``--pair`` value names.

    Model names may hold commas and spaces (``vendor/big, v2``), so a comma cannot simply split the value:
    every comma is tried, and the split whose two halves are the two models of one of the version's pairs
    (either order) is the one meant; halves are compared as written, then without surrounding spaces (so
    ``a, b`` works too). A JSON list (``["vendor/big, v2", "small model"]``) names the models exactly.
    :class:`GateError` when no split names a pair of the version (the message lists its pairs) or two do
    (use the JSON form).
    """
    listed = _json_pair(value)
    if listed is not None:
        return listed
    pairs = {frozenset((p["strong"], p["weak"])) for p in trained}
    commas = [i for i, ch in enumerate(value) if ch == ","]
    for strip in (False, True):
        found: list[tuple[str, str]] = []
        for i in commas:
            a, b = value[:i], value[i + 1:]
            if strip:
                a, b = a.strip(), b.strip()
            if a != b and frozenset((a, b)) in pairs and (a, b) not in found:
                found.append((a, b))
        if len(found) > 1:
            options = " or ".join(_pair_text(a, b) for a, b in found)
            raise GateError(f"--pair {value}: ambiguous, it can be split into {options}; name the models as a JSON "
                            f"list (--pair '[\"STRONG\", \"WEAK\"]')")
        if found:
            return found[0]
    raise GateError(f"--pair {value}: {version} has no head for that pair (it has: {_pairs_text(trained)})")


def _pair_text(strong: str, weak: str) -> str:
    """A pair the way ``--pair`` takes it back: ``STRONG,WEAK``, or a JSON list when a name holds a comma
    or surrounding spaces."""
    if any("," in m or m != m.strip() for m in (strong, weak)):
        return json.dumps([strong, weak])
    return f"{strong},{weak}"


def _pairs_text(trained: Sequence[dict[str, Any]]) -> str:
    return "; ".join(_pair_text(p["strong"], p["weak"]) for p in trained)


def finite_float(value: str) -> float:
    """argparse ``type`` of ``--margin``: a finite number (NaN never compares, -inf passes anything, and
    neither is valid JSON in the verdict)."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{value!r}: give a finite number")
    return number


def force_promote(registry_dir: Path, version: str, reason: str) -> str | None:
    """Make ``version`` active without the gate, recording ``reason``; return the version it replaced.

    Raises :class:`GateError` for an unknown registry or version, one already active, or an empty reason.
    """
    if not reason.strip():
        raise GateError("--force needs --reason TEXT: it is recorded with the promotion")
    registry, info = _inactive_version(registry_dir, version)
    _check_writable(registry_dir, info, "a forced promotion is recorded there")
    _check_loads(info)
    # The version replaced is the one active when the registry lock is held for the write: promote_over
    # writes only while it still is, so one another promotion made after this read is never recorded as
    # ``against`` (nor printed as "was"); read again and retry against that one.
    while True:
        previous = registry.active_version()
        if previous == version:  # another run promoted it meanwhile
            raise GateError(f"{version} is already the active version of {registry_dir}")
        verdict = {
            "decision": "promoted", "forced": True, "against": previous,
            "reason": f"forced without the gate: {reason.strip()}",
            "user": operator_name(),
        }
        if registry.promote_over(version, verdict, previous):
            return previous


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: 0 promoted, 1 refused by the gate, 2 anything else (usage, data, registry)."""
    parser = argparse.ArgumentParser(
        prog="pointsman promote",
        description="Promote a registry version when it beats the active router on held-out labelled prompts "
        "(paired bootstrap of the APGR difference; promoted only when the 95% CI's lower end exceeds the margin). "
        "Exit code 0 promoted, 1 refused by the gate, 2 usage, data or registry error.",
    )
    parser.add_argument("version", help="the registry version to promote, e.g. v0002-1a2b3c4d")
    parser.add_argument("--registry", required=True, help="the router registry directory")
    parser.add_argument(
        "--data", action="append", metavar="HELDOUT",
        help="held-out labelled data (repeatable): file:PATH, logs:STORE_URL, bundled or DIR; requests the "
        "version or the active one was trained on are left out (and counted)",
    )
    parser.add_argument("--margin", type=finite_float, default=0.0,
                        help="APGR difference the CI's lower end must exceed (a finite number; default 0)")
    parser.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES,
                        help=f"paired bootstrap resamples (>= {MIN_RESAMPLES}; default {DEFAULT_RESAMPLES})")
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="bootstrap seed (>= 0; default 0)")
    parser.add_argument(
        "--pair", action="append", type=pair_arg, metavar="STRONG,WEAK",
        help="gate only this pair's head (repeatable; the pairs your routes use; either order); default: every "
        "pair. Model names may hold commas and spaces: the comma that splits the value into the two models of "
        "one of the version's pairs is the one used (\"vendor/big, v2,small model\"); when two splits would "
        "name pairs, give a JSON list: '[\"vendor/big, v2\", \"small model\"]'",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--holdout", type=holdout_fraction, metavar="FRACTION",
        help="keep only the held-out part of each --data source: the part pointsman train --holdout FRACTION "
        "left out of training",
    )
    parser.add_argument(
        "--force", action="store_true",
        help="make the version active without the gate (a rollback, or a choice made on other evidence); "
        "needs --reason, takes no --data",
    )
    parser.add_argument("--reason", default="", help="with --force: why, recorded in the registry")
    args = parser.parse_args(argv)
    if args.force:
        if args.data:
            parser.error("--force skips the gate: give no --data")
    else:
        if args.reason:
            parser.error("--reason goes with --force (the gate writes its own reason)")
        if not args.data:
            parser.error("the following arguments are required: --data (or --force --reason TEXT)")
    registry = Path(args.registry)
    try:
        return _force(args, registry) if args.force else _gate(args, registry)
    except (GateError, DataError) as exc:
        print(f"pointsman promote: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"pointsman promote: {os_error_line(exc)}", file=sys.stderr)
    except Exception as exc:
        # Exit 1 means "refused by the gate": no failure may read so (an uncaught exception exits 1). Most
        # are a corrupt registry file (JSON that is not, or not the object it should be): named.
        problem = corrupt_file(registry) if registry.is_dir() else None
        print(f"pointsman promote: {problem or error_line(exc, 'failed')}", file=sys.stderr)
    return 2


def _force(args: argparse.Namespace, registry: Path) -> int:
    previous = force_promote(registry, args.version, args.reason)
    print(f"PROMOTED (forced, no gate): {args.version} is now the active version of {args.registry} "
          f"(was {previous or 'none: the shipped routers'}). Reason: {args.reason.strip()}")
    return 0


def _gate(args: argparse.Namespace, registry: Path) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    verdict = run_gate(
        registry, args.version, args.data, margin=args.margin, resamples=args.resamples,
        seed=args.seed, progress=not args.no_progress, pairs=args.pair, holdout=args.holdout,
    )
    if verdict.promoted:
        print(f"PROMOTED: {verdict.version} is now the active version of {args.registry} "
              f"(was {verdict.against}). {verdict.reason}")
        return 0
    # Not verdict.against: another promotion may have replaced it during the gate.
    active = resolve_routers_dir(registry).version
    print(f"REFUSED: {verdict.version} stays inactive; {active} stays active. {verdict.reason}")
    return 1
