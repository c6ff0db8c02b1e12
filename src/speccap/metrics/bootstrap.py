"""95% confidence intervals for caption quality by the paired bootstrap over clips.

Every method captions the same clips, so a difference between two methods is judged on the same
resampled clips for both (paired): clip-to-clip variation cancels and only the methods' difference
remains. Corpus BLEU-1 is not a mean of per-clip scores (clipped matches and lengths are summed
first, then the brevity penalty applies), so each clip carries its sufficient statistics and every
resample recomputes the corpus score from their sums, exactly as nltk's corpus_bleu would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the quality figures a report shows, and how each is computed from per-clip records
MEAN_KEYS = {"meteor": "meteor", "rouge_l": "rouge_l", "emotion_hit_rate": "emotion_hit"}
QUALITY_KEYS = ("bleu1", "meteor", "rouge_l", "emotion_hit_rate")
RESAMPLES = 2000
LEVEL = 0.95


@dataclass
class ClipStats:
    """Per-clip numbers of one method on a list of clips (the same order for every method)."""

    ids: list[str]
    columns: dict[str, np.ndarray]  # bleu1_match, bleu1_count, hyp_len, ref_len, meteor, rouge_l, emotion_hit

    @classmethod
    def from_records(cls, ids: list[str], per_caption: list[dict]) -> "ClipStats":
        cols = {k: np.array([float(r[k]) for r in per_caption]) for k in
                ("bleu1_match", "bleu1_count", "hyp_len", "ref_len", "meteor", "rouge_l")}
        if all("emotion_hit" in r for r in per_caption):
            cols["emotion_hit"] = np.array([100.0 * bool(r["emotion_hit"]) for r in per_caption])
        return cls(list(ids), cols)

    def to_json(self) -> dict:
        return {"ids": self.ids, **{k: v.tolist() for k, v in self.columns.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "ClipStats":
        return cls(list(d["ids"]), {k: np.asarray(v, float) for k, v in d.items() if k != "ids"})

    def subset(self, ids: list[str]) -> "ClipStats":
        """These clips' rows, in the order of `ids` (to pair a method run on fewer clips)."""
        where = {c: i for i, c in enumerate(self.ids)}
        missing = [c for c in ids if c not in where]
        if missing:
            raise ValueError(f"{len(missing)} clip(s) not in these stats, e.g. {missing[0]}")
        rows = np.array([where[c] for c in ids], dtype=int)
        return ClipStats(list(ids), {k: v[rows] for k, v in self.columns.items()})


@dataclass
class Mix:
    """A time-shared policy: each caption made by one of several methods, drawn with these weights;
    its expected figure on a resample is the weighted sum of theirs (a baseline between two operating
    points, e.g. rank-R verification at another rule's acceptance length)."""

    parts: list[tuple[ClipStats, float]]

    def __post_init__(self):
        if not self.parts or abs(sum(w for _, w in self.parts) - 1) > 1e-9 or min(w for _, w in self.parts) < 0:
            raise ValueError(f"a mix needs weights >= 0 summing to 1 (got {[w for _, w in self.parts]})")
        _check_paired(*[s for s, _ in self.parts])

    @property
    def ids(self) -> list[str]:
        return self.parts[0][0].ids


def bleu1_emotion(bleu1, emotion_hit_rate):
    """The token gates' two targets in one figure: the mean of BLEU-1 and the emotion hit rate (%);
    scalars or arrays of bootstrap draws alike (promotion and the verify-R choice rank by it)."""
    return (bleu1 + emotion_hit_rate) / 2


def _metric(stats: ClipStats, key: str, idx: np.ndarray) -> np.ndarray:
    """The metric on each resample; idx (B, n) indexes clips (a single row = one estimate)."""
    if isinstance(stats, Mix):
        return sum(w * _metric(s, key, idx) for s, w in stats.parts)
    c = stats.columns
    if key == "bleu1":
        match, count = c["bleu1_match"][idx].sum(-1), c["bleu1_count"][idx].sum(-1)
        hyp, ref = c["hyp_len"][idx].sum(-1), c["ref_len"][idx].sum(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            bp = np.where(hyp > ref, 1.0, np.exp(1.0 - ref / np.maximum(hyp, 1e-12)))
            bp = np.where(hyp == 0, 0.0, bp)
            return 100.0 * bp * np.where(count > 0, match / np.maximum(count, 1e-12), 0.0)
    if key == "quality":  # the WISV report's single figure: the mean of BLEU-1, METEOR and ROUGE-L
        return (_metric(stats, "bleu1", idx) + _metric(stats, "meteor", idx) + _metric(stats, "rouge_l", idx)) / 3
    if key == "bleu1_emotion":
        return bleu1_emotion(_metric(stats, "bleu1", idx), _metric(stats, "emotion_hit_rate", idx))
    col = MEAN_KEYS.get(key)
    if col is None or col not in c:
        raise KeyError(f"no per-clip {key!r} to bootstrap (have {sorted(c)})")
    return c[col][idx].mean(-1)


def _resamples(n: int, seed: int, resamples: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _interval(point: float, draws: np.ndarray) -> dict:
    """Percentile interval; resamples where the figure is undefined (a gap share over a zero gap)
    are left out, and an interval with none defined is NaN."""
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return {"value": float(point), "ci_low": float("nan"), "ci_high": float("nan")}
    lo, hi = np.percentile(draws, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    return {"value": float(point), "ci_low": float(lo), "ci_high": float(hi)}


def _check_paired(*stats: "ClipStats | Mix") -> None:
    for s in stats[1:]:
        if s.ids != stats[0].ids:
            raise ValueError("paired bootstrap needs the same clips in the same order for every method "
                             f"({len(stats[0].ids)} vs {len(s.ids)} clips)")


def mean_interval(values, seed: int = 0, resamples: int = RESAMPLES) -> dict:
    """{value, ci_low, ci_high, n} of the mean of per-clip numbers (not a caption metric)."""
    v = np.asarray(values, float)
    return _interval(v.mean(), v[_resamples(len(v), seed, resamples)].mean(1)) | {"n": len(v)}


def statistic_interval(n: int, statistic, seed: int = 0, resamples: int = RESAMPLES) -> dict:
    """{value, ci_low, ci_high, n} of `statistic(clip indices)` over n clips, for a figure that is not a
    mean of per-clip numbers (an equal error rate over pairs of clips, say): the clips are resampled."""
    draws = np.array([statistic(idx) for idx in _resamples(n, seed, resamples)], float)
    return _interval(statistic(np.arange(n)), draws) | {"n": n}


def interval(stats: ClipStats, key: str, seed: int = 0, resamples: int = RESAMPLES) -> dict:
    """{value, ci_low, ci_high} of one method's metric."""
    n = len(stats.ids)
    return _interval(_metric(stats, key, np.arange(n)), _metric(stats, key, _resamples(n, seed, resamples)))


def difference(a: ClipStats, b: ClipStats, key: str, seed: int = 0, resamples: int = RESAMPLES) -> dict:
    """{value, ci_low, ci_high} of metric(a) - metric(b), paired over the same clips."""
    _check_paired(a, b)
    n = len(a.ids)
    idx = _resamples(n, seed, resamples)
    full = np.arange(n)
    return _interval(_metric(a, key, full) - _metric(b, key, full), _metric(a, key, idx) - _metric(b, key, idx))


def mean_relative_change(pairs: list[tuple[ClipStats, ClipStats]], key: str, seed: int = 0,
                         resamples: int = RESAMPLES, keep_draws: bool = False) -> dict:
    """{value, ci_low, ci_high} of the mean over `pairs` (new, old) of 100 x (metric(new) - metric(old)) /
    metric(old): e.g. WISV against greedy verification averaged over channels and windows. All pairs
    hold the same clips and are resampled together (one resample of the clips serves every pair).
    `keep_draws`: the bootstrap draws too, under "draws", for `pooled_mean`."""
    if not pairs:
        raise ValueError("no pairs to compare")
    _check_paired(*[s for pair in pairs for s in pair])
    n = len(pairs[0][0].ids)
    idx, full = _resamples(n, seed, resamples), np.arange(n)

    def rel(ix):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.mean([100.0 * (_metric(a, key, ix) - _metric(b, key, ix)) / _metric(b, key, ix)
                            for a, b in pairs], axis=0)
    draws = rel(idx)
    out = _interval(float(rel(full)), draws)
    if keep_draws:
        out["draws"] = draws
    return out


def pooled_mean(draws: list[dict]) -> dict:
    """The mean of independent estimates (e.g. one per language: different clips), with a CI from
    their bootstrap draws averaged draw by draw (`draws`: `mean_relative_change(..., keep_draws=True)`
    outputs, each resampled on its own clips with as many resamples)."""
    value = float(np.mean([d["value"] for d in draws]))
    return _interval(value, np.mean([d["draws"] for d in draws], axis=0))


def gap_closed(edge: ClipStats, method: ClipStats, cloud: ClipStats, key: str, seed: int = 0,
               resamples: int = RESAMPLES) -> dict:
    """Share (%) of the edge -> cloud gap a method closes, with its CI, and whether the gap itself is
    significant (its CI above 0); when it is not, the share is noise and `significant_gap` says so."""
    _check_paired(edge, method, cloud)
    n = len(edge.ids)
    idx = _resamples(n, seed, resamples)
    full = np.arange(n)
    e, m, c = (_metric(s, key, full) for s in (edge, method, cloud))
    eb, mb, cb = (_metric(s, key, idx) for s in (edge, method, cloud))
    gap = cb - eb
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(np.abs(gap) > 1e-9, 100.0 * (mb - eb) / gap, np.nan)
    out = _interval(100.0 * (m - e) / (c - e) if abs(c - e) > 1e-9 else float("nan"), share)
    g = _interval(c - e, gap)
    out["gap"] = g
    out["significant_gap"] = g["ci_low"] > 0
    return out


def with_intervals(metrics: dict, stats: ClipStats, seed: int = 0) -> dict:
    """`metrics` plus `<key>_ci_low` / `<key>_ci_high` for every quality figure the clips allow."""
    out = dict(metrics)
    for key in QUALITY_KEYS:
        if key == "emotion_hit_rate" and "emotion_hit" not in stats.columns:
            continue
        ci = interval(stats, key, seed)
        out[f"{key}_ci_low"], out[f"{key}_ci_high"] = ci["ci_low"], ci["ci_high"]
    return out
