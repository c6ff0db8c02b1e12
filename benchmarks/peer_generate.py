"""Cloud-only captioning beside the peer a user would pick instead, transformers' own batched greedy
`generate()`, on the same trained cloud model, clips and thread count, in one run.

    python benchmarks/peer_generate.py [--clips 50] [--batch 1 32] [--threads 1] [--repeats 3]

For each B of `--batch`, on the first `--clips` test clips per language:
1. transformers: the cloud thinker's `generate()`, greedy, B clips a call (prompts left-padded, the
   audio features padded with their mask), each caption's language mask given as a logits processor
   (the ids the project's sessions block, models.language_mask), up to models.max_new_tokens;
2. speccap: the decode stage's cloud-only configuration through the stage's own worker job
   (pipeline.workers: B = 1 the single executor, B > 1 the batching one), record, link model and
   all; the features are read from disk per caption here, preloaded for transformers. No prompt is
   kept between repeats (`sweep.prompt_cache_mb: 0`): each side prefills every clip every time.
The two alternate `--repeats` times after a warm-up; clips per second is each side's median. Every
caption is checked equal, clip by clip. Writes reports/peer_generate.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
import yaml
from common import load_models, write_report
from transformers import LogitsProcessor, LogitsProcessorList

from speccap.config import load_params
from speccap.data.featurize import load_clip_features
from speccap.models.language_mask import BLOCKED_LOGIT
from speccap.pipeline.splits import eval_clips
from speccap.pipeline.sweep import build_configs
from speccap.pipeline.workers import Pool
from speccap.project import portable_command

TARGET = 1.0  # the issue's: cloud-only at B = 32 at least as fast as generate() at batch 32


class RowMask(LogitsProcessor):
    """Each row's blocked ids (its caption's language) at the project's blocked logit."""

    def __init__(self, mask: torch.Tensor):
        self.mask = mask

    def __call__(self, input_ids, scores):
        return scores.masked_fill(self.mask, BLOCKED_LOGIT)


def hf_captions(lm, clips: list[tuple[str, str, np.ndarray]], batch: int, max_new: int) -> list[str]:
    """transformers' batched greedy generate() over `clips` ((id, language, features)), `batch` a call."""
    width = lm.model.config.get_text_config().vocab_size
    out_caps = []
    for at in range(0, len(clips), batch):
        part = clips[at: at + batch]
        feats = [np.asarray(f, np.float32) for _, _, f in part]
        prompts = [lm.prompt_ids(f.shape[1], language) for f, (_, language, _) in zip(feats, part)]
        b, t, frames = len(part), max(map(len, prompts)), max(f.shape[1] for f in feats)
        x = torch.zeros((b, feats[0].shape[0], frames))
        fmask = torch.zeros((b, frames), dtype=torch.long)
        ids = torch.full((b, t), lm.pad_token_id)
        attn = torch.zeros_like(ids)
        blocked = torch.zeros((b, width), dtype=torch.bool)
        for i, (f, prompt, (_, language, _)) in enumerate(zip(feats, prompts, part)):
            x[i, :, : f.shape[1]] = torch.from_numpy(f)
            fmask[i, : f.shape[1]] = 1
            ids[i, t - len(prompt):] = torch.tensor(prompt)  # left padding: generate() appends on the right
            attn[i, t - len(prompt):] = 1
            blocked[i, lm.blocked_ids(language)] = True
            blocked[i, lm.vocab_size:] = True  # beyond the vocabulary the pair shares
        made = lm.model.generate(input_ids=ids, attention_mask=attn, input_features=x.to(lm.dtype),
                                 feature_attention_mask=fmask, max_new_tokens=max_new, do_sample=False,
                                 eos_token_id=lm.eos_token_id, pad_token_id=lm.pad_token_id,
                                 logits_processor=LogitsProcessorList([RowMask(blocked)]))
        for row in made[:, t:].tolist():
            out_caps.append(lm.decode(row[: row.index(lm.eos_token_id)] if lm.eos_token_id in row else row))
    return out_caps


def speccap_captions(pool: Pool, jobs: list) -> list[str]:
    """The captions of `jobs` through the stage's worker job, in the jobs' order (a batched worker
    hands records back as their loops end)."""
    made = {r["id"]: r for r in pool.imap(jobs)}
    failed = [r for r in made.values() if "error" in r]
    if failed:
        raise RuntimeError(f"cloud-only failed on {failed[0]['id']}: {failed[0]['error']}")
    return [made[clip]["caption"] for _, clip in jobs]


def run(n_clips: int, batches: list[int], threads: int, repeats: int) -> dict:
    params = load_params("params.yaml")
    _, cloud = load_models(params, threads)
    max_new = params.models.max_new_tokens
    configs = {c.language: c for c in build_configs(params) if c.method == "cloud"}
    clips = [(c["id"], lang, cloud.wire(load_clip_features(params.data.processed_dir, c["id"])[0]))
             for lang in params.data.languages for c in eval_clips(params, lang)[:n_clips]]
    jobs = [(configs[lang], cid) for cid, lang, _ in clips]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:  # a kept prompt would spare speccap's repeats their prefills
        unkept = Path(tmp) / "params.yaml"
        raw = yaml.safe_load(Path("params.yaml").read_text(encoding="utf-8"))
        raw.setdefault("sweep", {})["prompt_cache_mb"] = 0
        unkept.write_text(yaml.safe_dump(raw), encoding="utf-8")
        for b in batches:
            rows.append(_side_by_side(cloud, clips, jobs, b, max_new, threads, repeats, str(unkept)))
    return {"command": portable_command(), "threads": threads, "clips_per_language": n_clips, "repeats": repeats,
            "max_new_tokens": max_new, "cloud_parameters": cloud.num_parameters(), "rows": rows, "target": TARGET}


def _side_by_side(cloud, clips, jobs, b: int, max_new: int, threads: int, repeats: int, params_file: str) -> dict:
    """Both sides at B = `b`: each one's time per repeat, clips per second, captions compared."""
    sides = {"transformers": partial(hf_captions, cloud, clips, b, max_new),
             "speccap": partial(speccap_captions, Pool(params_file, workers=0, threads=threads, batch=b), jobs)}
    times: dict[str, list[float]] = {side: [] for side in sides}
    with torch.inference_mode():
        for fn in sides.values():
            fn()  # warm-up: first calls allocate
        for _ in range(repeats):
            for side, fn in sides.items():
                t0 = time.perf_counter()
                made = fn()
                times[side].append(time.perf_counter() - t0)
                if side == "transformers":
                    peer = made
                else:
                    mine = made
    rate = {side: len(clips) / statistics.median(ts) for side, ts in times.items()}
    differ = [{"clip": cid, "transformers": p, "speccap": m} for (cid, _, _), p, m in zip(clips, peer, mine) if p != m]
    return {"batch": b, "seconds": times, "clips_per_s": rate, "ratio": rate["speccap"] / rate["transformers"],
            "captions": len(clips), "captions_differ": len(differ), "differences": differ[:10]}


def markdown(r: dict) -> str:
    lines = [
        "# Cloud-only beside transformers' batched generate()",
        "",
        f"Made by `{r['command']}`: the trained cloud model ({r['cloud_parameters']:,} parameters) on the first "
        f"{r['clips_per_language']} test clips per language, greedy, up to {r['max_new_tokens']} tokens, "
        f"{r['threads']} torch thread(s); each side's median of {r['repeats']} alternating runs. transformers: the "
        "thinker's own `generate()`, B clips a call, the language mask as a logits processor. speccap: the decode "
        "stage's cloud-only configuration through the stage's worker job (records, link model and all).",
        "",
        "| clips at once (B) | transformers clips/s | speccap clips/s | speccap / transformers | captions equal |",
        "|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        lines.append(f"| {row['batch']} | {row['clips_per_s']['transformers']:.1f} | {row['clips_per_s']['speccap']:.1f} | "
                     f"{row['ratio']:.2f}x | {row['captions'] - row['captions_differ']} / {row['captions']} |")
    top = [row for row in r["rows"] if row["batch"] == max(x["batch"] for x in r["rows"])][0]
    met = "met" if top["ratio"] >= r["target"] and not top["captions_differ"] else "not met"
    lines += ["", f"At B = {top['batch']}: **{top['ratio']:.2f}x** transformers' batched `generate()` (target at least "
                  f"{r['target']:.0f}x with every caption equal: {met})."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=50, help="test clips per language")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="clips at once, on both sides")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("reports/peer_generate"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    r = run(args.clips, args.batch, args.threads, args.repeats)
    write_report(args.out, r, markdown)


if __name__ == "__main__":
    main()
