"""The batching executor (speccap.batching.lockstep) beside the single one, on the decode stage's
configurations, in one run.

    python benchmarks/batched_decode.py [--clips 50] [--batch 8 32] [--threads 1] [--prompt-cache-mb N]   # where the pipeline ran

1. Calibrate the cost model on a few train clips (speccap.decoding.cost): both executors charge every
   model call by it, so their records compare field for field.
2. Every configuration `dvc repro`'s decode stage runs (sweep.build_configs) on the first `--clips`
   test clips per language, through the stage's own worker job (pipeline.workers, in this process):
   once one caption at a time, then B captions at a time for each B of `--batch`. Captions per
   CPU-second of this process, side by side.
3. Equivalence: every caption and record compared. A caption that differs is listed with the smaller
   of the two models' top-2 logit gaps after the captions' common prefix (a batched matmul rounds
   differently; only a near-tie may flip).

Writes reports/batched_decode.{json,md,png}.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import yaml
from common import load_models, write_report
from cost_model import _calibration_clips
from greenlet import getcurrent, settrace
from tqdm import tqdm

from speccap.config import load_params
from speccap.data.featurize import load_clip_features
from speccap.decoding.cost import calibrate
from speccap.pipeline.splits import eval_clips
from speccap.pipeline.sweep import build_configs
from speccap.pipeline.workers import Pool, stepped
from speccap.project import portable_command

THROUGHPUT_TARGET = 3.0  # the issue's: captions per CPU-second, batched / single
PYTHON_TARGET = 0.15  # the issue's: the loops' own share of batched time, at most
# what only the measured world sets (wall time, seconds inside forwards, the process's CPU and memory)
UNSHARED = {"wall_time", "model_time", "cpu_percent", "ram_gb"}
# rules whose edge draws its tokens: each drafted token's law, draw and payload are the loop's own work
SAMPLING_RULES = {"spec_sampling", "qs", "sq"}


def _params_with(base: Path, cost: dict, batch: int, out: Path, prompt_cache_mb: int | None = None) -> Path:
    raw = yaml.safe_load(base.read_text(encoding="utf-8"))
    raw.setdefault("decode", {})["cost"] = cost
    raw.setdefault("sweep", {})["batch"] = batch
    if prompt_cache_mb is not None:
        raw["sweep"]["prompt_cache_mb"] = prompt_cache_mb
    out.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return out


def _pool_seconds(batch: int) -> dict:
    """Seconds the batching executor's row pools have spent in forwards, prefills and the statistics
    of each step's rows so far, and the forwards they ran and how many of them over the asking rows
    alone (this process's executor of `batch` rows, as the stage's worker job uses it)."""
    out = {"run": 0.0, "prefill": 0.0, "summary": 0.0, "steps": 0, "compacted": 0}
    for pool in stepped(batch)[0].pools:
        for k in ("run", "prefill", "summary"):
            out[k] += pool.seconds[k]
        out["steps"] += pool.steps
        out["compacted"] += pool.compacted
    return out


def family(cfg) -> str:
    """The kind of decoding a configuration is, as the report splits throughput by it."""
    if cfg.spec is None:
        return "edge-only and cloud-only"
    return "speculative, sampling rules" if cfg.spec.rule in SAMPLING_RULES else "speculative, greedy rules"


def _decode(params_file: Path, batch: int, threads: int, configs, clips, lockstep: bool | None = None
            ) -> tuple[dict, float, float, dict | None, dict]:
    """Every configuration on its language's clips through the stage's worker job (`lockstep` as
    Pool's); returns the records by (configuration, clip), this process's CPU seconds, the wall
    seconds, (batched) the wall seconds inside the executor's forwards and prefills (with, by
    `family`, the wall seconds its configurations took and the part of them in the executor's
    forwards, prefills and step statistics), and the CPU seconds by `family`."""
    pool = Pool(str(params_file), workers=0, threads=threads, batch=batch, lockstep=lockstep)
    records, cpu, wall, by_family = {}, 0.0, 0.0, {}
    executor_by_family: dict[str, list[float]] = {}  # kind: [wall seconds, of them in the executor's model work]
    for cfg in tqdm(configs, desc=f"batch {batch}", unit="config", leave=False):
        jobs = [(cfg, c["id"]) for c in clips[cfg.language]]
        before = _pool_seconds(batch) if batch > 1 else None
        c0, w0 = time.process_time(), time.perf_counter()
        made = list(pool.imap(jobs))
        spent, took = time.process_time() - c0, time.perf_counter() - w0
        cpu += spent
        wall += took
        by_family[family(cfg)] = by_family.get(family(cfg), 0.0) + spent
        if before is not None:
            after = _pool_seconds(batch)
            mine = executor_by_family.setdefault(family(cfg), [0.0, 0.0])
            mine[0] += took
            mine[1] += sum(after[k] - before[k] for k in ("run", "prefill", "summary"))
        records.update(((cfg.name, rec["id"]), rec) for rec in made)
    # each Pool loads its own models, so this executor and its pools served these jobs alone
    seconds = None if batch == 1 else {**_pool_seconds(batch), "by_family": executor_by_family}
    return records, cpu, wall, seconds, by_family


def _loops_code(params_file: Path, batch: int, threads: int, configs, clips) -> float:
    """One more batched pass, with a tracer on the greenlets' switches: the share of its wall time spent
    inside the caption loops' greenlets. Every model call (forward, prefill, step statistics) and the
    executor's own work run in the greenlet driving `Lockstep.map`, so this is the loops' code between
    their model calls alone. A pass of its own: the tracer's call on every switch costs time the
    timed passes should not carry."""
    hub, inside, since = getcurrent(), [0.0], [None]

    def trace(event, args):
        if event in ("switch", "throw"):
            origin, target = args
            now = time.perf_counter()
            if origin is not hub and since[0] is not None:
                inside[0] += now - since[0]
            since[0] = None if target is hub else now

    before = settrace(trace)
    try:
        _, _, wall, _, _ = _decode(params_file, batch, threads, configs, clips)
    finally:
        settrace(before)
    return inside[0] / wall


def _gap(edge, cloud, mel, lang: str, prefix: list[int]) -> float:
    """The smaller top-2 logit gap of the two models after `prefix` (single-sequence forwards)."""
    gaps = []
    for lm in (edge, cloud):
        sess = lm.start(lm.wire(mel), lang)
        logits = sess.extend(prefix).logits[-1] if prefix else sess.prefill_logits
        top = torch.topk(logits, 2).values
        gaps.append(float(top[0] - top[1]))
    return min(gaps)


def _compare(single: dict, batched: dict, languages: dict, edge, cloud, params) -> dict:
    differ, records_differ = [], 0
    for key, a in single.items():
        b = batched[key]
        if a["caption"] != b["caption"]:
            ta = edge.tokenizer.encode(a["caption"], add_special_tokens=False)
            tb = edge.tokenizer.encode(b["caption"], add_special_tokens=False)
            common = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
            mel, _ = load_clip_features(params.data.processed_dir, key[1])
            differ.append({"configuration": key[0], "clip": key[1], "single": a["caption"], "batched": b["caption"],
                           "top2_gap": _gap(edge, cloud, mel, languages[key[0]], ta[:common])})
        elif {k: v for k, v in a.items() if k not in UNSHARED} != {k: v for k, v in b.items() if k not in UNSHARED}:
            records_differ += 1
    return {"captions": len(single), "captions_differ": len(differ),
            "records_differ_with_equal_captions": records_differ, "differences": differ}


def run(n_clips: int, batches: list[int], threads: int, calib_clips: int, prompt_cache_mb: int | None = None,
        repeats: int = 1) -> dict:
    params_path = Path("params.yaml")
    params = load_params(params_path)
    kept = params.sweep.prompt_cache_mb if prompt_cache_mb is None else prompt_cache_mb
    edge, cloud = load_models(params, threads)
    cost, _ = calibrate({"edge": edge, "cloud": cloud}, _calibration_clips(params, calib_clips))
    configs = build_configs(params)
    clips = {lang: eval_clips(params, lang)[:n_clips] for lang in params.data.languages}
    passes: dict[int, list] = {b: [] for b in (1, *batches)}
    with tempfile.TemporaryDirectory() as tmp:
        files = {b: _params_with(params_path, cost.coef, b, Path(tmp) / f"params{b}.yaml", kept) for b in passes}
        for _ in range(repeats):  # the executors take turns, so a slow spell of the machine falls on all of them
            for b in passes:
                passes[b].append(_decode(files[b], b, threads, configs, clips))
        code = {b: _loops_code(files[b], b, threads, configs, clips) for b in batches}
    # each executor's pass of median CPU seconds stands for it (its records, profile and split by kind)
    runs = {b: sorted(ps, key=lambda p: p[1])[len(ps) // 2] for b, ps in passes.items()}
    captions = len(runs[1][0])
    single = captions / runs[1][1]
    languages = {c.name: c.language for c in configs}
    rows = [{"batch": b, "cpu_s": cpu, "wall_s": wall, "captions_per_cpu_s": captions / cpu,
             "ratio": captions / cpu / single, "profile": _profile(spent, wall, code.get(b)), "cpu_by_family": by_family,
             "pass_cpu_s": [p[1] for p in passes[b]],
             "pass_ratios": [one[1] / p[1] for one, p in zip(passes[1], passes[b])],
             "equivalence": None if b == 1 else _compare(runs[1][0], records, languages, edge, cloud, params)}
            for b, (records, cpu, wall, spent, by_family) in runs.items()]
    return {"command": portable_command(), "clips_per_language": n_clips, "threads": threads,
            "configurations": len(configs), "captions": captions, "cost_model": cost.coef, "rows": rows,
            "prompt_cache_mb": kept, "repeats": repeats,
            "target": THROUGHPUT_TARGET, "python_target": PYTHON_TARGET, "best_ratio": max(r["ratio"] for r in rows)}


def _profile(spent: dict | None, wall: float, loops_code: float | None = None) -> dict | None:
    """Shares of a batched run's wall time: the executor's batched forwards, its batched prefills, the
    statistics it computes once per step over every asking row's last logits (token statistics, a
    sampling draft's law, a greedy loop's token: `Session.extend(summarize=...)`), and the rest, the
    loops' own time (their Python, per-caption tensor work, the executor's switching); `loops_code`:
    the part of it inside the loops' code (`_loops_code`, from a traced pass)."""
    if spent is None:
        return None
    forwards, prefill, statistics = spent["run"] / wall, spent["prefill"] / wall, spent["summary"] / wall
    return {"forwards": forwards, "prefill": prefill, "statistics": statistics,
            "loops": 1.0 - forwards - prefill - statistics, "loops_code": loops_code,
            "compacted": spent["compacted"] / max(spent["steps"], 1),
            "loops_by_family": {kind: 1.0 - model / took for kind, (took, model) in spent.get("by_family", {}).items()}}


def markdown(r: dict) -> str:
    met = "met" if r["best_ratio"] >= r["target"] else "not met"
    lines = [
        "# The batching executor beside the single one",
        "",
        f"Made by `{r['command']}`: the decode stage's {r['configurations']} configurations on the first "
        f"{r['clips_per_language']} test clips per language ({r['captions']} captions per executor), through the "
        f"stage's worker job in one process at {r['threads']} torch thread(s). Every executor charges each model "
        "call by one cost model calibrated in the same run (speccap.decoding.cost). "
        + (f"Both keep prompts across configurations (`sweep.prompt_cache_mb: {r['prompt_cache_mb']}`; "
           "off in the stages by default): each clip's prompt is computed once per model, alone."
           if r.get("prompt_cache_mb") else "Neither keeps prompts (`sweep.prompt_cache_mb: 0`).")
        + (f" Every executor ran {r['repeats']} passes, taking turns (the single one, then each B, {r['repeats']} "
           "times over); each row is its executor's pass of median CPU seconds." if r.get("repeats", 1) > 1 else ""),
        "",
        "| captions at once (B) | CPU s | wall s | captions per CPU-second | batched / single | captions equal | "
        "other record fields differ | forwards | prefills | step statistics | loops' own | of it, in the loops' code | "
        "forwards over the asking rows alone |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        eq, prof = row["equivalence"], row.get("profile")
        same = "–" if eq is None else f"{eq['captions'] - eq['captions_differ']} / {eq['captions']}"
        other = "–" if eq is None else str(eq["records_differ_with_equal_captions"])
        shares = ("–",) * 6 if prof is None else tuple(f"{prof[k]:.0%}" if prof.get(k) is not None else "–"
                                                       for k in ("forwards", "prefill", "statistics", "loops",
                                                                 "loops_code", "compacted"))
        name = "1 (the single executor)" if row["batch"] == 1 else str(row["batch"])
        lines.append(f"| {name} | {row['cpu_s']:.1f} | {row['wall_s']:.1f} | {row['captions_per_cpu_s']:.1f} | "
                     f"{row['ratio']:.2f}x | {same} | {other} | {' | '.join(shares)} |")
    if r.get("repeats", 1) > 1:
        lines += ["", "Batched / single, pass by pass (each pass's CPU seconds against the single executor's in the "
                      "same pass): " + "; ".join(f"B = {row['batch']}: " + ", ".join(f"{x:.2f}x" for x in row["pass_ratios"])
                                               for row in r["rows"][1:]) + "."]
    best = max((row for row in r["rows"] if row.get("profile")), key=lambda row: row["ratio"])
    loops = best["profile"]["loops"]
    lines += ["", f"Best throughput, batched / single: **{r['best_ratio']:.2f}x** (target at least "
                  f"{r['target']:.0f}x: {met}). The loops' own share of batched time at that B ({best['batch']}): "
                  f"**{loops:.0%}** (target under {r['python_target']:.0%}: "
                  f"{'met' if loops < r['python_target'] else 'not met'}, held to the whole of it"
                  + (f"; of it, {code:.0%} in the loops' code between their model calls, the rest the executor's)."
                     if (code := best["profile"].get("loops_code")) is not None else ").")
                  + " \"Other record fields\": records whose "
                  "caption is equal but whose clocks, bytes, rounds or acceptance differ. The profile splits each "
                  "batched run's wall time into the row pools' forwards and prefills (batching.row_pool, setup "
                  "included), the statistics the executor computes once per step over every asking row's last "
                  "logits (entropy, margin and rank of a drafted token, a sampling draft's law, a greedy loop's "
                  "token: batching.lockstep), and the rest: the loops' own Python and per-caption tensor work, and "
                  "the executor's switching between them. \"Of it, in the loops' code\": the share of the wall time "
                  "of one more pass of each B, with a tracer on the greenlets' switches, spent inside the caption "
                  "loops' greenlets, that is in their code between model calls (every model call and the executor's "
                  "own work run in the greenlet that drives them); the rest of the loops' own share is the "
                  "executor's: grouping the calls, resuming the loops, following runs. \"Forwards over the asking "
                  "rows alone\": the share of the pools' forwards run over copies of the rows asking, where that "
                  "gives every row the full step's bits (`RowPool(compact=\"bitwise\")`, docs/decoding.md)."]
    lines += _by_family(r)
    differ = [d for row in r["rows"] if row["equivalence"] for d in row["equivalence"]["differences"]]
    if differ:
        lines += ["", "| configuration | clip | top-2 logit gap at the divergence | single | batched |", "|---|---|---|---|---|"]
        lines += [f"| {d['configuration']} | {d['clip']} | {d['top2_gap']:.2e} | {d['single']} | {d['batched']} |"
                  for d in differ]
    return "\n".join(lines) + "\n"


def _by_family(r: dict) -> list[str]:
    """Batched / single by kind of decoding (its configurations' CPU seconds in each executor)."""
    single = r["rows"][0]["cpu_by_family"]
    batched = r["rows"][1:]
    lines = ["", "By kind of decoding (CPU seconds of its configurations; batched / single in brackets; drawn in "
             "batched_decode.png):", "",
             "| kind | single | " + " | ".join(f"B = {row['batch']}" for row in batched) + " |",
             "|---|---|" + "---|" * len(batched)]
    for kind, s in single.items():
        cells = [f"{row['cpu_by_family'][kind]:.1f} ({s / row['cpu_by_family'][kind]:.2f}x)" for row in batched]
        lines.append(f"| {kind} | {s:.1f} | " + " | ".join(cells) + " |")
    lines += ["", "The loops' own share of each kind's batched time (as in the profile above, over its configurations "
                  "alone):", "", "| kind | " + " | ".join(f"B = {row['batch']}" for row in batched) + " |",
              "|---|" + "---|" * len(batched)]
    for kind in single:
        lines.append(f"| {kind} | " + " | ".join(
            f"{row['profile']['loops_by_family'][kind]:.0%}" if kind in row["profile"].get("loops_by_family", {})
            else "–" for row in batched) + " |")
    return lines + ["", "Each executor runs edge-only and cloud-only first, so they also pay for encoding every "
                        "clip's audio once per model (kept for the later configurations, `sweep.audio_cache_mb`), and "
                        "their few seconds move most with the machine's noise. A sampling rule's laws, their cumulative "
                        "distributions, Q-S's lattice points and the draws of a block's run (`Session.extend_run`) come "
                        "with the step, but its edge still books each drafted token's statistics and packs its q for "
                        "the wire, and the cloud judges each token against its q, in each caption's loop: work a shared "
                        "forward does not take over."]


def plot(r: dict, path: Path) -> None:
    """Batched / single against B: every configuration, and each kind of decoding, beside the target."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = r["rows"]
    batches = [row["batch"] for row in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(batches, [row["ratio"] for row in rows], "o-", color="black", lw=2, label="all configurations")
    for kind, single in rows[0]["cpu_by_family"].items():
        ax.plot(batches, [single / row["cpu_by_family"][kind] for row in rows], "o--", label=kind)
    ax.axhline(r["target"], color="grey", ls=":", label=f"target ({r['target']:.0f}x)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("captions at once (B)")
    ax.set_ylabel("captions per CPU-second, batched / single")
    ax.set_title("The batching executor beside the single one")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=50, help="test clips per language")
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32],
                    help="captions at once in the batching executor (each beside the single one)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calibration-clips", type=int, default=4, help="train clips per language timed for the cost model")
    ap.add_argument("--prompt-cache-mb", type=int, help="sweep.prompt_cache_mb for both executors (default: params')")
    ap.add_argument("--repeats", type=int, default=1,
                    help="passes of every executor, taking turns; each one's median pass stands for it")
    ap.add_argument("--out", type=Path, default=Path("reports/batched_decode"))
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    r = run(args.clips, args.batch, args.threads, args.calibration_clips, args.prompt_cache_mb, args.repeats)
    write_report(args.out, r, markdown)
    plot(r, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
