"""Promotion: the best learned gate on validation becomes `champion` only if it beats the current one.

Candidates and the current champion are compared on the same validation clips at the same budget
(each gate's threshold for `gates.promote_budget`, its flagged tokens judged by the R it carries
for the language). Score: how much of both gaps the gate closes, the gates' two targets. Edge-only
and cloud-only caption the same clips; per language the score is the mean of the share (%) of the
BLEU-1 gap and of the emotion-hit gap the gate closes, then the mean over the languages. A metric
whose gap is not positive on these clips (nothing to close) is left out, and a language with
neither falls back to the mean of BLEU-1 and the emotion hit rate (BLEU-1 alone without labels).
A candidate that is the champion already (same gate file) is not re-promoted; a candidate that is
not strictly better leaves the alias where it is. The decision and its reason are returned and
recorded on the model version (`run_promote`: the `promote` stage start to end). The champion ships
as its gate file, models/champion.gate.json (gating.gate_file, stamped with its registered name and
version): the very file the registry holds, which a device loads without MLflow (`speccap edge
--gate FILE`).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from ..config import Params, gate_decode
from ..data.featurize import load_clip_features
from ..decoding.build import DecodeSpec, build_decoder
from ..decoding.engine import cloud_only, edge_only, speculative
from ..decoding.link import Link
from ..gating.gate_file import write_gate
from ..metrics.bootstrap import bleu1_emotion
from ..metrics.caption import score_captions
from ..models.base import shared_vocab
from ..models.loading import load_role
from ..project import portable_path
from ..tracking import Tracker
from .gates import read_gates_json
from .saved import champion_path, gate_from_document, load_gate
from .trace_refs import training_clips
from .workers import Decode, in_process

OUT = Path("reports/promotion.json")


def validation_clips(params: Params) -> dict[str, list[dict]]:
    traced, asked = params.gates.traces.val_clips, params.gates.promote_clips  # 0 = all
    n = min(traced, asked) if traced and asked else traced or asked
    return {lang: training_clips(params, "val", lang)[: n or None]
            for lang in params.data.languages}


def score_of(bleu1: float, emotion_hit_rate: float | None, ends: dict | None = None) -> float:
    """A language's promotion score: with `ends` ({"edge": ..., "cloud": ...}, each {"bleu1",
    "emotion_hit_rate"} on the same clips), the mean share (%) of the positive gaps closed; without
    (or with no positive gap), the mean of BLEU-1 and the emotion hit rate, or BLEU-1 alone without
    emotion labels."""
    got = {"bleu1": bleu1, "emotion_hit_rate": emotion_hit_rate}
    shares = [] if ends is None else [
        100 * (got[k] - ends["edge"][k]) / (ends["cloud"][k] - ends["edge"][k]) for k in got
        if got[k] is not None and ends["edge"][k] is not None and ends["cloud"][k] - ends["edge"][k] > 0]
    if shares:
        return statistics.fmean(shares)
    return bleu1 if emotion_hit_rate is None else bleu1_emotion(bleu1, emotion_hit_rate)


def _scored(made: list, recs: list[dict], lang: str) -> dict:
    s = score_captions([r.caption for r in made], [r["references"] for r in recs], lang,
                       [r.get("emotion") for r in recs])
    return {"bleu1": s.bleu1, "emotion_hit_rate": s.emotion_hit_rate}


def evaluate_ends(decode: Decode, params: Params, clips: dict[str, list[dict]]) -> dict:
    """Per language, edge-only's and cloud-only's BLEU-1 and emotion hit rate on the clips: the ends
    of the gaps a gate is scored on. `decode(fn, jobs)`: the stage's models running `fn` on every job
    (workers.in_process)."""
    n, link = params.models.max_new_tokens, Link(params.link, seed=params.seed)
    out = {}
    for lang, recs in clips.items():
        def edge_one(e, c, rec, lang=lang):
            return edge_only(e, load_clip_features(params.data.processed_dir, rec["id"])[0], lang, n)

        def cloud_one(e, c, rec, lang=lang):
            return cloud_only(c, load_clip_features(params.data.processed_dir, rec["id"])[0], lang, link, n)
        out[lang] = {end: _scored(decode(fn, recs), recs, lang)
                     for end, fn in (("edge", edge_one), ("cloud", cloud_one))}
    return out


def evaluate_gate(decode: Decode, gate, params: Params, clips: dict[str, list[dict]], ends: dict | None = None) -> dict:
    """Per language BLEU-1, emotion hit rate and score (score_of, against `ends` when given: see
    evaluate_ends), their means over the languages ("bleu1", "emotion_hit_rate" when every language
    has one, "score"), and rho, of UGSD with `gate` on the clips."""
    out, per = {}, {}
    rhos = []
    for lang, recs in clips.items():
        # its flagged tokens judged by its own R for the language
        spec = DecodeSpec.from_params(params, gate_decode(params), gate=gate.name or "candidate",
                                    threshold=None, gate_rank=lang)  # the gate object holds its own

        def one(e, c, rec, spec=spec, lang=lang):
            mel, _ = load_clip_features(params.data.processed_dir, rec["id"])
            settings = build_decoder(spec, learned=lambda _spec: gate)
            return speculative(e, c, mel, lang, settings, Link(params.link, seed=params.seed))

        made = decode(one, recs)
        rhos.extend(r.metrics()["rho"] for r in made)
        per[lang] = _scored(made, recs, lang)
        per[lang]["score"] = score_of(per[lang]["bleu1"], per[lang]["emotion_hit_rate"], (ends or {}).get(lang))
    out["languages"] = per
    for key in ("bleu1", "emotion_hit_rate", "score"):
        vals = [v[key] for v in per.values()]
        if vals and all(v is not None for v in vals):
            out[key] = statistics.fmean(vals)
    out["rho"] = statistics.fmean(rhos) if rhos else 0.0
    return out


def _describe(s: dict) -> str:
    emotion = "" if s.get("emotion_hit_rate") is None else f", emotion hit {s['emotion_hit_rate']:.1f}%"
    return f"score {s['score']:.2f} (BLEU-1 {s['bleu1']:.2f}{emotion}, rho {s['rho']:.3f})"


def decide(candidates: dict[str, dict], champion: dict | None, champion_score: dict | None) -> dict:
    """candidates: name -> {"score", "bleu1", "rho", "gates_key"} (evaluate_gate's, emotion_hit_rate
    optional); champion: {"tags": {"gate", "gates_key"}} or None. Returns {"promote": name | None,
    "reason": str}."""
    if not candidates:
        return {"promote": None, "reason": "no candidate gates"}
    best = max(candidates, key=lambda n: candidates[n]["score"])
    b = candidates[best]
    if champion is None:
        return {"promote": best, "reason": f"first champion: {best} {_describe(b)} on validation"}
    tags = champion.get("tags", {})
    if tags.get("gate") == best and tags.get("gates_key") == b.get("gates_key"):
        return {"promote": None, "reason": f"{best} is the champion already"}
    who = f"the champion (version {champion.get('version')}, {tags.get('gate')})"
    if champion_score is None:
        return {"promote": best, "reason": f"{best} {_describe(b)} replaces {who}, which could not be scored"}
    if b["score"] > champion_score["score"]:
        return {"promote": best, "reason": f"{best} {_describe(b)} beats {who} {_describe(champion_score)} "
                                           "on validation at equal budget"}
    return {"promote": None, "reason": f"{best} {_describe(b)} does not beat {who} {_describe(champion_score)}"}


def run_promote(params: Params) -> dict:
    """The `promote` stage, start to end: edge-only, cloud-only, each target's chosen gate and the
    current champion decoded on the validation clips, the decision applied in the registry, the
    champion shipped; reports/promotion.json is what it returns."""
    torch.set_num_threads(params.sweep.threads * max(params.sweep.workers, 1))
    gates_json = read_gates_json(params)
    edge, cloud = load_role(params, "edge"), load_role(params, "cloud")
    shared_vocab(edge, cloud)
    clips = validation_clips(params)
    decode = in_process(params, edge, cloud)
    ends = evaluate_ends(decode, params, clips)  # the gaps every gate is scored on
    candidates = {}
    for name in dict.fromkeys(gates_json["chosen"].values()):  # per target, the classifier chosen on validation
        gate = load_gate(params, name)  # at the promote budget's threshold
        candidates[name] = evaluate_gate(decode, gate, params, clips, ends) | {
            "gates_key": gates_json["gates_key"], "version": gates_json["versions"][name]}
    tracker = Tracker.for_stage(params.tracking.uri, params.tracking.experiment, "promote")
    name = params.gates.registry_name
    champ = tracker.champion(name)
    champ_score = None
    if champ is not None:
        champ_score = evaluate_gate(decode, gate_from_document(tracker.load_gate(name, "champion"), name="champion"),
                                    params, clips, ends)
    decision = decide(candidates, champ, champ_score)
    if decision["promote"]:
        tracker.promote(name, candidates[decision["promote"]]["version"], decision["reason"])
    shipped = write_gate(champion_path(params), tracker.load_gate(name, "champion"))
    result = {"budget": params.gates.promote_budget, "ends": ends, "candidates": candidates,
              "champion_before": champ, "champion_score": champ_score, **decision,
              "champion_after": tracker.champion(name), "shipped": portable_path(shipped)}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1, default=str))
    return result
