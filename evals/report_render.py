"""Writes a ``pointsman eval`` report: ``report.json``, ``report.md``, ``report.html``, the PNG plots and
``decisions.jsonl`` (the replayed decision per request), all in one directory.

The HTML is self-contained apart from the PNGs beside it (inline CSS, no scripts, no network); the
Markdown references the same PNGs, so the directory can be archived or attached as it is. A report
has a direct section (``routers``, ``knob``, ``calibration``, ``breakdown``), an off-policy section
(``offpolicy``), or both; each part renders only when its section is there.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evals.report import jsonable
from evals.report_plots import PLOT_NAMES, write_plots

#: Every file :func:`write_report` may write into the report directory.
REPORT_FILES = ("report.json", "report.md", "report.html", "decisions.jsonl", *(f"{n}.png" for n in PLOT_NAMES))

PLOT_TITLES = {
    "pgr_curve": "PGR curve",
    "frontier": "Cost-quality frontier",
    "reliability": "Calibration (reliability diagram)",
    "breakdown": "Breakdown per source / domain",
    "offpolicy": "Off-policy estimates on logged traffic",
}


def write_report(
    report: Mapping[str, Any], out_dir: Path, decisions: Iterable[Mapping[str, Any]] = ()
) -> dict[str, Path]:
    """Write every file of the report into ``out_dir`` (created); returns ``{kind: path}``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = jsonable(report)
    data["plots"] = write_plots(data, out_dir)
    paths = {"json": out_dir / "report.json", "markdown": out_dir / "report.md", "html": out_dir / "report.html",
             "decisions": out_dir / "decisions.jsonl"}
    paths["json"].write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    paths["markdown"].write_text(render_markdown(data), encoding="utf-8")
    paths["html"].write_text(render_html(data), encoding="utf-8")
    with paths["decisions"].open("w", encoding="utf-8") as fh:
        for d in decisions:
            fh.write(json.dumps(jsonable(d), ensure_ascii=False) + "\n")
    for name, file in data["plots"].items():
        paths[name] = out_dir / file
    return paths


# ----------------------------------------------------------------------------- shared content


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def _num(value: Any, digits: int = 3) -> str:
    return "n/a" if _missing(value) else f"{value:.{digits}f}"


def _pct(value: Any) -> str:
    return "n/a" if _missing(value) else f"{100 * value:.1f}%"


def _est(entry: Mapping[str, Any] | None, digits: int = 3, pct: bool = False) -> str:
    """``value [lo, hi]``; just ``n/a`` for a missing value (an interval beside it would read as an estimate)."""
    if not entry:
        return "n/a"
    fmt = _pct if pct else (lambda v: _num(v, digits))
    lo, hi = (entry.get("ci") or [None, None])[:2]
    if _missing(lo) or _missing(hi) or _missing(entry.get("value")):
        return fmt(entry.get("value"))
    return f"{fmt(entry.get('value'))} [{fmt(lo)}, {fmt(hi)}]"


def cpt_text(entry: Mapping[str, Any] | None) -> str:
    """A CPT with its interval, saying how often the curve never reaches the target: ``62.0% [43.7%, not
    reached] (not reached in 28% of resamples)``; ``not reached`` when this data's curve does not."""
    if not entry:
        return "n/a"
    unreached = entry.get("unreached")
    if _missing(unreached) or not unreached:
        return _est(entry, pct=True)
    note = f" (not reached in {100 * unreached:.0f}% of resamples)"
    if entry.get("reached") is False:
        return "not reached" + note
    if _missing(entry.get("value")):
        return "n/a"
    lo, hi = (entry.get("ci") or [None, None])[:2]
    # Resamples that never reach the target rank above every share: a missing bound is "not reached".
    interval = "" if _missing(lo) else f" [{_pct(lo)}, {'not reached' if _missing(hi) else _pct(hi)}]"
    return _pct(entry["value"]) + interval + note


def _cost(entry: Mapping[str, Any] | None, report: Mapping[str, Any]) -> str:
    if not entry:
        return "n/a"
    if report.get("cost_basis", {}).get("kind") == "share":
        return _est(entry, pct=True)
    lo, hi = (entry.get("ci") or [None, None])[:2]
    value = entry.get("value")
    return _money(value) + ("" if _missing(lo) or _missing(hi) or _missing(value) else f" [{_money(lo)}, {_money(hi)}]")


def _money(value: Any) -> str:
    return "n/a" if _missing(value) else f"${value:.4g}"


def _verdict(report: Mapping[str, Any]) -> str:
    """Is the route better than random (its APGR above the random band), and than kNN (the paired difference's
    CI), a sentence each.

    The random band is the null: where random scores' APGR falls on these very requests (2.5% of draws above
    its top). The route's own bootstrap interval is not stacked on it: a lower 95% bound asked to clear the
    band's top called APGR 0.600 [0.552, 0.645] against random 0.499 [0.449, 0.553] indistinguishable."""
    routers = report["routers"]
    value = routers.get("router", {}).get("apgr", {}).get("value")
    band_hi = (routers["random"]["apgr"].get("ci") or [None, None])[1]
    parts = []
    if _missing(value) or _missing(band_hi):
        parts.append("Too few requests for confidence intervals")
    elif value > band_hi:
        parts.append(f"The route ranks requests better than random: its APGR ({_num(value)}) is above the random "
                     f"band ({_num(band_hi)}, which random scores pass in 2.5% of draws)")
    else:
        parts.append(f"The route is not distinguishable from random here: its APGR ({_num(value)}) does not clear "
                     f"the random band's top ({_num(band_hi)})")
    sentence = ", ".join(parts) + "."
    for warning in report.get("warnings", []):  # before the verdicts it qualifies
        sentence = f"Caution: {warning}. {sentence}"
    diff = report.get("differences", {}).get("router-knn", {}).get("apgr")
    if diff and diff.get("ci") and not any(_missing(v) for v in diff["ci"]):
        d_lo, d_hi = diff["ci"]
        # Its own sentence: appended to the random verdict with "and", a route "not distinguishable
        # from random ... and better than kNN" read as if both were said of the same thing.
        versus = "better on this data" if d_lo > 0 else "worse on this data" if d_hi < 0 else "not distinguishable"
        sentence += f" Compared with kNN: {versus} (APGR difference {_est(diff)})."
    return sentence


def _tables(report: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]], str]]:
    """Every table of the direct section as (title, header, rows, note); none without it."""
    routers = report.get("routers")
    if routers is None:
        return []
    tables = []
    names = [("router", f"this route ({report.get('router_version') or 'router'})"), ("knn", "kNN (cross-fitted)"),
             ("random", "random (95% band)"), ("oracle", "oracle")]
    rows = []
    for key, label in names:
        entry = routers.get(key)
        if entry is None:
            continue
        rows.append([label, _est(entry.get("apgr")), cpt_text(entry.get("cpt50")), cpt_text(entry.get("cpt80")),
                     _est(entry.get("aiq"))])
    for key, label in (("always_weak", "always-weak"), ("always_strong", "always-strong")):
        entry = routers[key]
        rows.append([label, "—", "—", "—", f"quality {_est(entry['quality'])}"])
    tables.append(("Routers on the same requests", ["router", "APGR", "CPT(50)", "CPT(80)", "AIQ"], rows,
                   "APGR: average performance gap recovered over the strong-call share (random 0.5). "
                   "CPT(x): the strong-call share needed to recover x of the gap (not reached: the curve never "
                   "gets there, rules pinning too much weak; the share of bootstrap resamples where it never "
                   "does is given, and an interval bound among them reads not reached). AIQ: mean quality of the "
                   "cost-quality frontier over the range always-weak … always-strong cost."))
    knob = report["knob"]
    threshold = knob.get("threshold")
    setting = (f"threshold {_num(threshold, 4)} ({knob.get('threshold_source', '')})"
               if threshold is not None else "no knob")
    if knob.get("target_share") is not None:
        setting += f", target strong share {_pct(knob['target_share'])}"
    tables.append(("The configured knob", ["setting", "strong calls", "quality", "PGR", "cost per request"],
                   [[setting, _est(knob["strong_share"], pct=True), _est(knob["quality"]), _est(knob["pgr"]),
                     _cost(knob["cost"], report)]],
                   "What the route decides as configured, on these requests."))
    diffs = report.get("differences", {})
    if diffs:
        tables.append(("Paired differences", ["comparison", "APGR", "AIQ"],
                       [[name.replace("-", " − ").replace("knn", "kNN"), _est(d.get("apgr")), _est(d.get("aiq"))]
                        for name, d in diffs.items()],
                       "Same bootstrap resamples for both routers: an interval excluding 0 is a difference."))
    cal = report["calibration"]
    cal_rows = [[f"{b['lo']:.1f}–{b['hi']:.1f}", str(b["count"]), _num(b["mean_predicted"]), _num(b["observed"])]
                for b in cal["bins"] if b["count"]]
    tables.append((f"Calibration: ECE {_est(cal['ece'])}", ["score bin", "requests", "mean score", "observed rate"],
                   cal_rows, f"Score: the knob's P(strong model needed). Observed: the share of requests where "
                             f"{cal['label']}. ECE: the request-weighted mean gap between the two over the "
                             f"bins; {cal['rows']} knob-decided requests."))
    for key in ("source", "domain"):
        groups = report["breakdown"][key]
        tables.append((f"Per {key}", [key, "requests", "strong q", "weak q", "APGR", "kNN APGR", "strong calls",
                                       "PGR at knob"],
                       [[g["group"], str(g["n"]), _num(g["strong_quality"]), _num(g["weak_quality"]),
                         _est(g.get("apgr")), _est(g.get("knn_apgr")), _pct(g["knob_share"]), _num(g["knob_pgr"])]
                        for g in groups],
                       "APGR only for groups with enough requests and a mean quality gap between the models "
                       "whose 95% interval lies above zero (PGR divides by that gap)."))
    return tables


def _data_name(name: Any) -> str:
    return f" (data: {name})" if name else ""


def _facts(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = report.get("rows", {})
    pair = report.get("pair", {})
    data = report.get("data", [])
    excluded = rows.get("excluded") or {}
    facts = [
        ("route", f"{report.get('route')} (config {report.get('config', '?')})"),
        ("router version", str(report.get("router_version") or "?")),
        (
            "pair",
            f"strong {pair.get('strong')}{_data_name(pair.get('strong_data'))}, "
            f"weak {pair.get('weak')}{_data_name(pair.get('weak_data'))}"
            + (f"; scored by the pair head {pair['reversed_from']} read reversed (trained the other way round)"
               if pair.get("reversed_from") else ""),
        ),
        (
            "data",
            "; ".join(
                f"{d['source']} ({d['rows']} labelled rows"
                + (f", {d['logged']} logged with an outcome" if "logged" in d else "")
                + ")"
                for d in data
            )
            or "?",
        ),
        (
            "requests evaluated",
            f"{rows.get('evaluated')} of {rows.get('total', '?')} labelled (direct)"
            + (f" ({rows.get('pinned_by_rules')} routed by rules)" if rows.get("pinned_by_rules") else ""),
        ),
        ("left out", ", ".join(f"{n} {why}" for why, n in excluded.items()) or "none"),
    ]
    off = report.get("estimator", {}).get("offpolicy")
    if off is not None:
        left = ", ".join(f"{n} {why}" for why, n in (off.get("excluded") or {}).items()) or "none"
        facts.append(
            ("logged requests (off-policy)", f"{off.get('rows')} of {off.get('rows_logged')} used; left out: {left}")
        )
    facts += [
        ("estimator", report.get("estimator", {}).get("text", "direct")),
        ("cost", report.get("cost_basis", {}).get("text", "") if report.get("routers") else ""),
        ("replay", report.get("replay_note", "")),
        ("bootstrap", f"{report['bootstrap']['draws']} resamples of {_resampled(report['bootstrap'])}, percentile "
                      f"{report['bootstrap']['level']:.0%} intervals, seed {report['bootstrap']['seed']}"),
    ]
    return [(k, v) for k, v in facts if v]


def _resampled(bootstrap: Mapping[str, Any]) -> str:
    """What a bootstrap drew: the prompts (every row of one together), or the requests one by one."""
    prompts = bootstrap.get("prompts")
    return "the requests" if prompts is None else f"the {prompts} prompts (every request of a prompt together)"


def _offpolicy_tables(report: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]], str]]:
    """The off-policy section's tables as (title, header, rows, note); none without it."""
    off = report.get("offpolicy")
    if off is None:
        return []
    pol, metric = off["policies"], off.get("metric", "quality")
    rows = []
    for key, label in (
        ("router", f"this route ({report.get('router_version') or 'router'})"),
        ("always_strong", "always-strong"),
        ("always_weak", "always-weak"),
    ):
        q = pol[key]["quality"]
        rows.append(
            [
                label,
                _est(q["ips"]),
                _est(q["snips"]),
                _est(q["dr"]),
                "—",
                str(pol[key]["matched"]),
                _num(pol[key]["ess"], 1),
            ]
        )
    rows.append(
        ["logging policy (as served)", "—", "—", "—", _est(pol["logging"]["quality"]), str(off["rows"]["used"]), "—"]
    )
    route, diff = pol["router"], off["differences"]["router-logging"]
    cost_basis = off.get("cost_basis", {})
    share_cost = cost_basis.get("kind") == "share"

    def cost(entry: Mapping[str, Any]) -> str:
        return _cost(entry, {"cost_basis": cost_basis})

    knob_rows = [
        [
            f"mean {metric}",
            "—",
            _est(route["quality"]["ips"]),
            _est(route["quality"]["snips"]),
            _est(route["quality"]["dr"]),
            _est(pol["logging"]["quality"]),
        ],
        ["difference from the logging policy", "—", _est(diff["ips"]), _est(diff["snips"]), _est(diff["dr"]), "0"],
        [
            "PGR (always-weak 0, always-strong 1)",
            "—",
            _est(route["pgr"]["ips"]),
            _est(route["pgr"]["snips"]),
            _est(route["pgr"]["dr"]),
            "—",
        ],
        [
            "strong calls",
            *(_est(route["strong_share"][k], pct=True) for k in ("replayed", "ips", "snips")),
            "—",
            _est(pol["logging"]["strong_share"], pct=True),
        ],
    ]
    if not share_cost:
        knob_rows.append(
            [
                "cost per request",
                "—",
                cost(route["cost"]["ips"]),
                cost(route["cost"]["snips"]),
                "—",
                cost(pol["logging"]["cost"]),
            ]
        )
    unsupported = route.get("unsupported", 0)
    prop = off.get("propensity", {})
    return [
        (
            f"Off-policy: mean {metric} on {off['rows']['used']} logged requests",
            ["policy", "IPS", "SNIPS", "DR", "observed", "rows matched", "ESS"],
            rows,
            f"Outcome: {off.get('outcome', '')}. IPS: {off['estimators']['ips']}. SNIPS: {off['estimators']['snips']}. "
            f"DR: {off['estimators']['dr']}. ESS: effective sample size (sum w)² / sum w². "
            f"Propensities from {_num(prop.get('min'))} to {_num(prop.get('max'))}.",
        ),
        (
            "Off-policy: the route at its configured knob",
            ["", "replayed (exact)", "IPS", "SNIPS", "DR", "logging policy (observed)"],
            knob_rows,
            "Replayed (exact): the route's own decisions on these requests (it is deterministic). Mean weight "
            f"{_est(route['weight_mean'])} (1 when the propensities are right). "
            + (
                f"{unsupported} requests where the route's choice had probability 0 under logging: IPS cannot see "
                "them, so its estimate is biased there. "
                if unsupported
                else ""
            )
            + f"Cost: {cost_basis.get('text', '?')}. {off.get('caveats', '')}",
        ),
    ]


def _offpolicy_headline(report: Mapping[str, Any]) -> str:
    """One sentence on the off-policy estimate, or ""."""
    off = report.get("offpolicy")
    if off is None:
        return ""
    route, logging_ = off["policies"]["router"], off["policies"]["logging"]
    return (
        f"Off-policy on {off['rows']['used']} logged requests: mean {off.get('metric', 'quality')} "
        f"{_est(route['quality']['snips'])} (SNIPS; IPS {_est(route['quality']['ips'])}, DR "
        f"{_est(route['quality']['dr'])}) against {_est(logging_['quality'])} as served, with "
        f"{_est(route['strong_share']['replayed'], pct=True)} strong calls (ESS {_num(route['ess'], 0)})."
    )


# ----------------------------------------------------------------------------- Markdown


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|", *(line(r) for r in rows)])


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown (plots referenced by file name)."""
    direct = "routers" in report
    out = [f"# pointsman eval: route `{report.get('route')}`", ""]
    if direct:
        router = report["routers"].get("router", {})
        out += [
            f"**APGR {_est(router.get('apgr'))}** (random {_est(report['routers']['random']['apgr'])}), "
            f"CPT(50) {cpt_text(router.get('cpt50'))}, CPT(80) {cpt_text(router.get('cpt80'))}, "
            f"AIQ {_est(router.get('aiq'))}; at the configured knob {_est(report['knob']['strong_share'], pct=True)} "
            f"strong calls recover PGR {_est(report['knob']['pgr'])}.",
            "",
            _verdict(report),
            "",
        ]
    if _offpolicy_headline(report):
        out += [f"**{_offpolicy_headline(report)}**" if not direct else _offpolicy_headline(report), ""]
    out += [*(f"- **{k}**: {v}" for k, v in _facts(report)), ""]
    plots = report.get("plots", {})
    tables = _tables(report)
    for title, header, rows, note in tables[:3]:
        out += [f"## {title}", "", _md_table(header, rows), "", f"_{note}_", ""]
    for name in ("pgr_curve", "frontier"):
        if name in plots:
            out += [f"## {PLOT_TITLES[name]}", "", f"![{PLOT_TITLES[name]}]({plots[name]})", ""]
    for title, header, rows, note in tables[3:]:
        out += [f"## {title}", "", _md_table(header, rows) if rows else "_(none)_", "", f"_{note}_", ""]
        if title.startswith("Calibration") and "reliability" in plots:
            out += [f"![{PLOT_TITLES['reliability']}]({plots['reliability']})", ""]
    if "breakdown" in plots:
        out += [f"![{PLOT_TITLES['breakdown']}]({plots['breakdown']})", ""]
    for title, header, rows, note in _offpolicy_tables(report):
        out += [f"## {title}", "", _md_table(header, rows), "", f"_{note}_", ""]
    if "offpolicy" in plots:
        out += [f"![{PLOT_TITLES['offpolicy']}]({plots['offpolicy']})", ""]
    out += ["## Estimators", "", *(f"- **{k}**: {v}" for k, v in _estimator_lines(report)), ""]
    if report.get("baselines"):
        out += ["## Baselines", "", *(f"- **{k}**: {v}" for k, v in report["baselines"].items()), ""]
    return "\n".join(out)


def _estimator_lines(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Which estimator produced which section, with its rows (the ``estimator`` block, said plainly)."""
    block = report.get("estimator", {})
    lines = []
    direct = block.get("direct")
    if direct is not None:
        lines.append(
            (
                "direct",
                f"{direct.get('rows', 0)} labelled requests; "
                + (f"numbers: {', '.join(direct.get('numbers', []))}. " if direct.get("rows") else "")
                + str(direct.get("text", "")),
            )
        )
    off = block.get("offpolicy")
    if off is not None:
        lines.append(
            (
                "off-policy",
                f"{off.get('rows', 0)} of {off.get('rows_logged', 0)} logged requests "
                f"({off.get('rows_without_propensity', 0)} without a propensity); " + str(off.get("text", "")),
            )
        )
    return lines


# ----------------------------------------------------------------------------- HTML

CSS = """
body{font:15px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#1d1d1f;
 max-width:1100px;margin:2em auto;padding:0 1.2em;background:#fff}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #e3e3e3;
 padding-bottom:.2em}
.headline{font-size:1.1em;background:#f3f6fb;border-left:4px solid #1f5fbf;padding:.7em 1em;margin:1em 0}
.verdict{margin:.6em 0 1.2em}
table{border-collapse:collapse;margin:.6em 0;font-variant-numeric:tabular-nums}
th,td{padding:.35em .8em;border-bottom:1px solid #e6e6e6;text-align:left;vertical-align:top}
th{background:#fafafa;font-weight:600} td.n{text-align:right}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.25em 1.2em;margin:1em 0}
dl.facts dt{font-weight:600;color:#555} dl.facts dd{margin:0}
.note{color:#666;font-size:.9em;margin-top:.2em}
figure{margin:1.2em 0} figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#666;font-size:.9em}
"""


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(report: Mapping[str, Any], name: str) -> str:
    file = report.get("plots", {}).get(name)
    if not file:
        return ""
    title = html.escape(PLOT_TITLES[name])
    return f'<figure><img src="{html.escape(file)}" alt="{title}"><figcaption>{title}</figcaption></figure>'


def render_html(report: Mapping[str, Any]) -> str:
    """The report as one HTML page (inline CSS; the plots are the PNG files beside it)."""
    e = html.escape
    headline = ""
    if "routers" in report:
        router = report["routers"].get("router", {})
        headline = (
            f"<b>APGR {e(_est(router.get('apgr')))}</b> (random {e(_est(report['routers']['random']['apgr']))}) · "
            f"CPT(50) {e(cpt_text(router.get('cpt50')))} · CPT(80) {e(cpt_text(router.get('cpt80')))} · "
            f"AIQ {e(_est(router.get('aiq')))}<br>At the configured knob: "
            f"{e(_est(report['knob']['strong_share'], pct=True))} strong calls, PGR {e(_est(report['knob']['pgr']))}"
        )
    if _offpolicy_headline(report):
        headline += ("<br>" if headline else "") + e(_offpolicy_headline(report))
    facts = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in _facts(report))
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>pointsman eval: {e(str(report.get('route')))}</title><style>{CSS}</style></head><body>",
        f"<h1>pointsman eval: route <code>{e(str(report.get('route')))}</code></h1>",
        f'<div class="headline">{headline}</div>',
        f'<p class="verdict">{e(_verdict(report))}</p>' if "routers" in report else "",
        f'<dl class="facts">{facts}</dl>',
    ]
    tables = _tables(report)
    for title, header, rows, note in tables[:3]:
        parts += [f"<h2>{e(title)}</h2>", _html_table(header, rows), f'<p class="note">{e(note)}</p>']
    if tables:
        parts += ["<h2>Curves</h2>", _figure(report, "pgr_curve"), _figure(report, "frontier")]
    for title, header, rows, note in tables[3:]:
        parts += [f"<h2>{e(title)}</h2>", _html_table(header, rows) if rows else "<p>(none)</p>",
                  f'<p class="note">{e(note)}</p>']
        if title.startswith("Calibration"):
            parts.append(_figure(report, "reliability"))
    parts.append(_figure(report, "breakdown"))
    for title, header, rows, note in _offpolicy_tables(report):
        parts += [f"<h2>{e(title)}</h2>", _html_table(header, rows), f'<p class="note">{e(note)}</p>']
    parts.append(_figure(report, "offpolicy"))
    parts += [
        "<h2>Estimators</h2>",
        "<ul>",
        *(f"<li><b>{e(k)}</b>: {e(v)}</li>" for k, v in _estimator_lines(report)),
        "</ul>",
    ]
    if report.get("baselines"):
        parts += [
            "<h2>Baselines</h2>",
            "<ul>",
            *(f"<li><b>{e(k)}</b>: {e(v)}</li>" for k, v in report["baselines"].items()),
            "</ul>",
        ]
    parts += [
        f'<p class="note">Generated {e(str(report.get("created_at", "")))} by pointsman eval.</p>',
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"
