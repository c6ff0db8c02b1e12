"""How strictly the cloud should judge a token the gate flagged: rank-R (R = decode.rank) vs greedy (R = 1).

The gate evaluation verifies a flagged token by the rank rule of the decode stage: the edge's token
stands when it is among the cloud's top R (R = 2 on the embedded testbed). A flagged token was
chosen because the edge is likely wrong there; letting the cloud's second choice stand gives the
word back to the edge where it matters most (e.g. the first word of the quoted sentence: the
edge's usual "The" is often the cloud's second choice). The `gates` stage chooses R per language
on validation (speccap.pipeline.verify_rank); this script shows both on the test clips: the chosen
critical gate at each budget's threshold, flagged tokens judged greedily and by rank-R, one of
them from the gate evaluation (reports/gate_runs, the R it chose) and the other decoded here: the share of the
edge -> cloud gap closed (BLEU-1, emotion hit) with 95% paired-bootstrap CIs, the escalation rate,
and the paired difference greedy - rank-R. The gates, thresholds and clips are the gate
evaluation's; only the verification differs. Run after `dvc repro gate_eval`:

    python benchmarks/gate_verify_rank.py     # -> reports/gate_verify_rank.md, .json
                                              #    (+ its runs under reports/gate_verify_rank/)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gate_common import ci_cells, clip_stats, gate_eval_run, paired_columns, read_records, references, rho, start, write_report  # noqa: E402

from speccap.pipeline.splits import eval_clips  # noqa: E402
from speccap.pipeline.sweep import run_config  # noqa: E402
from speccap.pipeline.verify_rank import rank_config  # noqa: E402
from speccap.pipeline.workers import Pool  # noqa: E402


def main() -> None:
    args, params, gates = start(__doc__)
    name = gates["chosen"]["critical"]
    verify = gates.get("verify", "alone")
    runs_dir = Path(args.out) / "gate_verify_rank"
    pool = Pool(args.params, params.sweep.workers, params.sweep.threads, stage="gate_verify_rank")
    rows = []
    try:
        for lang in params.data.languages:
            clips = eval_clips(params, lang)[: params.gates.eval_clips or None]
            edge, cloud = references(params, lang, clips)
            for budget, per_lang in sorted(gates["gates"][name]["thresholds"].items()):
                t = per_lang[lang]
                recs, paths = {}, {}
                for r in (params.decode.rank, 1):  # the gate evaluation's run where it judged by this R
                    cfg = rank_config(params, lang, name, t, r)
                    found = gate_eval_run(cfg.name)
                    paths[r] = found or runs_dir / f"{cfg.name}.jsonl"
                    recs[r] = read_records(found) if found else run_config(cfg, clips, pool, paths[r])
                ranked_recs, greedy_recs = recs[params.decode.rank], recs[1]
                ranked_path, greedy_path = paths[params.decode.rank], paths[1]
                s_rank = clip_stats(ranked_recs, clips, lang, ranked_path)
                s_greedy = clip_stats(greedy_recs, clips, lang, greedy_path)
                row = {"language": lang, "gate": name, "budget": float(budget), "threshold": t, "clips": len(clips),
                       "rho_rank": rho(ranked_recs), "rho_greedy": rho(greedy_recs)}
                row |= paired_columns(edge, cloud, {"rank": s_rank, "greedy": s_greedy}, ("greedy", "rank"))
                rows.append(row)
    finally:
        pool.close()
    out = Path(args.out)
    chosen = gates.get("verify_rank", {}).get("chosen", {})
    lines = ["# Flagged tokens judged greedily vs by rank-R\n",
             f"Made by `python benchmarks/gate_verify_rank.py`. The chosen critical gate ({name}, flagged tokens "
             f"verified {verify}) at each budget's threshold on the gate evaluation's test clips; a flagged token "
             f"judged by rank-R (R = {params.decode.rank}) or greedily (R = 1). The `gates` stage chose on "
             "validation: " + (", ".join(f"{lang} R = {r}" for lang, r in chosen.items()) or "no choice recorded")
             + " (the gate evaluation's rows; the other R is decoded here). Share of the edge -> cloud gap "
             "closed, % [95% paired-bootstrap CI over clips]; the difference greedy - rank-R in points, paired.\n",
             "| lang | rho* | rho rank-R / greedy | BLEU-1 share rank-R | BLEU-1 share greedy | BLEU-1 greedy - rank-R "
             "| emotion share rank-R | emotion share greedy | emotion hit greedy - rank-R |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['language']} | {r['budget']:g} | {r['rho_rank']:.3f} / {r['rho_greedy']:.3f} | "
                     + ci_cells(r, ("rank_share", "greedy_share", "greedy_minus_rank")) + " |")
    write_report(out, "gate_verify_rank", {"rank": params.decode.rank, "chosen_on_validation": chosen, "rows": rows},
                 lines)


if __name__ == "__main__":
    main()
