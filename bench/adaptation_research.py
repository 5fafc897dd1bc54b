"""Research: how fast can a pair difficulty head adapt to out-of-distribution traffic from few labels?

Data: RouterBench-train (``../shared/data/routerbench-train``; ARC-challenge, MBPP, Winogrande), GPT-4-1106
(strong) vs Mixtral-8x7B (weak) 0/1 outcomes. Bench only: the data has no licence, nothing built from
it is shipped.

Protocol:
- A fixed held-out set: the 600 prompts with the lowest ``prompt_unit(prompt, HOLDOUT_SEED)`` (a split by
  prompt hash, so duplicate prompts never straddle it). Every number below is APGR on these prompts.
- A learning curve: for each draw ``r`` a random order of the remaining prompts (the pool); the first
  50 / 100 / 200 / 400 / 800 / 1600 are the labelled requests (nested prefixes, so the curve is smooth).
- Every method fits on the labelled rows only; hyperparameters are chosen inside the fit by
  cross-validation on those rows (never the held-out set).
- Reported per cell: mean APGR over the draws with a 95% t-interval over draws; the random router's
  95% band (random scores on the held-out set); the shipped router's APGR (bundled difficulty head,
  static and MiniLM encoders); and for the chosen method the paired bootstrap (held-out prompts
  resampled, 1,000 times) of APGR(method) - APGR(shipped), averaged over draws, with its 95% CI.

Run (embeddings are cached under .cache/embeddings; MiniLM on 2 cores takes a few minutes cold):
``nice -n 10 .venv/bin/python bench/adaptation_research.py [--draws 10] [--methods a,b] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._args import int_list  # noqa: E402
from classifiers.heads import build_features, load_head  # noqa: E402
from evals.data import load_routellm, load_routerbench, resolve_data_dir  # noqa: E402
from evals.data.split import prompt_unit  # noqa: E402
from evals.embeddings import embed_prompts, embed_texts, get_encoder, prompt_text  # noqa: E402
from evals.metrics import evaluate_scores  # noqa: E402
from evals.pair_fit import PairPrior, fit_pair_difficulty, rank_gain  # noqa: E402

STRONG = "gpt-4-1106-preview"
WEAK = "mistralai/mixtral-8x7b-chat"
HOLDOUT = 600
HOLDOUT_SEED = 11  # the development split; --holdout-seed 12 is the confirmation split
SIZES = (50, 100, 200, 400, 800, 1600)
ROUTERS = ROOT / "classifiers" / "artifacts" / "routers"
ENCODERS = ("static", "minilm")
BASELINE = "plain LR (minilm emb)"


@dataclass
class Data:
    """RouterBench GPT-4 vs Mixtral rows (both outcomes known) with features per encoder."""

    prompts: list[str]
    texts: list[str]
    task: np.ndarray
    strong: np.ndarray
    weak: np.ndarray
    hold: np.ndarray  # indices of the held-out prompts
    holdout_seed: int
    pool: np.ndarray  # indices the labelled requests are drawn from
    x: dict[str, np.ndarray] = field(default_factory=dict)  # encoder -> build_features(emb, texts)
    emb: dict[str, np.ndarray] = field(default_factory=dict)
    shipped: dict[str, np.ndarray] = field(default_factory=dict)  # encoder -> shipped P(strong needed)
    prior: dict[str, PairPrior] = field(default_factory=dict)  # encoder -> RouteLLM rows

    @property
    def gain(self) -> np.ndarray:
        return self.strong - self.weak


def head_tail(text: str, head: int = 200, tail: int = 800) -> str:
    """Research text form: the first ``head`` and the last ``tail`` characters (MiniLM reads ~256 word pieces)."""
    return text if len(text) <= head + tail + 5 else f"{text[:head]} […] {text[-tail:]}"


def tail(text: str, chars: int = 600) -> str:
    """Research text form: the last ``chars`` characters (the question after a shared few-shot preamble)."""
    return text[-chars:]


def load_data(
    data_dir: Path, encoders: Sequence[str], with_prior: bool, holdout_seed: int = HOLDOUT_SEED, prior_sample: int = 0
) -> Data:
    """Rows with both outcomes, features per encoder (cached), the shipped heads' scores, RouteLLM priors."""
    rows = [r for r in load_routerbench(data_dir) if not (math.isnan(r.quality[STRONG]) or math.isnan(r.quality[WEAK]))]
    prompts = [r.prompt for r in rows]
    unit = np.array([prompt_unit(p, holdout_seed) for p in prompts])
    order = np.argsort(unit, kind="stable")
    hold = np.sort(order[:HOLDOUT])
    pool = np.sort(order[HOLDOUT:])
    data = Data(
        prompts=prompts,
        texts=[prompt_text(p) for p in prompts],
        task=np.array([r.task for r in rows]),
        strong=np.array([r.quality[STRONG] for r in rows]),
        weak=np.array([r.quality[WEAK] for r in rows]),
        hold=hold,
        pool=pool,
        holdout_seed=holdout_seed,
    )
    routellm = load_routellm(data_dir) if with_prior else []
    if 0 < prior_sample < len(routellm):  # a seeded sample, as `pointsman train --warm-start` takes
        keep = np.sort(np.random.default_rng(0).choice(len(routellm), prior_sample, replace=False))
        routellm = [routellm[i] for i in keep]
    for name in encoders:
        base = name.split("-")[0]  # "minilm-headtail", "static-tail": the encoder, another text form
        enc = get_encoder(base)
        if name == "minilm-headtail":
            emb = embed_texts(enc, [head_tail(t) for t in data.texts], progress=False)
        elif name.endswith("-tail"):
            emb = embed_texts(enc, [tail(t) for t in data.texts], progress=False)
        else:
            emb = embed_prompts(enc, prompts, progress=False)
        data.emb[name] = emb
        data.x[name] = build_features(emb, data.texts)
        shipped = ROUTERS / f"difficulty-gpt4-mixtral-{base}"
        if name == base and shipped.exists():
            data.shipped[name] = load_head(shipped).predict_proba(data.x[name])[:, 1]
        if routellm and (name == base or name.endswith("-tail")):
            r_texts = [prompt_text(r.prompt) for r in routellm]
            r_emb = embed_texts(enc, [tail(t) if name.endswith("-tail") else t for t in r_texts], progress=False)
            r_gain_scale = np.array([1 / 9 if r.dataset == "mt_bench" else 1.0 for r in routellm])
            data.prior[name] = PairPrior(
                x=build_features(r_emb, r_texts),
                strong_q=np.array([r.strong_quality for r in routellm]) * r_gain_scale,
                weak_q=np.array([r.weak_quality for r in routellm]) * r_gain_scale,
                weight=np.ones(len(routellm)),
            )
    return data


# ------------------------------------------------------------------------------------------ methods
# A method maps (data, labelled row indices, seed) to scores for data.hold (higher = send to strong).
Method = Callable[[Data, np.ndarray, int], np.ndarray]


def _std(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-8] = 1.0
    return mean, scale


def _cv_pick(
    n: int,
    seed: int,
    grid: Sequence[Any],
    fit_score: Callable[[np.ndarray, np.ndarray, Any], np.ndarray],
    gain: np.ndarray,
) -> Any:
    """The grid value whose 5-fold out-of-fold scores have the best rank_gain (ties: earlier value)."""
    k = min(5, n)
    folds = np.random.default_rng(seed).permutation(np.arange(n) % k)
    best, best_v = grid[0], -np.inf
    for value in grid:
        oof = np.zeros(n)
        for f in range(k):
            oof[folds == f] = fit_score(folds != f, folds == f, value)
        v = rank_gain(oof, gain, np.ones(n))
        if v > best_v + 1e-12:
            best, best_v = value, v
    return best


def plain_lr(encoder: str) -> Method:
    """The reference baseline: scikit-learn LogisticRegression() on the raw embeddings, label strong better."""

    def run(d: Data, idx: np.ndarray, seed: int) -> np.ndarray:
        from sklearn.linear_model import LogisticRegression

        y = (d.gain[idx] > 0).astype(int)
        if y.min() == y.max():
            return np.zeros(len(d.hold))
        model = LogisticRegression(max_iter=2000).fit(d.emb[encoder][idx], y)
        return np.asarray(model.predict_proba(d.emb[encoder][d.hold])[:, 1])

    return run


def lr_cv(encoder: str) -> Method:
    """Logistic regression on standardised features (embedding + cheap), C by inner CV."""

    def run(d: Data, idx: np.ndarray, seed: int) -> np.ndarray:
        from sklearn.linear_model import LogisticRegression

        x, y, g = d.x[encoder][idx], (d.gain[idx] > 0).astype(int), d.gain[idx]
        if y.min() == y.max():
            return np.zeros(len(d.hold))

        def fit_score(tr: np.ndarray, te: np.ndarray, c: float) -> np.ndarray:
            if y[tr].min() == y[tr].max():
                return np.zeros(int(te.sum()))
            m, s = _std(x[tr])
            model = LogisticRegression(C=c, max_iter=2000).fit((x[tr] - m) / s, y[tr])
            return np.asarray(model.decision_function((x[te] - m) / s))

        c = _cv_pick(len(idx), seed, (1e-4, 1e-3, 1e-2, 1e-1, 1.0), fit_score, g)
        return _lr_full(x, y, d.x[encoder][d.hold], c)

    return run


def _lr_full(x: np.ndarray, y: np.ndarray, xh: np.ndarray, c: float) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    m, s = _std(x)
    model = LogisticRegression(C=c, max_iter=2000).fit((x - m) / s, y)
    return np.asarray(model.decision_function((xh - m) / s))


def pair_fit(encoder: str, prior: bool = False, select: str = "mse", focus: float = 0.0) -> Method:
    """The product's evals.pair_fit.fit_pair_difficulty (optionally with the RouteLLM prior)."""

    def run(d: Data, idx: np.ndarray, seed: int) -> np.ndarray:
        head, _ = fit_pair_difficulty(
            d.x[encoder][idx],
            d.strong[idx],
            d.weak[idx],
            np.ones(len(idx)),
            seed=seed,
            prior=d.prior[encoder] if prior else None,
            select=select,
            focus=focus,
        )
        return head.predict_proba(d.x[encoder][d.hold])[:, 1]

    return run


def knn_gain(encoder: str) -> Method:
    """Mean gain of the k most similar labelled prompts (cosine on the embedding), k by inner CV."""

    def run(d: Data, idx: np.ndarray, seed: int) -> np.ndarray:
        e = d.emb[encoder]
        g = d.gain[idx]

        def score(ref: np.ndarray, gains: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
            sims = q @ ref.T
            k = min(k, len(ref))
            nn = np.argpartition(-sims, k - 1, axis=1)[:, :k]
            return np.asarray(gains[nn].mean(axis=1))

        ee = e[idx]

        def fit_score(tr: np.ndarray, te: np.ndarray, k: int) -> np.ndarray:
            return score(ee[tr], g[tr], ee[te], k)

        k = _cv_pick(len(idx), seed, (5, 10, 25, 50, 100), fit_score, g)
        return score(ee, g, e[d.hold], k)

    return run


def shipped_feature(encoder: str) -> Method:
    """pair_fit with the shipped head's logit appended as one more feature."""

    def run(d: Data, idx: np.ndarray, seed: int) -> np.ndarray:
        p = np.clip(d.shipped[encoder], 1e-6, 1 - 1e-6)
        x = np.hstack([d.x[encoder], np.log(p / (1 - p))[:, None]])
        head, _ = fit_pair_difficulty(x[idx], d.strong[idx], d.weak[idx], np.ones(len(idx)), seed=seed)
        return head.predict_proba(x[d.hold])[:, 1]

    return run


def prior_only(encoder: str) -> Method:
    """Diagnostic: no new data at all, the prior alone (pair_fit's ridge on the RouteLLM rows, alpha 1e4)."""

    cache: dict[int, np.ndarray] = {}

    def run(d: Data, idx: np.ndarray, seed: int) -> np.ndarray:
        if id(d) not in cache:  # the same for every draw and size
            pr = d.prior[encoder]
            head, _ = fit_pair_difficulty(pr.x, pr.strong_q, pr.weak_q, pr.weight, seed=0)
            cache[id(d)] = head.predict_proba(d.x[encoder][d.hold])[:, 1]
        return cache[id(d)]

    return run


def task_mean(d: Data, idx: np.ndarray, seed: int) -> np.ndarray:
    """Diagnostic (not deployable: the task is metadata): each held-out prompt gets its task's mean gain."""
    g = d.gain[idx]
    return np.array([g[d.task[idx] == t].mean() if (d.task[idx] == t).any() else g.mean() for t in d.task[d.hold]])


def methods(encoders: Sequence[str]) -> dict[str, Method]:
    out: dict[str, Method] = {"task-mean (diagnostic)": task_mean}
    if "minilm" in encoders:
        out[BASELINE] = plain_lr("minilm")
    for e in encoders:
        out[f"LR cv-C [{e}]"] = lr_cv(e)
        out[f"kNN gain [{e}]"] = knn_gain(e)
        out[f"ridge-gain, no prior [{e}]"] = pair_fit(e)
        if e.endswith("-tail"):
            out[f"pair_fit: ridge-gain + prior [{e}]"] = pair_fit(e, prior=True)
        if e in ENCODERS:
            out[f"ridge-gain + shipped logit [{e}]"] = shipped_feature(e)
            out[f"prior only (RouteLLM ridge) [{e}]"] = prior_only(e)
            out[f"ridge-gain + prior, CV by APGR [{e}]"] = pair_fit(e, prior=True, select="rank")
            out[f"ridge-gain + prior, focus 6 [{e}]"] = pair_fit(e, prior=True, focus=6.0)
            out[f"pair_fit: ridge-gain + prior [{e}]"] = pair_fit(e, prior=True)
    return out


# ------------------------------------------------------------------------------------------ running


def apgr(scores: np.ndarray, d: Data, rows: np.ndarray | None = None) -> float:
    h = d.hold if rows is None else d.hold[rows]
    s = scores if rows is None else scores[rows]
    return float(evaluate_scores(s, d.strong[h], d.weak[h]).apgr)


def random_band(d: Data, n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    rng = np.random.default_rng(seed)
    vals = np.array([apgr(rng.random(len(d.hold)), d) for _ in range(n)])
    return float(vals.mean()), float(np.quantile(vals, 0.025)), float(np.quantile(vals, 0.975))


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    from scipy.stats import t

    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), float("nan"), float("nan")
    half = float(t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def paired_vs(
    d: Data, scores: list[np.ndarray], refs: list[np.ndarray], n_boot: int = 1000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean over draws of APGR(scores[r]) - APGR(refs[r]) and its 95% CI from resampling held-out prompts.

    ``refs`` holds one reference per draw (the same array repeated for a fixed router such as the shipped one).
    """
    rng = np.random.default_rng(seed)
    point = float(np.mean([apgr(s, d) - apgr(r, d) for s, r in zip(scores, refs, strict=True)]))
    boots = np.empty(n_boot)
    for b in range(n_boot):
        rows = rng.integers(0, len(d.hold), len(d.hold))
        boots[b] = np.mean([apgr(s, d, rows) - apgr(r, d, rows) for s, r in zip(scores, refs, strict=True)])
    return point, float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


def resplit(d: Data, holdout_seed: int) -> Data:
    """The same rows and features with another held-out split (prompt hash with ``holdout_seed``)."""
    unit = np.array([prompt_unit(p, holdout_seed) for p in d.prompts])
    order = np.argsort(unit, kind="stable")
    return Data(
        prompts=d.prompts,
        texts=d.texts,
        task=d.task,
        strong=d.strong,
        weak=d.weak,
        hold=np.sort(order[:HOLDOUT]),
        pool=np.sort(order[HOLDOUT:]),
        holdout_seed=holdout_seed,
        x=d.x,
        emb=d.emb,
        shipped=d.shipped,
        prior=d.prior,
    )


def run_splits(
    d: Data, meths: dict[str, Method], draws: int, sizes: Sequence[int], seeds: Sequence[int]
) -> tuple[dict[str, dict[int, list[float]]], dict[str, list[float]]]:
    """Mean APGR over draws per held-out split: method -> size -> [per split]; shipped -> [per split]."""
    out: dict[str, dict[int, list[float]]] = {name: {n: [] for n in sizes} for name in meths}
    shipped: dict[str, list[float]] = {f"shipped [{e}]": [] for e in d.shipped}
    for seed in seeds:
        t0 = time.time()
        ds = resplit(d, seed)
        for e, sc in ds.shipped.items():
            shipped[f"shipped [{e}]"].append(apgr(sc[ds.hold], ds))
        for name, method in meths.items():
            for n in sizes:
                vals = []
                for r in range(draws):
                    perm = np.random.default_rng(1000 + r).permutation(ds.pool)
                    vals.append(apgr(method(ds, np.sort(perm[:n]), r), ds))
                out[name][n].append(float(np.mean(vals)))
        print(f"split {seed} done ({time.time() - t0:.0f}s)", flush=True)
    return out, shipped


def report_splits(
    out: dict[str, dict[int, list[float]]],
    shipped: dict[str, list[float]],
    sizes: Sequence[int],
    seeds: Sequence[int],
    draws: int,
    chosen: Sequence[str],
) -> str:
    """Mean over held-out splits [95% t-interval over splits]; paired differences for the chosen methods."""
    lines = [
        f"{len(seeds)} held-out splits (prompt-hash seeds {seeds[0]}-{seeds[-1]}, {HOLDOUT} prompts each), "
        f"{draws} draws per size and split. Cells: mean APGR [95% t-interval over splits].",
        "",
        "Shipped router: "
        + "; ".join(
            f"{k} {np.mean(v):.3f} [{t_interval(v)[1]:.3f}, {t_interval(v)[2]:.3f}]" for k, v in shipped.items()
        ),
        "",
        "| method | " + " | ".join(str(n) for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for name, per in out.items():
        cells = [
            f"{t_interval(per[n])[0]:.3f} [{t_interval(per[n])[1]:.3f}, {t_interval(per[n])[2]:.3f}]" for n in sizes
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name in chosen:
        if name not in out:
            continue
        refs = {k: {n: v for n in sizes} for k, v in shipped.items()}
        if BASELINE in out:
            refs[BASELINE] = out[BASELINE]
        lines += [
            "",
            f"{name} minus a reference, paired by split: mean [95% t-interval over splits]",
            "",
            "| reference | " + " | ".join(str(n) for n in sizes) + " |",
            "|---|" + "---|" * len(sizes),
        ]
        for ref_name, ref in refs.items():
            cells = []
            for n in sizes:
                m, lo, hi = t_interval(np.subtract(out[name][n], ref[n]).tolist())
                cells.append(f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]")
            lines.append(f"| {ref_name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(d: Data, meths: dict[str, Method], draws: int, sizes: Sequence[int]) -> dict[str, dict[int, list[np.ndarray]]]:
    """Held-out scores per method, size and draw."""
    out: dict[str, dict[int, list[np.ndarray]]] = {}
    for name, method in meths.items():
        t0 = time.time()
        out[name] = {n: [] for n in sizes}
        for r in range(draws):
            perm = np.random.default_rng(1000 + r).permutation(d.pool)
            for n in sizes:
                out[name][n].append(method(d, np.sort(perm[:n]), r))
        row = "  ".join(f"{n}:{np.mean([apgr(s, d) for s in out[name][n]]):.3f}" for n in sizes)
        print(f"{name:42s} {row}  ({time.time() - t0:.0f}s)", flush=True)
    return out


def report(
    d: Data, results: dict[str, dict[int, list[np.ndarray]]], sizes: Sequence[int], chosen: Sequence[str], draws: int
) -> str:
    mean_r, lo_r, hi_r = random_band(d)
    lines = [
        f"Held-out: {len(d.hold)} prompts (prompt hash, seed {d.holdout_seed}); pool {len(d.pool)}; "
        f"{draws} draws per size. Cells: mean APGR over draws [95% t-interval over draws].",
        "",
        f"Random router on the held-out set: {mean_r:.3f} (95% band {lo_r:.3f}-{hi_r:.3f}).",
        "",
    ]
    for name, sc in d.shipped.items():
        lines.append(f"Shipped router (bundled difficulty head, {name}): APGR {apgr(sc[d.hold], d):.3f}.")
    lines += ["", "| method | " + " | ".join(str(n) for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for name, per in results.items():
        cells = []
        for n in sizes:
            m, lo, hi = t_interval([apgr(s, d) for s in per[n]])
            cells.append(f"{m:.3f} [{lo:.3f}, {hi:.3f}]")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name in chosen:
        if name not in results:
            continue
        refs: dict[str, dict[int, list[np.ndarray]]] = {
            f"shipped [{enc}]": {n: [sc[d.hold]] * draws for n in sizes} for enc, sc in d.shipped.items()
        }
        if BASELINE in results:
            refs[BASELINE] = results[BASELINE]
        lines += [
            "",
            f"{name} minus a reference: mean over draws of the APGR difference [95% CI, paired bootstrap over "
            "the held-out prompts, 1,000 resamples]",
            "",
            "| reference | " + " | ".join(str(n) for n in sizes) + " |",
            "|---|" + "---|" * len(sizes),
        ]
        for ref_name, ref in refs.items():
            cells = []
            for n in sizes:
                p, lo, hi = paired_vs(d, results[name][n], ref[n])
                cells.append(f"{p:+.3f} [{lo:+.3f}, {hi:+.3f}]")
            lines.append(f"| {ref_name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--encoders", default="static,minilm")
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--sizes", type=int_list(), default=",".join(map(str, SIZES)))
    ap.add_argument("--methods", default="", help="|-separated substrings of method names (default: all)")
    ap.add_argument("--chosen", default="", help="|-separated methods to compare with the shipped router")
    ap.add_argument("--no-prior", action="store_true", help="skip the RouteLLM prior (faster start)")
    ap.add_argument("--holdout-seed", type=int, default=HOLDOUT_SEED)
    ap.add_argument("--splits", default="", help="e.g. 13-20: repeat over these held-out splits and average")
    ap.add_argument("--prior-sample", type=int, default=0, help="use a seeded sample of this many RouteLLM rows")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    encoders = [e for e in args.encoders.split(",") if e]
    sizes = args.sizes
    d = load_data(
        resolve_data_dir(args.data),
        encoders,
        with_prior=not args.no_prior,
        holdout_seed=args.holdout_seed,
        prior_sample=args.prior_sample,
    )
    print(f"{len(d.prompts)} prompts: held-out {len(d.hold)}, pool {len(d.pool)}", flush=True)
    meths = methods(encoders)
    if args.methods:
        keys = [k for k in args.methods.split("|") if k]
        meths = {n: m for n, m in meths.items() if any(k in n for k in keys)}
    if args.no_prior:
        meths = {n: m for n, m in meths.items() if "prior" not in n}
    chosen = [c for c in args.chosen.split("|") if c]
    if args.splits:
        lo, _, hi = args.splits.partition("-")
        seeds = list(range(int(lo), int(hi or lo) + 1))
        per_split, shipped = run_splits(d, meths, args.draws, sizes, seeds)
        text = report_splits(per_split, shipped, sizes, seeds, args.draws, chosen)
    else:
        results = run(d, meths, args.draws, sizes)
        text = report(d, results, sizes, chosen, args.draws)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
