"""Benchmark scripts refuse a bad comma-separated list value as a usage error (exit 2, naming the option)
before doing any work: no traceback, no fake upstream or gateway started first."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from bench._args import float_list, int_list

ROOT = Path(__file__).resolve().parents[2]

# (script, option, a value its old bare int()/float() parse raised a traceback on)
CASES = [
    ("adaptation.py", "--sizes", "abc"),
    ("adaptation_research.py", "--sizes", "abc"),
    ("agent_replicas.py", "--replicas", "abc"),
    ("cascade_live.py", "--samples", "abc"),
    ("cascade_live.py", "--samples", "1"),  # an agreement cascade takes 2..16 samples
    ("compare_overhead.py", "--concurrency", "abc"),
    ("compare_overhead.py", "--delays", "abc"),
    ("knob_seed.py", "--targets", "abc"),
    ("knob_seed.py", "--targets", "1.5"),
    ("limits_overhead.py", "--concurrency", "abc"),
    ("proxy_overhead.py", "--concurrency", "abc"),
    ("upstream_client.py", "--concurrency", "abc"),
    ("decision_latency.py", "--concurrency", "abc"),
    ("decision_latency.py", "--cpus", "abc"),
    ("loadgen.py", "--cpus", "abc"),
    ("feedback.py", "--concurrency", "abc"),
    ("feedback.py", "--concurrency", "0"),
]


@pytest.mark.parametrize(("script", "option", "value"), CASES, ids=[f"{s}{o}={v}" for s, o, v in CASES])
def test_a_bad_list_value_is_a_usage_error_before_any_work(
    tmp_path: Path, script: str, option: str, value: str
) -> None:
    args = [option, value]
    if script == "loadgen.py":
        args += ["--url", "http://127.0.0.1:9/v1/chat/completions"]  # its one required option
    # cwd is a scratch directory: a script that got as far as writing results would write them here.
    run = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert f"argument {option}: {value!r}" in run.stderr, run.stderr
    assert run.stdout == ""  # nothing started, nothing measured


def test_list_types() -> None:
    assert int_list()("1, 16,,64") == [1, 16, 64]
    assert int_list(minimum=0, allow_empty=True)("") == []
    assert float_list(minimum=0)("50,0") == [50.0, 0.0]
    for parse, text in [(int_list(), ""), (int_list(), "1.5"), (int_list(), "0"), (int_list(maximum=16), "17"),
                        (float_list(), "nan"), (float_list(), "inf"), (float_list(maximum=1), "1.01")]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)
