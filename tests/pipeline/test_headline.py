"""The headline: what an experiment is judged by, the one metrics file DVC prints."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from speccap.pipeline.headline import HeadlineError, headline, write_headline

ROOT = Path(__file__).resolve().parents[2]


def _reports(tmp_path, champion="tok-lightgbm-critical", budget=0.1):
    metrics = {lang: {"edge": {"bleu1": 60.0, "emotion_hit_rate": 30.0},
                      "cloud": {"bleu1": 80.0, "emotion_hit_rate": 90.0},
                      "ugsd": {"bleu1": 70.0, "emotion_hit_rate": 45.0, "rho": 0.1234, "total_time": 0.31234}}
               for lang in ("en", "zh")}
    row = {"budget": budget, "rho": 0.09876, "bleu1": {"value": 75.04, "ci_low": 70.0, "ci_high": 79.0},
           "emotion_hit_rate": {"value": 84.0, "ci_low": 80.0, "ci_high": 88.0}}
    gates = {"languages": {lang: {"gates": {champion: [row | {"budget": 0.05}, row], "entropy": [row]}}
                           for lang in ("en", "zh")}}
    promotion = {"budget": budget, "champion_after": {"version": "3", "tags": {"gate": champion}}}
    for rel, body in (("metrics.json", metrics), ("gates/gates.json", gates), ("promotion.json", promotion)):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps(body))
    return metrics, gates, promotion


def test_the_headline_holds_each_method_and_the_promoted_gate_at_its_budget(tmp_path):
    _reports(tmp_path)
    out = write_headline(["en", "zh"], tmp_path, tmp_path / "headline.json")
    assert json.loads((tmp_path / "headline.json").read_text()) == out
    en = out["en"]
    assert en["edge"] == {"bleu1": 60.0, "emotion": 30.0} and en["cloud"] == {"bleu1": 80.0, "emotion": 90.0}
    assert en["ugsd"] == {"bleu1": 70.0, "emotion": 45.0, "rho": 0.123, "seconds": 0.312}
    # the promoted gate's row at the promote budget, not the other budget's
    assert en["gate"] == {"bleu1": 75.0, "emotion": 84.0, "rho": 0.099, "gap_bleu1": 75.0, "gap_emotion": 90.0}
    assert list(out) == ["en", "zh"]


def test_what_a_run_does_not_measure_is_left_out(tmp_path):
    """MER2024 names no emotion per clip: no emotion hit, so no emotion figure and no emotion gap."""
    metrics, gates, promotion = _reports(tmp_path)
    for lang in metrics:
        for m in metrics[lang].values():
            m["emotion_hit_rate"] = None
    for entries in gates["languages"]["en"]["gates"].values():
        for e in entries:
            e.pop("emotion_hit_rate", None)
    en = headline(metrics, gates, promotion, ["en"])["en"]
    assert en["edge"] == {"bleu1": 60.0} and set(en["ugsd"]) == {"bleu1", "rho", "seconds"}
    assert en["gate"] == {"bleu1": 75.0, "rho": 0.099, "gap_bleu1": 75.0}


def test_a_missing_report_or_row_is_named(tmp_path):
    metrics, gates, promotion = _reports(tmp_path)
    with pytest.raises(HeadlineError, match="no row of the promoted gate 'tok-x' at budget 0.1 in en"):
        headline(metrics, gates, promotion | {"champion_after": {"tags": {"gate": "tok-x"}}}, ["en"])
    with pytest.raises(HeadlineError, match="en lacks edge-only, cloud-only or the default UGSD"):
        headline(metrics | {"en": {"edge": None}}, gates, promotion, ["en"])
    (tmp_path / "promotion.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"promotion.json: not there .*dvc repro promote"):
        write_headline(["en"], tmp_path, tmp_path / "headline.json")


def test_dvc_declares_the_headline_as_its_only_metrics():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    declared = [next(iter(m)) if isinstance(m, dict) else m for s in stages.values() for m in s.get("metrics", [])]
    assert declared == ["reports/headline.json"]


def test_dvc_metrics_show_is_a_short_table():
    """On the committed headline: what a newcomer's `dvc metrics show` prints (the target: < 5,000 characters)."""
    done = subprocess.run(["dvc", "metrics", "show"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "reports/headline.json" in done.stdout and "gate.gap_bleu1" in done.stdout
    assert len(done.stdout) < 5000, len(done.stdout)
