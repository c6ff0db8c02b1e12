"""The quality side of the privacy frontier: a cloud trained on each candidate uplink, and the share
of the edge -> cloud gap it keeps.

    python benchmarks/privacy_quality.py [--candidates 128x8 16x16c] [--clips 100]   # where the pipeline ran

The `privacy` stage measures what each uplink of `privacy.candidates` reveals
(reports/privacy/privacy.md); what the cloud can still caption from it needs a cloud trained on it.
For each candidate ([bands]x[frames merged], `c` for clip-normalised: `uplink:` params): the embedded
cloud trained on that view of the pipeline's features exactly as the `train` stage trains it with
those `uplink:` params (in benchmarks/out/privacy_quality/<candidate>/, the tokenizer shared), then
cloud-only captions of the first `--clips` test clips per language, the cloud reading that view.
Against the decode sweep's edge-only and cloud-only captions of the same clips
(reports/decode_summary.json: the cloud on the log-mel sent today): BLEU-1 and emotion hit with 95%
intervals, and the share of the gap kept, paired over clips. Writes reports/privacy_quality.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

from tqdm import tqdm

from speccap.config import load_params
from speccap.data.featurize import load_clip_features
from speccap.data.manifest import manifest_path, read_manifest
from speccap.data.uplink import Uplink
from speccap.decoding.engine import cloud_only
from speccap.decoding.link import Link
from speccap.metrics.bootstrap import ClipStats, gap_closed, interval
from speccap.metrics.caption import score_captions
from speccap.models.captioners import train_captioners
from speccap.models.loading import load_role
from speccap.params_uplink import UplinkParams
from speccap.pipeline.markdown import interval_text

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("bleu1", "emotion_hit_rate")


def _candidate_params(params, uplink: UplinkParams, where: Path):
    """params for one candidate: its uplink, its own models folder with the pipeline's tokenizer."""
    models = where / "models"
    if not (models / "tokenizer").exists():
        shutil.copytree(Path(params.models.dir) / "tokenizer", models / "tokenizer")
    return dataclasses.replace(params, uplink=uplink, models=dataclasses.replace(params.models, dir=str(models)))


def parse_candidate(text: str) -> UplinkParams:
    """"128x8" -> 128 bands, 8 frames merged; a trailing "c": clip-normalised."""
    norm = "clip" if text.endswith("c") else "none"
    bands, merge = (int(x) for x in text.rstrip("c").split("x"))
    return UplinkParams(bands, merge, norm)


def _stats(summary: dict, name: str, ids: list[str]) -> ClipStats:
    cfg = next(c for c in summary["configs"] if c["name"] == name)
    return ClipStats.from_json(cfg["clip_stats"]).subset(ids)


def _cloud_stats(p, cloud, clips: list[dict], lang: str) -> ClipStats:
    caps = []
    for i, rec in enumerate(tqdm(clips, desc=f"cloud-only {lang}", unit="clip")):
        mel = load_clip_features(p.data.processed_dir, rec["id"])[0]
        caps.append(cloud_only(cloud, mel, lang, Link(p.link, seed=i), p.models.max_new_tokens).caption)
    s = score_captions(caps, [c["references"] for c in clips], lang, [c.get("emotion") for c in clips])
    return ClipStats.from_records([c["id"] for c in clips], s.per_caption)


def run(candidates: list[str], n_clips: int, out_root: Path) -> dict:
    params = load_params()
    summary = json.loads((ROOT / "reports" / "decode_summary.json").read_text())
    test = {lang: read_manifest(manifest_path(params.data.processed_dir, "test", lang))[:n_clips]
            for lang in params.data.languages}
    rows = []
    for name in candidates:
        uplink = parse_candidate(name)
        where = out_root / name
        p = _candidate_params(params, uplink, where)
        if not (where / "models" / "cloud" / "config.json").exists():
            train_captioners(p, roles=("cloud",))
        cloud = load_role(p, "cloud")
        assert cloud.uplink == Uplink.from_params(uplink), f"{where}: a cloud trained on another uplink"
        row = {"candidate": name, "name": cloud.uplink.name(params.features.n_mels, params.features.hop_length),
               **uplink.__dict__, "languages": {}}
        for lang, clips in test.items():
            ids = [c["id"] for c in clips]
            edge, logmel = _stats(summary, f"edge-{lang}", ids), _stats(summary, f"cloud-{lang}", ids)
            cand = _cloud_stats(p, cloud, clips, lang)
            row["languages"][lang] = {
                "clips": len(ids),
                **{k: {"edge": interval(edge, k), "cloud (log-mel)": interval(logmel, k), "cloud": interval(cand, k),
                       "gap_kept": gap_closed(edge, cand, logmel, k)} for k in KEYS}}
        rows.append(row)
        print(json.dumps({"candidate": name, "bleu1": {
            lang: round(v["bleu1"]["cloud"]["value"], 1) for lang, v in row["languages"].items()}}), flush=True)
    return {"command": " ".join(["python", "benchmarks/privacy_quality.py", "--candidates", *candidates,
                                 "--clips", str(n_clips)]), "clips_per_language": n_clips,
            "hop_length": params.features.hop_length, "candidates": rows}


def markdown(r: dict) -> str:
    lines = ["# The quality side of the privacy frontier", "",
             f"Made by `{r['command']}`: per candidate uplink (speccap.data.uplink), the embedded cloud trained on it "
             "as the `train` stage trains the cloud with those `uplink:` params, cloud-only captions of the first "
             f"{r['clips_per_language']} test clips per language, against the decode sweep's edge-only and "
             "cloud-only (log-mel sent today) captions of the same clips; 95% intervals, paired over clips. "
             "What each representation reveals: reports/privacy/privacy.md.", "",
             "| representation | language | cloud BLEU-1 | edge-to-cloud BLEU-1 gap kept % | cloud emotion hit % | "
             "emotion-hit gap kept % |", "|---|---|---|---|---|---|"]
    for c in r["candidates"]:
        for lang, v in c["languages"].items():
            cells = []
            for k in KEYS:
                g = v[k]["gap_kept"]
                kept = interval_text(g) if g["significant_gap"] else f"{interval_text(g)} (gap inside the noise)"
                cells += [interval_text(v[k]["cloud"]), kept]
            lines.append(f"| {c['name']} | {lang} | " + " | ".join(cells) + " |")
    lines += ["", "For reference, on the same clips:", "", "| language | edge BLEU-1 | cloud BLEU-1 (log-mel) | "
              "edge emotion hit % | cloud emotion hit % (log-mel) |", "|---|---|---|---|---|"]
    for lang, v in r["candidates"][0]["languages"].items():
        lines.append(f"| {lang} | {interval_text(v['bleu1']['edge'])} | {interval_text(v['bleu1']['cloud (log-mel)'])} | "
                     f"{interval_text(v['emotion_hit_rate']['edge'])} | {interval_text(v['emotion_hit_rate']['cloud (log-mel)'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", nargs="+", default=["128x8", "8x1c", "128x8c", "16x16c"],
                    help="[bands]x[frames merged], c: clip-normalised (uplink: params)")
    ap.add_argument("--clips", type=int, default=100, help="test clips per language")
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "out" / "privacy_quality")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "privacy_quality")
    args = ap.parse_args()
    r = run(args.candidates, args.clips, args.work)
    args.out.with_suffix(".json").write_text(json.dumps(r, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(r))
    print(markdown(r))


if __name__ == "__main__":
    main()
