"""The routing probes file must hold: every probe gets the routing it expects (offline, real brain)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.probes import load_probe_config, load_probes, run_probes

PROBES = Path(__file__).resolve().parents[2] / "probes" / "routing.yaml"


async def test_every_probe_passes() -> None:
    config = load_probe_config(PROBES)
    assert config is not None
    results = await run_probes(config, load_probes(PROBES))
    failures = [f"{r.probe.name}: {'; '.join(r.failures)}" for r in results if not r.passed]
    assert not failures, "\n".join(failures)
    assert len(results) >= 8


def test_probe_cli_reports_and_fails_on_a_wrong_expectation(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "gateway.cli", "probe", str(PROBES)],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "0 failed" in ok.stdout
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(PROBES.read_text().replace("expect: {blocked: true}", "expect: {blocked: false}", 1))
    bad = subprocess.run([sys.executable, "-m", "gateway.cli", "probe", str(wrong)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert "FAIL  jailbreak in the last turn is blocked" in bad.stdout


def test_probe_file_errors_name_the_probe(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("probes:\n  - name: x\n    prompt: hi\n    expect: {modle: a}\n")
    with pytest.raises(ValueError, match=r"probes\.0\.expect: unknown key\(s\) modle \(expected model, rule"):
        load_probes(broken)
    broken.write_text("probes:\n  - prompt: 42\n    expect: {model: a}\n")
    with pytest.raises(ValueError, match=r"probes\.0\.prompt: expected text, got int"):
        load_probes(broken)
    broken.write_text("probes: [unclosed\n")
    with pytest.raises(ValueError, match=r"broken\.yaml: not valid YAML"):
        load_probes(broken)
    with pytest.raises(ValueError, match=r"cannot read probes file .*missing\.yaml"):
        load_probes(tmp_path / "missing.yaml")


def test_expect_may_name_just_the_model(tmp_path: Path) -> None:
    short = tmp_path / "short.yaml"
    short.write_text("probes:\n  - prompt: hi\n    expect: small-model\n")
    (probe,) = load_probes(short)
    assert probe.expect == {"model": "small-model"}
