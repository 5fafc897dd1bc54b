"""Writes an A/B report: ``ab-report.json``, ``ab-report.md``, ``ab-report.html`` and the PNG plots.

The JSON holds every number (NaN and infinite bounds as null). The Markdown references the PNGs
beside it; the HTML embeds them (base64), so it is one self-contained file: no scripts, no network.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evals.ab.plots import PLOT_TITLES, write_plots
from evals.report import jsonable, refuse_taken_names
from evals.report_render import _html_table, _md_table, _missing, _num, _pct

FORMATS = ("md", "html", "json")
Table = tuple[str, list[str], list[list[str]], str]


def write_ab_report(report: Mapping[str, Any], out_dir: Path, formats: Iterable[str] = FORMATS) -> dict[str, Path]:
    """Write the requested formats (``md``, ``html``, ``json``) into ``out_dir``; returns ``{kind: path}``.

    Plots are drawn when Markdown or HTML is asked for.
    """
    wanted = set(formats)
    unknown = wanted - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown report format(s) {', '.join(sorted(unknown))}; expected {', '.join(FORMATS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    refuse_taken_names(out_dir, report_files(wanted))  # before the first PNG: never half a report
    data = jsonable(report)
    data["plots"] = write_plots(data, out_dir) if wanted & {"md", "html"} else {}
    paths: dict[str, Path] = {name: out_dir / file for name, file in data["plots"].items()}
    if "json" in wanted:
        paths["json"] = out_dir / "ab-report.json"
        paths["json"].write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if "md" in wanted:
        paths["md"] = out_dir / "ab-report.md"
        paths["md"].write_text(render_markdown(data), encoding="utf-8")
    if "html" in wanted:
        paths["html"] = out_dir / "ab-report.html"
        paths["html"].write_text(render_html(data, out_dir), encoding="utf-8")
    return paths


def report_files(formats: Iterable[str]) -> list[str]:
    """The file names :func:`write_ab_report` may write for ``formats`` (the plots with md or html)."""
    wanted = set(formats)
    names = [f"ab-report.{f}" for f in FORMATS if f in wanted]
    if wanted & {"md", "html"}:
        names += [f"{name}.png" for name in PLOT_TITLES]
    return names


# ----------------------------------------------------------------------------- formatting


def _money(v: Any) -> str:
    return "n/a" if _missing(v) else (f"${v:.4g}" if v >= 0 else f"-${-v:.4g}")


def _bounds(ci: Sequence[Any] | None, fmt: Any) -> str:
    lo, hi = (ci or [None, None])[:2]
    if lo is None and hi is None:
        return " [unbounded]"
    return f" [{'-inf' if lo is None else fmt(lo)}, {'inf' if hi is None else fmt(hi)}]"


def _mean(entry: Mapping[str, Any] | None, fmt: Any = _num) -> str:
    """``mean [lo, hi] (n)`` of a per-arm mean entry."""
    if not entry or not entry.get("n"):
        return "n/a"
    return f"{fmt(entry['mean'])}{_bounds(entry.get('ci'), fmt)} (n={entry['n']})"


def _rate(entry: Mapping[str, Any] | None) -> str:
    if not entry or not entry.get("n"):
        return "n/a"
    return f"{_pct(entry['value'])}{_bounds(entry.get('ci'), _pct)}"


def _signed(v: Any, digits: int = 3) -> str:
    return "n/a" if _missing(v) else f"{v:+.{digits}f}"


def _signed_money(v: Any) -> str:
    return "n/a" if _missing(v) else ("+" if v >= 0 else "-") + f"${abs(v):.4g}"


def _signed_pct(v: Any) -> str:
    return "n/a" if _missing(v) else f"{100 * v:+.1f} pts"


def _diff(entry: Mapping[str, Any] | None, fmt: Any = _signed) -> str:
    if not entry or entry.get("estimate") is None:
        return "n/a"
    lo, hi = entry.get("ci") or [None, None]
    mark = " ✔" if entry.get("significant") else ""
    return f"{fmt(entry['estimate'])} [{'-inf' if lo is None else fmt(lo)}, {'inf' if hi is None else fmt(hi)}]{mark}"


def _when(t: Any) -> str:
    import time

    return "?" if t is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(t)))


# ----------------------------------------------------------------------------- shared content


def verdict_lines(report: Mapping[str, Any]) -> list[str]:
    """The verdict: one line per treatment arm (or the SRM warning alone)."""
    srm = report.get("srm")
    if srm and srm.get("mismatch"):
        return [str(report["verdict"])]
    lines = [str(v["text"]) for v in report.get("verdicts", {}).values()]
    return lines or [str(report["verdict"])]


def facts(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Key facts: what was compared, on what data, with which method."""
    m = report["method"]
    rows = report["rows"]
    arms = report["arms"]
    strong = report["strong_model"]
    srm = report.get("srm")
    excluded = ", ".join(f"{n} {why}" for why, n in (rows.get("excluded") or {}).items()) or "none"
    srm_text = (
        report.get("srm_note", "not run") if not srm
        else f"{'MISMATCH' if srm['mismatch'] else 'ok'}: chi-square p = {srm['p_value']:.3g} "
             f"(threshold {m['srm_alpha']:g}; {srm.get('note', '')})"
    )
    return [
        ("experiment", f"{report['experiment']} on route {report.get('route')}"),
        ("arms", ", ".join(f"{a} (weight {_num(arms[a]['weight'], 2)}{', control' if arms[a]['control'] else ''})"
                           for a in report["arms_order"]) or "none"),
        ("served requests", f"{rows['served']} (left out: {excluded})"),
        ("shadow decisions", str(rows["shadow"])),
        ("quality used by the verdict", f"{report['primary_source']}: {report['sources'][report['primary_source']]} "
                                        f"(metric {report.get('metric')})"),
        ("strong model", f"{strong['name'] or 'unknown'} ({strong['basis']})"),
        ("compared requests", "included" if report.get("include_compared") else
         "left out of quality and cost (they include calls made for learning)"),
        ("sample-ratio check", srm_text),
        ("method", f"{m['text']} alpha {m['alpha']:g}"
                   + (f" ({m['alpha_per_comparison']:.3g} per comparison, Bonferroni)"
                      if m["alpha_per_comparison"] != m["alpha"] else "")
                   + f", rho {m['rho']:.4f}, smallest difference that counts ±{m['min_effect']:g}"),
    ]


def tables(report: Mapping[str, Any]) -> list[Table]:
    """Every table as (title, header, rows, note)."""
    arms, order, primary = report["arms"], report["arms_order"], report["primary_source"]
    out: list[Table] = []
    rows = []
    for a in order:
        s = arms[a]
        status = "control" if s["control"] else "treatment"
        if s.get("stopped"):
            status += f"; stopped {_when(s['stopped']['stopped_at'])}: {s['stopped']['reason']}"
        rows.append([a, status, str(s["requests"]), _mean(s["quality"][primary]), _mean(s["cost_per_request"], _money),
                     _money(s["cost_per_quality_point"]), _rate(s.get("strong_share")),
                     f"{_num(s['latency_ms']['p50'], 0)} / {_num(s['latency_ms']['p99'], 0)}", _rate(s["error_rate"])])
    out.append(("Arms", ["arm", "status", "requests", f"quality ({primary})", "cost per request",
                         "cost per quality point", "strong model", "latency p50 / p99 (ms)", "error rate"], rows,
                "Intervals are always-valid confidence sequences: they hold at every sample size, so reading "
                "them early or often is safe. Cost per quality point: cost per request ÷ mean quality. "
                "Errors: a 5xx status or a stream that broke (a policy block or an upstream 4xx is not an "
                "error); client disconnects are left out."))
    sources = list(report["sources"])
    out.append(("Quality per source", ["arm", *sources],
                [[a, *(_mean(arms[a]["quality"][s]) for s in sources)] for a in order],
                "; ".join(f"{s}: {label}" for s, label in report["sources"].items())
                + ". Each source is shown on its own; the verdict uses " + primary + "."))
    diff_rows = []
    for a, d in report.get("differences", {}).items():
        for s in sources:
            diff_rows.append([a, f"quality ({s})" + (" · verdict" if s == primary else ""), _diff(d["quality"][s])])
        diff_rows.append([a, "cost per request", _diff(d["cost_per_request"], _signed_money)])
        diff_rows.append([a, "error rate", _diff(d["error_rate"], _signed_pct)])
        if d.get("strong_share"):
            diff_rows.append([a, "strong-model share", _diff(d["strong_share"], _signed_pct)])
    if diff_rows:
        out.append((f"Differences against control ({report['control']})", ["arm", "measure", "treatment − control"],
                    diff_rows, "✔: the interval excludes 0 (a difference declared at the report's alpha)."))
    srm = report.get("srm")
    if srm:
        unit = "assignment keys" if "assignment keys" in str(report.get("srm_note", "")) else "requests"
        out.append(("Sample-ratio check", ["arm", unit, "observed share", "expected share"],
                    [[a, str(n), _pct(n / max(sum(srm["counts"].values()), 1)),
                      _pct(srm["expected_share"].get(a, 0.0))] for a, n in srm["counts"].items()],
                    f"Chi-square p = {srm['p_value']:.3g}; a mismatch (p < {report['method']['srm_alpha']:g}) means "
                    "assignment or logging is broken and no number here can be trusted."))
    stops = report.get("stops") or []
    if stops:
        out.append(("Stopped arms", ["arm", "stopped at", "reason", "detail", "replica"],
                    [[s["arm"], _when(s["stopped_at"]), s["reason"], json.dumps(s.get("detail") or {}),
                      str(s.get("replica") or "")] for s in stops],
                    "A stopped arm's traffic went to control from then on."))
    shadow = report.get("shadow") or {}
    if shadow:
        out.append(("Shadow decisions", ["shadow arm", "decisions", "matched to served", "agreement with served",
                                         "strong share (shadow)", "strong share (served, same requests)"],
                    [[a, str(s["decisions"]), str(s["matched"]), _pct(s["agreement"]), _pct(s["strong_share"]),
                      _pct(s["served_strong_share"])] for a, s in shadow.items()],
                    "What each shadow arm would have chosen for the served requests; never served, so never in "
                    "the arms' statistics above."))
    return out


def method_lines(report: Mapping[str, Any]) -> list[str]:
    """How to read the numbers, and the caveats."""
    m = report["method"]
    return [
        f"Every interval is a {1 - m['alpha']:.0%} always-valid confidence sequence: the chance that it ever "
        "misses the true value, at any of the sample sizes it is read at, is at most alpha. Stopping the "
        "experiment as soon as it excludes 0 is therefore safe.",
        "Each arm's quality and rates use a bounded-data sequence (a mixture of bets on the mean: the betting "
        "confidence sequence of Waudby-Smith & Ramdas 2024, its wealth bounded from the mean and variance): "
        "exact at every size from the range alone, "
        "so it stays right for rates near 0% or 100%. Differences between arms and costs use the asymptotic "
        "sequence of Waudby-Smith, Arbour, Sinha, Kennedy & Ramdas 2024 (the normal-mixture boundary of the "
        "mSPRT with a plug-in variance; pooled when the arms are unequal).",
        f"The mixing parameter rho = {m['rho']:.4f} makes the sequences tightest near {m['planned_n']} requests "
        "per arm; they stay valid at every size.",
        "Not enough data: the number of further requests per arm at which the interval would shrink to the "
        "difference named, with the variances seen so far.",
        *report.get("caveats", []),
    ]


# ----------------------------------------------------------------------------- Markdown


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown (plots referenced by file name)."""
    out = [f"# pointsman ab: experiment `{report['experiment']}`", ""]
    out += [f"**{line}**" for line in verdict_lines(report)] + [""]
    out += [*(f"- **{k}**: {v}" for k, v in facts(report)), ""]
    for title, header, rows, note in tables(report):
        out += [f"## {title}", "", _md_table(header, rows) if rows else "_(none)_", "", f"_{note}_", ""]
    plots = report.get("plots", {})
    if plots:
        out += ["## Over time", ""]
        out += [f"![{PLOT_TITLES[name]}]({file})" for name, file in plots.items()] + [""]
    out += ["## How to read this", "", *(f"- {line}" for line in method_lines(report)), ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- HTML

CSS = """
body{font:15px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#1d1d1f;
 max-width:1200px;margin:2em auto;padding:0 1.2em;background:#fff}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #e3e3e3;
 padding-bottom:.2em}
.headline{font-size:1.1em;background:#f3f6fb;border-left:4px solid #1f5fbf;padding:.7em 1em;margin:1em 0}
.headline.srm{background:#fdf0f0;border-left-color:#d62728}
table{border-collapse:collapse;margin:.6em 0;font-variant-numeric:tabular-nums}
th,td{padding:.35em .8em;border-bottom:1px solid #e6e6e6;text-align:left;vertical-align:top}
th{background:#fafafa;font-weight:600}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.25em 1.2em;margin:1em 0}
dl.facts dt{font-weight:600;color:#555} dl.facts dd{margin:0}
.note{color:#666;font-size:.9em;margin-top:.2em}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:1em}
figure{margin:0} figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#666;font-size:.9em}
"""


def _figure(name: str, path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    title = html.escape(PLOT_TITLES[name])
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{title}">'
            f"<figcaption>{title}</figcaption></figure>")


def render_html(report: Mapping[str, Any], out_dir: Path) -> str:
    """The report as one self-contained HTML page (inline CSS, plots embedded from ``out_dir``)."""
    e = html.escape
    srm = bool((report.get("srm") or {}).get("mismatch"))
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>pointsman ab: {e(str(report['experiment']))}</title><style>{CSS}</style></head><body>",
        f"<h1>pointsman ab: experiment <code>{e(str(report['experiment']))}</code></h1>",
        f'<div class="headline{" srm" if srm else ""}">' + "<br>".join(e(v) for v in verdict_lines(report)) + "</div>",
        '<dl class="facts">' + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in facts(report)) + "</dl>",
    ]
    for title, header, rows, note in tables(report):
        parts += [f"<h2>{e(title)}</h2>", _html_table(header, rows) if rows else "<p>(none)</p>",
                  f'<p class="note">{e(note)}</p>']
    plots = report.get("plots", {})
    if plots:
        parts += ["<h2>Over time</h2>", '<div class="plots">',
                  *(_figure(name, out_dir / file) for name, file in plots.items()), "</div>"]
    parts += ["<h2>How to read this</h2>", "<ul>", *(f"<li>{e(line)}</li>" for line in method_lines(report)), "</ul>",
              f'<p class="note">Generated {e(str(report.get("created_at", "")))} by pointsman ab report.</p>',
              "</body></html>"]
    return "\n".join(parts) + "\n"
