"""Many captions per forward (speccap.batching.batched_step) against one caption per forward, side by side.

A Qwen2.5-Omni thinker's text decoder with random weights, at a real size (the 3B or 7B thinker's
text shapes; its audio tower is kept minimal: only decoding is timed here, not the audio prefill) or
at the embedded default's size. Each row holds its own prompt (random token ids, lengths spread
around --prompt), then decodes the way speculative decoding does:

- draft: one token per row per forward (the edge drafting);
- verify: 5 tokens per row per forward, then 4 rolled back (a cloud verifying a block, keeping one).

`single` is today's engine: one sequence, `FastStep` on HF's DynamicCache, sequence after sequence.
`batched B` is B rows in one `BatchedStep` forward. Printed and written: ms per forward, tokens
scored per second, the ratio to single, and the peak memory (CUDA) or resident set (CPU). It also
checks, in float32, that each row's logits equal its sequence's own (max |diff|, argmax agreement),
and reports the same in the timed dtype. Run:

    python benchmarks/batched_step.py --size 3b --device cuda --dtype bfloat16   # -> reports/batched_step_cuda.*
    python benchmarks/batched_step.py --size embedded --device cpu               # -> reports/batched_step_cpu.*
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from speccap.batching.batched_step import BatchedCache, BatchedStep  # noqa: E402
from speccap.config import ThinkerSize  # noqa: E402
from speccap.models.configs import SpecialIds, build_model  # noqa: E402
from speccap.models.fast_step import FastStep  # noqa: E402

VOCAB = 151936  # Qwen's
QWEN_IDS = SpecialIds(audio=151646, audio_start=151647, audio_end=151648, image=151655, video=151656,
                      vision_start=151652, vision_end=151653, pad=151643, eos=151645)
_AUDIO = dict(audio_d=64, audio_layers=1, audio_heads=2, audio_ffn=128)  # not used when decoding
SIZES = {  # the thinkers' text decoders (Qwen2.5-Omni-3B and -7B configs); embedded: params.yaml's default
    "3b": ThinkerSize(text_hidden=2048, text_layers=36, text_heads=16, text_kv_heads=2, text_ffn=11008, **_AUDIO),
    "7b": ThinkerSize(text_hidden=3584, text_layers=28, text_heads=28, text_kv_heads=4, text_ffn=18944, **_AUDIO),
    "embedded": ThinkerSize(),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prompts(rows: int, length: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(max(8, length - 32), length + 33, (rows,), generator=g)
    return [torch.randint(0, 900, (int(n),), generator=g) for n in lens]  # within every vocabulary here


def _prefill(step: FastStep, ids: torch.Tensor, device) -> DynamicCache:
    cache = DynamicCache()
    step.step(ids.to(device), torch.arange(len(ids), device=device), cache)
    return cache


def _single(step: FastStep, prompts, calls: int, block: int, device) -> float:
    """Seconds for `calls` forwards of `block` tokens on each sequence, one sequence at a time."""
    total = 0.0
    for ids in prompts:
        cache = _prefill(step, ids, device)
        tok = torch.full((block,), 5, device=device)
        _sync(device)
        t = time.perf_counter()
        for _ in range(calls):
            start = cache.get_seq_length()
            step.step(tok, torch.arange(start, start + block, device=device), cache)
            if block > 1:
                cache.crop(-(block - 1))
        _sync(device)
        total += time.perf_counter() - t
    return total


def _batched(step: BatchedStep, prefill: FastStep, prompts, calls: int, block: int, device) -> float:
    """Seconds for `calls` forwards of `block` tokens on every row at once (prompts prefilled one by one)."""
    rows = len(prompts)
    cache = BatchedCache(step, rows, max(len(p) for p in prompts) + calls + block + 1)
    for r, ids in enumerate(prompts):
        cache.load_row(r, _prefill(prefill, ids, device))
    tok = torch.full((rows, block), 5, device=device)
    counts = torch.full((rows,), block, device=device)
    _sync(device)
    t = time.perf_counter()
    for _ in range(calls):
        step.step(tok, counts, cache)
        if block > 1:
            cache.lengths -= block - 1
    _sync(device)
    return time.perf_counter() - t


def _graphed(step: BatchedStep, prefill: FastStep, prompts, calls: int, block: int, device) -> float:
    """`_batched` with the step captured once as a CUDA graph and replayed: no per-kernel launch
    from Python (the attention reads the whole capacity, masked, so every replay has one shape)."""
    rows = len(prompts)
    cap = max(len(p) for p in prompts) + calls + 2 * block + 8
    cache = BatchedCache(step, rows, cap)
    for r, ids in enumerate(prompts):
        cache.load_row(r, _prefill(prefill, ids, device))
    tok = torch.full((rows, block), 5, device=device)
    counts = torch.full((rows,), block, device=device)

    def one():
        out = step.step(tok, counts, cache, span=cap)
        if block > 1:
            cache.lengths -= block - 1
        return out
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm up off the main stream, as capture requires
        one()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        one()
    _sync(device)
    t = time.perf_counter()
    for _ in range(calls):
        graph.replay()
    _sync(device)
    return time.perf_counter() - t


def _agreement(model, prompts, device) -> dict:
    """Each row's first draft logits in one batched forward against its sequence's own."""
    single, batched = FastStep(model), BatchedStep(model)
    cache = BatchedCache(batched, len(prompts), max(len(p) for p in prompts) + 2)
    want = []
    for r, ids in enumerate(prompts):
        c = _prefill(single, ids, device)
        cache.load_row(r, c)
        n = c.get_seq_length()
        want.append(single.step(torch.tensor([7], device=device), torch.tensor([n], device=device), c)[0][0])
    got = batched.step(torch.full((len(prompts), 1), 7, device=device), torch.ones(len(prompts), dtype=torch.long,
                                                                                     device=device), cache)[0][:, 0]
    want = torch.stack(want).float()
    flipped = got.argmax(-1) != want.argmax(-1)
    top2 = want.topk(2, dim=-1).values
    return {"max_abs_diff": float((got.float() - want).abs().max()),
            "argmax_agree": float((~flipped).float().mean()), "rows": len(prompts),
            # a flip is a near-tie when the sequence's own top-2 logits were this close
            "flip_top2_gaps": [float(g) for g in (top2[:, 0] - top2[:, 1])[flipped]]}


def _memory(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB, the process's peak


def run(size: str, device: torch.device, dtype: torch.dtype, batches: list[int], prompt: int, calls: int,
        vocab: int = VOCAB) -> dict:
    torch.set_default_device(device)
    special = QWEN_IDS if vocab == VOCAB else SpecialIds.at_end(vocab)
    model = build_model("qwen2_5_omni", vocab, SIZES[size], special, seed=0).eval()
    torch.set_default_device("cpu")
    out = {"size": size, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "dtype": str(dtype).removeprefix("torch."), "prompt": prompt, "calls": calls, "vocab": vocab,
           "threads": torch.get_num_threads(),
           "params_text_b": sum(p.numel() for p in model.model.language_model.parameters()) / 1e9}
    with torch.inference_mode():
        out["agreement_float32"] = _agreement(model, _prompts(8, prompt, 1), device)
        model.to(dtype)
        out["agreement_" + out["dtype"]] = _agreement(model, _prompts(8, prompt, 1), device)
        single, batched = FastStep(model), BatchedStep(model)
        rows = []
        for mode, block in (("draft", 1), ("verify", 5)):
            _single(single, _prompts(1, prompt, 9), 3, block, device)  # warm-up
            n_single = 4
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            secs = _single(single, _prompts(n_single, prompt, 2), calls, block, device)
            base = {"mode": mode, "batch": 1, "engine": "single", "ms_per_forward": secs * 1000 / (calls * n_single),
                    "tokens_per_s": n_single * calls * block / secs, "peak_gib": _memory(device)}
            rows.append(base)
            for b in batches:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                _batched(batched, single, _prompts(b, prompt, 9), 3, block, device)  # warm-up
                secs = _batched(batched, single, _prompts(b, prompt, 3), calls, block, device)
                tps = b * calls * block / secs
                rows.append({"mode": mode, "batch": b, "engine": "batched", "ms_per_forward": secs * 1000 / calls,
                             "tokens_per_s": tps, "vs_single": tps / base["tokens_per_s"], "peak_gib": _memory(device)})
                print(json.dumps(rows[-1]), flush=True)
            if device.type != "cuda":
                continue
            for b in batches:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
                secs = _graphed(batched, single, _prompts(b, prompt, 3), calls, block, device)
                tps = b * calls * block / secs
                rows.append({"mode": mode, "batch": b, "engine": "batched+graph", "ms_per_forward": secs * 1000 / calls,
                             "tokens_per_s": tps, "vs_single": tps / base["tokens_per_s"], "peak_gib": _memory(device)})
                print(json.dumps(rows[-1]), flush=True)
    out["rows"] = rows
    return out


def render(r: dict) -> str:
    lines = [f"# Batched decoding step: {r['size']} thinker text decoder on {r['device']} ({r['dtype']})", "",
             "Written by `benchmarks/batched_step.py`. Random weights at the real text-decoder shapes "
             f"({r['params_text_b']:.2f} B parameters, a vocabulary of {r.get('vocab', VOCAB)}, "
             f"{r.get('threads', '?')} torch threads); prompts of about {r['prompt']} tokens; {r['calls']} forwards "
             "per measurement. draft = one token per row per forward; verify = five, four rolled back. single = "
             "today's engine (one sequence per forward, `FastStep`); batched B = B rows in one forward (`BatchedStep`).",
             "", "| mode | engine | B | ms / forward | tokens / s | x single | x B=1, same engine | peak memory (GiB) |",
             "|---|---|---|---|---|---|---|---|"]
    one = {(row["mode"], row["engine"]): row["tokens_per_s"] for row in r["rows"] if row["batch"] == 1}
    for row in r["rows"]:
        peak = f"{row['peak_gib']:.2f}" if "peak_gib" in row else ""
        lines.append(f"| {row['mode']} | {row['engine']} | {row['batch']} | {row['ms_per_forward']:.2f} | "
                     f"{row['tokens_per_s']:.0f} | {row.get('vs_single', 1.0):.1f} | "
                     f"{row['tokens_per_s'] / one[row['mode'], row['engine']]:.1f} | {peak} |")
    lines += ["", "Each row's logits in one batched forward against its own sequence's (8 rows, ragged prompts):", ""]
    for key in (k for k in r if k.startswith("agreement_")):
        a = r[key]
        gaps = ", ".join(f"{g:.3g}" for g in a["flip_top2_gaps"]) or "none"
        lines.append(f"- {key.removeprefix('agreement_')}: max |logit diff| {a['max_abs_diff']:.2e}, "
                     f"argmax agrees on {a['argmax_agree']:.0%} of rows; the sequence's own top-2 gap where it "
                     f"flips: {gaps}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="embedded")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--prompt", type=int, default=256, help="tokens per prompt (10 s of audio: about 250)")
    ap.add_argument("--calls", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=VOCAB, help="vocabulary size (Qwen's; the embedded models: 1000)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0: torch's default)")
    ap.add_argument("--out", default=None, help="reports/batched_step_<device type> when not given")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    r = run(args.size, device, getattr(torch, args.dtype), args.batches, args.prompt, args.calls, args.vocab)
    out = Path(args.out or ROOT / "reports" / f"batched_step_{device.type}")
    out.with_suffix(".json").write_text(json.dumps(r, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(r))
    print(render(r))


if __name__ == "__main__":
    main()
