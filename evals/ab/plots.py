"""The PNG plots of an A/B report over time (matplotlib, Agg: no display needed).

Each function takes the JSON-ready report dict of :func:`evals.ab.analysis.analyze` (after
``jsonable``: None for unknown or unbounded values) and a path, draws one figure and returns the
path, or None when there is nothing to draw.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evals.report_plots import _plt  # the eval report's look

PALETTE = ("#1f5fbf", "#e07b00", "#2a9d47", "#d62728", "#8c564b", "#9467bd", "#17becf")
PLOT_TITLES = {
    "quality_over_time": "Quality per arm over time (always-valid bands)",
    "difference_over_time": "Difference against control over time",
    "requests_over_time": "Requests per arm over time",
}


def _arr(values: Sequence[Any] | None) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in (values or [])], dtype=float)


def _times(report: Mapping[str, Any]) -> list[dt.datetime]:
    return [dt.datetime.fromtimestamp(float(t or 0.0), tz=dt.UTC) for t in report["timeline"]["created_at"]]


def _colors(report: Mapping[str, Any]) -> dict[str, str]:
    return {arm: PALETTE[i % len(PALETTE)] for i, arm in enumerate(report["arms_order"])}


def _finish(ax: Any, fig: Any, title: str, report: Mapping[str, Any], path: Path) -> Path:
    import matplotlib.dates as mdates

    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
    ax.set_xlabel("time (UTC)")
    ax.set_title(f"{title}\nexperiment {report['experiment']} · route {report.get('route')}", fontsize=11)
    ax.legend(loc="best", framealpha=0.92)
    fig.savefig(path)
    return path


def quality_over_time(report: Mapping[str, Any], path: Path) -> Path | None:
    """Each arm's cumulative mean quality (primary source) with its confidence-sequence band."""
    series = report["timeline"]
    if not series["looks"]:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.4, 5.0), layout="constrained")
    times, colors = _times(report), _colors(report)
    for arm, q in series["quality"].items():
        mean = _arr(q["mean"])
        lo, hi = np.clip(_arr(q["lower"]), 0, 1), np.clip(_arr(q["upper"]), 0, 1)
        ax.plot(times, mean, color=colors[arm], lw=2, label=f"{arm}{' (control)' if arm == report['control'] else ''}")
        ax.fill_between(times, lo, hi, color=colors[arm], alpha=0.15, lw=0)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel(f"mean quality ({series['source']}), {1 - report['method']['alpha']:.0%} CS")
    try:
        return _finish(ax, fig, PLOT_TITLES["quality_over_time"], report, path)
    finally:
        plt.close(fig)


def difference_over_time(report: Mapping[str, Any], path: Path) -> Path | None:
    """Each treatment's quality difference against control, with its confidence sequence."""
    series = report["timeline"]
    if not any(np.isfinite(_arr(d["estimate"])).any() for d in series["differences"].values()):
        return None  # no look had both arms scored yet
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.4, 5.0), layout="constrained")
    times, colors = _times(report), _colors(report)
    effect = float(report["method"]["min_effect"])
    ax.axhline(0, color="#222222", lw=1)
    for sign in (-1, 1):
        ax.axhline(sign * effect, color="#999999", lw=0.8, ls=(0, (2, 3)))
    # At the left edge in axes coordinates, not at the first look's time: that look may have no
    # difference yet, fall outside the x range the lines set, and drag the label off the axes (the
    # constrained layout then shrinks the axes to nothing to make room for it).
    ax.text(0.005, effect, f" ±{effect:g}: smallest difference that counts", va="bottom", fontsize=8,
            color="#555555", transform=ax.get_yaxis_transform())
    finite: list[float] = []
    for arm, d in series["differences"].items():
        est, lo, hi = _arr(d["estimate"]), _arr(d["lower"]), _arr(d["upper"])
        ax.plot(times, est, color=colors[arm], lw=2, label=f"{arm} − {report['control']}")
        ax.fill_between(times, np.clip(lo, -1, 1), np.clip(hi, -1, 1), color=colors[arm], alpha=0.15, lw=0)
        finite += [v for v in (*lo, *hi, *est) if np.isfinite(v)]
    span = max([abs(v) for v in finite] + [2 * effect])
    ax.set_ylim(-min(span, 1) * 1.1, min(span, 1) * 1.1)
    alpha = report["method"]["alpha_per_comparison"]
    ax.set_ylabel(f"quality difference ({series['source']}), {1 - alpha:.1%} CS")
    try:
        return _finish(ax, fig, PLOT_TITLES["difference_over_time"], report, path)
    finally:
        plt.close(fig)


def requests_over_time(report: Mapping[str, Any], path: Path) -> Path | None:
    """Cumulative served requests per arm (a stopped arm's line goes flat at its stop)."""
    series = report["timeline"]
    if not series["looks"]:
        return None
    import matplotlib.dates as mdates

    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.4, 4.2), layout="constrained")
    times, colors = _times(report), _colors(report)
    for arm, counts in series["requests"].items():
        ax.step(times, _arr(counts), where="post", color=colors[arm], lw=2, label=arm)
    stops = [(dt.datetime.fromtimestamp(float(stop["stopped_at"]), tz=dt.UTC), stop)
             for stop in report.get("stops") or []]
    for when, stop in stops:
        ax.axvline(when, color=colors.get(stop["arm"], "#d62728"), ls="--", lw=1)
    left, right = ax.get_xlim()  # final now that the stop lines are in
    for when, stop in stops:
        # A label right of the middle reads leftwards, so it stays inside the axes; kept out of the
        # layout, a long one cannot shrink the axes to nothing to make room for itself.
        leftwards = float(mdates.date2num(when)) > (left + right) / 2
        label = ax.text(when, 0.99, f" {stop['arm']} stopped: {stop['reason']} ", fontsize=8, va="top",
                        ha="right" if leftwards else "left", transform=ax.get_xaxis_transform())
        label.set_in_layout(False)
    ax.set_ylabel("served requests (cumulative)")
    try:
        return _finish(ax, fig, PLOT_TITLES["requests_over_time"], report, path)
    finally:
        plt.close(fig)


def write_plots(report: Mapping[str, Any], out_dir: Path) -> dict[str, str]:
    """Every plot the report has data for, as ``{name: file name}`` inside ``out_dir``."""
    out: dict[str, str] = {}
    for name, draw in (("quality_over_time", quality_over_time), ("difference_over_time", difference_over_time),
                       ("requests_over_time", requests_over_time)):
        path = draw(report, out_dir / f"{name}.png")
        if path is not None:
            out[name] = path.name
    return out
