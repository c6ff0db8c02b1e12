"""What an experiment is judged by, in one small file: reports/headline.json, the only file dvc.yaml
declares as metrics, so `dvc metrics show`, `dvc metrics diff` and `dvc exp show` print it and
nothing else (every other report is a plain output, intervals included).

Per language, x100 point estimates: BLEU-1 and emotion hit of edge-only and cloud-only; of the
default UGSD configuration (params `decode:`), with its rho and its modelled seconds per caption; and
of the promoted gate at the promote budget, with its rho and the share of each edge-to-cloud gap it
closes (gap closed = (x - edge) / (cloud - edge), in %). The default UGSD's gaps are left out: they
follow from the figures beside them, and 4 more columns would push `dvc exp show` past a 200-column
terminal when a decode param changes (every UGSD figure moves then). Its name and the
intervals are in reports/gates/gates.md and reports/promotion.json.
"""

from __future__ import annotations

import json
from pathlib import Path

HEADLINE = Path("reports/headline.json")
QUALITY = {"bleu1": "bleu1", "emotion": "emotion_hit_rate"}  # headline name -> report key


class HeadlineError(ValueError):
    """A report the headline is made of lacks what it needs (names the file and the key)."""


def _gap(x: float | None, edge: float | None, cloud: float | None) -> float | None:
    if None in (x, edge, cloud) or cloud == edge:
        return None
    return round(100.0 * (x - edge) / (cloud - edge), 1)


def _value(entry, digits: int) -> float | None:
    """A report's figure, rounded: a number, or an interval's point value; None where the run does
    not measure it (no emotion labels on MER2024: no emotion hit)."""
    if isinstance(entry, dict):
        entry = entry.get("value")
    return round(float(entry), digits) if isinstance(entry, (int, float)) else None


def _figures(**values: float | None) -> dict[str, float]:
    """Only what was measured: a metrics file holds numbers, and DVC shows a missing one as '-'."""
    return {k: v for k, v in values.items() if v is not None}


def _quality(row: dict) -> dict[str, float | None]:
    return {name: _value(row.get(key), 1) for name, key in QUALITY.items()}


def _with_gaps(row: dict, edge: dict, cloud: dict, **extra: float | None) -> dict[str, float]:
    q = _quality(row)
    return _figures(**q, **extra, **{f"gap_{k}": _gap(q[k], edge.get(k), cloud.get(k)) for k in QUALITY})


def headline(metrics: dict, gates: dict, promotion: dict, languages) -> dict:
    """The headline from the report stage's metrics.json, gate_eval's gates.json and promote's
    promotion.json (their contents); `languages`: the ones to show, in order."""
    champion = (promotion.get("champion_after") or {}).get("tags", {}).get("gate")
    budget = promotion.get("budget")
    out = {}
    for lang in languages:
        per = metrics.get(lang) or {}
        if not all(per.get(m) for m in ("edge", "cloud", "ugsd")):
            raise HeadlineError(f"reports/metrics.json: {lang} lacks edge-only, cloud-only or the default UGSD "
                                "(dvc repro report)")
        edge, cloud, ugsd = (_quality(per[m]) for m in ("edge", "cloud", "ugsd"))
        row = {"edge": _figures(**edge), "cloud": _figures(**cloud),
               "ugsd": _figures(**ugsd, rho=_value(per["ugsd"].get("rho"), 3),
                                seconds=_value(per["ugsd"].get("total_time"), 3))}
        entries = gates.get("languages", {}).get(lang, {}).get("gates", {}).get(champion, [])
        at = next((e for e in entries if e.get("budget") == budget), None)
        if at is None:
            raise HeadlineError(f"reports/gates/gates.json: no row of the promoted gate {champion!r} at budget "
                                f"{budget} in {lang} (dvc repro gate_eval promote)")
        row["gate"] = _with_gaps(at, edge, cloud, rho=_value(at.get("rho"), 3))
        out[lang] = row
    return out


def write_headline(languages, reports: Path = Path("reports"), out: Path = HEADLINE) -> dict:
    """Read the three reports under `reports`, write the headline to `out`, return it."""
    def load(rel: str, stage: str) -> dict:
        path = reports / rel
        if not path.exists():
            raise FileNotFoundError(f"{path}: not there (run the stage that writes it: dvc repro {stage})")
        return json.loads(path.read_text())
    result = headline(load("metrics.json", "report"), load("gates/gates.json", "gate_eval"),
                      load("promotion.json", "promote"), languages)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result
