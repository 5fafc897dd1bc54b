"""The cost-quality knob: a threshold on P(strong needed), fixed or calibrated to a target share.

With a target share ``s`` the threshold is chosen from the scores of the last ``window``
decisions so that a share ``s`` of them reaches it: if that traffic keeps its distribution, a
share ``s`` of the next requests goes to the strong model. The window is seeded with historic
scores (for example from the decision log) so a fresh gateway does not start uncalibrated.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from policies.base import PolicyError
from policies.echo import client_echo

REQUEST_FIELD = "pointsman"  # the gateway's namespace in a request body
THRESHOLD_HEADER = "x-pointsman-threshold"
#: A plain unsigned decimal (0.3, .3, 1, 1., 3e-1): not Python's float() syntax, which also reads
#: "nan", "inf", "1_000" and other scripts' digits. Numbers read from headers and query strings use it.
PLAIN_DECIMAL = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


@dataclass(frozen=True, slots=True)
class KnobDecision:
    """One knob decision: ``strong`` when ``score >= threshold``.

    ``source`` says where the threshold came from: ``config``, ``calibrated`` (from the window),
    ``uncalibrated`` (target mode with too few scores yet: ``1 - target``) or ``override``.

    ``tie_share`` is set when a calibrated threshold falls inside a run of equal scores in the window
    (many identical prompts): only that share of the scores equal to the threshold goes strong, chosen
    by the request's ``draw``, so identical prompts split instead of all going one way.
    """

    score: float
    threshold: float
    source: str
    strong: bool
    tie_share: float | None = None


class ScoreSink(Protocol):
    """A score window kept elsewhere (``gateway/shared_state.py``: Redis, so replicas calibrate on one
    window): :meth:`CostQualityKnob.observe` hands it every score, and whoever keeps it loads the merged
    window back with :meth:`CostQualityKnob.replace`."""

    def add(self, score: float) -> None:
        """Take one observed score (must not block: a shared window sends them later, in batches)."""
        ...


class CostQualityKnob:
    """A fixed ``threshold`` or a ``target_share`` calibrated on a sliding window of scores."""

    def __init__(
        self,
        *,
        threshold: float | None = None,
        target_share: float | None = None,
        window: int = 2000,
        min_samples: int = 50,
        seed: Iterable[float] = (),
    ) -> None:
        if threshold is not None and target_share is not None:
            raise ValueError("set either threshold or target_share, not both")
        if window < 1 or min_samples < 1:
            raise ValueError("window and min_samples must be at least 1")
        self.fixed = 0.5 if threshold is None and target_share is None else threshold
        self.target_share = target_share
        self.min_samples = min_samples
        # The window in arrival order (to evict the oldest) and sorted (to read quantiles in O(1)).
        self._recent: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []
        self._sink: ScoreSink | None = None
        for score in seed:
            self.observe(score)

    @property
    def window(self) -> int:
        """How many scores the window keeps at most."""
        maxlen = self._recent.maxlen
        assert maxlen is not None
        return maxlen

    def share(self, sink: ScoreSink) -> None:
        """Also hand every observed score to ``sink`` (a window shared by replicas)."""
        self._sink = sink

    def scores(self) -> list[float]:
        """The window's scores, oldest first."""
        return list(self._recent)

    def replace(self, scores: Iterable[float]) -> None:
        """Make the window exactly ``scores`` (oldest first; the last ``window`` of them are kept)."""
        finite = [s for s in scores if math.isfinite(s)]
        self._recent = deque(finite, maxlen=self.window)
        self._sorted = sorted(self._recent)

    @property
    def samples(self) -> int:
        """How many scores the window holds."""
        return len(self._recent)

    def observe(self, score: float) -> None:
        """Add a decided request's score to the calibration window (no-op for a fixed threshold)."""
        if self.target_share is None or not math.isfinite(score):
            return
        if self._sink is not None:
            self._sink.add(score)
        if len(self._recent) == self._recent.maxlen:
            oldest = self._recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._recent.append(score)
        bisect.insort(self._sorted, score)

    def threshold(self) -> tuple[float, str]:
        """The current threshold and its source (see :class:`KnobDecision`)."""
        threshold, source, _ = self._calibration()
        return threshold, source

    def _calibration(self) -> tuple[float, str, float | None]:
        """The threshold, its source, and the tie share (see :class:`KnobDecision`)."""
        if self.target_share is None:
            assert self.fixed is not None
            return self.fixed, "config", None
        if len(self._sorted) < self.min_samples:
            return 1.0 - self.target_share, "uncalibrated", None
        threshold, tie_share = _share_threshold(self._sorted, self.target_share)
        return threshold, "calibrated", tie_share

    def decide(self, score: float, override: float | None = None, *, draw: float | None = None) -> KnobDecision:
        """Compare ``score`` with the threshold (or the per-request ``override``).

        ``draw`` (in [0, 1), fixed per request: :func:`policies.explore.request_fraction`) splits a score
        equal to a calibrated threshold that falls inside a run of equal scores: strong when ``draw <
        tie_share``. Without it such a score goes strong, as every score at the threshold does.
        """
        tie_share: float | None = None
        if override is not None:
            threshold, source = override, "override"
        else:
            threshold, source, tie_share = self._calibration()
        strong = score >= threshold
        if tie_share is not None and score == threshold and draw is not None:
            strong = draw < tie_share
        return KnobDecision(score=score, threshold=threshold, source=source, strong=strong, tie_share=tie_share)


def _share_threshold(ordered: list[float], share: float) -> tuple[float, float | None]:
    """A threshold that ``round(share * n)`` of the ``n`` sorted scores reach, and the tie share.

    It lies halfway between the weakest score that goes strong and the strongest that does not,
    so new scores from the same distribution split in the same proportion. When those two are equal
    (a run of identical scores straddles the cut) no threshold splits them: the threshold is that
    score, and the tie share is the part of the run that has to go strong for the share to hold
    (``None`` otherwise).
    """
    n = len(ordered)
    strong = round(share * n)
    first_strong = n - strong
    if strong == 0:
        return math.nextafter(ordered[-1], math.inf), None
    if first_strong == 0:
        return ordered[0], None
    below, above = ordered[first_strong - 1], ordered[first_strong]
    if below < above:
        return (below + above) / 2, None
    start = bisect.bisect_left(ordered, above)
    end = bisect.bisect_right(ordered, above)
    return above, (end - first_strong) / (end - start)


def distribution_seed(quantiles: Sequence[float], n: int) -> list[float]:
    """``n`` scores spread like a head's recorded score quantiles (``quantiles[i]`` at probability
    ``i / (len - 1)``): a target-share window seeded with them calibrates from the first request.

    Returns ``[]`` when ``quantiles`` is not a usable, non-decreasing list of finite numbers.
    """
    values = list(quantiles)
    if n < 1 or len(values) < 2 or not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
        return []
    if any(b < a for a, b in itertools.pairwise(values)):
        return []
    steps = len(values) - 1
    out = []
    for i in range(n):
        at = (i + 0.5) / n * steps  # midpoints: no point sits exactly on the extremes
        low = min(int(at), steps - 1)
        frac = at - low
        out.append(values[low] + (values[low + 1] - values[low]) * frac)
    return out


def threshold_override(headers: Mapping[str, str], body: Mapping[str, Any] | None = None) -> float | None:
    """The per-request threshold: the ``x-pointsman-threshold`` header, else the request field
    ``{"pointsman": {"threshold": ...}}`` (the gateway's own namespace, stripped before forwarding).

    Raises :class:`PolicyError` (400) naming the header or field when it is not a number in [0, 1].
    """
    raw: Any = headers.get(THRESHOLD_HEADER)
    if raw is None:
        # Plain dicts (tests, replays) may not be case-insensitive like HTTP header maps.
        raw = next((v for k, v in headers.items() if k.lower() == THRESHOLD_HEADER), None)
    where = f"header {THRESHOLD_HEADER}"
    if raw is None and body is not None:
        extension = body.get(REQUEST_FIELD)
        if extension is not None and not isinstance(extension, Mapping):
            raise PolicyError(f"field {REQUEST_FIELD}: must be an object", status=400, code="invalid_threshold")
        raw = extension.get("threshold") if extension is not None else None
        where = f"field {REQUEST_FIELD}.threshold"
    if raw is None:
        return None
    try:
        # float() also takes "0_0.5" and " 1e-1 "; a header holds a plain decimal number or is wrong.
        if isinstance(raw, str) and not PLAIN_DECIMAL.fullmatch(raw):
            raise ValueError(raw)
        value = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not (0.0 <= value <= 1.0):  # also rejects NaN
        raise PolicyError(
            f"{where}: {client_echo(raw)} is not a number between 0 and 1",
            status=400,
            code="invalid_threshold",
        )
    return value
