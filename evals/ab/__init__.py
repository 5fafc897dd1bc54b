"""A/B analysis of routing experiments: per-arm quality, cost and latency with always-valid statistics.

    data = await load_experiment(store, "knob-vs-utility")      # evals.ab.load
    report = analyze(data, Options(alpha=0.05))                 # evals.ab.analysis
    write_ab_report(report, Path("out"), formats={"md", "html", "json"})   # evals.ab.render

``pointsman ab report EXPERIMENT --store URL`` does all three (:mod:`evals.ab.cli`).
"""

from evals.ab.analysis import Options, analyze, difference_path
from evals.ab.data import ArmSpec, ExperimentData, ServedRows, ShadowRows, experiment_data, served_rows
from evals.ab.verdict import ArmVerdict, arm_verdict, winner

__all__ = [
    "ArmSpec",
    "ArmVerdict",
    "ExperimentData",
    "Options",
    "ServedRows",
    "ShadowRows",
    "analyze",
    "arm_verdict",
    "difference_path",
    "experiment_data",
    "served_rows",
    "winner",
]
