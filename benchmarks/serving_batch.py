"""The verifier server batching concurrent sessions (`speccap serve-cloud --batch`) beside the serialized
one, on loopback, in one run.

    python benchmarks/serving_batch.py [--clips 10] [--clients 32] [--per-client 4] [--batch 32]
                                       [--window-ms 2] [--out reports/serving_batch]

Both servers are `speccap serve-cloud` in a process of their own at 1 torch thread, with the embedded
cloud of the pipeline (models/cloud); `--clients` edge clients (threads here, sharing models/edge)
caption `--per-client` clips each at once, every block escalated (gate `always`, the default L and
rule) so that the verifier is the load. The serialized server verifies one request at a time
(`--compute-slots 1`); the batching one gathers the concurrent sessions' calls over `--window-ms`
into one forward (speccap.batching.gather). Per server: verifications per second, p50 / p99 of a
verification's round trip, captions equal to the in-process loop's.

Run where the pipeline has run (models/, data/processed/). Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import models_and_test_clips, write_report
from serving import Server

from speccap.config import load_params
from speccap.decoding.build import DecodeSpec, build_decoder
from speccap.decoding.engine import speculative
from speccap.decoding.link import Link
from speccap.project import portable_command
from speccap.serving.load import run_load

THROUGHPUT_TARGET = 3.0  # the issue's: verifications per second, batched / serialized, at no worse p99


def run(params_path: str, n_clips: int, clients: int, per_client: int, batch: int, window_ms: float) -> dict:
    params = load_params(params_path)
    edge, cloud, clips = models_and_test_clips(params, n_clips, 1)

    def make_settings():
        return build_decoder(DecodeSpec.from_params(params, gate="always", threshold=None, in_flight=0, seed=0))

    jobs = [(mel, lang) for _, lang, mel in clips]
    expected = [speculative(edge, cloud, mel, lang, make_settings(), Link(params.link)).token_ids
                for mel, lang in jobs]
    token = secrets.token_urlsafe(24)
    out = {"command": portable_command(), "clients": clients, "per_client": per_client,
           "clips": len(jobs), "batch": batch, "window_ms": window_ms, "target": THROUGHPUT_TARGET}
    for name, extra in server_kinds(batch, window_ms).items():
        srv = Server(params_path, token, extra=extra)
        try:
            with tqdm(total=clients * per_client, desc=name, unit="caption") as bar:
                summary, captions, errors = run_load(edge, srv.url, token, jobs, make_settings, params.link,
                                                     clients=clients, per_client=per_client, progress=bar.update)
        finally:
            srv.stop()
        summary["verifications_per_s"] = summary["verify_requests"] / summary["wall_s"] if summary["wall_s"] else 0.0
        summary["equal_to_in_process"] = sum(c.token_ids == expected[c.job] for c in captions)
        summary["errors_shown"] = errors[:5]
        out[name] = summary
    return compared(out)


def server_kinds(batch: int, window_ms: float) -> dict[str, tuple[str, ...]]:
    """The two servers side by side: `serve-cloud` arguments of each."""
    return {"serialized": ("--compute-slots", "1", "--no-access-log"),
            "batched": ("--batch", str(batch), "--batch-window-ms", str(window_ms), "--no-access-log")}


def compared(out: dict) -> dict:
    """`out` with the batched server's throughput against the serialized one's, and the target."""
    s, b = out["serialized"], out["batched"]
    out["ratio"] = b["verifications_per_s"] / s["verifications_per_s"] if s["verifications_per_s"] else 0.0
    out["target_met"] = out["ratio"] >= THROUGHPUT_TARGET and b["verify_p99_ms"] <= s["verify_p99_ms"]
    return out


def server_arguments(ap: argparse.ArgumentParser, out: str) -> None:
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--clips", type=int, default=10, help="test clips per language")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--per-client", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--window-ms", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=Path(out))


def markdown(r: dict) -> str:
    rows = []
    for name in ("serialized", "batched"):
        x = r[name]
        rows.append(f"| {name} | {x['captions']} | {x['lost']} | {x['equal_to_in_process']} | {x['verify_requests']} | "
                    f"{x['verifications_per_s']:.1f} | {x['verify_p50_ms']:.1f} | {x['verify_p99_ms']:.1f} |")
    met = "met" if r["target_met"] else "not met"
    return "\n".join([
        "# The verifier server batching concurrent sessions",
        "",
        f"Made by `{r['command']}`: {r['clients']} edge clients on loopback, {r['per_client']} captions each over "
        f"{r['clips']} test clips, every block escalated; each server `speccap serve-cloud` at 1 torch thread. "
        f"Batched: `--batch {r['batch']} --batch-window-ms {r['window_ms']:g}`.",
        "",
        "| server | captions | lost | equal to in-process | verifications | verifications/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Verifications per second, batched / serialized: **{r['ratio']:.2f}x** (target at least "
        f"{r['target']:.0f}x at no worse p99: {met}). The clients draft on the same machine, so both servers "
        f"share its cores with {r['clients']} edges.",
        "",
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    server_arguments(ap, "reports/serving_batch")
    a = ap.parse_args()
    write_report(a.out, run(a.params, a.clips, a.clients, a.per_client, a.batch, a.window_ms), markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
