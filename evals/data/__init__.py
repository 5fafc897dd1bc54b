"""Routing data sets: RouteLLM (GPT-4 vs Mixtral) and RouterBench-train (11 models with costs)."""

from evals.data.domains import DOMAINS
from evals.data.paths import resolve_data_dir
from evals.data.records import MultiModelRecord, PairRecord
from evals.data.routellm import STRONG, WEAK, load_gsm8k, load_mmlu, load_mt_bench, load_routellm
from evals.data.routerbench import load_routerbench
from evals.data.split import DEFAULT_SEED, Split, fold_of, split_indices, split_of

__all__ = [
    "DEFAULT_SEED",
    "DOMAINS",
    "STRONG",
    "WEAK",
    "MultiModelRecord",
    "PairRecord",
    "Split",
    "fold_of",
    "load_gsm8k",
    "load_mmlu",
    "load_mt_bench",
    "load_routellm",
    "load_routerbench",
    "resolve_data_dir",
    "split_indices",
    "split_of",
]
