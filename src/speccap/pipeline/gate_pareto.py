"""The gate evaluation's Pareto figure (reports/gates/pareto.png: every row's BLEU-1 and emotion hit
against the rho it reached, per language) and the data files dvc.yaml's gate plots read."""

from __future__ import annotations

import csv
from pathlib import Path

from .gate_names import CEILING, KEYS, ORACLE, is_oracle
from .quality_table import error_bars


def _on_axis(series: dict[str, list[dict]]) -> tuple[dict, list[tuple[str, dict]], float]:
    """The entries the rho axis shows, those it does not (a gate's row far beyond every budget, such
    as the pending variant that sends its whole block: drawn, it would squeeze the curves into the
    left of the panel), and the axis's right end."""
    budgets = [e["budget"] for es in series.values() for e in es if e.get("budget")]
    limit = 2 * max(budgets) if budgets else 1.0
    kept, far = {}, []
    for name, entries in series.items():
        kept[name] = [e for e in entries if name == ORACLE or e["rho"] <= limit]
        far += [(name, e) for e in entries if name != ORACLE and e["rho"] > limit]
    shown = [e["rho"] for es in kept.values() for e in es]
    return kept, far, 1.1 * max(shown) if shown else 1.0


def pareto_data(result: dict, out: Path) -> None:
    """dvc.yaml's plots of the gates: per language, pareto_<lang>.csv, one row per budget rho* and per
    series (entropy per token, the chosen learned gate of each target, named by its target so
    that experiments that chose another classifier still share a column) its BLEU-1, emotion hit
    and the rho it reached."""
    for lang, r in result["languages"].items():
        series = {"entropy": r["gates"].get("entropy", [])}
        series |= {f"learned_{n.rsplit('-', 1)[1]}": es for n, es in r["gates"].items()
                   if n.startswith("tok-") and " (" not in n}
        budgets = sorted({e["budget"] for es in series.values() for e in es if e.get("budget") is not None})
        at = {s: {e.get("budget"): e for e in es} for s, es in series.items()}
        columns = [f"{s}_{k}" for s in series for k in (*(k for k, _ in KEYS), "rho")]
        with open(out / f"pareto_{lang}.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["budget", *columns])
            for b in budgets:
                w.writerow([b, *(_point(at[s].get(b), k) for s in series for k in (*(k for k, _ in KEYS), "rho"))])


def _point(entry: dict | None, key: str):
    if entry is None or key not in entry:
        return ""
    return entry[key]["value"] if isinstance(entry[key], dict) else entry[key]


def _on_all_clips(e: dict, k: str, r: dict) -> tuple[float, float, float]:
    """(value, low, high) of an entry's metric as the plot shows it: a row searched on fewer clips than
    edge and cloud (the ceiling) is drawn at edge + its share of the gap on its clips x the gap on all
    clips, so it stands on the same scale as the rows beside it."""
    if e["clips"] == r.get("clips") or f"gap_closed_{k}" not in e:
        return e[k]["value"], e[k]["ci_low"], e[k]["ci_high"]
    g, base, gap = e[f"gap_closed_{k}"], r["edge"][k]["value"], r["cloud"][k]["value"] - r["edge"][k]["value"]
    return tuple(base + v / 100 * gap for v in (g["value"], g["ci_low"], g["ci_high"]))


def pareto_plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    langs = list(result["languages"])
    if not langs:
        return
    fig, axes = plt.subplots(len(KEYS), len(langs), figsize=(5.5 * len(langs), 4 * len(KEYS)), squeeze=False)
    for col, lang in enumerate(langs):
        r = result["languages"][lang]
        series = {n: e for n, e in r["gates"].items() if not is_oracle(n)}
        series[ORACLE] = sorted((e for n, es in r["gates"].items() if is_oracle(n) for e in es),
                                key=lambda e: e["rho"])  # the oracles at a budget and the unlimited one
        series, far, x_max = _on_axis(series)
        for row, (k, label) in enumerate(KEYS):
            ax = axes[row][col]
            if k not in r["edge"]:
                ax.set_visible(False)
                continue
            for name, entries in sorted(series.items()):
                if not entries:
                    continue
                xs = [e["rho"] for e in entries]
                points = [_on_all_clips(e, k, r) for e in entries]
                ys = [p[0] for p in points]
                err = error_bars(points)
                if name == CEILING and entries[0]["clips"] != r.get("clips"):
                    name = f"{CEILING} (its gap shares on {entries[0]['clips']} clips)"
                style = dict(marker="*", ms=9, ls="--", capsize=2) if name == ORACLE else dict(marker="o", capsize=3)
                ax.errorbar(xs, ys, yerr=err, label=name, **style)
            ax.set_xlim(0, x_max)
            # what lies beyond the axis is named under it instead of stretching it
            beyond = "".join(f"\nbeyond the axis: {name}\nat rho {e['rho']:.2f}, {label} {e[k]['value']:.1f} "
                             f"[{e[k]['ci_low']:.1f}, {e[k]['ci_high']:.1f}]" for name, e in far)
            ax.axhline(r["cloud"][k]["value"], color="k", ls=":", lw=1, label="cloud-only")
            ax.axhline(r["edge"][k]["value"], color="grey", ls=":", lw=1, label="edge-only")
            ax.set_xlabel("rho (share of drafted tokens sent)" + beyond)
            ax.set_ylabel(label)
            ax.set_title(f"{label} at equal budgets ({lang}), 95% CI")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
