"""The decoding loops on the target hardware: real-size random-weight Qwen2.5-Omni thinkers (the 3B
thinker's shapes on the edge, the 7B's in the cloud, audio towers included, built from configs: no
download) with Qwen's real vocabulary, one command, one report.

    python benchmarks/device_check.py                      # on a GPU node -> reports/device_check.{json,md}
    python benchmarks/device_check.py --device cpu --size tiny --clips 6 --batch 3 --out /tmp/device_check

For `--clips` clips of real audio lengths (random log-mel, 4 to 20 s, languages alternating):
the default UGSD loop (params.yaml's decode settings, measured clock), cloud-only and edge-only, in
that order (and on request, `--loops`, the sampling decoders: speculative sampling, Q-S and a
sampled edge-only, at sweep.qs_temperature), each one caption at a time (the single executor, on the first `--single-clips`: at real
sizes it is the slow part) and twice `--batch` at a time (the batching
executor, speccap.batching.lockstep): with the eager batched step, and with the step at fixed shapes
replayed from captured CUDA graphs (speccap.batching.step_graphs; on a CPU the fixed shapes run
eagerly), side by side: captions and tokens per second, GPU memory (the framework's peak allocated),
GPU utilisation (NVML, sampled every 50 ms through each run by speccap.metrics.system) and batch
invariance (the share of captions that differ batched from alone, with the top-2 logit gap where
they part). Then the batch-invariant setting (step_graphs.Invariant: every step at one shape, each
clip prefilled alone), batched and, for the first `--invariant-clips`, one caption at a time
through it: what it costs against the graphs, and whether its captions still differ. With random weights the captions mean nothing;
their tokens are what is compared.

Not in it yet: the replaying server (benchmarks/serving_replay.py needs the trained models).
Without a GPU (and without `--device cpu`) it says so and writes a report that says so. Sections
stop starting once `--budget-s` seconds have gone, and the report names what was skipped. Progress
goes to stderr with the seconds since start, and the report is rewritten after every timed run,
so a run cut short (a lease ending, a timeout) leaves what it measured; a loop that raises is
reported as failed and the next one runs.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from common import write_report

from speccap.batching.lockstep import decode_all
from speccap.batching.step_graphs import Invariant
from speccap.config import LinkConfig, ThinkerSize, load_params
from speccap.decoding.build import DecodeSpec, build_decoder
from speccap.decoding.engine import cloud_only, edge_only, speculative
from speccap.decoding.link import Link
from speccap.metrics.system import ResourceMonitor
from speccap.models.base import shared_vocab
from speccap.models.configs import SpecialIds, build_model
from speccap.models.loading import qwen_chat_template
from speccap.models.qwen_vocab import QWEN_OMNI_SPECIAL, qwen_tokenizer_offline
from speccap.models.thinker import ThinkerLM
from speccap.project import portable_command

VOCAB = 151936  # Qwen2.5-Omni's embedding rows
QWEN_IDS = SpecialIds(**{k: QWEN_OMNI_SPECIAL[t] for k, t in (
    ("audio", "<|AUDIO|>"), ("audio_start", "<|audio_bos|>"), ("audio_end", "<|audio_eos|>"), ("image", "<|IMAGE|>"),
    ("video", "<|VIDEO|>"), ("vision_start", "<|vision_bos|>"), ("vision_end", "<|vision_eos|>"),
    ("pad", "<|endoftext|>"), ("eos", "<|im_end|>"))})
# the Qwen2.5-Omni thinkers' shapes (their config.json files): the audio tower is the same in both
_AUDIO = dict(audio_d=1280, audio_layers=32, audio_heads=20, audio_ffn=5120)
SIZES = {
    "3b": ThinkerSize(text_hidden=2048, text_layers=36, text_heads=16, text_kv_heads=2, text_ffn=11008, **_AUDIO),
    "7b": ThinkerSize(text_hidden=3584, text_layers=28, text_heads=28, text_kv_heads=4, text_ffn=18944, **_AUDIO),
    "tiny": ThinkerSize(text_hidden=64, text_layers=2, text_heads=4, text_kv_heads=2, text_ffn=128, audio_d=64,
                        audio_layers=1, audio_heads=2, audio_ffn=128),
}
FRAMES_PER_SECOND = 100  # Whisper-style log-mel hop (10 ms)
_T0 = time.perf_counter()


def log(msg: str) -> None:
    """Progress on stderr, with the seconds since start: a run on a leased machine may be cut short."""
    print(f"[{time.perf_counter() - _T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


def build_thinker(size: str, device: torch.device, dtype: torch.dtype, seed: int, name: str) -> ThinkerLM:
    """A random-weight Qwen2.5-Omni thinker of `size`, made on `device` in `dtype` (no host copy)."""
    tok = qwen_tokenizer_offline()
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = build_model("qwen2_5_omni", VOCAB, SIZES[size], QWEN_IDS, 128, seed)
    finally:
        torch.set_default_dtype(old)
    return ThinkerLM(model.eval(), tok, qwen_chat_template(tok), QWEN_IDS.eos, name)


def audio_clips(n: int, seed: int) -> list[tuple[np.ndarray, str]]:
    """`n` log-mel clips of 4 to 20 seconds, languages alternating."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((128, int(rng.uniform(4, 20) * FRAMES_PER_SECOND))).astype(np.float32),
             ("en", "zh")[i % 2]) for i in range(n)]


# --loops' names for the loops' report names; the default check runs the first three, the sampling
# decoders (at the sweep's sampling temperature, sweep.qs_temperature) on request
LOOPS = {"ugsd": "UGSD (default)", "cloud-only": "cloud-only", "edge-only": "edge-only",
         "spec-sampling": "speculative sampling", "qs": "Q-S", "edge-sampled": "edge-only, sampled"}
DEFAULT_LOOPS = ["ugsd", "cloud-only", "edge-only"]


def loops(params, max_new: int, only: list[str]) -> dict:
    spec = DecodeSpec.from_params(params, cost=None, max_new_tokens=max_new)
    t = params.sweep.qs_temperature
    sampling = {rule: DecodeSpec.from_params(params, cost=None, max_new_tokens=max_new, rule=rule, temperature=t)
                for rule in ("spec_sampling", "qs")}

    def spec_loop(s: DecodeSpec):
        return lambda e, c, job: speculative(e, c, job[0], job[1], build_decoder(s), Link(params.link))
    # the loop the targets name first: when the time budget runs out, the baselines are what is skipped
    every = {
        "UGSD (default)": spec_loop(spec),
        "cloud-only": lambda e, c, job: cloud_only(c, job[0], job[1], Link(LinkConfig()), max_new),
        "edge-only": lambda e, c, job: edge_only(e, job[0], job[1], max_new),
        "speculative sampling": spec_loop(sampling["spec_sampling"]),
        "Q-S": spec_loop(sampling["qs"]),
        "edge-only, sampled": lambda e, c, job: edge_only(e, job[0], job[1], max_new, temperature=t),
    }
    return {name: fn for name, fn in every.items() if name in {LOOPS[k] for k in only}}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_run(fn, edge, cloud, jobs, batch: int, device: torch.device, graphs: bool | None = None,
              invariant: Invariant | None = None) -> tuple[list, dict]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with ResourceMonitor() as mon:  # the GPU sampled through the run, as the pipeline's runs are
        _sync(device)
        t0 = time.perf_counter()
        recs = decode_all(edge, cloud, fn, jobs, batch, graphs, invariant)
        _sync(device)
        wall = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for r in recs)
    out = {"batch": batch, "graphs": graphs, "invariant": invariant is not None, "wall_s": wall,
           "captions_per_s": len(recs) / wall, "tokens_per_s": tokens / wall, "tokens": tokens} | mon.gpu_summary()
    if device.type == "cuda":
        out["peak_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    log(f"B = {batch}, graphs {graphs}, invariant {invariant is not None}: {len(recs)} captions, {tokens} tokens "
        f"in {wall:.1f} s")
    return recs, out


def top2_gap(lms, mel, lang: str, prefix: list[int]) -> float:
    """The smallest top-2 logit gap, over `lms`, of the next token after `prefix` (single sequence)."""
    gaps = []
    for lm in lms:
        sess = lm.start(mel, lang)
        logits = sess.extend(prefix).logits[-1] if prefix else sess.prefill_logits
        top = torch.topk(logits.float(), 2).values
        gaps.append(float(top[0] - top[1]))
    return min(gaps)


def invariance(name: str, single: list, batched: list, jobs, edge, cloud) -> dict:
    lms = {"edge-only": (edge,), "edge-only, sampled": (edge,), "cloud-only": (cloud,)}.get(name, (edge, cloud))
    gaps = []
    for a, b, (mel, lang) in zip(single, batched, jobs):
        if a.token_ids != b.token_ids:
            at = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
                      min(len(a.token_ids), len(b.token_ids)))
            gaps.append(top2_gap(lms, mel, lang, a.token_ids[:at]))
    return {"captions": len(single), "differ": len(gaps), "share_differ": len(gaps) / len(single),
            "top2_gaps": gaps}


def run(args) -> dict:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    result = {"command": portable_command(), "device": args.device, "dtype": args.dtype, "clips": args.clips,
              "single_clips": min(args.single_clips or args.clips, args.clips),
              "batch": args.batch, "max_new_tokens": args.max_new_tokens, "sizes": {"edge": args.edge_size,
                                                                                   "cloud": args.cloud_size},
              "machine": platform.node(), "skipped": [], "failed": {}, "partial": {}, "loops": {}}
    if device.type == "cuda":
        if not torch.cuda.is_available():
            result["no_gpu"] = "no CUDA device on this machine: nothing was measured"
            return result
        result["gpu"] = torch.cuda.get_device_name(device)
    start = time.perf_counter()
    with torch.inference_mode():
        t0 = time.perf_counter()
        edge = build_thinker(args.edge_size, device, dtype, 1, "edge")
        cloud = build_thinker(args.cloud_size, device, dtype, 2, "cloud")
        shared_vocab(edge, cloud)
        result["build_s"] = time.perf_counter() - t0
        log(f"models built in {result['build_s']:.1f} s")
        result["parameters"] = {"edge": edge.num_parameters(), "cloud": cloud.num_parameters()}
        jobs = audio_clips(args.clips, 0)
        result["audio_seconds"] = [mel.shape[1] / FRAMES_PER_SECOND for mel, _ in jobs]
        longest = max(len(lm.prompt_ids(mel.shape[1], lang)) for lm in (edge, cloud) for mel, lang in jobs)
        invariant = Invariant.covering(args.batch, longest, args.max_new_tokens)
        result["invariant"] = {"rows": invariant.rows, "span": invariant.span}
        warm = audio_clips(2, 1)  # first calls allocate and pick kernels: not timed
        for name, fn in loops(load_params(args.params), 4, args.loops).items():
            decode_all(edge, cloud, fn, warm, 1)
            decode_all(edge, cloud, fn, warm, 2)
            log(f"warmed up {name}")
        for name, fn in loops(load_params(args.params), args.max_new_tokens, args.loops).items():
            if time.perf_counter() - start > args.budget_s:
                result["skipped"].append(name)
                continue
            log(f"{name} ...")

            def keep(kind: str, stats: dict, name=name) -> None:  # each run's figures as soon as they exist
                result["partial"].setdefault(name, {})[kind] = stats
                result["total_s"] = time.perf_counter() - start
                write_report(args.out, result, markdown)

            try:
                result["loops"][name] = measure_loop(name, fn, edge, cloud, jobs, args, device, invariant, keep)
                result["partial"].pop(name)
            except (RuntimeError, ValueError, TypeError, AssertionError) as exc:  # a path never run on this device:
                # the rest still reports
                result["failed"][name] = "".join(traceback.format_exception_only(exc)).strip()
                traceback.print_exc()
            result["total_s"] = time.perf_counter() - start
            write_report(args.out, result, markdown)  # a run cut short still leaves what it measured
    result["total_s"] = time.perf_counter() - start
    return result


def measure_loop(name: str, fn, edge, cloud, jobs, args, device: torch.device, invariant: Invariant,
                 keep: Callable[[str, dict], None]) -> dict:
    """One loop through every executor: single, batched eager, batched at fixed shapes (graphs on
    CUDA), and the batch-invariant setting batched and (for the first --invariant-clips) alone."""
    alone = jobs[: args.single_clips or len(jobs)]  # the single executor's captions/s from these
    single, s = timed_run(fn, edge, cloud, alone, 1, device)
    keep("single", s)
    eager, e = timed_run(fn, edge, cloud, jobs, args.batch, device, graphs=False)
    keep("batched", e)
    # the fixed shapes (batching.step_graphs): captured and replayed on CUDA, eager elsewhere
    graphed, g = timed_run(fn, edge, cloud, jobs, args.batch, device, graphs=True)
    keep("graphs", g)
    # the batch-invariant setting: one caption at a time and batched, both at its one shape
    # (alone: the first --invariant-clips only; a caption alone steps all the setting's rows)
    few = jobs[: args.invariant_clips]
    alone_inv, a = timed_run(fn, edge, cloud, few, 1, device, invariant=invariant)
    keep("invariant_alone", a)
    batched_inv, i = timed_run(fn, edge, cloud, jobs, args.batch, device, invariant=invariant)
    return {
        "invariant": i, "invariant_ratio": i["captions_per_s"] / s["captions_per_s"],
        "invariant_vs_graphs": i["captions_per_s"] / g["captions_per_s"],
        "invariance_setting": invariance(name, alone_inv, batched_inv[: len(few)], few, edge, cloud),
        "single": s, "batched": e, "graphs": g, "ratio": e["captions_per_s"] / s["captions_per_s"],
        "graphs_ratio": g["captions_per_s"] / s["captions_per_s"],
        "graphs_vs_eager": g["captions_per_s"] / e["captions_per_s"],
        "invariance": invariance(name, single, eager[: len(alone)], alone, edge, cloud),
        "invariance_graphs": invariance(name, single, graphed[: len(alone)], alone, edge, cloud)}


# issue 53's targets for the default loop at B = 32: x the single executor, graphs x the eager batched step
TARGETS = {"graphs_ratio": 5.0, "graphs_vs_eager": 3.0}


def _targets(r: dict) -> list[str]:
    """The targets' lines for the UGSD loop, where it ran to the end."""
    row = r["loops"].get("UGSD (default)")
    if row is None:
        return []
    inv = row["invariance_setting"]
    checks = [(f"captions/s batched with graphs x one at a time >= {TARGETS['graphs_ratio']:g}x",
               f"{row['graphs_ratio']:.1f}x", row["graphs_ratio"] >= TARGETS["graphs_ratio"]),
              (f"graphs x the eager batched step >= {TARGETS['graphs_vs_eager']:g}x",
               f"{row['graphs_vs_eager']:.2f}x", row["graphs_vs_eager"] >= TARGETS["graphs_vs_eager"]),
              ("under the batch-invariant setting, batched = alone on every caption compared",
               f"{inv['differ']} of {inv['captions']} differ", inv["differ"] == 0)]
    return ["", "The default UGSD loop against the targets:", "", "| target | measured | |", "|---|---|---|"] + [
        f"| {name} | {got} | {'met' if ok else 'not met'} |" for name, got, ok in checks]


def markdown(r: dict) -> str:
    lines = ["# The decoding loops on the target hardware", ""]
    if "no_gpu" in r:
        return "\n".join(lines + [f"Made by `{r['command']}`: {r['no_gpu']}.", ""])
    where = r.get("gpu") or r["device"]
    lines += [f"Made by `{r['command']}` on {where}, {r['dtype']}: random-weight Qwen2.5-Omni thinkers "
              f"({r['sizes']['edge']} shapes on the edge, {r['parameters']['edge']:,} parameters; {r['sizes']['cloud']} "
              f"in the cloud, {r['parameters']['cloud']:,}) with Qwen's vocabulary, {r['clips']} clips of "
              f"{min(r['audio_seconds']):.0f}-{max(r['audio_seconds']):.0f} s, up to {r['max_new_tokens']} tokens, "
              f"batched {r['batch']} at a time (one at a time: the first {r.get('single_clips', r['clips'])}). "
              f"Models built in {r['build_s']:.0f} s; the whole check "
              f"{r['total_s']:.0f} s.", "",
              "| loop | executor | captions/s | tokens/s | peak allocated GB | GPU util mean / max % | x single | "
              "x batched eager |", "|---|---|---|---|---|---|---|---|"]
    fixed = "graphs" if r["device"].startswith("cuda") else "fixed shapes, eager"
    kinds = (("single", "single", None), ("batched", "batched, eager step", "ratio"),
             ("graphs", f"batched, {fixed}", "graphs_ratio"), ("invariant", "batched, batch-invariant", "invariant_ratio"))
    for name, row in r["loops"].items():
        for kind, label, ratio in kinds:
            x = row[kind]
            util = f"{x['gpu_percent']:.0f} / {x['gpu_percent_max']:.0f}" if "gpu_percent" in x else "–"
            mem = f"{x['peak_allocated_gb']:.1f}" if "peak_allocated_gb" in x else "–"
            vs_eager = x["captions_per_s"] / row["batched"]["captions_per_s"]
            lines.append(f"| {name} | {label} (B = {x['batch']}) | {x['captions_per_s']:.2f} | {x['tokens_per_s']:.1f} | "
                         f"{mem} | {util} | {f'{row[ratio]:.2f}x' if ratio else ''} | "
                         f"{f'{vs_eager:.2f}x' if kind in ('graphs', 'invariant') else ''} |")
    inv_at = r["invariant"]
    lines += ["", "Batch invariance: captions decoded batched that differ from the same clip decoded alone (the "
              "first two: alone = the single executor; batch-invariant: alone = one caption at a time through the "
              f"setting, {inv_at['rows']} rows x {inv_at['span']} slots).", "",
              "| loop | batched, eager step: differ | smallest top-2 gap where they part | "
              f"batched, {fixed}: differ | smallest top-2 gap | batch-invariant: differ | smallest top-2 gap | "
              "batch-invariant x graphs |", "|---|---|---|---|---|---|---|---|"]
    for name, row in r["loops"].items():
        cells = []
        for inv in (row["invariance"], row["invariance_graphs"], row["invariance_setting"]):
            cells += [f"{inv['differ']} / {inv['captions']}", f"{min(inv['top2_gaps']):.3g}" if inv["top2_gaps"] else "–"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {row['invariant_vs_graphs']:.2f}x |")
    for name, runs in r.get("partial", {}).items():
        lines += ["", f"{name}: cut short; finished runs: " + "; ".join(
            f"{kind} (B = {x['batch']}) {x['captions_per_s']:.2f} captions/s" for kind, x in runs.items()) + "."]
    for name, err in r.get("failed", {}).items():
        lines += ["", f"{name}: failed ({err})."]
    if r["skipped"]:
        lines += ["", f"Skipped (past the time budget): {', '.join(r['skipped'])}."]
    lines += _targets(r)
    lines += ["", "Not measured here: the replaying server (benchmarks/serving_replay.py)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--edge-size", default="3b", choices=sorted(SIZES))
    ap.add_argument("--cloud-size", default="7b", choices=sorted(SIZES))
    ap.add_argument("--size", choices=sorted(SIZES), help="both models at this size (e.g. tiny, to try it on a CPU)")
    ap.add_argument("--clips", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--single-clips", type=int, default=8,
                    help="decode only the first N clips one at a time (0: all): the single executor's figures and "
                         "the batch-invariance comparisons come from those (one at a time is the slow part)")
    ap.add_argument("--invariant-clips", type=int, default=4,
                    help="clips decoded one at a time under the batch-invariant setting, against its batched captions")
    ap.add_argument("--loops", nargs="+", choices=list(LOOPS), default=DEFAULT_LOOPS,
                    help=f"the loops to run (default: {', '.join(DEFAULT_LOOPS)}, UGSD first)")
    ap.add_argument("--budget-s", type=float, default=360.0,
                    help="start no section after this many seconds")
    ap.add_argument("--params", default="params.yaml", help="where the UGSD loop's decode settings come from")
    ap.add_argument("--out", type=Path, default=Path("reports/device_check"))
    args = ap.parse_args()
    if args.size:
        args.edge_size = args.cloud_size = args.size
    if args.clips < 1 or args.batch < 1 or args.invariant_clips < 1 or args.single_clips < 0:
        ap.error("--clips, --batch and --invariant-clips must be at least 1, --single-clips at least 0")
    r = run(args)
    write_report(args.out, r, markdown)
    return 0 if "no_gpu" not in r else 2


if __name__ == "__main__":
    sys.exit(main())
