"""The cost-model clock (speccap.decoding.cost) beside measured compute, in one run.

    python benchmarks/cost_model.py [--clips 20] [--threads 1]   # where the pipeline ran (models/, data/)

1. Calibrate: time single-sequence calls of both trained models on a few train clips (prefill,
   extends of 1-8 tokens at four cache lengths) and fit the cost model.
2. Accuracy: on the first `--clips` test clips per language, edge-only, cloud-only and the blocking
   UGSD loop (params' gate and threshold, adaptive L) run twice, once on the measured clock and once
   charged by the model; the loops' calls do not depend on the clock, so each caption's edge and
   cloud compute compare call for call. Per model: the median |model - measured| / measured.
3. Determinism: the pipelined loop (N = 2, adaptive draft-ahead: it decides by time) on the same
   clips, twice on each clock, the second time beside a busy process on every core. Measured, its
   clocks move with the load; charged, every clock repeats.

Writes reports/cost_model.{json,md} (the fitted coefficients in the .json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import statistics
from pathlib import Path

from common import models_and_test_clips
from tqdm import tqdm

from speccap.config import load_params
from speccap.data.featurize import load_clip_features
from speccap.data.manifest import manifest_path, read_manifest
from speccap.decoding.build import DecodeSpec, build_decoder
from speccap.decoding.cost import calibrate
from speccap.decoding.engine import cloud_only, edge_only, speculative
from speccap.decoding.link import Link
from speccap.project import portable_command

TARGET = 0.10  # the bound on the median relative error, per model


def _spin(stop) -> None:
    while not stop.is_set():
        pass


class Busy:
    """A busy process on every core while inside (the load a shared machine puts beside a run)."""

    def __enter__(self):
        self.stop = mp.Event()
        self.procs = [mp.Process(target=_spin, args=(self.stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for p in self.procs:
            p.join(timeout=10)


def _calibration_clips(params, n: int):
    out = []
    for lang in params.data.languages:
        for rec in read_manifest(manifest_path(params.data.processed_dir, "train", lang))[:n]:
            out.append((load_clip_features(params.data.processed_dir, rec["id"])[0], lang))
    return out


def _runs(params, edge, cloud, clips, cost, in_flight: int = 0) -> dict[str, list]:
    d = DecodeSpec.from_params(params, block_len=0, in_flight=in_flight, seed=0)
    out = {f"pipelined N={in_flight}": []} if in_flight else {"edge-only": [], "cloud-only": [], "ugsd": []}
    for i, (_rec, lang, mel) in enumerate(clips):
        if in_flight:
            s = dataclasses.replace(build_decoder(d), cost=cost)
            out[f"pipelined N={in_flight}"].append(speculative(edge, cloud, mel, lang, s, Link(params.link, seed=i)))
            continue
        out["edge-only"].append(edge_only(edge, mel, lang, params.models.max_new_tokens, cost=cost))
        out["cloud-only"].append(cloud_only(cloud, mel, lang, Link(params.link, seed=i), params.models.max_new_tokens,
                                            cost=cost))
        s = dataclasses.replace(build_decoder(d), cost=cost)
        out["ugsd"].append(speculative(edge, cloud, mel, lang, s, Link(params.link, seed=i)))
    return out


def _clocks(r) -> tuple:
    return (r.total_time, r.ttft, r.wait_time, r.edge_compute, r.cloud_compute, r.rounds, r.wasted)


def run(n_clips: int, threads: int, calib_clips: int) -> dict:
    params = load_params()
    edge, cloud, clips = models_and_test_clips(params, n_clips, threads)
    model, samples = calibrate({"edge": edge, "cloud": cloud}, _calibration_clips(params, calib_clips))
    measured = _runs(params, edge, cloud, tqdm(clips, desc="measured clock", unit="clip"), None)
    charged = _runs(params, edge, cloud, tqdm(clips, desc="cost-model clock", unit="clip"), model)
    errors = {"edge": [], "cloud": []}
    rows = []
    for mode in measured:
        for m, c in zip(measured[mode], charged[mode], strict=True):
            assert m.token_ids == c.token_ids, "the clock changed a caption"
            for role, got, want in (("edge", c.edge_compute, m.edge_compute), ("cloud", c.cloud_compute, m.cloud_compute)):
                if want > 0:
                    errors[role].append(abs(got - want) / want)
        rows.append({"mode": mode, "measured_s": statistics.fmean(r.edge_compute + r.cloud_compute for r in measured[mode]),
                     "model_s": statistics.fmean(r.edge_compute + r.cloud_compute for r in charged[mode])})
    accuracy = {role: {"median_rel_error": statistics.median(e), "p90_rel_error": sorted(e)[int(0.9 * (len(e) - 1))],
                       "captions": len(e)} for role, e in errors.items()}
    determinism = {}
    for name, cost in (("measured", None), ("cost model", model)):
        quiet = _runs(params, edge, cloud, clips, cost, in_flight=2)
        with Busy():
            loaded = _runs(params, edge, cloud, clips, cost, in_flight=2)
        (q,), (ld,) = quiet.values(), loaded.values()
        determinism[name] = {"captions": len(q), "same_clocks": sum(_clocks(a) == _clocks(b) for a, b in zip(q, ld)),
                             "same_captions": sum(a.token_ids == b.token_ids for a, b in zip(q, ld)),
                             "mean_total_quiet": statistics.fmean(r.total_time for r in q),
                             "mean_total_loaded": statistics.fmean(r.total_time for r in ld)}
    return {"command": portable_command(), "clips": len(clips), "threads": threads,
            "calibration_calls": len(samples), "fit": model.to_json(), "accuracy": accuracy, "modes": rows,
            "determinism": determinism, "target": TARGET}


def markdown(r: dict) -> str:
    acc = r["accuracy"]
    lines = [
        "# The cost-model clock beside measured compute", "",
        f"Made by `{r['command']}` on {r['clips']} test clips (en + zh) at {r['threads']} torch thread(s); the "
        f"model fitted to {r['calibration_calls']} timed single-sequence calls of the trained embedded models "
        "(speccap.decoding.cost). Relative error per caption: |charged - measured| / measured compute of that "
        "model in that caption, over edge-only, cloud-only and the blocking UGSD loop.", "",
        "| model | median relative error | 90th percentile | captions | target (median) |", "|---|---|---|---|---|"]
    for role, a in acc.items():
        ok = "met" if a["median_rel_error"] <= r["target"] else "not met"
        lines.append(f"| {role} | {100 * a['median_rel_error']:.1f}% | {100 * a['p90_rel_error']:.1f}% | "
                     f"{a['captions']} | at most {100 * r['target']:.0f}%: {ok} |")
    lines += ["", "| loop | mean compute per caption, measured s | charged by the model s |", "|---|---|---|"]
    lines += [f"| {x['mode']} | {x['measured_s']:.4f} | {x['model_s']:.4f} |" for x in r["modes"]]
    lines += ["", "The pipelined loop (N = 2, adaptive draft-ahead) twice on each clock, the second time beside a "
              "busy process on every core:", "",
              "| clock | captions with every clock equal | captions equal | mean total s, quiet | beside the load |",
              "|---|---|---|---|---|"]
    for name, d in r["determinism"].items():
        lines.append(f"| {name} | {d['same_clocks']} / {d['captions']} | {d['same_captions']} / {d['captions']} | "
                     f"{d['mean_total_quiet']:.4f} | {d['mean_total_loaded']:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=20, help="test clips per language")
    ap.add_argument("--calibration-clips", type=int, default=4, help="train clips per language timed to fit")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("reports/cost_model"))
    args = ap.parse_args()
    r = run(args.clips, args.threads, args.calibration_clips)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(r, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(r))
    print(markdown(r))


if __name__ == "__main__":
    main()
