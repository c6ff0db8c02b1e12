"""The quality table with 95% paired-bootstrap intervals: each method, the differences between
methods on the same clips, and the share of the edge -> cloud gap the speculative default closes."""

from __future__ import annotations

from ..metrics.bootstrap import ClipStats, difference, gap_closed, interval
from .markdown import md_table

METRICS = (("bleu1", "BLEU-1"), ("meteor", "METEOR"), ("rouge_l", "ROUGE-L"), ("emotion_hit_rate", "emotion hit %"))
PAIRS = (("cloud", "edge"), ("ugsd", "edge"), ("cloud", "ugsd"))


def format_ci(d: dict | None, signed: bool = False) -> str:
    """'71.1 [69.9, 72.3]' (or '+8.4 [+7.0, +9.8]' signed) from {value, ci_low, ci_high}; the value
    alone when there is no interval (older summaries)."""
    if d is None or d.get("value") is None:
        return "–"
    f = "{:+.1f}" if signed else "{:.1f}"
    if d.get("ci_low") is None:
        return f.format(d["value"])
    return f"{f.format(d['value'])} [{f.format(d['ci_low'])}, {f.format(d['ci_high'])}]"


def format_share(g: dict) -> str:
    """A share of a gap (metrics.bootstrap.gap_closed) with its interval, or the point marked as noise
    when the gap itself is not above 0."""
    return format_ci(g) if g["significant_gap"] else f"{g['value']:.0f} (noise: gap not above 0)"


def metric_ci(metrics: dict, key: str) -> dict:
    """{value, ci_low, ci_high} of a summary's figure from its `<key>_ci_low` / `<key>_ci_high`."""
    return {"value": metrics.get(key), "ci_low": metrics.get(f"{key}_ci_low"), "ci_high": metrics.get(f"{key}_ci_high")}


def _stats(config: dict | None) -> ClipStats | None:
    return ClipStats.from_json(config["clip_stats"]) if config and config.get("clip_stats") else None


def _keys(stats: ClipStats) -> list[str]:
    return [k for k, _ in METRICS if k != "emotion_hit_rate" or "emotion_hit" in stats.columns]


def quality_with_intervals(pick: dict, langs: list[str], labels: dict[str, str]) -> tuple[str, dict]:
    """(Markdown, JSON) for the methods in `labels` ({method: label}) picked per (language, method)."""
    result: dict = {}
    parts = ["# Caption quality (test split, x100) with 95% confidence intervals\n\n"
             "Each figure is followed by its 95% interval from a paired bootstrap over the test clips "
             "(2000 resamples; corpus BLEU-1 is recomputed from each resample's summed counts). Differences are "
             "paired: both methods on the same resampled clips. A difference whose interval excludes 0 is "
             "significant at 5%.\n"]
    for lang in langs:
        stats = {m: _stats(pick.get((lang, m))) for m in labels}
        have = {m: s for m, s in stats.items() if s is not None}
        if not have:
            continue
        keys = _keys(next(iter(have.values())))
        res = result[lang] = {"methods": {}, "differences": {}, "ugsd_gap_closed": {}}
        rows = []
        for m, label in labels.items():
            s = stats[m]
            res["methods"][m] = {k: interval(s, k) for k in keys} if s else None
            wrong = (pick[(lang, m)] or {}).get("metrics", {}).get("wrong_language_rate")
            rows.append([f"{label} (n = {len(s.ids)})" if s else label]
                        + [format_ci(res["methods"][m][k]) if s else "–" for k in keys]
                        + ["–" if wrong is None else f"{wrong:.1f}"])
        parts.append(f"\n## {lang}\n\n" + md_table(["method"] + [n for k, n in METRICS if k in keys]
                                                     + ["wrong language %"], rows) + "\n")
        rows = []
        for a, b in PAIRS:
            if stats.get(a) is None or stats.get(b) is None:
                continue
            d = {k: difference(stats[a], stats[b], k) for k in keys}
            res["differences"][f"{a}-{b}"] = d
            rows.append([f"{labels[a]} − {labels[b]}"] + [format_ci(d[k], signed=True) for k in keys])
        if rows:
            parts.append("\n" + md_table(["difference"] + [n for k, n in METRICS if k in keys], rows) + "\n")
        if all(stats.get(m) is not None for m in ("edge", "ugsd", "cloud")):
            lines = []
            for k, name in METRICS:
                if k not in keys:
                    continue
                g = gap_closed(stats["edge"], stats["ugsd"], stats["cloud"], k)
                res["ugsd_gap_closed"][k] = g
                gap = format_ci(g["gap"], signed=True)
                verdict = (f"{format_ci(g)} % of a gap of {gap}" if g["significant_gap"] else
                           f"not meaningful: the gap itself, {gap}, is not above 0")
                lines.append(f"- {name}: {verdict}")
            parts.append(f"\nShare of the edge → cloud gap that {labels['ugsd']} closes:\n\n" + "\n".join(lines) + "\n")
    return "".join(parts), result


def error_bars(points: list[tuple[float, float, float]]) -> list[list[float]]:
    """matplotlib's yerr for (value, ci_low, ci_high) points. A corpus-level score (BLEU-1) need not
    lie inside the bootstrap interval of the per-clip scores on a few clips: its bar then stops at
    the point instead of going negative (which matplotlib refuses)."""
    return [[max(0.0, v - lo) for v, lo, _ in points], [max(0.0, hi - v) for v, _, hi in points]]
