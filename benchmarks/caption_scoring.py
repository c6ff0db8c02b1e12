"""Caption scoring as the sweep stages do it: the libraries' sentence BLEU and ROUGE-L beside the ones
speccap computes, on every caption the stages scored, in one run.

    python benchmarks/caption_scoring.py [--repeats 3] [--out reports/caption_scoring]   # after `dvc repro`

A sweep stage (decode, gate_eval, wisv_eval) scores each configuration's captions in its main
process once the configuration is decoded, while its workers wait. speccap.metrics.caption computes
sentence BLEU-1/4 (smoothing method 1), the clipped n-gram statistics corpus BLEU sums and ROUGE-L
itself: each clip's reference n-grams counted once for all its captions, the LCS length
bit-parallel. Here both ways score the distinct (caption, references) pairs of every record log a
stage kept (reports/runs, gate_runs, wisv_runs), each from an empty cache, alternating, and every
number is compared to the last bit and type. Then the whole `score_captions` of each stage's
configurations (METEOR, languages and emotions included) is timed as the stage runs it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from common import write_report
from nltk.translate.bleu_score import SmoothingFunction, modified_precision, sentence_bleu
from rouge_score import rouge_scorer

from speccap.config import load_params
from speccap.data.manifest import manifest_path, read_manifest
from speccap.metrics import caption
from speccap.project import portable_command

LOGS = {"decode": "reports/runs", "gate_eval": "reports/gate_runs", "wisv_eval": "reports/wisv_runs"}


class _Tokens:
    def __init__(self, language: str):
        self.language = language

    def tokenize(self, text: str) -> list[str]:
        return caption.tokenize(text, self.language)


def libraries(hyp: str, refs: tuple[str, ...], language: str, scorer) -> tuple:
    """BLEU-1, BLEU-4, ROUGE-L (x1) and the n-gram statistics, by nltk and rouge-score."""
    h = caption.tokenize(hyp, language)
    r = [caption.tokenize(x, language) for x in refs]
    sm = SmoothingFunction().method1
    b1 = sentence_bleu(r, h, weights=(1, 0, 0, 0), smoothing_function=sm) if h else 0.0
    b4 = sentence_bleu(r, h, smoothing_function=sm) if h else 0.0
    rl = scorer.score_multi(list(refs), hyp)["rougeL"].fmeasure if h else 0.0
    grams = tuple((p.numerator, p.denominator) for p in (modified_precision(r, h, n) for n in range(1, 5)))
    return b1, b4, rl, grams


def speccap(hyp: str, refs: tuple[str, ...], language: str, _=None) -> tuple:
    """The same numbers as speccap.metrics.caption computes them."""
    b1, b4, rl, grams, _ = caption.overlaps(caption.tokenize(hyp, language), caption.references_of(refs, language))
    return b1, b4, rl, grams


def _stage_logs(params) -> dict[str, list[tuple[str, list[dict], list[dict]]]]:
    """Per stage, each configuration's log: (language, its records, the clips they caption)."""
    clips = {lang: {c["id"]: c for c in read_manifest(manifest_path(params.data.processed_dir, "test", lang))}
             for lang in params.data.languages}
    out: dict[str, list] = {}
    for stage, folder in LOGS.items():
        for log in sorted(Path(folder).glob("*.jsonl")):
            recs = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
            recs = [r for r in recs if "caption" in r]
            lang = next((lg for lg in clips if recs and recs[0]["id"] in clips[lg]), None)
            if lang is not None and all(r["id"] in clips[lang] for r in recs):
                out.setdefault(stage, []).append((lang, recs, [clips[lang][r["id"]] for r in recs]))
    return out


def _time(fn, pairs, scorers) -> tuple[float, list]:
    caption.references_of.cache_clear()
    t0 = time.perf_counter()
    made = [fn(h, refs, lang, scorers[lang]) for h, refs, lang in pairs]
    return time.perf_counter() - t0, made


def run(repeats: int) -> dict:
    params = load_params()
    logs = _stage_logs(params)
    scorers = {lang: rouge_scorer.RougeScorer(["rougeL"], tokenizer=_Tokens(lang)) for lang in params.data.languages}
    caption.score_captions(["warm"], [["warm up wordnet"]], "en")  # WordNet loads once per process
    rows = []
    for stage, configs in logs.items():
        pairs = list(dict.fromkeys((r["caption"], tuple(x for x in c["references"] if x.strip()), lang)
                                   for lang, recs, clips in configs for r, c in zip(recs, clips)))
        times: dict[str, list[float]] = {"libraries": [], "speccap": []}
        made = {}
        for _ in range(repeats):
            for name, fn in (("libraries", libraries), ("speccap", speccap)):
                spent, made[name] = _time(fn, pairs, scorers)
                times[name].append(spent)
        differ = sum(repr(a) != repr(b) for a, b in zip(made["libraries"], made["speccap"]))
        caption._caption_scores.cache_clear()
        caption.references_of.cache_clear()
        t0 = time.perf_counter()
        for lang, recs, clips in configs:
            caption.score_captions([r["caption"] for r in recs], [c["references"] for c in clips], lang,
                                   [c.get("emotion") for c in clips])
        whole = time.perf_counter() - t0
        lib, ours = statistics.median(times["libraries"]), statistics.median(times["speccap"])
        rows.append({"stage": stage, "configurations": len(configs), "captions": sum(len(r) for _, r, _ in configs),
                     "distinct": len(pairs), "libraries_s": lib, "speccap_s": ours, "ratio": lib / ours,
                     "differ": differ, "score_captions_s": whole})
    return {"command": portable_command(), "repeats": repeats, "rows": rows}


def markdown(r: dict) -> str:
    lines = ["# Caption scoring: the libraries beside speccap's own sentence BLEU and ROUGE-L", "",
             f"Made by `{r['command']}`: every record log the sweep stages kept, each distinct (caption, references) "
             "pair scored by nltk's `sentence_bleu` (BLEU-1 and BLEU-4, smoothing method 1) and `modified_precision` "
             "(n = 1..4) and rouge-score's `score_multi` (ROUGE-L), and by speccap.metrics.caption, each from an empty "
             f"cache, alternating, median of {r['repeats']}. Then the stage's whole scoring (`score_captions` per "
             "configuration, METEOR, language and emotion included, each caption scored once per process) as the "
             "stage runs it between its decoding runs.", "",
             "| stage | configurations | captions | distinct | libraries s | speccap s | libraries / speccap | "
             "numbers that differ | the stage's whole scoring s |", "|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['stage']} | {row['configurations']} | {row['captions']} | {row['distinct']} | "
                     f"{row['libraries_s']:.1f} | {row['speccap_s']:.1f} | {row['ratio']:.1f}x | {row['differ']} | "
                     f"{row['score_captions_s']:.1f} |")
    lines += ["", "\"Numbers that differ\": pairs whose BLEU-1, BLEU-4, ROUGE-L or n-gram statistics are not the "
                  "libraries' to the last bit and type (tests/metrics/test_caption.py holds the same)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="reports/caption_scoring")
    a = ap.parse_args()
    write_report(Path(a.out), run(a.repeats), markdown)


if __name__ == "__main__":
    main()
