"""The gate evaluation: token gates, the entropy baselines and the oracle at equal budgets on the
test clips, with 95% paired-bootstrap intervals; the Pareto table and plot.

Configurations per language: edge-only and cloud-only (the gap), the oracle, and at every budget
rho*: the rule baselines per token and per block of gates.traces.block_len (UGSD's gate), and the
learned token gate chosen on validation for each target. Thresholds come from the `gates` stage
(validation traces). The oracle verifies every token (gate `always` at token level): its caption
is what a gate that escalates exactly the tokens the cloud replaces would write, and its rho is
those tokens' share, corrected / drafted. The oracle at a budget (`gates.oracle_corrections`, one
row per k) replaces only the first k of them in each caption and takes no bonus tokens
(decoding.verify.Rank.max_corrections); a gate at budget rho* is held against the one of those
that sent the most without exceeding rho* (`oracle_at`). Gap closed = (method - edge) / (cloud - edge), for
BLEU-1 and for the emotion hit, each with its interval; a share of a gap whose interval reaches 0 is noise.

Latency on the papers' hardware: speccap.pipeline.papers_hardware.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config import Params, gate_decode
from ..decoding.gates import VERIFY
from ..metrics.bootstrap import ClipStats, gap_closed, interval
from .ceiling import CEILING_TEXT, ceiling_lines, on_ceiling_clips
from .gate_names import CEILING, KEYS, ORACLE, is_oracle, oracle_name, untuned_name
from .gate_pareto import pareto_data, pareto_plot
from .gates import BLOCK_SUFFIX, entropy_section, main_gate
from .markdown import md_table
from .papers_hardware import papers_parts, papers_seconds
from .quality_table import format_ci, format_share
from .sweep import RunConfig, ugsd_config
from .verify_rank import default_rank, rule_fields
from .verify_rank import section as verify_rank_section

OUT = Path("reports/gates")


def tuned_temperature(entry: dict, budget: float, lang: str) -> float | None:
    """The temperature a rule baseline was tuned to at this budget (pipeline.gates.tune_entropy);
    None where it has none or it is 1 (so its configuration is the untuned one)."""
    t = entry.get("temperature", {}).get(str(budget), {}).get(lang)
    return None if t in (None, 1.0) else float(t)


def gate_configs(params: Params, gates_json: dict) -> tuple[list[RunConfig], dict[RunConfig, dict]]:
    """The configurations and, for each gated one, {gate_name, budget, detail}: `detail` ones (the
    per-block baselines, the gates of the other targets, the other verification variant) run on the
    first `gates.detail_clips` test clips, the rest on all (`gate_clips`)."""
    d = gate_decode(params)
    g = params.gates
    base = dict(rule=d.rule, **({"rank": d.rank} if d.rule == "rank" else {}))
    chosen = gates_json["chosen"]
    main = main_gate(chosen) if chosen else None  # the first target's: the one the champion is meant for
    ranks = gates_json.get("verify_rank", {}).get("chosen", {})
    configs, tags = [], {}
    for lang in params.data.languages:
        configs += [RunConfig("edge", lang), RunConfig("cloud", lang)]
        # token level: flagged tokens judged by the R chosen on validation (pipeline.verify_rank)
        tok = rule_fields(params, ranks.get(lang, default_rank(params)))
        oracle = ugsd_config(params, lang, gate="always", threshold=None, block_len=0, token=g.verify, **tok)
        configs.append(oracle)
        tags[oracle] = {"gate_name": ORACLE, "budget": None, "detail": False}
        for k in g.oracle_corrections:  # the oracle at a budget: the first k tokens the cloud replaces
            capped = oracle.with_spec(corrections=k)
            configs.append(capped)
            tags[capped] = {"gate_name": oracle_name(k), "budget": None, "detail": False}
        for b in g.budgets:
            for rule in g.baselines:
                entry = gates_json["gates"][rule]
                thr, temp = entry["thresholds"][str(b)][lang], tuned_temperature(entry, b, lang)
                cfg = ugsd_config(params, lang, gate=rule, threshold=float(thr), block_len=0, token=g.verify,
                                  gate_temperature=temp, **tok)
                tags[cfg] = {"gate_name": rule, "budget": b, "detail": False}
                if temp is not None:  # beside it, the untuned rule at its own threshold: what tuning changed
                    raw = ugsd_config(params, lang, gate=rule, threshold=float(entry["untuned_thresholds"][str(b)][lang]),
                                      block_len=0, token=g.verify, **tok)
                    tags[raw] = {"gate_name": untuned_name(rule), "budget": b, "detail": False}
                    configs.append(raw)
                thr = gates_json["gates"][rule + BLOCK_SUFFIX]["thresholds"][str(b)][lang]
                block = ugsd_config(params, lang, gate=rule, threshold=float(thr), block_len=d.block_len, **base)
                tags[block] = {"gate_name": rule + BLOCK_SUFFIX, "budget": b, "detail": True}
                configs += [cfg, block]
            for name in dict.fromkeys(chosen.values()):
                thr = gates_json["gates"][name]["thresholds"][str(b)][lang]
                cfg = ugsd_config(params, lang, gate=name, threshold=float(thr), block_len=0, token=g.verify, **tok)
                tags[cfg] = {"gate_name": name, "budget": b, "detail": name != main}
                configs.append(cfg)
        # the other verification variant, for the main gate at the promote budget: what the
        # pending tokens add (same threshold, so it flags the same tokens and sends more)
        other = next(v for v in VERIFY if v != g.verify)
        name = main
        if name and str(g.promote_budget) in gates_json["gates"][name]["thresholds"]:
            thr = gates_json["gates"][name]["thresholds"][str(g.promote_budget)][lang]
            cfg = ugsd_config(params, lang, gate=name, threshold=float(thr), block_len=0, token=other, **tok)
            tags[cfg] = {"gate_name": f"{name} ({other})", "budget": g.promote_budget, "detail": True}
            configs.append(cfg)
    return configs, tags


def oracle_at(per_gate: dict, budget: float) -> tuple[str, dict] | None:
    """The oracle row a gate at `budget` is held against: of the oracles at a budget (first k
    replacements), the one that sent the most without exceeding `budget` (what it really sent,
    corrected / drafted: every position is the edge's draft there). The unlimited oracle is left
    out: it takes the cloud's bonus tokens unexamined, so its corrected / drafted is an estimate."""
    rows = [(name, e) for name, entries in per_gate.items() if is_oracle(name) and name != ORACLE
            for e in entries if e["rho"] <= budget + 1e-9]
    return max(rows, key=lambda r: r[1]["rho"], default=None)


def gate_clips(params: Params, tags: dict[RunConfig, dict], clips: dict[str, list[dict]]):
    """The test clips of each configuration: `clips` of its language, the first `gates.detail_clips`
    of them for a detail one."""
    n = params.gates.detail_clips
    return lambda cfg: clips[cfg.language][:n] if n and tags.get(cfg, {}).get("detail") else clips[cfg.language]


def decode_references(summary_path: Path, clips: dict[str, list[dict]]) -> list[dict]:
    """Edge-only and cloud-only rows of the decode stage (reports/references.json, or any summary
    with a "configs" list) that hold exactly these clips:
    the gate evaluation reuses them instead of captioning the same clips again (they do not depend
    on any gate)."""
    if not summary_path.exists():
        return []
    rows = json.loads(summary_path.read_text()).get("configs", [])
    out = []
    for r in rows:
        if r.get("method") in ("edge", "cloud") and r.get("status") == "FINISHED" and r.get("clip_stats") \
                and r["clip_stats"]["ids"] == [c["id"] for c in clips.get(r["language"], [])]:
            out.append(r)
    return out


def _stats(c: dict) -> ClipStats:
    return ClipStats.from_json(c["clip_stats"])


def build_gate_report(params: Params, summary: dict, out: Path = OUT, dagger: list[dict] | None = None,
                      verify_rank: dict | None = None, entropy: dict | None = None) -> dict:
    """`dagger`: the gates stage's DAgger rounds (gates.json "dagger"), shown in their own section;
    `verify_rank`: its choice of R for flagged tokens (gates.json "verify_rank"), likewise; `entropy`:
    the entropy baseline's entry (its tuned temperatures), likewise."""
    out.mkdir(parents=True, exist_ok=True)
    ok = [c for c in summary["configs"] if c["status"] == "FINISHED" and c.get("clip_stats")]
    rows, result = [], {"languages": {}}
    for lang in params.data.languages:
        ref = {m: next((c for c in ok if c["method"] == m and c["language"] == lang), None) for m in ("edge", "cloud")}
        if not ref["edge"] or not ref["cloud"]:
            continue
        edge, cloud = _stats(ref["edge"]), _stats(ref["cloud"])
        em, cm = ref["edge"]["metrics"], ref["cloud"]["metrics"]
        edge_time, cloud_time = papers_seconds(em, "edge"), papers_seconds(cm, "cloud")
        keys = [k for k, _ in KEYS if k != "emotion_hit_rate" or "emotion_hit" in edge.columns]
        per_gate: dict[str, list] = {}
        kept: dict[tuple, ClipStats] = {}  # each row's per-clip numbers, to pair gates with the ceiling
        lang_res = result["languages"][lang] = {
            "edge": {k: interval(edge, k) for k in keys}, "cloud": {k: interval(cloud, k) for k in keys},
            "gates": per_gate}
        for c in ok:
            if c["language"] != lang or c["method"] != "ugsd":
                continue
            s = _stats(c)
            entry = _entry(c, s, edge, cloud, cm, edge_time, keys)
            per_gate.setdefault(c["gate_name"], []).append(entry)
            rows.append([lang, c["gate_name"], "-" if is_oracle(c["gate_name"]) else c["budget"], len(s.ids),
                         f"{entry['rho']:.3f}"]
                        + [format_ci(entry[k]) for k in keys] + [format_share(entry[f"gap_closed_{k}"]) for k in keys]
                        + [_x(entry["papers_time"], 1), _x(entry["papers_x_edge"]),
                           _x(entry["cloud_compute_vs_cloud_only"])])
            kept[(c["gate_name"], c["budget"])] = s
        for entries in per_gate.values():
            entries.sort(key=lambda e: e["budget"] or 0.0)
        on_ceiling_clips(per_gate, kept, edge, cloud, keys)
        lang_res["gap"] = {k: gap_closed(edge, edge, cloud, k)["gap"] for k in keys}
        lang_res["clips"] = len(edge.ids)
        lang_res["papers_hardware"] = {"edge_only_s": edge_time, "cloud_only_s": cloud_time,
                                       "cloud_only_x_edge": cloud_time / edge_time if edge_time else None}
        lang_res["targets"] = _targets(per_gate, params, keys)
        lang_res["ceiling"] = ceiling_lines(per_gate, keys)
    text = _markdown(params, summary, result, rows)
    if entropy and entropy.get("temperature"):
        result["entropy_temperature"] = entropy["temperature"]
        text.append("\n" + entropy_section(entropy))
    if verify_rank and verify_rank.get("validation"):
        result["verify_rank"] = verify_rank
        text.append("\n" + verify_rank_section(verify_rank))
    if dagger:
        result["dagger"] = dagger
        text.append("\n" + dagger_section(dagger))
    (out / "gates.md").write_text("\n".join(text) + "\n")
    pareto_plot(result, out / "pareto.png")
    pareto_data(result, out)
    (out / "gates.json").write_text(json.dumps(result, indent=1))
    return result


def _markdown(params: Params, summary: dict, result: dict, rows: list[list]) -> list[str]:
    """gates.md up to its optional sections: what the rows are, edge and cloud per language, the table,
    the ceiling's reach and the targets."""
    names = [n for _, n in KEYS]
    header = ["lang", "gate", "budget rho*", "clips", "rho"] + names + [f"{n} gap closed %" for n in names] + [
        "papers' hw s", "x edge-only", "cloud steps x cloud-only"]
    text = ["# Gates at equal escalation budgets (test clips)\n",
            "Thresholds picked on validation traces for each budget rho*; rho is the share of drafted tokens "
            "the gate really sent (the oracle's: the tokens the cloud replaced). Intervals: 95% paired bootstrap "
            "over the test clips. Gap closed = (gate - edge) / (cloud - edge). Time on the papers' hardware "
            "(edge 2.10, cloud 24.16 tokens/s, params.link) counted in model steps; cloud steps = forwards "
            "per caption against cloud-only's (speccap/pipeline/gate_report.py says how).\n"
            + (f"\nThe oracle, the per-token baselines and the {params.gates.targets[0]}-target gates (the main "
               "target's) run on all test clips; the "
               f"per-block baselines, the other targets and the other verification variant on the first "
               f"{params.gates.detail_clips} (`gates.detail_clips`, to keep `dvc repro` within its time budget): "
               "their intervals are wider, their gap shares are paired with edge and cloud on those clips, and "
               "their time ratios are against edge-only's mean over all clips.\n" if params.gates.detail_clips else "")]
    folds = max((len(c["folds"]) for c in summary["configs"] if c.get("folds")), default=0)
    if folds:  # pipeline.crossfit: the test clips were the only referenced ones
        text.append(f"Cross-fitted over {folds} folds of the test clips (`data.cross_fit`): each gate and baseline row "
                    "pools one run per fold, every clip decoded by the gates trained and thresholded without its "
                    "fold; edge, cloud and the oracle run once over all clips.\n")
    for lang, r in result["languages"].items():
        ref_line = ", ".join(f"{n}: edge {format_ci(r['edge'][k])}, cloud {format_ci(r['cloud'][k])}, gap "
                             f"{format_ci(r['gap'][k], signed=True)}" for k, n in KEYS if k in r["edge"])
        hw = r["papers_hardware"]
        text.append(f"- {lang}: {ref_line}; on the papers' hardware edge-only {hw['edge_only_s']:.1f} s, "
                    f"cloud-only {hw['cloud_only_s']:.1f} s per caption")
    text.append("\n" + md_table(header, rows) + "\n")
    if any(r["ceiling"] for r in result["languages"].values()):
        text.append(CEILING_TEXT)
        for lang, r in result["languages"].items():
            text += [f"- {lang}: {line}" for line in r["ceiling"]]
    text.append("\n## Targets (budget rho* <= 0.1)\n")
    for lang, r in result["languages"].items():
        for line in r["targets"]["lines"]:
            text.append(f"- {lang}: {line}")
    return text


def _entry(c: dict, s: ClipStats, edge: ClipStats, cloud: ClipStats, cloud_metrics: dict, edge_time: float,
           keys: list[str]) -> dict:
    """One gate row at one budget: its rho, times, and each metric with its interval and gap closed."""
    m = c["metrics"]
    # a row run on fewer clips (gates.detail_clips) is paired with edge and cloud on those clips
    e_s, c_s = (edge, cloud) if s.ids == edge.ids else (edge.subset(s.ids), cloud.subset(s.ids))
    oracle = is_oracle(c["gate_name"])
    rho = m.get("corrected", 0.0) / m["drafted"] if oracle and m.get("drafted") else m.get("rho", 0.0)
    if c["gate_name"] == CEILING:  # a search, not a decoder: no clock to read
        entry = {"budget": c["budget"], "rho": rho, "clips": len(s.ids), "threshold": None, "papers_time": None,
                 "papers_x_edge": None, "cloud_compute_vs_cloud_only": None,
                 "corrections_per_caption": m.get("corrections_per_caption")}
        for k in keys:
            entry[k] = interval(s, k)
            entry[f"gap_closed_{k}"] = gap_closed(e_s, s, c_s, k)
        return entry
    parts = papers_parts(m, "ugsd")
    papers_time = sum(parts.values())
    entry = {"budget": c["budget"], "rho": rho, "clips": len(s.ids), "threshold": c["threshold"], "total_time": m["total_time"],
             "cloud_compute": m.get("cloud_compute", 0.0), "edge_compute": m.get("edge_compute", 0.0),
             "papers_time": papers_time,
             "papers_x_edge": papers_time / edge_time if edge_time else None,
             # the ratio's parts: the edge's forwards (x edge-only's: the caption's length), the
             # cloud's forwards and the link, each over edge-only's time
             "papers_x_edge_parts": {k: v / edge_time for k, v in parts.items()} if edge_time else None,
             "cloud_compute_vs_cloud_only": m.get("rounds", 0.0) / (cloud_metrics["tokens"] + 1)}
    for k in keys:
        entry[k] = interval(s, k)
        entry[f"gap_closed_{k}"] = gap_closed(e_s, s, c_s, k)
    return entry


def dagger_section(rounds: list[dict]) -> str:
    """The DAgger rounds: what each traced under which gate, and how that gate ranked the mismatches
    of the trajectories it led to, before and after training on them (same validation traces)."""
    def auc(v):
        return "–" if v is None else f"{v:.3f}"
    rows = []
    for r in rounds:
        val, train = r["traces"]["val"], r["traces"]["train"]
        rows.append([r["round"], r["gate"], f"{train['clips']} / {val['clips']}", f"{val['mismatch_rate']:.3f}",
                     f"{val['critical_rate']:.3f}", f"{r['corrected_share_of_val_tokens']:.3f}",
                     f"{auc(r['val_auc_before']['critical'])} -> {auc(r['val_auc_after']['critical'])}",
                     f"{auc(r['val_auc_before']['mismatch'])} -> {auc(r['val_auc_after']['mismatch'])}",
                     r.get("chosen_after", "–")])
    return ("## DAgger rounds (gates stage)\n\nEach round decoded train and validation clips with the gate named "
            "(at the promote budget), traced the captions the loop committed and trained the gates again with "
            "them; the thresholds above come from the last round's validation traces. AUC: that gate on the "
            "round's validation traces, before -> after training on the round (the chosen gate of the same "
            "target after).\n\n"
            + md_table(["round", "gate", "train / val clips", "val mismatch rate", "val critical rate",
                        "val tokens the gate corrected", "AUC critical", "AUC mismatch", "chosen after"], rows) + "\n")


def _x(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _targets(per_gate: dict, params: Params, keys: list[str]) -> dict:
    """For each learned gate at each budget <= 0.1: its gap shares (with CI), entropy's point
    estimates per token and per block at the same budget, and the oracle's share."""
    out = {"gates": {}, "lines": []}
    rules = [r for b in params.gates.baselines for r in (b, b + BLOCK_SUFFIX)]
    for name, entries in per_gate.items():
        if is_oracle(name) or name == CEILING or name in rules or name.endswith(")"):  # the other verification variant: shown, not a target
            continue
        for e in entries:
            if e["budget"] is None or e["budget"] > 0.1 + 1e-9:
                continue
            # the ceiling at this budget: the oracle that sent the most within it (or within what the gate sent)
            best = oracle_at(per_gate, max(e["rho"], e["budget"]))
            oracle = None if best is None else best[1]
            rec = {"budget": e["budget"], "rho": e["rho"], "papers_x_edge": e["papers_x_edge"],
                   "papers_x_edge_parts": e.get("papers_x_edge_parts"),
                   "cloud_compute_vs_cloud_only": e["cloud_compute_vs_cloud_only"],
                   "oracle": None if best is None else {"name": best[0], "rho": oracle["rho"]}}
            for k in keys:
                share = e[f"gap_closed_{k}"]
                ent = {r: next((x[f"gap_closed_{k}"]["value"] for x in per_gate.get(r, []) if x["budget"] == e["budget"]),
                               None) for r in rules}
                rec[k] = {"share": share, "entropy_point": ent,
                          "ci_low_above_entropy": all(v is None or share["ci_low"] > v for v in ent.values()),
                          "oracle": None if oracle is None else oracle[f"gap_closed_{k}"]["value"]}
            rec["closes_80"] = all(rec[k]["share"]["value"] >= 80 for k in keys)
            rec["within_10_of_oracle"] = None if oracle is None else all(
                rec[k]["share"]["value"] >= rec[k]["oracle"] - 10 for k in keys)
            rec["within_10"] = e["rho"] <= 0.10 + 1e-9  # what the gate really sent, not the budget it aimed at
            ceil = next((x for x in per_gate.get(CEILING, []) if x["budget"] == e["budget"]), None)
            if ceil is not None and e.get("on_ceiling_clips"):  # both on the ceiling's clips: the distance to it
                rec["ceiling"] = {k: {"ceiling": ceil[f"gap_closed_{k}"]["value"],
                                      "gate": e["on_ceiling_clips"][k]["value"]} for k in keys}
            out["gates"].setdefault(name, []).append(rec)
            parts = [f"{n} {format_ci(rec[k]['share'])}% (tuned entropy per token / entropy per block "
                     + " / ".join("–" if v is None else f"{v:.0f}" for v in rec[k]["entropy_point"].values())
                     + ("" if rec[k]["oracle"] is None else f"; oracle {rec[k]['oracle']:.0f}") + ")"
                     for k, n in KEYS if k in keys]
            ceiling = ("" if best is None else f"; the oracle it is held against: {best[0]} (rho {oracle['rho']:.3f}), "
                       f"within 10 points of it in both: {rec['within_10_of_oracle']}")
            if "ceiling" in rec:
                ceiling += (f"; on the ceiling's {ceil['clips']} clips the gate closes "
                            + " / ".join(f"{rec['ceiling'][k]['gate']:.0f}" for k in keys) + "% against the ceiling's "
                            + " / ".join(f"{rec['ceiling'][k]['ceiling']:.0f}" for k in keys) + "% at this budget")
            out["lines"].append(f"{name} at rho* {e['budget']} (rho {e['rho']:.3f}): " + "; ".join(parts)
                                + f"; >= 80% of both gaps: {rec['closes_80']}; rho <= 0.10: {rec['within_10']}{ceiling}; "
                                f"CI lower bound above entropy's "
                                f"points: {all(rec[k]['ci_low_above_entropy'] for k in keys)}; papers' hardware: "
                                f"{_x(rec['papers_x_edge'])} x edge-only time (target <= 1.05{_parts(rec)}), cloud compute "
                                f"{_x(rec['cloud_compute_vs_cloud_only'])} x cloud-only's (target <= 0.15)")
    return out


def _parts(rec: dict) -> str:
    p = rec.get("papers_x_edge_parts")
    if not p:
        return ""
    return (f"; edge forwards {p['edge']:.3f} (the caption's length against edge-only's) + cloud forwards "
            f"{p['cloud']:.3f} + link {p['link']:.3f}")


