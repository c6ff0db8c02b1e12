"""The learned-gates evaluation: configurations at equal budgets, the Pareto table and plot.

Every gate (the rule baselines and the learned ones) runs on the test clips at each budget rho*
with the threshold the `gates` stage picked for it on validation traces; edge-only and cloud-only
on the same clips give the gap. Gap closed = (BLEU-1 - edge) / (cloud - edge).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config import Params, gate_decode
from .markdown import md_table
from .gates import learned_names
from .sweep import RunConfig

OUT = Path("reports/gates")


def gate_configs(params: Params, gates_json: dict) -> tuple[list[RunConfig], dict[RunConfig, dict]]:
    """The configurations and, for each gated one, {gate, budget}."""
    d = gate_decode(params)
    base = dict(rule=d.rule, rank=d.rank if d.rule == "rank" else 0)
    configs, tags = [], {}
    names = list(params.gates.baselines) + learned_names(params)
    for lang in params.data.languages:
        configs += [RunConfig("edge", lang), RunConfig("cloud", lang)]
        for name in names:
            for b in params.gates.budgets:
                thr = gates_json["gates"][name]["thresholds"][str(b)][lang]  # calibrated per language
                cfg = RunConfig("ugsd", lang, name, float(thr), d.block_len, **base)
                configs.append(cfg)
                tags[cfg] = {"gate_name": name, "budget": b}
    return configs, tags


def build_gate_report(params: Params, summary: dict, out: Path = OUT) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    ok = [c for c in summary["configs"] if c["status"] == "FINISHED"]
    langs = list(params.data.languages)
    rows, result = [], {"languages": {}}
    for lang in langs:
        ref = {m: next((c["metrics"] for c in ok if c["method"] == m and c["language"] == lang), None)
               for m in ("edge", "cloud")}
        if not ref["edge"] or not ref["cloud"]:
            continue
        gap = ref["cloud"]["bleu1"] - ref["edge"]["bleu1"]
        per_gate = {}
        for c in ok:
            if c["language"] != lang or c["method"] != "ugsd":
                continue
            m = c["metrics"]
            closed = 100 * (m["bleu1"] - ref["edge"]["bleu1"]) / gap if gap > 0 else None
            entry = {"budget": c["budget"], "rho": m.get("rho", 0.0), "bleu1": m["bleu1"], "meteor": m["meteor"],
                     "rouge_l": m["rouge_l"], "total_time": m["total_time"], "gap_closed": closed,
                     "threshold": c["threshold"]}
            per_gate.setdefault(c["gate_name"], []).append(entry)
            rows.append([lang, c["gate_name"], c["budget"], m.get("rho", 0.0), m["bleu1"], m["meteor"], m["rouge_l"],
                         m.get("emotion_hit_rate"), m["total_time"], closed])
        for entries in per_gate.values():
            entries.sort(key=lambda e: e["budget"])
        result["languages"][lang] = {"edge": ref["edge"]["bleu1"], "cloud": ref["cloud"]["bleu1"], "gates": per_gate,
                                     "target": _target(per_gate, params)}
    header = ["lang", "gate", "budget rho*", "rho", "BLEU-1", "METEOR", "ROUGE-L", "emotion hit %", "total s",
              "gap closed %"]
    fmt = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) and abs(v) < 1 else  # noqa: E731
                                           f"{v:.1f}" if isinstance(v, float) else str(v))
    lines = [md_table(header, rows, fmt)]
    target_lines = []
    for lang, r in result["languages"].items():
        for name, t in r["target"].items():
            target_lines.append(f"- {lang} {name}: best gap closed at rho <= 0.15: "
                                f"{fmt(t['best_closed_at_015'])}% (target >= 80%); not worse than entropy at any "
                                f"budget: {t['never_worse_than_entropy']}")
    (out / "gates.md").write_text(
        "# Gates at equal escalation budgets (test clips)\n\nThresholds picked on validation traces for each "
        "budget rho*; rho is what the gate really sent. Gap closed = share of the edge -> cloud BLEU-1 gap.\n\n"
        + "\n".join(lines) + "\n\n## Targets\n\n" + "\n".join(target_lines) + "\n")
    _pareto_plot(result, out / "pareto.png")
    (out / "gates.json").write_text(json.dumps(result, indent=1))
    return result


def _target(per_gate: dict, params: Params) -> dict:
    ent = {e["budget"]: e["bleu1"] for e in per_gate.get("entropy", [])}
    out = {}
    for name in learned_names(params):
        entries = per_gate.get(name, [])
        under = [e["gap_closed"] for e in entries if e["rho"] <= 0.15 and e["gap_closed"] is not None]
        out[name] = {"best_closed_at_015": max(under) if under else None,
                     "never_worse_than_entropy": all(e["bleu1"] >= ent.get(e["budget"], -1) for e in entries)
                     if ent else None}
    return out


def _pareto_plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    langs = list(result["languages"])
    if not langs:
        return
    fig, axes = plt.subplots(1, len(langs), figsize=(5.5 * len(langs), 4), squeeze=False)
    for ax, lang in zip(axes[0], langs):
        r = result["languages"][lang]
        for name, entries in sorted(r["gates"].items()):
            ax.plot([0.0] + [e["rho"] for e in entries], [r["edge"]] + [e["bleu1"] for e in entries], marker="o",
                    label=name, ls="--" if name in ("entropy", "margin", "logprob") else "-")
        ax.axhline(r["cloud"], color="k", ls=":", lw=1, label="cloud-only")
        ax.axhline(r["edge"], color="grey", ls=":", lw=1, label="edge-only")
        ax.set_xlabel("rho (share of drafted tokens sent)")
        ax.set_ylabel("BLEU-1")
        ax.set_title(f"gates at equal budgets ({lang})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
