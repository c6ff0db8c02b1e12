"""The report stage: tables (Markdown) mirroring the papers and plots (PNG + CSV for `dvc plots`)
from the decode sweep's summary."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from ..config import Params
from .markdown import md_table
from .quality_table import error_bars, format_ci, metric_ci, quality_with_intervals

QUALITY = (("bleu1", "BLEU-1"), ("bleu4", "BLEU-4"), ("meteor", "METEOR"), ("rouge_l", "ROUGE-L"))
EFFICIENCY = (("ttft", "TTFT s"), ("itps", "ITPS /s"), ("otps", "OTPS /s"), ("oet", "OET s"),
              ("total_time", "Total s"), ("cpu_percent", "CPU %"), ("ram_gb", "RAM GB"),
              ("gpu_percent", "GPU %"), ("gpu_memory_gb", "GPU mem GB"))
# the columns of the plots' data files (reports/plots/*_<lang>.csv)
PLOT_METRICS = ("bleu1", "emotion_hit_rate", "total_time", "rho")


def _fmt(v, nd=2):
    return "–" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def _table(header: list[str], rows: list[list]) -> str:
    return md_table(header, rows, _fmt) + "\n"


def _at_default_gate(c: dict, params: Params) -> bool:
    d = params.decode
    return (c["method"] == "ugsd" and c["gate"] == d.gate
            and (d.gate in ("never", "always") or abs((c["threshold"] or 0) - d.threshold) < 1e-9))


def _clips_note(params: Params) -> str:
    """Which clips the rows ran on, when the sweep's details run on fewer than its headline three."""
    n = params.sweep.detail_clips
    if not n:
        return ""
    return (f"Edge-only, cloud-only and UGSD at the default setting run on all test clips (`sweep.clips`); the other "
            f"configurations on the first {n} of them (`sweep.detail_clips`), so their intervals are wider and their "
            "point estimates are not paired with the headline three's.\n\n")


def default_ugsd(configs: list[dict], params: Params, lang: str, in_flight: int | None = None) -> dict | None:
    """The UGSD configuration at the default gate, threshold and L (and loop: decode.in_flight)."""
    d = params.decode
    n = d.in_flight if in_flight is None else in_flight
    for c in configs:
        if (_at_default_gate(c, params) and c["language"] == lang and c["block_len"] == d.block_len
                and c.get("in_flight", 0) == n):
            return c
    return None


def build_report(params: Params, summary: dict, out_dir: str | Path = "reports") -> dict:
    out = Path(out_dir)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    ok = [c for c in summary["configs"] if c["status"] == "FINISHED"]
    # the sampling-rule comparison (Q-S vs dense speculative sampling) has its own table; the
    # others are the papers' greedy sweeps
    sampled = [c for c in ok if c.get("temperature") is not None]
    ok = [c for c in ok if c.get("temperature") is None]
    failed = [c for c in summary["configs"] if c["status"] != "FINISHED"]
    langs = list(params.data.languages)
    pick = {}
    for lang in langs:
        for m in ("edge", "cloud"):
            pick[(lang, m)] = next((c for c in ok if c["method"] == m and c["language"] == lang), None)
        pick[(lang, "ugsd")] = default_ugsd(ok, params, lang)
    methods = (("edge", "Edge-only"), ("ugsd", "UGSD (default)"), ("cloud", "Cloud-only"))

    # Table 3-4 style: quality per method and language, with 95% paired-bootstrap intervals
    quality_md, quality_ci = quality_with_intervals(pick, langs, dict(methods))
    rows = []
    for m, label in methods:
        row = [label]
        for lang in langs:
            c = pick[(lang, m)]
            row += [c["metrics"].get(k) if c else None for k, _ in QUALITY]
        rows.append(row)
    header = ["method"] + [f"{n} {lang}" for lang in langs for _, n in QUALITY]
    (out / "tables" / "quality.md").write_text(
        quality_md + "\n## All figures (point estimates)\n\n" + _table(header, rows))

    # Table 2 style: efficiency
    rows = []
    for lang in langs:
        for m, label in methods:
            c = pick[(lang, m)]
            rows.append([lang, label] + [c["metrics"].get(k) if c else None for k, _ in EFFICIENCY])
    (out / "tables" / "efficiency.md").write_text(
        "# Efficiency per caption (means; virtual clock = measured compute + modelled link)\n\n"
        + _table(["lang", "method"] + [n for _, n in EFFICIENCY], rows))

    # Table 5 style: what leaves the device
    d = params.decode
    ugsd = [c for c in ok if c["method"] == "ugsd" and c.get("in_flight", 0) == d.in_flight]
    rows = [[c["language"], c["name"], c.get("clips"), c["metrics"].get("rho"), c["metrics"].get("bytes_up"),
             c["metrics"].get("rounds"), c["metrics"].get("aal"), c["metrics"].get("bleu1")] for c in ugsd]
    for lang in langs:
        for m in ("edge", "cloud"):
            c = pick[(lang, m)]
            if c:
                rows.append([lang, c["name"], c.get("clips"), 0.0 if m == "edge" else 1.0, c["metrics"].get("bytes_up", 0.0),
                             c["metrics"].get("rounds", 0.0), None, c["metrics"].get("bleu1")])
    (out / "tables" / "privacy.md").write_text(
        "# Token transmission rate (rho = transmitted / drafted) and uplink bytes per caption\n\n"
        + _clips_note(params) + _table(["lang", "config", "clips", "rho", "bytes up", "rounds", "AAL", "BLEU-1"], rows))

    lsweep = _l_sweep_table(params, ugsd, out)
    _gates_table(params, ok, ugsd, out)
    _pipelined_table(params, ok, langs, pick, out)
    _qs_table(params, sampled, out)
    _plots([c for c in ok if c.get("in_flight", 0) == d.in_flight], langs, lsweep, out / "plots")
    if failed:
        (out / "tables" / "failed.md").write_text("# Failed configurations\n\n" + _table(
            ["config", "error"], [[c["name"], c.get("error", "")[:300]] for c in failed]))
    metrics = {lang: {m: ({k: pick[(lang, m)]["metrics"].get(k) for k in
                           ("bleu1", "bleu4", "meteor", "rouge_l", "emotion_hit_rate", "total_time", "otps", "rho", "aal")}
                          if pick[(lang, m)] else None) for m, _ in methods} for lang in langs}
    metrics["configs"] = {"finished": len(ok), "failed": len(failed)}
    metrics["intervals"] = quality_ci  # per language: each method's CIs, paired differences, gap closed
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    return metrics


def _l_sweep_table(params: Params, ugsd: list[dict], out: Path) -> list[dict]:
    """The L sweep at the default gate: its table and CSV; returns its configurations."""
    d = params.decode
    lsweep = sorted([c for c in ugsd if _at_default_gate(c, params)], key=lambda c: (c["language"], c["block_len"] or 999))
    rows = [[c["language"], "adaptive" if c["block_len"] == 0 else c["block_len"], c.get("clips"),
             format_ci(metric_ci(c["metrics"], "bleu1"))] +
            [c["metrics"].get(k) for k in ("meteor", "rouge_l", "total_time", "rho", "aal", "rounds")]
            for c in lsweep]
    (out / "tables" / "l_sweep.md").write_text(
        f"# Draft length L (gate {d.gate} {d.threshold:g}, rule {d.rule})\n\n" + _clips_note(params)
        + _table(["lang", "L", "clips", "BLEU-1 [95% CI]", "METEOR", "ROUGE-L", "total s", "rho", "AAL", "rounds"], rows))
    for lang in params.data.languages:  # dvc.yaml's plots: one file per language, the fixed L as x
        fixed = [c for c in lsweep if c["language"] == lang and c["block_len"]]
        _series(out / "plots" / f"l_sweep_{lang}.csv", ["L", *PLOT_METRICS],
                [[c["block_len"], *(c["metrics"].get(k) for k in PLOT_METRICS)] for c in fixed])
    return lsweep


def _gates_table(params: Params, ok: list[dict], ugsd: list[dict], out: Path) -> None:
    """The gates at the default L (table), and quality against rho for every configuration (CSV)."""
    d = params.decode
    gates = sorted([c for c in ugsd if c["block_len"] == d.block_len], key=lambda c: (c["language"], c["gate"], c["threshold"] or 0))
    rows = [[c["language"], c["gate"], c["threshold"], c.get("clips"), format_ci(metric_ci(c["metrics"], "bleu1"))]
            + [c["metrics"].get(k) for k in ("meteor", "rouge_l", "emotion_hit_rate", "rho", "total_time")] for c in gates]
    (out / "tables" / "gates.md").write_text(
        f"# Gates at L = {d.block_len}\n\n" + _clips_note(params)
        + _table(["lang", "gate", "threshold", "clips", "BLEU-1 [95% CI]", "METEOR", "ROUGE-L", "emotion hit %", "rho",
                  "total s"], rows))
    for lang in params.data.languages:  # dvc.yaml's plots: every configuration a point, rho as x
        points = sorted(([{"edge": 0.0, "cloud": 1.0}.get(c["method"], c["metrics"].get("rho", 0.0)), c["name"],
                          *(c["metrics"].get(k) for k in PLOT_METRICS if k != "rho")]
                         for c in ok if c["language"] == lang), key=lambda row: (row[0], row[1]))
        _series(out / "plots" / f"quality_vs_rho_{lang}.csv",
                ["rho", "config", *(k for k in PLOT_METRICS if k != "rho")], points)


def _series(path: Path, header: list[str], rows: list[list]) -> None:
    """A data file of dvc.yaml's plots (CSV: one x column, one column per y)."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def _qs_table(params: Params, sampled: list[dict], out: Path) -> None:
    """Q-S at each lattice level (and adaptive) against dense speculative sampling, every block verified."""
    path = out / "tables" / "qs.md"
    if not sampled:
        path.write_text("# Q-S\n\nNo sampled configurations in this sweep (sweep.qs_levels is empty).\n")
        return
    rows = []
    for c in sorted(sampled, key=lambda c: (c["language"], c["rule"] != "spec_sampling", c.get("level") or 999)):
        m = c["metrics"]
        rows.append([c["language"], c["rule"] if c["rule"] != "qs" else f"qs l={c.get('level') or 'adaptive'}",
                     c.get("clips"), m.get("total_time"), (m.get("tokens") or 0) / m["total_time"] if m.get("total_time") else None,
                     m.get("aal"), m.get("rounds"), m.get("bytes_up"), m.get("bleu1"), m.get("meteor")])
    t = sampled[0].get("temperature")
    path.write_text(
        f"# Q-S vs speculative sampling (temperature {t:g}, every block verified, link {params.link.name})\n\n"
        "Both are lossless: the output follows the cloud's distribution. Q-S sends the lattice-quantized draft "
        "distribution sparsely instead of dense float16 rows; a coarser lattice sends less and is accepted less "
        "often. tokens/s = committed tokens / total time (virtual clock).\n\n" + _clips_note(params)
        + _table(["lang", "rule", "clips", "total s", "tokens/s", "AAL", "rounds", "bytes up", "BLEU-1", "METEOR"], rows))


def _pipelined_table(params: Params, ok: list[dict], langs: list[str], pick: dict, out: Path) -> None:
    """Blocking vs pipelined verification at the default gate and L, against edge- and cloud-only."""
    rows = []
    for lang in langs:
        edge = pick[(lang, "edge")]
        base = edge["metrics"]["total_time"] if edge else None
        runs = sorted((c for c in ok if c["language"] == lang and c["method"] == "ugsd"
                       and c == default_ugsd(ok, params, lang, c.get("in_flight", 0))),
                      key=lambda c: c.get("in_flight", 0))
        for c in [edge] + runs + [pick[(lang, "cloud")]]:
            if c is None:
                continue
            m = c["metrics"]
            mode = c["method"] if c["method"] != "ugsd" else (
                f"pipelined N={c['in_flight']}" if c.get("in_flight") else "blocking")
            rows.append([lang, mode, c.get("clips"), m.get("total_time"), m.get("total_time") / base if base else None, m.get("otps"),
                         m.get("wait_time", 0.0), m.get("wasted", 0.0), m.get("stale", 0.0), m.get("rounds", 0.0),
                         m.get("bleu1")])
    d = params.decode
    (out / "tables" / "pipelined.md").write_text(
        f"# Blocking vs pipelined verification (gate {d.gate} {d.threshold:g}, L = {d.block_len or 'adaptive'}, "
        f"link {params.link.name}: RTT {params.link.rtt_ms:g} ms)\n\nPer caption means. N = blocks in flight while the "
        "edge drafts ahead; wasted = drafted tokens thrown away after a rejection; stale = blocks the cloud dropped "
        "unverified. For greedy rules the captions are the blocking loop's, so quality only moves with sampling.\n\n"
        + _clips_note(params) + _table(["lang", "mode", "clips", "total s", "x edge-only", "OTPS", "wait s", "wasted",
                                        "stale", "rounds", "BLEU-1"],
                 rows))


def _plots(ok: list[dict], langs: list[str], lsweep: list[dict], out: Path) -> None:
    colors = {"edge": "tab:blue", "cloud": "tab:red", "ugsd": "tab:green"}
    for name, xkey, xlabel in (("quality_vs_time", "total_time", "total time per caption (s)"),
                               ("quality_vs_rho", "rho", "token transmission rate rho")):
        fig, axes = plt.subplots(1, len(langs), figsize=(5.5 * len(langs), 4), squeeze=False)
        for ax, lang in zip(axes[0], langs):
            for c in (c for c in ok if c["language"] == lang):
                x = c["metrics"].get(xkey, 0.0) if not (xkey == "rho" and c["method"] != "ugsd") else \
                    (0.0 if c["method"] == "edge" else 1.0)
                m = c["metrics"]
                # the 95% bootstrap interval of BLEU-1 as an error bar (absent in older summaries)
                yerr = (error_bars([(m["bleu1"], m["bleu1_ci_low"], m["bleu1_ci_high"])])
                        if "bleu1_ci_low" in m else None)
                ax.errorbar(x, m["bleu1"], yerr=yerr, fmt="o", color=colors[c["method"]], ms=5, capsize=2,
                            elinewidth=0.8, label=c["method"] if c["method"] != "ugsd" else "UGSD configs")
            handles, labels = ax.get_legend_handles_labels()
            uniq = dict(zip(labels, handles))
            ax.legend(uniq.values(), uniq.keys(), fontsize=8)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("BLEU-1")
            ax.set_title(lang)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=110)
        plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    swept = sorted({c["block_len"] for c in lsweep if c["block_len"]})
    for lang, color in zip(langs, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        pts = sorted((c for c in lsweep if c["language"] == lang and c["block_len"]), key=lambda c: c["block_len"])
        xs = [c["block_len"] for c in pts]
        ys = [c["metrics"]["bleu1"] for c in pts]
        err = error_bars([(y, c["metrics"].get("bleu1_ci_low", y), c["metrics"].get("bleu1_ci_high", y))
                          for y, c in zip(ys, pts)])
        axes[0].errorbar(xs, ys, yerr=err, marker="o", capsize=2, label=f"{lang}, fixed L", color=color)
        axes[1].plot(xs, [c["metrics"]["total_time"] for c in pts], marker="o", label=f"{lang}, fixed L", color=color)
        # the UGSD-adaptive rule has no single L: a level across the panel
        for c in (c for c in lsweep if c["language"] == lang and not c["block_len"]):
            axes[0].axhline(c["metrics"]["bleu1"], color=color, ls="--", lw=1, label=f"{lang}, adaptive L")
            axes[1].axhline(c["metrics"]["total_time"], color=color, ls="--", lw=1, label=f"{lang}, adaptive L")
    for ax, ylabel in zip(axes, ("BLEU-1 (95% CI)", "total time per caption (s, this machine)")):
        ax.set_xticks(swept)
        ax.set_xlabel("draft length L")
        ax.set_ylabel(ylabel)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "l_sweep.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for c in lsweep:
        acc = c["metrics"].get("position_acceptance") or []
        if c["block_len"] in (5, 7) and acc:
            ax.plot(range(1, len(acc) + 1), acc, marker=".", label=f"{c['language']} L={c['block_len']}")
    ax.set_xlabel("position in block")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "position_acceptance.png", dpi=110)
    plt.close(fig)
