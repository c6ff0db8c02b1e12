"""Blocking vs pipelined verification vs edge-only vs cloud-only, side by side in one run.

    python benchmarks/pipelined.py [--params params.yaml] [--clips 20] [--in-flight 1 4] [--out reports/pipelined]

On the embedded models, over links with RTT 5 / 50 / 200 ms and the two-state Markov channel
(4 Mbps good / 350 kbps bad), at the entropy and margin gates of params (decode.threshold and the
middle margin of the sweep), default L and rule. Two hardware settings on the virtual clock:

- `this machine`: compute as measured here (the embedded edge drafts a token in ~1 ms, so a
  round trip of 50 ms costs as much as ~50 drafted tokens);
- `papers' hardware`: measured compute scaled so that edge-only runs at the 2.10 tokens/s and
  cloud-only at the 24.16 tokens/s of the seed report's Table 2 (a 3B edge on 2 CPU cores, a 7B
  cloud on a GPU); the scales are calibrated in this run from the edge-only and cloud-only OTPS.

Reports total time, OTPS, wait, wasted drafted tokens per caption, the ratio to edge-only, and
whether the pipelined captions equal the blocking ones (they must, for greedy rules). Pipelined
runs use the adaptive draft-ahead rule, and the deepest one also `always` (drafting ahead whenever
the in-flight limit allows). Writes
<out>.json, <out>.md and <out>.png (time vs RTT for the four modes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from common import mean, models_and_test_clips
from tqdm import tqdm

from speccap.config import LinkConfig, MarkovParams, load_params
from speccap.decoding.build import DecodeSpec, build_decoder
from speccap.decoding.engine import cloud_only, edge_only, speculative
from speccap.decoding.link import Link
from speccap.metrics.caption import score_captions
from speccap.pipeline.papers_hardware import PAPER_CLOUD_OTPS, PAPER_EDGE_OTPS
from speccap.project import portable_command


def channels(base: LinkConfig) -> dict[str, LinkConfig]:
    out = {f"RTT {r} ms": dataclasses.replace(base, name=f"rtt{r}", rtt_ms=float(r)) for r in (5, 50, 200)}
    out["Markov 4M/350k"] = dataclasses.replace(base, name="markov", rtt_ms=50.0, markov=MarkovParams())
    return out


def run(params_path, n_clips: int, in_flight: list[int], out: Path, threads: int) -> dict:
    params = load_params(params_path)
    edge, cloud, clips = models_and_test_clips(params, n_clips, threads)
    max_new = params.models.max_new_tokens
    margins = sorted(params.sweep.gates.get("margin", (0.3,)))
    gates = {"entropy": params.decode.threshold, "margin": margins[len(margins) // 2]}
    if params.decode.gate not in ("entropy", "margin"):
        gates = {params.decode.gate: params.decode.threshold}

    # calibrate the papers' hardware from this machine's edge-only / cloud-only token rates
    calib = {"edge": [], "cloud": []}
    for _rec, lang, mel in tqdm(clips, desc="calibrate", unit="clip"):
        calib["edge"].append(edge_only(edge, mel, lang, max_new).metrics()["otps"])
        calib["cloud"].append(cloud_only(cloud, mel, lang, Link(LinkConfig(rtt_ms=0.0)), max_new).metrics()["otps"])
    scales = {"this machine": (1.0, 1.0),
              "papers' hardware": (mean(calib["edge"]) / PAPER_EDGE_OTPS, mean(calib["cloud"]) / PAPER_CLOUD_OTPS)}

    results, captions = [], {}
    for hw, (es, cs) in scales.items():
        decode = dataclasses.replace(params.decode, edge_time_scale=es, cloud_time_scale=cs)
        for ch_name, ch in channels(params.link).items():
            modes = {"edge-only": None, "cloud-only": None}
            for g, thr in gates.items():
                modes[f"{g} blocking"] = (g, thr, 0, "adaptive")
                for n in in_flight:
                    modes[f"{g} pipelined N={n}"] = (g, thr, n, "adaptive")
                modes[f"{g} pipelined N={max(in_flight)} always"] = (g, thr, max(in_flight), "always")
            recs = {m: [] for m in modes}
            for i, (rec, lang, mel) in enumerate(tqdm(clips, desc=f"{hw}, {ch_name}", unit="clip")):
                for m, spec in modes.items():
                    link = Link(ch, seed=i)  # the same channel draws for every mode of a clip
                    if m == "edge-only":
                        r = edge_only(edge, mel, lang, max_new, time_scale=es)
                    elif m == "cloud-only":
                        r = cloud_only(cloud, mel, lang, link, max_new, time_scale=cs)
                    else:
                        g, thr, n, ahead = spec
                        d = DecodeSpec.from_params(params, decode, gate=g, threshold=thr, in_flight=n, draft_ahead=ahead,
                                                   seed=0)
                        r = speculative(edge, cloud, mel, lang, build_decoder(d), link)
                    recs[m].append(r)
                    captions.setdefault(m, {})[rec["id"]] = r.caption
            edge_time = mean([r.total_time for r in recs["edge-only"]])
            edge_per_token = edge_time / mean([max(r.n_tokens, 1) for r in recs["edge-only"]])
            for m, rs in recs.items():
                ms = [r.metrics() for r in rs]
                total, tokens = mean([x["total_time"] for x in ms]), mean([max(x["tokens"], 1) for x in ms])
                results.append({
                    "hardware": hw, "channel": ch_name, "mode": m, "total_time": total, "tokens": tokens,
                    "x_edge": total / edge_time, "x_edge_per_token": total / tokens / edge_per_token,
                    "otps": mean([x["otps"] for x in ms]),
                    "ttft": mean([x["ttft"] for x in ms]), "wait_time": mean([x["wait_time"] for x in ms]),
                    "wasted": mean([x["wasted"] for x in ms]), "stale": mean([x["stale"] for x in ms]),
                    "rounds": mean([x["rounds"] for x in ms]), "rho": mean([x["rho"] for x in ms])})

    # quality per mode (captions do not depend on the clock) and the equivalence check
    quality, same = {}, {}
    for m, caps in captions.items():
        row = {}
        for lang in params.data.languages:
            sel = [(rec, caps[rec["id"]]) for rec, lg, _ in clips if lg == lang]
            s = score_captions([c for _, c in sel], [r["references"] for r, _ in sel], lang,
                               [r.get("emotion") for r, _ in sel])
            row[lang] = round(s.summary()["bleu1"], 2)
        quality[m] = row
        if "pipelined" in m:
            blocking = captions[m.split(" pipelined")[0] + " blocking"]
            same[m] = sum(caps[k] == blocking[k] for k in caps)
    report = {"command": portable_command(), "clips": len(clips), "threads": threads,
              "scales": {k: {"edge": v[0], "cloud": v[1]} for k, v in scales.items()},
              "gates": gates, "block_len": params.decode.block_len, "rule": params.decode.rule,
              "rank": params.decode.rank, "results": results, "bleu1": quality, "identical_captions": same}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown(report))
    plot(report, out.with_suffix(".png"))
    return report


def markdown(r: dict) -> str:
    lines = [f"# Pipelined verification\n\nMade by `{r['command']}` on {r['clips']} test clips (en + zh) at "
             f"{r['threads']} threads; gates {r['gates']}, L = {r['block_len'] or 'adaptive'}, rule {r['rule']} "
             f"(R = {r['rank']}). Virtual clock: measured compute x scale + modelled link.\n",
             "Hardware scales (measured compute x): " + "; ".join(
                 f"{k}: edge {v['edge']:.1f}, cloud {v['cloud']:.1f}" for k, v in r["scales"].items()) + "\n",
             "Identical captions, pipelined vs blocking (greedy rules must give all): " + ", ".join(
                 f"{m}: {n}/{r['clips']}" for m, n in r["identical_captions"].items()) + "\n",
             "BLEU-1 (x100): " + "; ".join(f"{m}: " + ", ".join(f"{lang} {v}" for lang, v in q.items())
                                          for m, q in r["bleu1"].items()) + "\n"]
    for hw in r["scales"]:
        lines.append(f"\n## {hw}\n")
        lines.append("| channel | mode | total s | tokens | x edge-only | x edge-only per token | OTPS | TTFT s | "
                     "wait s | wasted | stale | rounds |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for x in r["results"]:
            if x["hardware"] == hw:
                lines.append(f"| {x['channel']} | {x['mode']} | {x['total_time']:.3f} | {x['tokens']:.1f} | "
                             f"{x['x_edge']:.2f} | {x['x_edge_per_token']:.2f} | {x['otps']:.1f} | {x['ttft']:.3f} | "
                             f"{x['wait_time']:.3f} | {x['wasted']:.1f} | "
                             f"{x['stale']:.1f} | {x['rounds']:.1f} |")
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    hws = list(r["scales"])
    gate = next(iter(r["gates"]))
    fig, axes = plt.subplots(1, len(hws), figsize=(6 * len(hws), 4))
    for ax, hw in zip(axes, hws):
        rows = [x for x in r["results"] if x["hardware"] == hw and x["channel"].startswith("RTT")]
        rtts = sorted({int(x["channel"].split()[1]) for x in rows})
        modes = ["edge-only", "cloud-only", f"{gate} blocking"] + sorted(
            {x["mode"] for x in rows if x["mode"].startswith(f"{gate} pipelined")})
        for m in modes:
            ys = [next(x["total_time"] for x in rows if x["mode"] == m and x["channel"] == f"RTT {t} ms") for t in rtts]
            ax.plot(rtts, ys, marker="o", label=m)
        ax.set_xscale("log")
        ax.set_xlabel("RTT (ms)")
        ax.set_ylabel("total time per caption (s)")
        ax.set_title(hw)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default=None)
    ap.add_argument("--clips", type=int, default=20, help="test clips per language")
    ap.add_argument("--in-flight", type=int, nargs="+", default=[1, 4], help="pipelined depths to compare")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("reports/pipelined"))
    args = ap.parse_args()
    r = run(args.params, args.clips, args.in_flight, args.out, args.threads)
    print(markdown(r))


if __name__ == "__main__":
    main()
