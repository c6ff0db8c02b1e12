"""The `privacy` stage, start to end: what the uplink reveals about the speech.

For what the edge sends (`uplink:`) and the candidates of `privacy.candidates`: speech rebuilt
from each by two attackers (STOI against the original), and the voice named and verified from each
(speccap.pipeline.privacy). Writes reports/privacy/ (speccap.pipeline.privacy_report) and logs one
MLflow run per representation in the "<experiment>-privacy" experiment.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config import Params
from ..tracking import Tracker
from .privacy import measure
from .privacy_report import plot, render, target_met

OUT = Path("reports/privacy")


def run_privacy(params: Params) -> dict:
    """Measure, write reports/privacy/, log; the clips, each representation's STOI and those that
    meet the privacy targets are what it returns."""
    result = measure(params, params.features.workers)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "privacy.json").write_text(json.dumps(result, indent=1) + "\n")
    (OUT / "privacy.md").write_text(render(result))
    plot(result, OUT / "privacy.png")
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "privacy")
    key = f"privacy-{params.privacy.clips}-{params.privacy.train_clips}"
    with tracker.sweep(key, {"privacy": params.privacy.__dict__}, {"sweep_key": key, "stage": "privacy"}) as parent:
        for w in result["wires"]:
            learned = {"learned_encoder": w["digest"]} if "learned" in w else {}  # rows, not bands
            tracker.log_config(parent, f"{key}-{w['rows']}-{w['merge']}-{w['normalize']}"
                               + (f"-{w['digest']}" if learned else ""), w["name"],
                               {"representation": w["name"], "bands": w["rows"], "merge": w["merge"],
                                "normalize": w["normalize"], "hop": w["hop"] * w["merge"], "sent_today": w["sent"],
                                **learned}, _metrics(w))
        tracker.log_artifacts(parent, [OUT / "privacy.md", OUT / "privacy.png", OUT / "privacy.json"])
    return {"clips": result["clips"], "stoi": {w["name"]: round(w["stoi"]["value"], 3) for w in result["wires"]},
            "target_met": [w["name"] for w in result["wires"] if target_met(w)]}


def _metrics(w: dict) -> dict:
    m = {"bytes_per_second": w["bytes_per_second"], "target_met": target_met(w)}
    for name, ci in (("stoi", w["stoi"]), ("voice_id", w["voice_id"].get("accuracy"))):
        if ci:
            m |= {name: ci["value"], f"{name}_ci_low": ci["ci_low"], f"{name}_ci_high": ci["ci_high"]}
    m |= {f"stoi_{k.replace(' ', '_')}": ci["value"] for k, ci in w["stoi_by_attacker"].items()}
    if w["voice_id"]["measured"]:
        v = w["voice_id"]
        m |= {"commonest_voice": v["majority"], "speaker_eer": v["eer"]["value"], "speaker_eer_ci_low": v["eer"]["ci_low"],
              "speaker_eer_ci_high": v["eer"]["ci_high"]}
        m |= {f"voice_id_{k.replace(' ', '_')}": x for k, x in v["accuracy_by_attacker"].items()}
    return m
