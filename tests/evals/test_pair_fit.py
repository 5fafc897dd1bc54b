"""fit_pair_difficulty on synthetic data whose gain structure is known."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from classifiers.heads import load_head
from evals.metrics import evaluate_scores
from evals.pair_fit import PairPrior, fit_pair_difficulty, inner_folds, rank_gain


def _synthetic(n: int, seed: int, d: int = 48, flip: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features whose first column decides who needs the strong model.

    The weak model is right on "easy" prompts (x0 < 0) 90% of the time and on hard ones 10%; the strong
    model is right 90% of the time everywhere. So the gain grows with x0 (or falls, when
    ``flip``), and the other columns are noise.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    hard = x[:, 0] < 0 if flip else x[:, 0] > 0
    strong = (rng.random(n) < 0.9).astype(float)
    weak = (rng.random(n) < np.where(hard, 0.1, 0.9)).astype(float)
    return x, strong, weak


def test_head_ranks_prompts_needing_the_strong_model_higher() -> None:
    x, s, w = _synthetic(400, seed=1)
    head, report = fit_pair_difficulty(x, s, w, np.ones(len(x)), seed=0)
    assert head.labels == ("weak_ok", "strong_needed")
    xt, st, wt = _synthetic(2000, seed=2)
    p = head.predict_proba(xt)[:, 1]
    hard = xt[:, 0] > 0
    # Probabilities: in [0, 1], and hard prompts score higher on average by a wide margin.
    assert ((p >= 0) & (p <= 1)).all()
    assert p[hard].mean() > p[~hard].mean() + 0.15
    # On fresh prompts the routing curve is close to the true score's (APGR 0.73; random ~0.5).
    ceiling = evaluate_scores(xt[:, 0], st, wt).apgr
    assert evaluate_scores(p, st, wt).apgr > ceiling - 0.06
    assert report["rows"] == 400


def test_calibrated_probability_tracks_the_strong_better_rate() -> None:
    x, s, w = _synthetic(1500, seed=3)
    head, _ = fit_pair_difficulty(x, s, w, np.ones(len(x)), seed=0)
    assert head.calibration["method"] == "platt"
    xt, st, wt = _synthetic(4000, seed=4)
    p = head.predict_proba(xt)[:, 1]
    better = (st > wt).astype(float)
    # Calibration in the large: the mean probability is the rate of "strong better" on fresh prompts.
    assert abs(p.mean() - better.mean()) < 0.03
    # Deciles of the probability: the observed rate rises from the lowest decile to the highest.
    deciles = [better[b].mean() for b in np.array_split(np.argsort(p), 10)]
    assert deciles[-1] - deciles[0] > 0.6
    # And it separates: hard prompts (true rate 0.9 * 0.9 = 0.81) vs easy ones (0.9 * 0.1 = 0.09).
    hard = xt[:, 0] > 0
    assert p[hard].mean() > 0.6 > 0.25 > p[~hard].mean()


def test_same_seed_same_head_and_saved_head_scores_the_same(tmp_path: Path) -> None:
    x, s, w = _synthetic(300, seed=5)
    a, ra = fit_pair_difficulty(x, s, w, np.ones(len(x)), seed=7)
    b, rb = fit_pair_difficulty(x, s, w, np.ones(len(x)), seed=7)
    assert ra == rb
    assert a.calibration == b.calibration
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])
    loaded = load_head(a.save(tmp_path / "head"))
    np.testing.assert_allclose(loaded.predict_proba(x), a.predict_proba(x))


def test_prior_steers_a_tiny_fit_and_new_data_overrides_it() -> None:
    # With 12 new rows the prior (same structure, 3000 rows) lifts the fit; when 1500 new rows
    # show the opposite structure, the new data wins over the prior.
    px, ps, pw = _synthetic(3000, seed=6)
    prior = PairPrior(px, ps, pw, np.ones(len(px)))
    xt, st, wt = _synthetic(2000, seed=8)
    few_x, few_s, few_w = _synthetic(12, seed=9)
    with_prior, _ = fit_pair_difficulty(few_x, few_s, few_w, np.ones(12), seed=0, prior=prior)
    without, _ = fit_pair_difficulty(few_x, few_s, few_w, np.ones(12), seed=0)
    apgr_prior = evaluate_scores(with_prior.predict_proba(xt)[:, 1], st, wt).apgr
    apgr_none = evaluate_scores(without.predict_proba(xt)[:, 1], st, wt).apgr
    assert apgr_prior > 0.62
    assert apgr_prior > apgr_none + 0.03

    fx, fs, fw = _synthetic(1500, seed=10, flip=True)
    xf, sf, wf = _synthetic(2000, seed=11, flip=True)
    overridden, _ = fit_pair_difficulty(fx, fs, fw, np.ones(len(fx)), seed=0, prior=prior)
    ceiling = evaluate_scores(-xf[:, 0], sf, wf).apgr
    assert evaluate_scores(overridden.predict_proba(xf)[:, 1], sf, wf).apgr > ceiling - 0.06


def test_weights_count_rows() -> None:
    # Weight 0 rows are ignored: fitting on rows with zero-weight garbage equals fitting without them.
    x, s, w = _synthetic(300, seed=12)
    junk_x, junk_s, junk_w = _synthetic(100, seed=13, flip=True)
    weight = np.concatenate([np.ones(300), np.zeros(100)])
    xt, st, wt = _synthetic(2000, seed=14)
    head, _ = fit_pair_difficulty(
        np.vstack([x, junk_x]), np.concatenate([s, junk_s]), np.concatenate([w, junk_w]), weight, seed=0
    )
    assert evaluate_scores(head.predict_proba(xt)[:, 1], st, wt).apgr > evaluate_scores(xt[:, 0], st, wt).apgr - 0.06


def test_rank_gain_is_zero_for_a_constant_scorer_and_positive_for_the_oracle() -> None:
    gain = np.array([1.0, 0.0, -1.0, 1.0, 0.0])
    ones = np.ones(5)
    assert rank_gain(np.zeros(5), gain, ones) == 0.0
    assert rank_gain(gain, gain, ones) > 0
    assert rank_gain(-gain, gain, ones) < 0


def test_fixed_prior_weight_and_prior_off() -> None:
    px, ps, pw = _synthetic(2000, seed=15)
    prior = PairPrior(px, ps, pw, np.ones(len(px)))
    x, s, w = _synthetic(40, seed=16, flip=True)
    # A fixed weight is used as given (2x the new rows' total weight) and reported; no choice is made.
    heavy, report = fit_pair_difficulty(x, s, w, np.ones(40), seed=0, prior=prior, prior_weight=2.0)
    assert report["prior_weight_rows"] == 80.0 and report["prior_rows"] == 2000
    assert all("prior_rows=80," in k for k in report["cv_mse"])
    # Weight 0 is the fit without a prior, exactly.
    off, off_report = fit_pair_difficulty(x, s, w, np.ones(40), seed=0, prior=prior, prior_weight=0.0)
    none, _ = fit_pair_difficulty(x, s, w, np.ones(40), seed=0)
    np.testing.assert_array_equal(off.params["coef"], none.params["coef"])
    assert off_report["prior_rows"] == 0
    # The heavy prior pulls the head towards the prior's structure (x0 > 0 hard), the unweighted fit
    # follows the new rows (x0 < 0 hard).
    xt = np.zeros((2, x.shape[1]))
    xt[:, 0] = [2.0, -2.0]
    assert np.diff(heavy.predict_proba(xt)[:, 1])[0] < 0
    assert np.diff(none.predict_proba(xt)[:, 1])[0] > 0


def test_a_handful_of_rows_uses_the_defaults_and_still_fits() -> None:
    px, ps, pw = _synthetic(2000, seed=17)
    x, s, w = _synthetic(4, seed=18)
    head, report = fit_pair_difficulty(x, s, w, np.ones(4), seed=0, prior=PairPrior(px, ps, pw, np.ones(2000)))
    assert report["folds"] == 0 and report["cv_mse"] == {} and head.calibration == {"method": "none"}
    xt, st, wt = _synthetic(2000, seed=19)
    assert evaluate_scores(head.predict_proba(xt)[:, 1], st, wt).apgr > 0.65


def test_bad_input_is_refused() -> None:
    x, s, w = _synthetic(20, seed=20)
    for kwargs, message in (
        ({"weight": np.zeros(20)}, "weights"),
        ({"weight": np.ones(19)}, "same number of rows"),
        ({"prior_weight": -1.0}, "prior_weight"),
    ):
        args: dict = {"weight": np.ones(20), **kwargs}
        with pytest.raises(ValueError, match=message):
            fit_pair_difficulty(x, s, w, args.pop("weight"), seed=0, **args)
    with pytest.raises(ValueError, match="features"):
        fit_pair_difficulty(x, s, w, np.ones(20), seed=0, prior=PairPrior(x[:, :5], s, w, np.ones(20)))


def _clustered(n: int, seed: int, centre: int, hard_sign: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unit-norm 'embeddings' around axis ``centre``; hard (weak model fails) where sign(x[:, 5]) == hard_sign."""
    rng = np.random.default_rng(seed)
    e = rng.normal(scale=0.25, size=(n, 16))
    e[:, centre] += 1.0
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    hard = np.sign(e[:, 5]) == hard_sign
    strong = (rng.random(n) < 0.9).astype(float)
    weak = (rng.random(n) < np.where(hard, 0.1, 0.9)).astype(float)
    return e, strong, weak


def test_the_prior_is_focused_on_prompts_like_the_new_traffic() -> None:
    # The prior mixes two kinds of prompts with opposite structures; the new traffic is of the first
    # kind. Focusing the prior on prompts like the traffic keeps the half that agrees with it.
    ax, as_, aw = _clustered(1500, seed=21, centre=0, hard_sign=1.0)
    bx, bs, bw = _clustered(1500, seed=22, centre=1, hard_sign=-1.0)
    prior = PairPrior(np.vstack([ax, bx]), np.concatenate([as_, bs]), np.concatenate([aw, bw]), np.ones(3000))
    x, s, w = _clustered(30, seed=23, centre=0, hard_sign=1.0)
    xt, st, wt = _clustered(3000, seed=24, centre=0, hard_sign=1.0)

    def apgr(focus: float) -> float:
        head, _ = fit_pair_difficulty(x, s, w, np.ones(30), seed=0, prior=prior, focus=focus)
        return evaluate_scores(head.predict_proba(xt)[:, 1], st, wt).apgr

    assert apgr(4.0) > apgr(0.0) + 0.05
    # The embedding columns were detected (all 16 columns are unit-norm rows); the default is no focus.
    _, report = fit_pair_difficulty(x, s, w, np.ones(30), seed=0, prior=prior)
    assert report["prior_focus"] == 0.0
    _, report = fit_pair_difficulty(x, s, w, np.ones(30), seed=0, prior=prior, focus=6.0)
    assert report["prior_focus"] == 6.0 and all(k.startswith("focus=6,") for k in report["cv_mse"])


def test_uninformative_labels_give_probabilities_near_the_base_rate_not_near_one_half() -> None:
    """Noise labels (the strong model better on ~20% of prompts, unrelated to the features): a 0.5
    threshold must not send nearly everything to the strong model, whatever the fit made of it."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(300, 24))
    strong = (rng.random(300) < 0.25).astype(float)
    weak = np.zeros(300)
    head, _ = fit_pair_difficulty(x, strong, weak, np.ones(300), seed=0)
    p = head.predict_proba(rng.normal(size=(1000, 24)))[:, 1]
    assert abs(p.mean() - strong.mean()) < 0.1, (p.mean(), strong.mean())
    assert (p >= 0.5).mean() < 0.2


def test_anti_correlated_out_of_fold_scores_keep_the_ranking_and_centre_on_the_rate() -> None:
    from evals.pair_fit import _platt_on_scores

    score = np.linspace(-0.2, 0.2, 200)
    label = score < -0.1  # higher score, *less* often strong-better: a negative Platt slope
    calibration = _platt_on_scores(score, label, np.ones(200))
    assert calibration["method"] == "platt" and calibration["a"] > 0  # ranking kept
    p = 1 / (1 + np.exp(-(calibration["a"] * score + calibration["b"])))
    assert abs(p.mean() - label.mean()) < 0.05


def test_a_prompt_judged_several_times_does_not_pick_a_penalty_that_memorises_it() -> None:
    """80 prompts of pure noise, each judged five times: folds by row put a prompt's copies on both sides,
    the held-out copy was fitted already, and the weakest penalty won (300: a head fitted to noise). Folds
    keep a prompt's rows together, so the choice is the one the 80 distinct prompts make (the strongest)."""
    rng = np.random.default_rng(0)
    prompts, copies = 80, 5
    x = rng.normal(size=(prompts, 32))
    strong, weak = (rng.integers(0, 2, prompts).astype(float) for _ in range(2))
    keys = [f"prompt {i}" for i in np.repeat(np.arange(prompts), copies)]
    once, _ = fit_pair_difficulty(x, strong, weak, np.ones(prompts), seed=0, embedding_dim=32)
    repeated = [np.repeat(a, copies, axis=0) for a in (x, strong, weak)]
    _, grouped = fit_pair_difficulty(*repeated, np.ones(prompts * copies), seed=0, embedding_dim=32, groups=keys)
    tried = [float(name.rsplit("alpha=", 1)[1]) for name in grouped["cv_mse"]]
    assert grouped["alpha"] == once.config["alpha"] == max(tried)


def test_inner_folds_keep_a_prompts_rows_together_and_are_unchanged_for_distinct_prompts() -> None:
    groups = ["a", "b", "a", "c", "b", "a", "d", "e", "f", "g", "c", "h"]
    folds = inner_folds(len(groups), 5, seed=3, groups=groups)
    for g in set(groups):
        assert len({folds[i] for i, h in enumerate(groups) if h == g}) == 1
    distinct = [f"p{i}" for i in range(12)]
    assert (inner_folds(12, 5, seed=3, groups=distinct) == inner_folds(12, 5, seed=3)).all()
