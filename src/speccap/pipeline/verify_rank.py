"""How strictly the cloud judges a token the gate flagged: R of the rank rule per language, chosen
on validation (the `gates` stage, params gates.verify_ranks).

A flagged token was chosen because the edge is likely wrong there. Under rank-R (R = decode.rank)
the edge's token stands when it is among the cloud's top R, which can hand the word back to the
edge exactly where it matters (on the embedded testbed: the quote's first word, where the edge's
usual "The" is often the cloud's second choice). Greedy judgement (R = 1) replaces it instead, at
the same escalations: the gate flags the same tokens, only the verdict differs. Whether that helps
depends on the language and the models, so it is measured, not assumed: the chosen gate of the
main target (pipeline.gates.main_gate, at its promote-budget thresholds) decodes the validation clips once per
candidate R. The R with the highest mean of BLEU-1 and the emotion hit (the gates' two targets)
on those clips wins, decode.rank on a tie: a hyperparameter chosen on validation like the
thresholds and the classifier. The paired difference against decode.rank, with its 95% CI, is
reported beside it. (An earlier rule kept decode.rank unless another R beat it with a CI above 0;
on 150 validation clips a language it could not move for gains of 1-2 points, so the test
evaluation judged flagged tokens by the R that validation had ranked second in both languages.)

The choice goes into gates.json ("verify_rank") and into every learned gate's file
("verify_rank": language -> R), so the test evaluation, the promotion and a deployed champion
(`speccap caption|edge --gate champion`) judge flagged tokens the same way. The traces and their
labels stay at decode.rank. Records are written per clip under data/verify_rank/ (resumable; a
changed gate, model or setting gets new files).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..config import Params
from ..gating.gate_file import read_gate, write_gate
from ..metrics.bootstrap import ClipStats, difference, interval
from .gates import learned_names, main_gate
from .markdown import md_table
from .saved import gate_path
from .sweep import RunConfig, config_key, models_fingerprint, prune_logs, run_config, summarize, ugsd_config
from .trace_refs import refs_path, training_clips
from .workers import Pool

VERIFY_RANK_DIR = Path("data/verify_rank")
KEY = "bleu1_emotion"  # metrics.bootstrap: mean of BLEU-1 and the emotion hit rate


def default_rank(params: Params) -> int:
    """The R flagged tokens are judged by unless validation says otherwise: decode's rank rule."""
    return params.decode.rank if params.decode.rule == "rank" else 1


def candidate_ranks(params: Params) -> list[int]:
    """The default first, then gates.verify_ranks (each once)."""
    return list(dict.fromkeys((default_rank(params), *params.gates.verify_ranks)))


def rule_fields(params: Params, rank: int) -> dict:
    """The decoder's rule (and rank) for flagged tokens judged by rank-`rank`: at the default R, what
    decode's rule gives (the same configurations, records and keys as before there was a choice)."""
    d = params.decode
    if rank == default_rank(params):
        return dict(rule=d.rule, **({"rank": d.rank} if d.rule == "rank" else {}))
    return dict(rule="rank", rank=rank)


def rank_config(params: Params, lang: str, gate: str, threshold: float, rank: int) -> RunConfig:
    """A token gate at `threshold`, flagged tokens judged by rank-`rank`."""
    return ugsd_config(params, lang, gate=gate, threshold=float(threshold), block_len=0, token=params.gates.verify,
                       **rule_fields(params, rank))


def choose(stats: dict[int, ClipStats], default: int) -> tuple[int, dict[int, dict]]:
    """The R to judge by, from each candidate's per-clip numbers on the same clips, and one row
    per candidate: BLEU-1, emotion hit and their mean with CIs, and the paired difference of that
    mean against the default's."""
    rows = {}
    for r, s in stats.items():
        row = {"bleu1": interval(s, "bleu1")}
        if "emotion_hit" in s.columns:
            row["emotion_hit_rate"] = interval(s, "emotion_hit_rate")
        key = KEY if "emotion_hit" in s.columns else "bleu1"
        row["key"] = key
        row["minus_default"] = None if r == default else difference(s, stats[default], key)
        rows[r] = row
    gain = {r: 0.0 if row["minus_default"] is None else row["minus_default"]["value"] for r, row in rows.items()}
    best = max(gain.values())
    return (default if gain.get(default) == best else next(r for r, g in gain.items() if g == best)), rows


def validation_clips(params: Params, lang: str) -> list[dict]:
    n = params.gates.traces.val_clips
    return training_clips(params, "val", lang)[: n or None]


def choose_verify_rank(params: Params, params_path: str | None, gates_json: dict, out_dir: Path = VERIFY_RANK_DIR,
                       workers: int | None = None, progress=None) -> dict:
    """Decode the validation clips with the main target's chosen gate once per candidate R
    and choose R per language (module docstring). Returns what goes into gates.json."""
    ranks, default = candidate_ranks(params), default_rank(params)
    name = main_gate(gates_json["chosen"])
    thresholds = gates_json["gates"][name]["thresholds"][str(params.gates.promote_budget)]
    out = {"gate": name, "budget": params.gates.promote_budget, "default": default, "candidates": ranks,
           "chosen": {}, "validation": {}}
    if len(ranks) == 1:
        out["chosen"] = {lang: default for lang in params.data.languages}
        prune_logs(out_dir, set())  # nothing decoded: an earlier run's logs are no output of this one
        return out
    gate_sha = hashlib.sha256(gate_path(params, name).read_bytes()).hexdigest()[:12]
    models_fp = models_fingerprint(params)
    pool = Pool.for_stage(params, params_path, "gates", workers=workers)
    used = set()
    try:
        for lang in params.data.languages:
            clips = validation_clips(params, lang)
            if not clips:
                raise ValueError(f"{refs_path(params, 'val', lang)}: no validation clips to "
                                 "choose the verification rank on")
            ids = [c["id"] for c in clips]
            stats, rho = {}, {}
            for r in ranks:
                cfg = rank_config(params, lang, name, thresholds[lang], r)
                path = out_dir / f"{config_key(cfg, params, models_fp, ids)}-{gate_sha}.jsonl"
                used.add(path.name)
                summary = summarize(cfg, run_config(cfg, clips, pool, path, progress), clips)
                stats[r], rho[r] = ClipStats.from_json(summary["clip_stats"]), summary["rho"]
            out["chosen"][lang], rows = choose(stats, default)
            out["validation"][lang] = {str(r): {**row, "rho": rho[r], "clips": len(ids)} for r, row in rows.items()}
    finally:
        pool.close()
    prune_logs(out_dir, used)
    return out


def stamp_gates(params: Params, chosen: dict[str, int], fold: int | None = None) -> None:
    """Write the chosen R per language into every learned gate's file (what the registry logs and
    a deployed champion reads back; `fold`: the cross-fitted gates of that fold)."""
    for name in learned_names(params):
        path = gate_path(params, name, fold)
        write_gate(path, read_gate(path) | {"verify_rank": dict(chosen)})


def total_captions(params: Params) -> int:
    """Captions `choose_verify_rank` decodes (for a progress bar)."""
    ranks = candidate_ranks(params)
    if len(ranks) == 1:
        return 0
    return len(ranks) * sum(len(validation_clips(params, lang)) for lang in params.data.languages)


def section(vr: dict | None) -> str:
    """The report's paragraph and table: which R judges flagged tokens in each language, and why."""
    if not vr or not vr.get("validation"):
        return ""
    rows = []
    for lang, per in vr["validation"].items():
        for r, row in per.items():
            d = row["minus_default"]
            diff = "–" if d is None else f"{d['value']:+.2f} [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}]"
            emo = row.get("emotion_hit_rate")
            rows.append([lang, r + (" (chosen)" if int(r) == vr["chosen"][lang] else ""), row["clips"],
                         f"{row['rho']:.3f}", f"{row['bleu1']['value']:.2f}",
                         "–" if emo is None else f"{emo['value']:.1f}", diff])
    return ("## How flagged tokens are judged (validation, `gates` stage)\n\n"
            f"The gate {vr['gate']} at the rho* = {vr['budget']:g} thresholds decoded the validation clips once per "
            f"R of the rank rule; the R with the highest mean of BLEU-1 and emotion hit is chosen (R = {vr['default']}, "
            "decode's, on a tie; speccap/pipeline/verify_rank.py). Every token-level row "
            "above (the oracle, entropy per token, the learned gates) judges flagged tokens by the chosen R of its "
            "language; the per-block baselines by decode's rule.\n\n"
            + md_table(["lang", "R", "clips", "rho", "BLEU-1", "emotion hit %", "mean(BLEU-1, emotion) - default's "
                        "[95% CI]"], rows) + "\n")
