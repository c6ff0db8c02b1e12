"""The lean decoding step (speccap.models.fast_step) against transformers' forward, side by side.

For each role of the embedded default and for the real-size Qwen2.5-Omni-7B text decoder shape
(random weights, 2 of its 28 layers: the per-call machinery is the same, the arithmetic per
layer is the real one): milliseconds per one-token extension and per 5-token verify forward, HF
vs fast, interleaved in one run, median of rounds. With the trained models (after `dvc repro
train`) it also decodes test clips both ways, UGSD default settings, and checks the captions are
the same. Run:

    python benchmarks/fast_step.py [--params params.yaml] [--clips 20]   # -> reports/fast_step.{md,json}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from speccap.config import ThinkerSize, load_params  # noqa: E402
from speccap.models.configs import build_model  # noqa: E402
from speccap.models.thinker import PromptTemplate, ThinkerLM  # noqa: E402
from speccap.models.tokenizer import special_ids, train_tokenizer  # noqa: E402
from speccap.project import portable_command  # noqa: E402

# Qwen2.5-Omni-7B's text decoder: 3584 wide, 28 heads of 128, 4 KV heads, FFN 18944 (2 layers here)
SEVEN_B = ThinkerSize(text_hidden=3584, text_layers=2, text_heads=28, text_kv_heads=4, text_ffn=18944,
                      audio_d=64, audio_layers=1, audio_heads=2, audio_ffn=128)


def _time_calls(lm: ThinkerLM, mel: np.ndarray, n_tokens: int, rounds: int, calls: int) -> dict:
    """Median ms per extend() of `n_tokens`, HF and fast interleaved round by round."""
    out = {"hf": [], "fast": []}
    for _ in range(rounds):
        for mode in ("hf", "fast"):
            lm.use_fast_step = mode == "fast"
            s = lm.start(mel, "en")
            t = time.perf_counter()
            for _ in range(calls):
                s.extend([5] * n_tokens)
                if n_tokens > 1:  # keep one: the cache grows by a token a call, as in decoding
                    s.rollback(n_tokens - 1)
            out[mode].append((time.perf_counter() - t) * 1000 / calls)
    lm.use_fast_step = True
    return {k: statistics.median(v) for k, v in out.items()}


def _random_lm(size: ThinkerSize, vocab: int) -> ThinkerLM:
    tok = train_tokenizer(["In the audio, a speaker speaks. 在音频中，说话者。"] * 4, 96)
    special = special_ids(tok)
    model = build_model("qwen2_5_omni", vocab, size, special, seed=0)
    en = tok.convert_tokens_to_ids("<|en|>")
    return ThinkerLM(model, tok, PromptTemplate(suffix={"en": [en]}), special.eos, "random")


def _decode_both(params, n_clips: int, threads: int) -> dict:
    from common import models_and_test_clips

    from speccap.decoding.build import DecodeSpec, build_decoder
    from speccap.decoding.engine import speculative
    from speccap.decoding.link import Link
    edge, cloud, clips = models_and_test_clips(params, n_clips, threads)
    res = {"hf": [], "fast": []}
    captions = {"hf": [], "fast": []}
    for _rec, lang, mel in clips:
        for mode in ("hf", "fast"):
            edge.use_fast_step = cloud.use_fast_step = mode == "fast"
            t = time.perf_counter()
            r = speculative(edge, cloud, mel, lang, build_decoder(DecodeSpec.from_params(params, seed=0)),
                            Link(params.link, seed=0))
            res[mode].append(time.perf_counter() - t)
            captions[mode].append(r.caption)
    return {"clips": len(clips), "hf_s_per_caption": statistics.fmean(res["hf"]),
            "fast_s_per_caption": statistics.fmean(res["fast"]),
            "speedup": statistics.fmean(res["hf"]) / statistics.fmean(res["fast"]),
            "same_captions": sum(a == b for a, b in zip(captions["hf"], captions["fast"]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default=None)
    ap.add_argument("--clips", type=int, default=20, help="test clips per language decoded both ways")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "reports" / "fast_step"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    params = load_params(args.params)
    mel = np.random.default_rng(0).standard_normal((params.features.n_mels, 180)).astype(np.float32)
    shapes = {"edge (embedded)": params.models.edge.size, "cloud (embedded)": params.models.cloud.size,
              "Qwen2.5-Omni-7B text shape, 2 layers": SEVEN_B}
    rows = []
    for name, size in shapes.items():
        lm = _random_lm(size, 1000 if "7B" not in name else 4096)
        big = "7B" in name
        for n in (1, 5):
            t = _time_calls(lm, mel, n, rounds=3 if big else 5, calls=20 if big else 100)
            rows.append({"model": name, "tokens": n, "hf_ms": t["hf"], "fast_ms": t["fast"],
                         "speedup": t["hf"] / t["fast"]})
            print(rows[-1], flush=True)
    result = {"command": portable_command(), "threads": args.threads, "calls": rows}
    if (Path(params.models.dir) / "cloud").exists() and args.clips:
        result["decode"] = _decode_both(params, args.clips, args.threads)
        print(result["decode"], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = ["# The lean decoding step vs transformers' forward", "",
             f"Made by `{result['command']}` at {args.threads} torch thread(s) on CPU. Milliseconds per `extend()` "
             "call (median of rounds, HF and fast interleaved); random weights of each shape.", "",
             "| model | tokens per call | HF ms | fast ms | speed-up |", "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['tokens']} | {r['hf_ms']:.2f} | {r['fast_ms']:.2f} | {r['speedup']:.2f}x |"
              for r in rows]
    if "decode" in result:
        d = result["decode"]
        lines += ["", f"UGSD at the default settings on the trained models, {d['clips']} test clips: "
                  f"{d['hf_s_per_caption'] * 1000:.0f} ms a caption through HF, {d['fast_s_per_caption'] * 1000:.0f} ms "
                  f"through the fast step ({d['speedup']:.2f}x); {d['same_captions']} of {d['clips']} captions the same."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
