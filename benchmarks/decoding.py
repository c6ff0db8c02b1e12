"""Benchmark of the decoding engine on the embedded models, measured side by side in one run.

    python benchmarks/decoding.py [--params params.yaml] [--clips 30] [--out reports/decoding]

1. engine overhead: share of the speculative loop's wall time spent outside model forwards;
2. cloud work: token positions the cloud runs per caption with its persistent KV cache, against
   re-encoding audio + prefix at every escalation (what the published implementation does);
3. the method's speed-up bound: gate `always` + greedy with the cloud model drafting for itself,
   against plain cloud greedy generation (compute only, no link);
4. edge-only vs UGSD vs cloud-only: total time, OTPS, rho, AAL and caption quality.
Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import mean, models_and_test_clips
from tqdm import tqdm

from speccap.config import LinkConfig, load_params
from speccap.decoding.build import DecodeSpec, build_decoder
from speccap.decoding.engine import cloud_only, edge_only, speculative
from speccap.decoding.link import Link
from speccap.metrics.caption import score_captions
from speccap.project import portable_command

NO_LINK = LinkConfig(name="none", uplink_mbps=1e9, downlink_mbps=1e9, rtt_ms=0.0, overhead_bytes=0)


def run(params_path, n_clips: int, out: Path, threads: int) -> dict:
    params = load_params(params_path)
    edge, cloud, clips = models_and_test_clips(params, n_clips, threads)
    max_new = params.models.max_new_tokens
    ugsd = DecodeSpec.from_params(params, seed=0)
    self_spec = DecodeSpec(gate="always", threshold=None, rule="greedy", block_len=params.decode.block_len or 5,
                           max_new_tokens=max_new)
    runs = {k: [] for k in ("edge", "cloud", "ugsd", "ugsd_nocache", "self_spec", "cloud_plain")}
    for _rec, lang, mel in tqdm(clips, desc="decode", unit="clip"):
        link = lambda: Link(params.link, seed=0)  # noqa: E731 - a fresh channel per run
        runs["edge"].append(edge_only(edge, mel, lang, max_new))
        runs["cloud"].append(cloud_only(cloud, mel, lang, link(), max_new))
        runs["ugsd"].append(speculative(edge, cloud, mel, lang, build_decoder(ugsd), link()))
        nocache = build_decoder(ugsd.replace(cloud_cache=False))
        runs["ugsd_nocache"].append(speculative(edge, cloud, mel, lang, nocache, link()))
        runs["self_spec"].append(speculative(cloud, cloud, mel, lang, build_decoder(self_spec), Link(NO_LINK)))
        runs["cloud_plain"].append(cloud_only(cloud, mel, lang, Link(NO_LINK), max_new))

    def quality(key):
        res = {}
        for lang in params.data.languages:
            pairs = [(r, c) for r, (rec, lg, _) in zip(runs[key], clips) if lg == lang for c in [rec]]
            s = score_captions([r.caption for r, _ in pairs], [c["references"] for _, c in pairs], lang,
                               [c.get("emotion") for _, c in pairs])
            res[lang] = {"bleu1": s.bleu1, "meteor": s.meteor, "rouge_l": s.rouge_l, "emotion_hit": s.emotion_hit_rate}
        return res

    def summary(key):
        ms = [r.metrics() for r in runs[key]]
        return {k: mean([m[k] for m in ms]) for k in ("total_time", "ttft", "otps", "rho", "aal", "rounds", "tokens",
                                                        "bytes_up", "bytes_down", "cloud_tokens", "edge_compute",
                                                        "cloud_compute", "link_time")}

    overhead = [1 - r.model_time / r.wall_time for r in runs["ugsd"] if r.wall_time > 0]
    same_self = sum(a.token_ids == b.token_ids for a, b in zip(runs["self_spec"], runs["cloud_plain"]))
    result = {
        "command": portable_command(), "clips": len(clips), "threads": threads,
        "settings": {"decode": params.decode.__dict__ | {"adaptive": params.decode.adaptive.__dict__},
                     "link": params.link.__dict__},
        "engine_overhead_share": mean(overhead),
        "cloud_work": {"persistent_cache_tokens": summary("ugsd")["cloud_tokens"],
                       "reencode_tokens": summary("ugsd_nocache")["cloud_tokens"],
                       "ratio": summary("ugsd_nocache")["cloud_tokens"] / max(summary("ugsd")["cloud_tokens"], 1),
                       "persistent_cloud_seconds": summary("ugsd")["cloud_compute"],
                       "reencode_cloud_seconds": summary("ugsd_nocache")["cloud_compute"]},
        "self_speculation": {"cloud_plain_seconds": summary("cloud_plain")["total_time"],
                             "self_spec_seconds": summary("self_spec")["total_time"],
                             "speedup": summary("cloud_plain")["total_time"] / max(summary("self_spec")["total_time"], 1e-9),
                             "identical_captions": f"{same_self}/{len(clips)}"},
        "methods": {k: summary(k) | {"quality": quality(k)} for k in ("edge", "ugsd", "cloud")},
    }
    built = build_decoder(ugsd)
    result["methods"]["ugsd"]["settings"] = built.gate.describe() | built.rule.describe() | built.policy.describe()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    out.with_suffix(".md").write_text(markdown(result))
    return result


def markdown(r: dict) -> str:
    cw, ss = r["cloud_work"], r["self_speculation"]
    lines = ["# Decoding engine", "", f"Made by `{r['command']}` on {r['clips']} test clips at {r['threads']} threads.", "",
             f"- Engine overhead (wall time outside model forwards, speculative loop): "
             f"**{100 * r['engine_overhead_share']:.1f}%** (target < 10%).",
             f"- Cloud work per caption: {cw['persistent_cache_tokens']:.0f} token positions with the persistent cache vs "
             f"{cw['reencode_tokens']:.0f} re-encoding audio + prefix at every escalation: **{cw['ratio']:.1f}x** less "
             f"({cw['persistent_cloud_seconds']:.3f} s vs {cw['reencode_cloud_seconds']:.3f} s of cloud compute).",
             f"- Upper bound of the speed-up (cloud drafting for itself, gate always + greedy, no link): "
             f"{ss['self_spec_seconds']:.3f} s vs {ss['cloud_plain_seconds']:.3f} s plain greedy = **{ss['speedup']:.2f}x**; "
             f"identical captions {ss['identical_captions']}.", "",
             "| method | total s | TTFT s | OTPS | rho | AAL | rounds | bytes up | BLEU-1 en | BLEU-1 zh | emotion en | emotion zh |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k, m in r["methods"].items():
        q = m["quality"]
        lines.append(f"| {k} | {m['total_time']:.3f} | {m['ttft']:.3f} | {m['otps']:.1f} | {m['rho']:.2f} | {m['aal']:.2f} | "
                     f"{m['rounds']:.1f} | {m['bytes_up']:.0f} | {q.get('en', {}).get('bleu1', 0):.1f} | "
                     f"{q.get('zh', {}).get('bleu1', 0):.1f} | {q.get('en', {}).get('emotion_hit', 0):.1f} | "
                     f"{q.get('zh', {}).get('emotion_hit', 0):.1f} |")
    lines += ["", f"UGSD settings: {r['methods']['ugsd']['settings']}; link: {r['settings']['link']}", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default=None)
    ap.add_argument("--clips", type=int, default=30, help="test clips per language")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("reports/decoding"))
    args = ap.parse_args()
    print(markdown(run(args.params, args.clips, args.out, args.threads)))


if __name__ == "__main__":
    main()
