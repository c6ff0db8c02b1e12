"""DVC stage `privacy` as its flow runs it: on the tiny project's TTS clips, into reports/privacy/ and
one MLflow run per representation."""

import json
from pathlib import Path

import pytest

from flows.privacy import privacy_flow
from speccap.tracking import Tracker

from .views import check_view

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server")]


def test_privacy_flow_reports_each_representation(own_project, tmp_path):
    _, raw, pfile = own_project("privacy-test", privacy={
        "clips": 2, "train_clips": 4, "candidates": [{"bands": 8, "merge": 4}, {"bands": 8, "merge": 4, "normalize": "clip"}]})
    out = privacy_flow(str(pfile))
    r = json.loads(Path("reports/privacy/privacy.json").read_text())
    assert out["clips"] == r["clips"] == 4  # 2 per language
    assert [w["name"] for w in r["wires"]] == ["log-mel 128 bands, hop 320 (what the edge sends)",
                                               "log-mel 8 bands, hop 1280", "log-mel 8 bands, hop 1280, clip-normalised"]
    today, coarse, normalised = r["wires"]
    assert normalised["voice_id"]["attacker"] in ("clip statistics", "frames")
    assert today["stoi"]["value"] > coarse["stoi"]["value"] > r["floor"]["value"]
    for w in r["wires"]:
        assert w["stoi"]["ci_low"] <= w["stoi"]["value"] <= w["stoi"]["ci_high"]
        # both attackers rebuilt it; the stronger is the one counted
        assert set(w["stoi_by_attacker"]) == {"spread back", "learned inverter"}
        assert w["stoi"] == max(w["stoi_by_attacker"].values(), key=lambda ci: ci["value"])
        assert 0 <= w["voice_id"]["eer"]["value"] <= 100
    md = Path("reports/privacy/privacy.md").read_text()
    assert "| log-mel 8 bands, hop 1280 | 200 |" in md and "Target (rebuilt-speech STOI at most 0.3" in md
    assert Path("reports/privacy/privacy.png").stat().st_size > 5000
    tracker = Tracker(raw["tracking"]["uri"], "privacy-test-privacy")  # the privacy experiment
    rows = [x for x in tracker.runs() if "config_id" in x["tags"]]
    assert sorted((x["params"]["hop"], x["params"]["normalize"]) for x in rows) == [
        ("1280", "clip"), ("1280", "none"), ("320", "none")]
    sent = next(x for x in rows if x["params"]["sent_today"] == "True")
    assert sent["metrics"]["stoi"] == pytest.approx(today["stoi"]["value"])
    assert sent["metrics"]["speaker_eer"] == pytest.approx(today["voice_id"]["eer"]["value"])
    check_view(tracker, "privacy")
