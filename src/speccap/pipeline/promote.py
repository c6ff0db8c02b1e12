"""Promotion: the best learned gate on validation becomes `champion` only if it beats the current one.

Candidates and the current champion are compared on the same validation clips at the same budget
(each gate's threshold for `gates.promote_budget`, its flagged tokens judged by the R it carries
for the language): quality = BLEU-1 averaged over the languages.
A candidate that is the champion already (same gate file) is not re-promoted; a candidate that is
not strictly better leaves the alias where it is. The decision and its reason are returned (and
recorded on the model version by the flow).
"""

from __future__ import annotations

import statistics

from ..config import Params, gate_decode
from ..data.featurize import load_clip_features
from ..data.manifest import manifest_path, read_manifest
from ..decoding.engine import settings_from_params, speculative
from ..decoding.link import Link
from ..decoding.verify import rule_for_gate
from ..metrics.caption import score_captions


def validation_clips(params: Params) -> dict[str, list[dict]]:
    traced, asked = params.gates.traces.val_clips, params.gates.promote_clips  # 0 = all
    n = min(traced, asked) if traced and asked else traced or asked
    return {lang: read_manifest(manifest_path(params.data.processed_dir, "val", lang))[: n or None]
            for lang in params.data.languages}


def evaluate_gate(edge, cloud, gate, params: Params, clips: dict[str, list[dict]]) -> dict:
    """BLEU-1 per language and on average, and rho, of UGSD with `gate` on the clips."""
    out = {}
    rhos = []
    for lang, recs in clips.items():
        caps = []
        for rec in recs:
            mel, _ = load_clip_features(params.data.processed_dir, rec["id"])
            settings = settings_from_params(gate_decode(params), params.models.max_new_tokens, params.seed)
            settings.gate = gate
            settings.rule = rule_for_gate(settings.rule, gate, lang)  # its flagged tokens judged by its own R
            r = speculative(edge, cloud, mel, lang, settings, Link(params.link, seed=params.seed))
            caps.append(r.caption)
            rhos.append(r.metrics()["rho"])
        s = score_captions(caps, [r["references"] for r in recs], lang)
        out[lang] = s.bleu1
    out["bleu1"] = statistics.fmean(out[lang] for lang in clips)
    out["rho"] = statistics.fmean(rhos) if rhos else 0.0
    return out


def decide(candidates: dict[str, dict], champion: dict | None, champion_score: dict | None) -> dict:
    """candidates: name -> {"bleu1", "rho", "gates_key"}; champion: {"tags": {"gate", "gates_key"}} or None.
    Returns {"promote": name | None, "reason": str}."""
    if not candidates:
        return {"promote": None, "reason": "no candidate gates"}
    best = max(candidates, key=lambda n: candidates[n]["bleu1"])
    b = candidates[best]
    if champion is None:
        return {"promote": best, "reason": f"first champion: {best} BLEU-1 {b['bleu1']:.2f} at rho {b['rho']:.3f} "
                                           "on validation"}
    tags = champion.get("tags", {})
    if tags.get("gate") == best and tags.get("gates_key") == b.get("gates_key"):
        return {"promote": None, "reason": f"{best} is the champion already"}
    c = champion_score or {"bleu1": float("-inf"), "rho": 0.0}
    if b["bleu1"] > c["bleu1"]:
        return {"promote": best, "reason": f"{best} BLEU-1 {b['bleu1']:.2f} (rho {b['rho']:.3f}) beats the champion "
                                           f"(version {champion.get('version')}, {tags.get('gate')}) "
                                           f"{c['bleu1']:.2f} (rho {c['rho']:.3f}) on validation at equal budget"}
    return {"promote": None, "reason": f"{best} BLEU-1 {b['bleu1']:.2f} does not beat the champion "
                                       f"(version {champion.get('version')}, {tags.get('gate')}) {c['bleu1']:.2f}"}
