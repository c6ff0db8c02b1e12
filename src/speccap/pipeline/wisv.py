"""WISV's evaluation in the pipeline (stage `wisv_eval`): every rule with every block verified, on
each named channel of `wisv.channels` and each draft window of `wisv.block_lens`, against greedy and
rank-R verification, and its report. The head it evaluates is trained by pipeline/wisv_head.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config import Params
from ..metrics.bootstrap import ClipStats, Mix, interval, mean_relative_change, pooled_mean
from . import splits
from .markdown import md_table
from .quality_table import format_ci
from .splits import SHIPPED_VAL_FOLD
from .sweep import RunConfig, ugsd_config

OUT = Path("reports/wisv")
# the WISV paper's headline against greedy verification (Qwen-family models, its channel set)
PAPER = {"aal_gain_pct": 60.8, "rounds_change_pct": -37.3, "accuracy_loss_pct_below": 1.0}
# a 7B model's last hidden size (Qwen2.5-Omni-7B's thinker), for the upload-protocol table
HIDDEN_7B = 3584


def wisv_configs(params: Params) -> list[RunConfig]:
    """Edge-only and cloud-only (the quality references), then greedy, rank-R (each R of
    wisv.verify_ranks) and WISV with every block verified, per channel and draft window. Greedy and
    rank-R read nothing of the channel: the sweep decodes them on the first channel and relinks them
    onto the others (pipeline.sweep.relink_source)."""
    w, configs = params.wisv, []
    for lang in params.data.languages:
        configs += [RunConfig("edge", lang), RunConfig("cloud", lang)]
        for ch in w.channels:
            for length in w.block_lens:
                every = dict(gate="always", threshold=None, block_len=length, channel=ch)
                configs += [ugsd_config(params, lang, **every, rule="greedy")]
                configs += [ugsd_config(params, lang, **every, rule="rank", rank=r) for r in w.verify_ranks]
                configs += [ugsd_config(params, lang, **every, rule="wisv")]
    return configs


def rule_label(rule: str, rank: int) -> str:
    """A rule as the report names it: greedy, rank2, rank3, wisv."""
    return f"rank{rank}" if rule == "rank" else rule


def rank_rules(params: Params) -> list[str]:
    """The rank-R rules of the evaluation, greedy (R = 1) first."""
    return ["greedy"] + [f"rank{r}" for r in params.wisv.verify_ranks]


def rules(params: Params) -> list[str]:
    return rank_rules(params) + ["wisv"]


def _quality(m: dict) -> float:
    return (m["bleu1"] + m["meteor"] + m["rouge_l"]) / 3


def _pct(new: float, old: float) -> float | None:
    return 100 * (new - old) / old if old else None


def build_wisv_report(params: Params, summary: dict, head: dict | None = None, out: Path = OUT) -> dict:
    """The comparison table (per language, channel and window), the plot, the upload-protocol
    table for a 7B hidden size, and the side-by-side with the paper's numbers."""
    out.mkdir(parents=True, exist_ok=True)
    ok = [c for c in summary["configs"] if c["status"] == "FINISHED"]
    cell: dict = {}
    stats: dict = {}  # per-clip numbers, for the paired intervals
    for c in ok:
        if c["method"] == "ugsd":
            key = (c["language"], c["channel"], c["block_len"], rule_label(c["rule"], c.get("rank", 0)))
            cell[key] = c["metrics"]
            if c.get("clip_stats"):
                stats[key] = ClipStats.from_json(c["clip_stats"])
    rows, deltas = [], []
    for lang in params.data.languages:
        for ch in params.wisv.channels:
            for length in params.wisv.block_lens:
                g = cell.get((lang, ch, length, "greedy"))
                for rule in rules(params):
                    m = cell.get((lang, ch, length, rule))
                    if m is None:
                        continue
                    tput = m["tokens"] / m["total_time"] if m.get("total_time") else 0.0
                    st = stats.get((lang, ch, length, rule))
                    rows.append({"lang": lang, "channel": ch, "L": length, "rule": rule, "aal": m["aal"],
                                 "quality_ci": _ci(interval(st, "quality")) if st else None,
                                 "bleu1_ci": [m["bleu1_ci_low"], m["bleu1_ci_high"]] if "bleu1_ci_low" in m else None,
                                 "rounds": m["rounds"], "latency": m["total_time"], "throughput": tput,
                                 "bleu1": m["bleu1"], "meteor": m["meteor"], "rouge_l": m["rouge_l"],
                                 "quality": _quality(m), "tolerated": m.get("tolerated", 0.0),
                                 "bytes_up": m.get("bytes_up", 0.0), "hidden_requests": m.get("hidden_requests", 0.0),
                                 # of the tokens the cloud examined, the share it disagreed with
                                 "mismatch_rate": m["corrected"] / (m["accepted"] + m["corrected"])
                                 if m.get("accepted", 0) + m.get("corrected", 0) else 0.0})
                    if rule == "wisv" and g is not None:
                        gs = stats.get((lang, ch, length, "greedy"))
                        deltas.append({"lang": lang, "channel": ch, "L": length,
                                       "aal_pct": _pct(m["aal"], g["aal"]), "rounds_pct": _pct(m["rounds"], g["rounds"]),
                                       # a round commits at most L + 1 tokens (L accepted and the cloud's
                                       # next): no rule gets below tokens / (L + 1) rounds a caption
                                       "rounds_floor_pct": _pct(m["tokens"] / (length + 1), g["rounds"]),
                                       "latency_pct": _pct(m["total_time"], g["total_time"]),
                                       "quality_pct": _pct(_quality(m), _quality(g)),
                                       "quality_pct_ci": _ci(mean_relative_change([(st, gs)], "quality"))
                                       if st and gs else None})
    refs = {lang: {mth: next((_quality(c["metrics"]) for c in ok if c["method"] == mth and c["language"] == lang),
                             None) for mth in ("edge", "cloud")} for lang in params.data.languages}
    mean = lambda k: float(np.mean([d[k] for d in deltas if d[k] is not None])) if deltas else None  # noqa: E731
    result = {"rows": rows, "deltas": deltas, "references": refs, "paper": PAPER, "head": head or {},
              "mean": {k: mean(k) for k in ("aal_pct", "rounds_pct", "rounds_floor_pct", "latency_pct",
                                            "quality_pct")},
              "quality_pct_ci": _mean_quality_ci(params, stats),
              "against_rank": against_rank_frontier(params, cell, stats),
              "protocols": protocol_table(params, rows)}
    (out / "wisv.md").write_text(_markdown(params, result))
    _plot(params, rows, out / "wisv.png")
    return result


def _ci(iv: dict) -> list[float]:
    return [iv["ci_low"], iv["ci_high"]]


def _quality_change(params: Params, stats: dict, lang: str, against: str) -> dict | None:
    """WISV's quality change (%) against `against` in one language, averaged over channels and
    windows, every (channel, window) pair resampled on the same clips; with its bootstrap draws."""
    pairs = [(stats[(lang, ch, n, "wisv")], stats[(lang, ch, n, against)])
             for ch in params.wisv.channels for n in params.wisv.block_lens
             if (lang, ch, n, "wisv") in stats and (lang, ch, n, against) in stats]
    return mean_relative_change(pairs, "quality", keep_draws=True) if pairs else None


def _mean_quality_ci(params: Params, stats: dict) -> list[float] | None:
    """95% CI of WISV's quality change against greedy, averaged over languages, channels and windows:
    the languages' draws (different clips) are averaged draw by draw."""
    per_lang = [c for lang in params.data.languages if (c := _quality_change(params, stats, lang, "greedy"))]
    return _ci(pooled_mean(per_lang)) if per_lang else None


def frontier_point(points: list[tuple[float, str]], aal: float) -> tuple[list[tuple[str, float]], bool]:
    """Rank-R verification at acceptance length `aal`: the two neighbouring rank rules (greedy is
    R = 1) time-shared, the higher R on a share w = (aal - AAL_lo) / (AAL_hi - AAL_lo) of captions.
    `points`: (AAL, rule) of each rank rule. Returns ([(rule, weight)], beyond): `beyond` when `aal`
    lies past the highest AAL measured (then the highest R alone stands in, at a lower AAL)."""
    pts = sorted(points)
    if aal <= pts[0][0]:
        return [(pts[0][1], 1.0)], False
    for (a_lo, lo), (a_hi, hi) in zip(pts, pts[1:]):
        if aal <= a_hi:
            w = (aal - a_lo) / (a_hi - a_lo) if a_hi > a_lo else 1.0
            return [(lo, 1 - w), (hi, w)], False
    return [(pts[-1][1], 1.0)], True


def frontier_mix(ranks: dict[str, tuple[float, ClipStats]], aal: float) -> dict:
    """Rank-R at acceptance length `aal` from `ranks` {rule: (AAL, per-clip stats)}: the time-shared
    mix (frontier_point) as a bootstrap Mix, its AAL, whether `aal` lay beyond the highest R, and a
    label ("0.40 greedy+0.60 rank2")."""
    parts, beyond = frontier_point([(a, r) for r, (a, _) in ranks.items()], aal)
    return {"mix": Mix([(ranks[r][1], w) for r, w in parts]), "aal": sum(w * ranks[r][0] for r, w in parts),
            "beyond": beyond, "label": "+".join(f"{w:.2f} {r}" for r, w in parts if w > 0)}


def against_rank_frontier(params: Params, cell: dict, stats: dict) -> list[dict]:
    """WISV against rank-R verification at equal AAL, per language. Rank-R accepts more as R grows
    and loses quality for it; between two R a time-shared mix reaches any AAL in between. On each
    channel and window the mix at WISV's AAL is built (frontier_point) and WISV's quality change
    against it taken paired on the same clips, averaged over channels and windows; `separated` when
    its CI is above 0. `beyond`: (channel, window) pairs where WISV accepts more than the highest R."""
    ranks = rank_rules(params)
    out = []
    for lang in params.data.languages:
        pairs, aal_w, aal_mix, beyond, mixes = [], [], [], 0, []
        for ch in params.wisv.channels:
            for n in params.wisv.block_lens:
                k = (lang, ch, n)
                if any(k + (r,) not in stats for r in ranks + ["wisv"]):
                    continue
                a = cell[k + ("wisv",)]["aal"]
                f = frontier_mix({r: (cell[k + (r,)]["aal"], stats[k + (r,)]) for r in ranks}, a)
                pairs.append((stats[k + ("wisv",)], f["mix"]))
                aal_w.append(a)
                aal_mix.append(f["aal"])
                beyond += f["beyond"]
                mixes.append(f["label"])
        if not pairs:
            continue
        change = mean_relative_change(pairs, "quality")
        out.append({"lang": lang, "aal_wisv": float(np.mean(aal_w)), "aal_rank": float(np.mean(aal_mix)),
                    "aal_ratio": float(np.mean(aal_w) / np.mean(aal_mix)), "mixes": mixes, "beyond": beyond,
                    "pairs": len(pairs), "quality_pct": change["value"], "quality_pct_ci": _ci(change),
                    "separated": bool(change["ci_low"] > 0)})
    return out


def protocol_table(params: Params, rows: list[dict]) -> list[dict]:
    """Full- vs selective-hidden link time per channel and window, for a 7B edge's hidden size and
    the mismatches WISV met here (the link model, no losses)."""
    from ..decoding import packets
    from ..decoding.link import Link
    from ..decoding.wisv.upload import expected_seconds
    out = []
    for ch, cfg in params.wisv.channels.items():
        for length in params.wisv.block_lens:
            wr = [r for r in rows if r["channel"] == ch and r["L"] == length and r["rule"] == "greedy"]
            k = float(np.mean([r["mismatch_rate"] for r in wr])) * length if wr else 1.0  # per block
            est = expected_seconds(Link(cfg), length, HIDDEN_7B, k, packets.id_bits(152_064))
            out.append({"channel": ch, "L": length, "mismatches": k, "full_ms": 1e3 * est["full"],
                        "selective_ms": 1e3 * est["selective"],
                        "choice": "full" if est["full"] <= est["selective"] else "selective"})
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def _table(header: list[str], rows: list[list]) -> str:
    return md_table(header, rows, _fmt)


def _markdown(params: Params, r: dict) -> str:
    m, h = r["mean"], r["head"]
    chans = "; ".join(f"{n}: up {c.uplink_mbps:g} / down {c.downlink_mbps:g} Mbps, RTT {c.rtt_ms:g} ms"
                      + (f", Markov {c.markov.good_mbps:g} / {c.markov.bad_mbps:g} Mbps" if c.markov else "")
                      for n, c in params.wisv.channels.items())
    main = _table(["lang", "channel", "L", "rule", "AAL", "rounds", "latency s", "tokens/s", "BLEU-1 [95% CI]",
                   "METEOR", "ROUGE-L", "quality [95% CI]", "tolerated", "bytes up", "hidden requests"],
                  [[x["lang"], x["channel"], x["L"], x["rule"], x["aal"], x["rounds"], x["latency"], x["throughput"],
                    _with_ci(x["bleu1"], x.get("bleu1_ci")), x["meteor"], x["rouge_l"],
                    _with_ci(x["quality"], x.get("quality_ci")), x["tolerated"], x["bytes_up"], x["hidden_requests"]]
                   for x in r["rows"]])
    deltas = _table(["lang", "channel", "L", "AAL %", "rounds %", "rounds floor %", "latency %",
                     "quality % [95% CI]"],
                    [[d["lang"], d["channel"], d["L"], d["aal_pct"], d["rounds_pct"], d.get("rounds_floor_pct"),
                      d["latency_pct"],
                      _with_ci(d["quality_pct"], d.get("quality_pct_ci"), signed=True)] for d in r["deltas"]])
    proto = _table(["channel", "L", "mismatches / block", "full-hidden ms", "selective-hidden ms", "faster"],
                   [[p["channel"], p["L"], p["mismatches"], p["full_ms"], p["selective_ms"], p["choice"]]
                    for p in r["protocols"]])
    refs = "; ".join(f"{lang}: edge-only {_fmt(v['edge'])}, cloud-only {_fmt(v['cloud'])}"
                     for lang, v in r["references"].items())
    head = _head_section(h) if h else ""
    return (
        "# WISV: CSI-aware acceptance vs greedy and rank-R verification\n\n"
        f"Every block verified (gate `always`), test clips ({params.wisv.eval_clips or 'all'} per language"
        + (f"; cross-fitting: only fold {SHIPPED_VAL_FOLD} of {params.data.cross_fit.folds}, the clips the head did not "
           "learn from" if splits.active(params) else "") + "), "
        f"upload protocol `{params.wisv.protocol}`, tau {params.wisv.tau:g}, WISV's rank cap "
        f"{params.wisv.max_rank or 'none'} (`wisv.max_rank`: a mismatch outside the cloud's top R is repaired "
        "whatever the head says; reports/wisv_rank_cap.md), rank-R with R in "
        f"{{{', '.join(str(x) for x in params.wisv.verify_ranks)}}}. "
        f"Channels: {chans}. Latency: modelled end to end per caption (measured compute + link model); "
        "throughput = tokens / latency; quality = mean of BLEU-1, METEOR and ROUGE-L (x100). Intervals: 95% paired "
        "bootstrap over the clips (the quality change against greedy: both on the same resampled clips). "
        + ("" if not params.wisv.eval_clips else
           f"{params.wisv.eval_clips} clips, not all, to keep `dvc repro` within its time budget: "
           f"{len(params.wisv.channels)} channels x "
           f"{len(params.wisv.block_lens)} windows x {len(rules(params))} rules per language; the intervals are the "
           "wider for it. ")
        + "\n\n"
        "## Side by side with the paper (WISV vs greedy verification)\n\n"
        + _table(["", "AAL", "rounds", "accuracy / quality"],
                 [["paper", f"+{PAPER['aal_gain_pct']}%", f"{PAPER['rounds_change_pct']}%",
                   f"< {PAPER['accuracy_loss_pct_below']:g}% loss"],
                  ["ours (mean over languages, channels, windows)", _pct_s(m["aal_pct"]), _pct_s(m["rounds_pct"]),
                   _pct_s(m["quality_pct"]) + (f" [{r['quality_pct_ci'][0]:+.1f}, {r['quality_pct_ci'][1]:+.1f}]"
                                               if r.get("quality_pct_ci") else "")]])
        + f"\n\nLatency change, mean: {_pct_s(m['latency_pct'])}. Quality references: {refs}. "
        + ("" if m.get("rounds_floor_pct") is None else
           "Rounds have a floor: a round commits at most L + 1 tokens (L accepted and the cloud's next), so no "
           "rule, however much it tolerates, gets below tokens / (L + 1) rounds a caption. Against greedy's "
           f"rounds that floor is {_pct_s(m['rounds_floor_pct'])} on average here (column `rounds floor %` of "
           "the table against greedy): "
           "short windows on short captions leave little to cut.")
        + "\n\n"
        "## Per channel and window\n\n" + main + "\n\n## WISV against greedy\n\n" + deltas + "\n"
        + "\n## WISV against rank-R at equal AAL\n\n"
        "Both accept more than greedy verification; at the same acceptance, does WISV keep more quality? Rank-R "
        "accepts more as R grows (greedy is R = 1); two neighbouring R time-shared (the higher one on a share w of "
        "the captions) reach any AAL between theirs, so on each channel and window WISV is compared with the mix at "
        "its own AAL. The quality change is paired on the same clips and averaged over channels and windows; "
        "WISV beats rank-R only when its CI is above 0. `beyond`: channel-window pairs where WISV accepts more than "
        "the highest R measured, compared with that R alone (a lower AAL).\n\n"
        + _table(["lang", "AAL WISV", "AAL rank mix", "mixes (channel x window)", "beyond",
                  "quality change vs rank-R % [95% CI]", "CI above 0"],
                 [[a["lang"], a["aal_wisv"], a["aal_rank"], "; ".join(a["mixes"]), f"{a['beyond']} of {a['pairs']}",
                   _with_ci(a["quality_pct"], a["quality_pct_ci"], signed=True), "yes" if a["separated"] else "no"]
                  for a in r.get("against_rank", [])]) + "\n"
        + head
        + f"\n## Upload protocol for a 7B edge (hidden size {HIDDEN_7B}, float16)\n\n"
        "Link time of one verification round on each channel, with the mismatches per block greedy verification "
        "met here. The `auto` protocol makes this choice per round; on these embedded models (hidden sizes "
        f"{params.models.edge.size.text_hidden} / {params.models.cloud.size.text_hidden}) the states are small and "
        "full-hidden almost always wins.\n\n" + proto + "\n\nPlot: wisv.png.\n")


def _head_section(h: dict) -> str:
    """The trained head's section of the report: its AUCs against their ceiling, what it rejects, how it is built."""
    factored = h.get("factored")
    crit_name = "its criticality score (the channel term left out)" if factored else "its P(reject)"
    return (f"\n## The head (validation traces)\n\n"
            f"AUC on the raw critical labels, {crit_name}: {_fmt(h.get('val_auc_critical'))} (target 0.80); "
            f"on the relabeled targets, its P(reject): {_fmt(h.get('val_auc'))} (target 0.85). "
            f"A head that knew every raw critical flag and ordered them by the channel's repair budget would "
            f"reach {_fmt(h.get('val_auc_ceiling'))} on the relabeled targets: the rest is the relabeling's own "
            f"draw (which critical mismatches a channel tolerates depends on their neighbours' importance and a "
            f"random policy), which no head can predict. Accuracy {_fmt(h.get('val_accuracy'))} at tau "
            f"{_fmt(h.get('tau'))}. Repairs asked on the poorest third of drawn channels vs the best third: "
            f"labels {_fmt(h.get('label_repair_poor'))} vs {_fmt(h.get('label_repair_good'))}, head "
            f"{_fmt(h.get('head_reject_poor'))} vs {_fmt(h.get('head_reject_good'))}. The head rejects "
            f"{_fmt(h.get('head_reject_critical'))} of critical and {_fmt(h.get('head_reject_noncritical'))} of "
            f"non-critical mismatches. Plots: head_vs_channel.png, calibration.png.\n\n"
            f"The head: {'hidden states projected to ' + str(h.get('rank')) + ' dims each' if h.get('rank') else 'raw hidden states'}"
            f"{', with the cloud scalars' if h.get('scalars') else ''}"
            + ("; factored: a criticality score of the token, trained on the raw critical flags as well as the "
               "relabeled targets, plus a linear channel term (P(reject) = sigmoid(z + w . CSI + b))"
               if factored else "; the CSI read beside the token, trained on the relabeled targets")
            + f"; trained {_fmt(h.get('fit_epochs_run'))} epochs, "
            f"kept epoch {_fmt(h.get('fit_best_epoch'))} (lowest loss on held-out train captions). "
            f"Each cloud scalar alone on the raw critical labels (validation AUC): "
            + (", ".join(f"{k[len('val_auc_critical_'):]} {_fmt(v)}" for k, v in h.items()
                         if k.startswith("val_auc_critical_")) or "-") + ".\n")


def _with_ci(v, ci: list[float] | None, signed: bool = False) -> str:
    """A figure with its [low, high] interval, as quality_table.format_ci writes them."""
    return format_ci({"value": v, "ci_low": ci[0] if ci else None, "ci_high": ci[1] if ci else None}, signed)


def _pct_s(v) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def _plot(params: Params, rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    chans = list(params.wisv.channels)
    length = max(params.wisv.block_lens)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key, label in zip(axes, ("aal", "rounds", "latency"), ("AAL (tokens / round)", "rounds per caption",
                                                                   "latency per caption, s")):
        names = rules(params)
        width = 0.8 / len(names)
        for j, rule in enumerate(names):
            vals = [np.mean([x[key] for x in rows if x["channel"] == ch and x["rule"] == rule and x["L"] == length]
                            or [np.nan]) for ch in chans]
            ax.bar(np.arange(len(chans)) + (j - (len(names) - 1) / 2) * width, vals, width, label=rule)
        ax.set_xticks(np.arange(len(chans)))
        ax.set_xticklabels(chans, rotation=20, fontsize=8)
        ax.set_ylabel(label)
    # one legend for the three panels, beside the title: inside a panel it covered the last channel's bars
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=len(names), fontsize=8, frameon=False)
    fig.suptitle(f"WISV vs greedy and rank-R, L = {length}, mean over languages", x=0.35)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
