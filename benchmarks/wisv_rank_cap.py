"""WISV within rank-R: the cap `wisv.max_rank` chosen on validation clips, then shown on test clips.

    python benchmarks/wisv_rank_cap.py [--params params.yaml] [--clips 100] [--caps 0 2 3 5] [--out reports/wisv_rank_cap]
    python benchmarks/wisv_rank_cap.py --render reports/wisv_rank_cap.json   # the Markdown again, no run

Where the pipeline ran (trained models and WISV head). For each language and split (validation, then
test; the first --clips clips of each), one channel (the first of wisv.channels) and the longest
window of wisv.block_lens: greedy, rank-R for R in wisv.verify_ranks, and WISV at wisv.tau with each
rank cap (0 = none: the paper's rule). Every WISV variant is set against greedy (AAL, quality) and
against the rank frontier at its own AAL (the neighbouring R time-shared, as in reports/wisv/), with
95% paired-bootstrap CIs. The cap chosen is the one whose quality change against the rank frontier,
averaged over the languages, is highest on the validation clips; the test rows are reported for
every cap, the chosen one marked.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from speccap.config import load_params  # noqa: E402
from speccap.data.featurize import load_clip_features  # noqa: E402
from speccap.data.manifest import manifest_path, read_manifest  # noqa: E402
from speccap.decoding.build import DecodeSpec, build_decoder  # noqa: E402
from speccap.decoding.engine import speculative  # noqa: E402
from speccap.decoding.link import Link  # noqa: E402
from speccap.metrics.bootstrap import ClipStats, interval, mean_relative_change  # noqa: E402
from speccap.metrics.caption import score_captions  # noqa: E402
from speccap.pipeline.markdown import md_table  # noqa: E402
from speccap.pipeline.saved import cached_head  # noqa: E402
from speccap.pipeline.wisv import frontier_mix  # noqa: E402
from speccap.pipeline.workers import _init_worker, worker  # noqa: E402


def decode(params, clips, mels, lang: str, length: int, link_cfg, rule: str, rank: int = 1, cap: int = 0,
           head=None) -> dict:
    """Caption the clips (`mels`: their features, loaded once for every rule); AAL over all rounds
    and the per-clip quality statistics. WISV: the full upload, its tolerance capped at rank `cap`."""
    spec = DecodeSpec.from_params(params, gate="always", threshold=None, block_len=length, rule=rule, rank=rank,
                                  wisv_protocol="full", wisv_max_rank=cap)
    w = worker()
    caps, accepted, rounds = [], 0, 0
    for _c, mel in tqdm(list(zip(clips, mels)), desc=f"{lang} {rule}{rank if rule == 'rank' else ''}", leave=False):
        rec = speculative(w.edge, w.cloud, mel, lang, build_decoder(spec, head=head), Link(link_cfg, seed=params.seed))
        caps.append(rec.caption)
        accepted += rec.accepted
        rounds += rec.rounds
    scored = score_captions(caps, [c["references"] for c in clips], lang, [c.get("emotion") for c in clips])
    return {"aal": accepted / rounds if rounds else 0.0,
            "stats": ClipStats.from_records([c["id"] for c in clips], scored.per_caption)}


def _ci(d: dict) -> list[float]:
    return [d["ci_low"], d["ci_high"]]


def compare(base: dict, variant: dict) -> dict:
    """A WISV variant against greedy and against the rank frontier at its AAL."""
    f = frontier_mix({name: (b["aal"], b["stats"]) for name, b in base.items()}, variant["aal"])
    vs_rank = mean_relative_change([(variant["stats"], f["mix"])], "quality")
    vs_greedy = mean_relative_change([(variant["stats"], base["greedy"]["stats"])], "quality")
    return {"aal": variant["aal"], "aal_pct": 100 * (variant["aal"] / base["greedy"]["aal"] - 1),
            "quality": interval(variant["stats"], "quality")["value"],
            "vs_greedy_pct": vs_greedy["value"], "vs_greedy_ci": _ci(vs_greedy),
            "vs_rank_pct": vs_rank["value"], "vs_rank_ci": _ci(vs_rank), "beyond": f["beyond"], "mix": f["label"]}


def render(out: dict, verify_ranks) -> str:
    """The Markdown of a run's JSON."""
    chosen = out["chosen"]
    cap = lambda c: (f"**{c or 'none'}**" if c == chosen else str(c or "none"))  # noqa: E731
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) and abs(v) < 10 else (f"{v:.1f}" if isinstance(v, float) else str(v))  # noqa: E731
    table = md_table(["split", "lang", "max_rank", "AAL", "AAL vs greedy %", "quality", "vs greedy % [95% CI]",
                      "vs rank-R at equal AAL % [95% CI]", "rank mix"],
                     [[r["split"], r["lang"], cap(r["max_rank"]), r["aal"], r["aal_pct"], r["quality"],
                       f"{r['vs_greedy_pct']:+.1f} [{r['vs_greedy_ci'][0]:+.1f}, {r['vs_greedy_ci'][1]:+.1f}]",
                       f"{r['vs_rank_pct']:+.1f} [{r['vs_rank_ci'][0]:+.1f}, {r['vs_rank_ci'][1]:+.1f}]",
                       r["mix"] + (" (beyond)" if r["beyond"] else "")] for r in out["rows"]], fmt)
    caps = sorted({r["max_rank"] for r in out["rows"]})
    return ("# WISV within rank-R: the rank cap\n\n"
            f"Made by `python benchmarks/wisv_rank_cap.py --clips {out['clips']} --caps {' '.join(map(str, caps))}`. "
            f"WISV (tau {out['tau']:g}) tolerates a mismatch only when its head says so AND the draft token is in the "
            f"cloud's top `max_rank` (none: the paper's rule, the head alone). Channel {out['channel']}, L = {out['L']}, "
            f"every block verified, the first {out['clips']} clips of each split. Against greedy and against rank-R "
            f"(R = 1, {', '.join(map(str, verify_ranks))}) time-shared to WISV's AAL, paired 95% bootstrap CIs over the "
            "clips.\n\n"
            "Chosen on validation (the highest quality change against the rank frontier, mean over languages): "
            f"max_rank = {chosen or 'none'} ("
            + ", ".join(f"{c if int(c) else 'none'}: {v:+.2f}" for c, v in out["val_score"].items()) + ").\n\n"
            + table + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--clips", type=int, default=100)
    ap.add_argument("--caps", type=int, nargs="+", default=[0, 2, 3, 5])
    ap.add_argument("--out", type=Path, default=Path("reports/wisv_rank_cap"))
    ap.add_argument("--render", type=Path, help="only write the Markdown of this JSON (next to it), no run")
    args = ap.parse_args()
    params = load_params(args.params)
    if args.render:
        args.render.with_suffix(".md").write_text(render(json.loads(args.render.read_text()), params.wisv.verify_ranks))
        return
    _init_worker(args.params, 2)
    head = cached_head(params, worker().cache)
    w = params.wisv
    channel = next(iter(w.channels))
    link_cfg, length = w.channels[channel], max(w.block_lens)
    rows: dict = {}
    for split in ("val", "test"):
        for lang in params.data.languages:
            clips = read_manifest(manifest_path(params.data.processed_dir, split, lang))[: args.clips]
            mels = [load_clip_features(params.data.processed_dir, c["id"])[0] for c in clips]
            base = {"greedy": decode(params, clips, mels, lang, length, link_cfg, "greedy")}
            for r in w.verify_ranks:
                base[f"rank{r}"] = decode(params, clips, mels, lang, length, link_cfg, "rank", r)
            for cap in args.caps:
                v = decode(params, clips, mels, lang, length, link_cfg, "wisv", cap=cap, head=head)
                rows[(split, lang, cap)] = compare(base, v) | {"clips": len(clips)}
                print(split, lang, cap, json.dumps({k: rows[(split, lang, cap)][k] for k in
                                                    ("aal_pct", "vs_greedy_pct", "vs_rank_pct")}), flush=True)
    score = {cap: float(np.mean([rows[("val", lang, cap)]["vs_rank_pct"] for lang in params.data.languages]))
             for cap in args.caps}
    chosen = max(args.caps, key=lambda c: (score[c], -c))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = {"channel": channel, "L": length, "tau": w.tau, "clips": args.clips, "chosen": chosen,
           "val_score": score, "rows": [{"split": s, "lang": lang, "max_rank": cap, **r}
                                        for (s, lang, cap), r in rows.items()]}
    args.out.with_suffix(".json").write_text(json.dumps(out, indent=1))
    args.out.with_suffix(".md").write_text(render(out, w.verify_ranks))
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
