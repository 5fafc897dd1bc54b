"""The PNG plots of a ``pointsman eval`` report (matplotlib, Agg: no display needed).

Each function takes the report dict of :func:`evals.report.compute_report` and a path, draws one
figure and returns the path, or None when the report has nothing to draw for it.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COLORS = {
    "router": "#1f5fbf", "knn": "#e07b00", "oracle": "#2a9d47", "random": "#7f7f7f", "knob": "#d62728",
    "ends": "#222222",
}
#: Characters per line of a plot's subtitle (about what a 9-inch title line holds at 11 pt).
SUBTITLE_WIDTH = 100
LABELS = {"router": "this route", "knn": "kNN (cross-fitted)", "oracle": "oracle", "random": "random"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({
        "font.size": 10, "axes.titlesize": 12, "axes.labelsize": 10.5, "legend.fontsize": 9,
        "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.25,
        "figure.dpi": 110, "savefig.dpi": 110,
    })
    return plt


def _nan(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _fmt(v: Any, digits: int = 2) -> str:
    v = _nan(v)
    return "n/a" if math.isnan(v) else f"{v:.{digits}f}"


def _ci(entry: Mapping[str, Any] | None) -> str:
    if not entry:
        return "n/a"
    lo, hi = entry.get("ci") or (None, None)
    # No interval beside a missing value: "n/a [0.1, 0.9]" reads as if there were an estimate.
    if any(math.isnan(_nan(v)) for v in (lo, hi, entry.get("value"))):
        return _fmt(entry.get("value"))
    return f"{_fmt(entry.get('value'))} [{_fmt(lo)}, {_fmt(hi)}]"


def _subtitle(report: Mapping[str, Any]) -> str:
    """Route, pair, and the rows behind each estimator (direct; IPS/SNIPS/DR on logged requests)."""
    rows = report.get("rows", {})
    pair = report.get("pair", {})
    sizes = []
    if "routers" in report:
        sizes.append(f"{rows.get('evaluated', '?')} labelled requests (direct)")
    if "offpolicy" in report:
        sizes.append(f"{report['offpolicy']['rows']['used']} logged (IPS/SNIPS/DR)")
    text = f"route {report.get('route', '?')} · {pair.get('strong', '?')} vs {pair.get('weak', '?')} · " + (
        " + ".join(sizes) or "?"
    )
    # Long model names (``mistralai/Mixtral-8x7B-Instruct-v0.1``) would run past the figure's edge.
    return "\n".join(textwrap.wrap(text, SUBTITLE_WIDTH, break_on_hyphens=False))


def gap_caution(report: Mapping[str, Any]) -> str | None:
    """The caution a PGR plot carries when its pair's quality gap makes PGR misleading (the weak model
    does better, or the two are not told apart), else None: a plot is often looked at on its own."""
    gap = report.get("quality_gap") or {}
    inverted, resolved = bool(gap.get("inverted")), bool(gap.get("resolved", True))
    if resolved and not inverted:
        return None
    lo, hi = gap.get("ci") or (None, None)
    span = f"strong minus weak {_nan(gap.get('value')):+.3f} [95% CI {_nan(lo):+.3f}, {_nan(hi):+.3f}]"
    if inverted:
        return f"Caution: the weak model does better on these requests\n({span}): PGR reads upside down"
    return f"Caution: the two models are not told apart on these requests\n({span}): PGR means little here"


def pgr_curve(report: Mapping[str, Any], path: Path) -> Path:
    """Performance gap recovered against the strong-call share, for the route and every baseline."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.4, 5.6), layout="constrained")
    routers = report["routers"]
    rand = routers["random"]["curve"]
    xs = [100 * p["share"] for p in rand]
    ax.plot(xs, [_nan(p["pgr"]) for p in rand], color=COLORS["random"], ls="--", lw=1.2,
            label=f"random, APGR {_ci(routers['random']['apgr'])} (95% band)")
    ax.fill_between(xs, [_nan(p["pgr_band"][0]) for p in rand], [_nan(p["pgr_band"][1]) for p in rand],
                    color=COLORS["random"], alpha=0.15, lw=0)
    for name, style in (("oracle", ":"), ("knn", "-"), ("router", "-")):
        entry = routers.get(name)
        if entry is None:
            continue
        curve = sorted(entry["curve"], key=lambda p: p["share"])
        x = [100 * p["share"] for p in curve]
        ax.plot(x, [_nan(p["pgr"]) for p in curve], ls=style, marker="o", ms=3.5 if name != "router" else 4.5,
                lw=2.2 if name == "router" else 1.5, color=COLORS[name],
                label=f"{LABELS[name]}, APGR {_ci(entry['apgr'])}", zorder=3 if name == "router" else 2)
        if name == "router":
            ax.fill_between(x, [_nan(p["pgr_ci"][0]) for p in curve], [_nan(p["pgr_ci"][1]) for p in curve],
                            color=COLORS[name], alpha=0.12, lw=0)
    ax.scatter([0, 100], [0, 1], color=COLORS["ends"], marker="s", s=36, zorder=4,
               label="always-weak (PGR 0) / always-strong (PGR 1)")
    knob = report["knob"]
    kx, ky = 100 * _nan(knob["strong_share"]["value"]), _nan(knob["pgr"]["value"])
    if not (math.isnan(kx) or math.isnan(ky)):
        ax.scatter([kx], [ky], marker="*", s=260, color=COLORS["knob"], edgecolor="white", zorder=5,
                   label=f"configured knob: {kx:.0f}% strong, PGR {ky:.2f}")
    for level, name in ((0.5, "CPT(50)"), (0.8, "CPT(80)")):
        ax.axhline(level, color="#999999", lw=0.8, ls=(0, (2, 3)), zorder=1)
        ax.text(101, level, name, va="center", ha="left", fontsize=8, color="#555555",
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.9})
    ys = [_nan(p["pgr"]) for e in routers.values() if isinstance(e, Mapping) and "curve" in e for p in e["curve"]]
    finite = [y for y in ys if not math.isnan(y)]
    ax.set_ylim(min(-0.1, *finite) - 0.05 if finite else -0.1, max(1.15, *finite) + 0.05 if finite else 1.15)
    ax.set_xlim(-2, 108)
    ax.set_xlabel("calls to the strong model (%)")
    ax.set_ylabel("performance gap recovered (PGR)")
    ax.set_title("Quality recovered per share of strong calls\n" + _subtitle(report), fontsize=11)
    ax.legend(loc="lower right", framealpha=0.92)
    caution = gap_caution(report)
    if caution is not None:
        ax.text(0.01, 0.99, caution, transform=ax.transAxes, va="top", ha="left", fontsize=9, color="#a61b1b",
                zorder=6, bbox={"boxstyle": "round,pad=0.35", "fc": "#fff4f4", "ec": "#a61b1b", "alpha": 0.95})
    # The caution also travels in the PNG's text chunk, for whoever reads the file without looking.
    fig.savefig(path, metadata=None if caution is None else {"Description": caution})
    plt.close(fig)
    return path


def frontier(report: Mapping[str, Any], path: Path) -> Path:
    """Mean quality against mean cost per request: every router's operating points and its frontier."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.4, 5.6), layout="constrained")
    routers = report["routers"]
    weak, strong = routers["always_weak"], routers["always_strong"]
    wx, wy = _nan(weak["cost"]["value"]), _nan(weak["quality"]["value"])
    sx, sy = _nan(strong["cost"]["value"]), _nan(strong["quality"]["value"])
    ax.plot([wx, sx], [wy, sy], color=COLORS["random"], ls="--", lw=1.2,
            label=f"random (mixing the two), AIQ {_fmt(routers['random']['aiq']['value'], 3)}")
    for name in ("oracle", "knn", "router"):
        entry = routers.get(name)
        if entry is None:
            continue
        pts = sorted(entry["curve"], key=lambda p: _nan(p["cost"]))
        ax.scatter([_nan(p["cost"]) for p in pts], [_nan(p["quality"]) for p in pts], color=COLORS[name],
                   s=22 if name == "router" else 14, alpha=0.85, zorder=3)
        hull = entry.get("frontier") or []
        ax.plot([_nan(p["cost"]) for p in hull], [_nan(p["quality"]) for p in hull], color=COLORS[name],
                lw=2.2 if name == "router" else 1.4, ls=":" if name == "oracle" else "-",
                label=f"{LABELS[name]} frontier, AIQ {_ci_digits(entry['aiq'], 3)}")
    ax.scatter([wx, sx], [wy, sy], color=COLORS["ends"], marker="s", s=40, zorder=4)
    ax.annotate("always-weak", (wx, wy), textcoords="offset points", xytext=(6, -12), fontsize=8.5)
    ax.annotate("always-strong", (sx, sy), textcoords="offset points", xytext=(-10, -14), fontsize=8.5, ha="right")
    knob = report["knob"]
    kx, ky = _nan(knob["cost"]["value"]), _nan(knob["quality"]["value"])
    if not (math.isnan(kx) or math.isnan(ky)):
        ax.scatter([kx], [ky], marker="*", s=260, color=COLORS["knob"], edgecolor="white", zorder=5,
                   label=f"configured knob: quality {ky:.3f} at {_money(kx, report)}")
    basis = report.get("cost_basis", {})
    unit = {"labelled": "USD", "prices": "USD, estimated from the configured prices",
            "share": "strong-call share: no costs known"}.get(str(basis.get("kind")), "cost")
    ax.set_xlabel(f"mean cost per request ({unit})")
    ax.set_ylabel("mean quality")
    if basis.get("kind") in ("labelled", "prices"):
        ax.xaxis.set_major_formatter(_money_formatter(plt))
    ax.set_title("Cost-quality frontier (AIQ: mean frontier quality over the cost range)\n" + _subtitle(report),
                 fontsize=11)
    ax.legend(loc="lower right", framealpha=0.92)
    fig.savefig(path)
    plt.close(fig)
    return path


def _ci_digits(entry: Mapping[str, Any], digits: int) -> str:
    lo, hi = entry.get("ci") or (None, None)
    if lo is None or hi is None or math.isnan(_nan(entry.get("value"))):
        return _fmt(entry.get("value"), digits)
    return f"{_fmt(entry.get('value'), digits)} [{_fmt(lo, digits)}, {_fmt(hi, digits)}]"


def _money(value: float, report: Mapping[str, Any]) -> str:
    if report.get("cost_basis", {}).get("kind") == "share":
        return f"{value:.0%} strong"
    return f"${value:.3g}/request"


def _money_formatter(plt: Any) -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: f"${v:.2g}")


def reliability(report: Mapping[str, Any], path: Path) -> Path | None:
    """Reliability diagram of the knob's score as P(strong model better), with the scores' histogram."""
    calibration = report["calibration"]
    bins = [b for b in calibration["bins"] if b["count"]]
    if not bins:
        return None
    plt = _plt()
    fig, (ax, hist) = plt.subplots(2, 1, figsize=(8.4, 7.6), height_ratios=(3, 1.2), sharex=True,
                                   layout="constrained")
    ax.plot([0, 1], [0, 1], color="#999999", ls="--", lw=1, label="perfectly calibrated")
    width = [b["hi"] - b["lo"] for b in bins]
    ax.bar([b["lo"] for b in bins], [b["observed"] for b in bins], width=width, align="edge", color=COLORS["router"],
           alpha=0.25, edgecolor=COLORS["router"], lw=0.8, label="observed rate per bin")
    ax.plot([b["mean_predicted"] for b in bins], [b["observed"] for b in bins], marker="o", color=COLORS["router"],
            lw=1.8, label="mean score vs observed")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("share where the strong model was better")
    ax.set_title(f"Calibration of the route's score: ECE {_ci(calibration['ece'])} "
                 f"({calibration['rows']} knob-decided requests)\n{_subtitle(report)}", fontsize=11)
    ax.legend(loc="upper left", framealpha=0.92)
    hist.bar([b["lo"] for b in bins], [b["count"] for b in bins], width=width, align="edge", color="#8aa6d6",
             edgecolor="white")
    hist.set_ylabel("requests")
    hist.set_xlabel("score: predicted P(strong model needed)")
    fig.savefig(path)
    plt.close(fig)
    return path


def breakdown(report: Mapping[str, Any], path: Path) -> Path | None:
    """APGR per source and per domain, this route next to kNN, with 95% CIs and the random line."""
    panels = [(key, [g for g in report["breakdown"][key] if g.get("apgr")]) for key in ("source", "domain")]
    panels = [(key, groups) for key, groups in panels if groups]
    if not panels:
        return None
    plt = _plt()
    heights = [max(1.6, 0.55 * len(groups) + 0.9) for _, groups in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.4, sum(heights) + 0.9), height_ratios=heights,
                             layout="constrained", squeeze=False)
    values = [_nan(v) for _, groups in panels for g in groups for key in ("apgr", "knn_apgr")
              for v in (g[key]["value"], *(g[key]["ci"] or ()))]
    finite = [v for v in values if not math.isnan(v)]
    lo, hi = min(0.0, *finite), max(1.0, *finite)
    for ax, (key, groups) in zip(axes[:, 0], panels, strict=True):
        _bars(ax, groups)
        ax.set_xlim(lo - 0.02, hi + 0.02)
        ax.set_title(f"APGR per {key} (whiskers: 95% CI; dashed: random = 0.5)", fontsize=10.5, loc="left")
    axes[-1, 0].set_xlabel("APGR")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=9, frameon=False)
    fig.suptitle(_subtitle(report), fontsize=9.5, color="#444444", x=0.02, ha="left")
    fig.savefig(path)
    plt.close(fig)
    return path


def _bars(ax: Any, groups: Sequence[Mapping[str, Any]]) -> None:
    ys = list(range(len(groups)))[::-1]
    for offset, key, name in ((0.18, "apgr", "router"), (-0.18, "knn_apgr", "knn")):
        values = [_nan(g[key]["value"]) for g in groups]
        lo = [v - _nan(g[key]["ci"][0]) for v, g in zip(values, groups, strict=True)]
        hi = [_nan(g[key]["ci"][1]) - v for v, g in zip(values, groups, strict=True)]
        ax.barh([y + offset for y in ys], values, height=0.34, color=COLORS[name], alpha=0.8,
                xerr=[_clean(lo), _clean(hi)], error_kw={"elinewidth": 1, "capsize": 2.5, "ecolor": "#333333"},
                label=LABELS[name])
    ax.axvline(0.5, color=COLORS["random"], ls="--", lw=1)
    ax.set_yticks(ys, [f"{_short(g['group'])}  (n={g['n']})" for g in groups])
    ax.grid(axis="y", visible=False)


def _clean(values: Sequence[float]) -> list[float]:
    return [0.0 if math.isnan(v) else max(v, 0.0) for v in values]


def _short(text: str, limit: int = 34) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def offpolicy(report: Mapping[str, Any], path: Path) -> Path | None:
    """The off-policy estimates of mean quality (IPS, SNIPS, DR, 95% CIs) for the route, always-strong and
    always-weak, next to the logging policy's observed mean on the same logged requests."""
    off = report.get("offpolicy")
    if off is None:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.4, 4.8), layout="constrained")
    pol = off["policies"]
    groups = [("router", LABELS["router"]), ("always_strong", "always-strong"), ("always_weak", "always-weak")]
    styles = {"ips": ("o", "#9bb7e0"), "snips": ("D", COLORS["router"]), "dr": ("s", "#2a9d47")}
    ticks, labels = [], []
    for g, (key, label) in enumerate(groups):
        base = len(groups) - g
        for k, (est, (marker, color)) in enumerate(styles.items()):
            entry = pol[key]["quality"][est]
            y = base + 0.22 * (1 - k)
            v, (lo, hi) = _nan(entry["value"]), (_nan(x) for x in (entry.get("ci") or (None, None)))
            if math.isnan(v):
                continue
            err = [[max(v - lo, 0.0) if not math.isnan(lo) else 0.0], [max(hi - v, 0.0) if not math.isnan(hi) else 0.0]]
            ax.errorbar(
                [v],
                [y],
                xerr=err,
                fmt=marker,
                color=color,
                ecolor=color,
                capsize=3,
                ms=6,
                label=est.upper() if g == 0 else None,
            )
        ticks.append(base)
        labels.append(f"{label}\n(ESS {_fmt(pol[key]['ess'], 0)})")
    observed = pol["logging"]["quality"]
    ax.axvline(
        _nan(observed["value"]),
        color=COLORS["knob"],
        ls="--",
        lw=1.2,
        label=f"logging policy, observed {_ci(observed)}",
    )
    band = (observed.get("ci") or (None, None))[:2]
    if None not in band:
        ax.axvspan(_nan(band[0]), _nan(band[1]), color=COLORS["knob"], alpha=0.08, lw=0)
    ax.set_yticks(ticks, labels)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel(f"mean {off.get('metric', 'quality')} (whiskers: 95% bootstrap CI)")
    ax.set_title(
        f"Off-policy estimates on {off['rows']['used']} logged requests with propensities\n" + _subtitle(report),
        fontsize=11,
    )
    ax.legend(loc="best", framealpha=0.92, fontsize=8.5)
    fig.savefig(path)
    plt.close(fig)
    return path


#: Every plot :func:`write_plots` may write, as ``<name>.png`` (checked before an eval computes anything).
PLOT_NAMES = ("pgr_curve", "frontier", "reliability", "breakdown", "offpolicy")


def write_plots(report: Mapping[str, Any], out_dir: Path) -> dict[str, str]:
    """Every plot the report has data for, as ``{name: file name}`` inside ``out_dir``: the direct
    section's four when it is there, the off-policy plot when that section is."""
    out: dict[str, str] = {}
    direct = (
        (("pgr_curve", pgr_curve), ("frontier", frontier), ("reliability", reliability), ("breakdown", breakdown))
        if "routers" in report
        else ()
    )
    for name, draw in (*direct, ("offpolicy", offpolicy)):
        path = draw(report, out_dir / f"{name}.png")
        if path is not None:
            out[name] = path.name
    return out
