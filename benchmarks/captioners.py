"""Benchmark of the embedded captioners: size, training time, prefill and per-token decode time at
2 threads, and the edge/cloud quality gap on the test split (greedy), side by side in one run.

    python benchmarks/captioners.py [--params params.yaml] [--limit N] [--out reports/captioners]

Writes <out>.json and <out>.md. Reads models/ (run `dvc repro train` first).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch
from tqdm import tqdm

from speccap.config import load_params
from speccap.data.featurize import load_clip_features
from speccap.data.manifest import manifest_path, read_manifest
from speccap.metrics.caption import score_captions
from speccap.models.generate import generate
from speccap.models.loading import load_role
from speccap.project import portable_command

METRICS = ("bleu1", "bleu4", "meteor", "rouge_l", "emotion_hit_rate", "wrong_language_rate")


def run(params_path: str | None, limit: int | None, out: Path, threads: int) -> dict:
    params = load_params(params_path)
    torch.set_num_threads(threads)
    train_report = json.loads((Path(params.models.dir) / "train_report.json").read_text())
    result = {"command": portable_command(), "threads": threads, "machine": platform.processor() or
              platform.machine(), "models": {}, "quality": {}}
    for role in ("edge", "cloud"):
        lm = load_role(params, role)
        tr = train_report.get(role, {})
        timing = {"prefill_ms": [], "decode_ms_per_token": []}
        quality = {}
        for lang in params.data.languages:
            recs = read_manifest(manifest_path(params.data.processed_dir, "test", lang))[:limit]
            caps = []
            for rec in tqdm(recs, desc=f"{role} {lang}", unit="clip"):
                mel, _ = load_clip_features(params.data.processed_dir, rec["id"])
                g = generate(lm, mel, lang, params.models.max_new_tokens)
                caps.append(g.caption)
                timing["prefill_ms"].append(1000 * g.prefill_seconds)
                if g.n_tokens:
                    timing["decode_ms_per_token"].append(1000 * g.decode_seconds / g.n_tokens)
            s = score_captions(caps, [r["references"] for r in recs], lang, [r.get("emotion") for r in recs])
            quality[lang] = {k: getattr(s, k) for k in METRICS} | {"n": s.n, "example": caps[0]}
        result["models"][role] = {
            "parameters": lm.num_parameters(), "train_seconds": tr.get("train_seconds"), "steps": tr.get("steps"),
            "best_val_loss": tr.get("best_val_loss"),
            "prefill_ms_median": statistics.median(timing["prefill_ms"]),
            "decode_ms_per_token_median": statistics.median(timing["decode_ms_per_token"]),
        }
        result["quality"][role] = quality
    e, c = result["models"]["edge"], result["models"]["cloud"]
    result["ratios"] = {"cloud_over_edge_parameters": c["parameters"] / e["parameters"],
                        "cloud_over_edge_decode_time": c["decode_ms_per_token_median"] / e["decode_ms_per_token_median"],
                        "cloud_over_edge_prefill_time": c["prefill_ms_median"] / e["prefill_ms_median"],
                        "total_train_minutes": ((e["train_seconds"] or 0) + (c["train_seconds"] or 0)) / 60}
    result["gap"] = {lang: {k: result["quality"]["cloud"][lang][k] - result["quality"]["edge"][lang][k]
                            for k in ("bleu1", "meteor", "rouge_l", "emotion_hit_rate")}
                     for lang in params.data.languages}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    out.with_suffix(".md").write_text(markdown(result))
    return result


def markdown(r: dict) -> str:
    lines = ["# Embedded captioners", "", f"Made by `{r['command']}` at {r['threads']} threads.", "",
             "| model | parameters | train min | steps | prefill ms | decode ms/token |", "|---|---|---|---|---|---|"]
    for role, m in r["models"].items():
        lines.append(f"| {role} | {m['parameters']:,} | {(m['train_seconds'] or 0) / 60:.1f} | {m['steps']} | "
                     f"{m['prefill_ms_median']:.1f} | {m['decode_ms_per_token_median']:.2f} |")
    lines += ["", "Test split, greedy, x100:", "",
              "| model | lang | BLEU-1 | BLEU-4 | METEOR | ROUGE-L | emotion hit % | wrong lang % |",
              "|---|---|---|---|---|---|---|---|"]
    for role, q in r["quality"].items():
        for lang, s in q.items():
            lines.append(f"| {role} | {lang} | {s['bleu1']:.1f} | {s['bleu4']:.1f} | {s['meteor']:.1f} | "
                         f"{s['rouge_l']:.1f} | {s['emotion_hit_rate']:.1f} | {s['wrong_language_rate']:.1f} |")
    lines += ["", "Cloud minus edge:", "", "| lang | BLEU-1 | METEOR | ROUGE-L | emotion hit |", "|---|---|---|---|---|"]
    for lang, g in r["gap"].items():
        lines.append(f"| {lang} | {g['bleu1']:+.1f} | {g['meteor']:+.1f} | {g['rouge_l']:+.1f} | {g['emotion_hit_rate']:+.1f} |")
    ra = r["ratios"]
    lines += ["", f"Cloud/edge: {ra['cloud_over_edge_parameters']:.1f}x parameters, "
              f"{ra['cloud_over_edge_decode_time']:.2f}x decode time per token, "
              f"{ra['cloud_over_edge_prefill_time']:.2f}x prefill time; both trained in "
              f"{ra['total_train_minutes']:.1f} minutes together.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default=None)
    ap.add_argument("--limit", type=int, default=None, help="clips per language (default: the whole test split)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("reports/captioners"))
    args = ap.parse_args()
    r = run(args.params, args.limit, args.out, args.threads)
    print(markdown(r))


if __name__ == "__main__":
    main()
