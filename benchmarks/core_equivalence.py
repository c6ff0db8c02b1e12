"""The decoding core before and after a change, side by side: every caption and record field the
same on the trained models, or the difference named.

    python benchmarks/core_equivalence.py --base REV [--clips 4] [--out reports/core_equivalence]

Runs the same decoders twice on the first `--clips` test clips per language, once with the code of
git revision REV (a temporary worktree on PYTHONPATH) and once with the working tree's, in fresh
processes, and compares what they return:
- single-model loops: edge-only (greedy, sampled, a 3-token limit) and cloud-only records,
  `generate()`, the shadow labels' edge trajectory, one shadow-labelled clip, one traced clip;
- speculative loops: every record field of ten decoders (blocking at decode's settings, adaptive L,
  greedy, speculative sampling, Q-S, pipelined, the oracle at a budget, token gates alone and
  pending, no cloud cache), and WISV (auto upload, the trained head) on three channels;
- and, in the working tree alone, the networked edge against the in-process loop (every decoder a
  served cloud runs, WISV with each upload protocol): every count and packet equal.
Clocks are charged by one fixed cost model, so every clock field is compared; only measured process
fields (wall time, model time, CPU and RAM) are left out. Needs the trained models (`dvc repro train`)
and, for WISV, the trained head (`dvc repro wisv_head`).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

from speccap.project import portable_command, project_root

MEASURED = {"model_time", "wall_time", "resources", "sessions"}
WISV_CHANNELS = {"near": {"rtt_ms": 1.0, "uplink_mbps": 0.5}, "default": {}, "far": {"rtt_ms": 60.0}}


def _record(rec) -> list:
    return sorted((k, v) for k, v in vars(rec).items() if k not in MEASURED)


def _specs() -> dict:
    from speccap.decoding.build import DecodeSpec
    return {"blocking": DecodeSpec(), "adaptive-L": DecodeSpec(block_len=0), "greedy": DecodeSpec(rule="greedy", rank=1),
            "spec-sampling": DecodeSpec(gate="always", rule="spec_sampling", temperature=1.0),
            "qs": DecodeSpec(gate="always", rule="qs", temperature=1.0), "pipelined": DecodeSpec(in_flight=2),
            "oracle-k2": DecodeSpec(gate="always", corrections=2), "token-alone": DecodeSpec(token="alone"),
            "token-pending": DecodeSpec(token="pending"), "no-cloud-cache": DecodeSpec(cloud_cache=False)}


def dump(n_clips: int, out: str, params_path: str | None = None) -> None:
    """Run every decoder (with whatever speccap is importable) and pickle {name: result}."""
    sys.path.insert(0, str(Path(__file__).parent))
    from common import models_and_test_clips

    from speccap.config import LinkConfig, load_params
    from speccap.decoding.build import DecodeSpec, build_decoder
    from speccap.decoding.cost import CostModel
    from speccap.decoding.engine import cloud_only, edge_only, speculative
    from speccap.decoding.link import Link
    from speccap.gating.shadow import ShadowSettings, edge_trajectory, shadow_caption
    from speccap.gating.traces import TraceSettings, trace_caption, verifying_every_block
    from speccap.models.generate import generate
    from speccap.pipeline.saved import cached_head, head_path

    params = load_params(params_path)
    edge, cloud, clips = models_and_test_clips(params, n_clips, 1)
    cost = CostModel({r: {"prefill": [0.01, 1e-4], "extend": [2e-3, 1e-3, 1e-6]} for r in ("edge", "cloud")})
    specs = _specs()
    head = cached_head(params, {}) if head_path(params).exists() else None
    out_d: dict[str, object] = {}
    for i, (meta, lang, mel) in enumerate(clips):
        tag = f"{meta['id']}"
        out_d[f"edge-only/{tag}"] = _record(edge_only(edge, mel, lang, cost=cost))
        out_d[f"edge-only sampled/{tag}"] = _record(edge_only(edge, mel, lang, temperature=0.7, seed=i, cost=cost))
        out_d[f"edge-only 3 tokens/{tag}"] = _record(edge_only(edge, mel, lang, max_new_tokens=3, cost=cost))
        out_d[f"cloud-only/{tag}"] = _record(cloud_only(cloud, mel, lang, Link(LinkConfig()), cost=cost))
        g = generate(cloud, mel, lang, max_new_tokens=20, temperature=0.5, seed=i)
        out_d[f"generate/{tag}"] = (g.token_ids, len(g.token_seconds))
        b = edge_trajectory(edge, mel, lang, 8 if i % 2 else 128)
        out_d[f"edge trajectory/{tag}"] = (b.tokens, repr(b.stats), [c.numpy().tolist() for c in b.context])
        x, labels, cap = shadow_caption(edge, cloud, mel, lang, meta["references"], meta.get("emotion"),
                                        ShadowSettings(max_new_tokens=40 if i % 2 else 128))
        out_d[f"shadow labels/{tag}"] = (x.tolist(), repr(labels), cap)
        rows, cap = trace_caption(edge, cloud, mel, lang, meta["references"],
                                  TraceSettings(verifying_every_block(max_new_tokens=30 if i % 2 else 128)))
        out_d[f"trace/{tag}"] = (repr(rows), cap)
        for name, spec in specs.items():
            s = build_decoder(spec.replace(cost=cost, seed=i), link=Link(LinkConfig()), vocab=edge.vocab_size)
            out_d[f"{name}/{tag}"] = _record(speculative(edge, cloud, mel, lang, s, Link(LinkConfig())))
        if head is not None:
            for channel, kw in WISV_CHANNELS.items():
                spec = DecodeSpec(gate="always", rule="wisv", cost=cost, seed=i)
                s = build_decoder(spec, head=head, link=Link(LinkConfig(**kw)), vocab=edge.vocab_size)
                out_d[f"wisv {channel}/{tag}"] = _record(speculative(edge, cloud, mel, lang, s, Link(LinkConfig(**kw))))
    Path(out).write_bytes(pickle.dumps(out_d))


# the decoders a served cloud runs (the server caches, always, and knows no correction budget)
NETWORKED = ("blocking", "adaptive-L", "greedy", "spec-sampling", "qs", "token-alone", "token-pending")
# what the networked edge books as the in-process loop does (its clocks are measured round trips, and
# the tolerated mismatches stay with the server)
COUNTS = ("token_ids", "drafted", "rounds", "transmitted", "synced", "accepted", "corrected", "bonus",
          "hidden_requests", "edge_fed", "position_checked", "position_accepted")


def networked(n_clips: int, params_path: str | None = None) -> dict[str, list[int]]:
    """The working tree's networked edge against its in-process loop: a verifier server on loopback
    (`create_app` with the trained WISV head, a real socket), features in float32, q rows in float16
    as in-process. Per decoder: [clips, clips with every count and every packet (direction, kind,
    bytes; the OPEN packet aside) equal]."""
    sys.path.insert(0, str(Path(__file__).parent))
    from common import models_and_test_clips

    from speccap.config import LinkConfig, load_params
    from speccap.decoding.build import DecodeSpec, build_decoder
    from speccap.decoding.engine import speculative
    from speccap.decoding.link import Link
    from speccap.pipeline.saved import cached_head, head_path
    from speccap.serving.client import VerifierClient
    from speccap.serving.edge import caption_remote, check_compatible
    from speccap.serving.server import BackgroundServer, create_app

    params = load_params(params_path)
    edge, cloud, clips = models_and_test_clips(params, n_clips, 1)
    head = cached_head(params, {}) if head_path(params).exists() else None
    specs = {name: spec for name, spec in _specs().items() if name in NETWORKED}
    if head is not None:
        specs |= {f"wisv {p}": DecodeSpec(gate="always", rule="wisv", wisv_protocol=p) for p in ("full", "selective", "auto")}
    token = "core-equivalence"

    def books(rec) -> tuple:
        sent = [(p["dir"], p["kind"], p["bytes"]) for p in rec.packets if p["kind"] != "features"]
        return tuple(getattr(rec, k) for k in COUNTS) + (sent,)
    out: dict[str, list[int]] = {}
    with BackgroundServer(create_app(cloud, {token: "bench"}, wisv_head=head)) as srv, \
            VerifierClient(srv.url, token) as client:
        info = client.info()
        check_compatible(edge, info)
        for i, (_, lang, mel) in enumerate(clips):
            for name, spec in specs.items():
                spec = spec.replace(seed=i)
                ref = speculative(edge, cloud, mel, lang, build_decoder(spec, head=head, link=Link(LinkConfig()),
                                                                        vocab=edge.vocab_size), Link(LinkConfig()))
                got = caption_remote(edge, client, info, mel, lang,
                                     build_decoder(spec, link=Link(LinkConfig()), vocab=edge.vocab_size),
                                     Link(LinkConfig()), "float32", "float16")
                row = out.setdefault(name, [0, 0])
                row[0] += 1
                row[1] += books(got) == books(ref) and got.network["fallback"] == 0
    return out


def _run(tree: Path, n_clips: int, out: Path) -> None:
    """The dump of `tree`'s code under `tree`'s own params.yaml (a revision's schema may not know the
    other's keys), run from the project root, where the data and models are."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    subprocess.run([sys.executable, __file__, "--dump", str(out), "--clips", str(n_clips), "--params",
                    str(tree / "params.yaml")], env=env, check=True, cwd=project_root())


def _differences(before: dict, after: dict) -> dict[str, list[str]]:
    """Per decoder: the clips whose results differ, with the fields that do (records) or 'result'."""
    out: dict[str, list[str]] = {}
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list):
            fields = [k for (k, va), (_, vb) in zip(a, b) if va != vb] or ["fields"]
            da, db = dict(a), dict(b)
            if "bytes_up" in fields and db.get("rounds"):  # what the uplink gained, per round
                fields[fields.index("bytes_up")] = f"bytes_up ({(db['bytes_up'] - da['bytes_up']) / db['rounds']:+g} a round)"
        else:
            fields = ["result"]
        out.setdefault(key.split("/")[0], []).append(f"{key.split('/')[1]}: {', '.join(fields)}")
    return out


def markdown(r: dict) -> str:
    lines = [f"# The decoding core before and after: {r['base']} against the working tree\n",
             f"`{r['command']}`, {r['clips_per_language']} test clips per language, trained models, "
             "clocks charged by one fixed cost model (so every clock field is compared); measured process "
             "fields left out.\n", "| decoder | clips | equal |", "| --- | --- | --- |"]
    for name, n in r["decoders"].items():
        diff = r["differences"].get(name, [])
        lines.append(f"| {name} | {n} | {'all' if not diff else f'{n - len(diff)} of {n}'} |")
    lines.append(f"\nEvery record's token ids the same: {'yes' if r['same_captions'] else 'NO'}.")
    if r.get("networked"):
        lines += ["\n## Networked = in-process (the working tree)\n",
                  "The networked edge (`speccap.serving.edge`, a verifier server on loopback with the trained WISV "
                  "head) against the in-process loop on the same clips: every count (" + ", ".join(COUNTS) + ") "
                  "and every packet's direction, kind and size equal (the OPEN packet, which carries what the "
                  "in-process FEATURES packet does plus the rule, aside), and no fallback. Features travel in "
                  "float32 here, so the cloud reads what it reads in-process.\n",
                  "| decoder | clips | equal |", "| --- | --- | --- |"]
        for name, (n, same) in r["networked"].items():
            lines.append(f"| {name} | {n} | {'all' if same == n else f'{same} of {n}'} |")
    if r["differences"]:
        lines.append("\nWhere they differ (clip: fields):\n")
        for name, rows in r["differences"].items():
            lines.append(f"- {name}: " + "; ".join(rows[:3]) + (f"; and {len(rows) - 3} more" if len(rows) > 3 else ""))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="the git revision to compare against")
    ap.add_argument("--clips", type=int, default=4, help="test clips per language")
    ap.add_argument("--out", default="reports/core_equivalence")
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dump:
        return dump(args.clips, args.dump, args.params)
    if not args.base:
        ap.error("--base REV is required")
    root = project_root()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), args.base], cwd=root, check=True)
        try:
            _run(tree, args.clips, Path(tmp) / "before.pkl")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=root, check=True)
        _run(root, args.clips, Path(tmp) / "after.pkl")
        before, after = (pickle.loads((Path(tmp) / f).read_bytes()) for f in ("before.pkl", "after.pkl"))
    decoders: dict[str, int] = {}
    for key in after:
        decoders[key.split("/")[0]] = decoders.get(key.split("/")[0], 0) + 1
    base = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=root, capture_output=True, text=True,
                          check=True).stdout.strip()
    records = [k for k in after if isinstance(after[k], list)]
    same_captions = all(dict(before[k]).get("token_ids") == dict(after[k]).get("token_ids") for k in records)
    r = {"command": portable_command(), "base": base, "clips_per_language": args.clips, "decoders": decoders,
         "same_captions": same_captions, "differences": _differences(before, after),
         "networked": networked(args.clips)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(r, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(r))
    print(markdown(r))


if __name__ == "__main__":
    main()
