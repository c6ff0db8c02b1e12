"""The verifier server alone: recorded edge traffic replayed by clients that run no model, against the
serialized and the batching server, in one run.

    python benchmarks/serving_replay.py [--clips 10] [--clients 32] [--per-client 4] [--batch 32]
                                        [--window-ms 2] [--out reports/serving_replay]

1. Record: the first `--clips` test clips per language, each captioned once by the networked edge
   (every block escalated: gate `always`, the default L and rule) against a serialized
   `speccap serve-cloud`; every request it sends (OPEN, each VERIFY, the closing DELETE) is kept
   with the answer it got.
2. Replay: `--clients` threads, each on its own HTTP connection, replay `--per-client` recorded
   captions one after the other, each request as soon as the previous answer is in: the OPEN
   packet, every VERIFY re-addressed to the new session, then DELETE. No model runs on the client
   side, so the server is the whole load (benchmarks/serving_batch.py measures it beside 32 edges
   drafting on the same cores).
3. Per server (serialized: `--compute-slots 1`; batching: `--batch B --batch-window-ms W`, both at
   1 torch thread): verifications per second, p50 / p99 of a VERIFY's round trip, and how many
   answers equal the recording (accepted count and token; a batched forward may flip a near-tie).

Run where the pipeline has run (models/, data/processed/). Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import secrets
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import models_and_test_clips, write_report
from serving import Server
from serving_batch import THROUGHPUT_TARGET, compared, server_arguments, server_kinds

from speccap.config import load_params
from speccap.decoding import packets
from speccap.decoding.build import DecodeSpec, build_decoder
from speccap.decoding.link import Link
from speccap.project import portable_command
from speccap.serving.client import VerifierClient
from speccap.serving.edge import caption_remote

# the start of every packet: magic, wire version, kind, then the session id a replay re-addresses
_ADDRESS = struct.Struct("<2sBBI")


@dataclass
class Recorded:
    """One caption's traffic: the OPEN packet, then each VERIFY packet with the answer it got."""
    open_packet: bytes = b""
    verifies: list[tuple[bytes, bytes]] = field(default_factory=list)


class RecordingClient(VerifierClient):
    """A VerifierClient that keeps every OPEN and VERIFY it sends, with the answer."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.caption = Recorded()

    def request(self, method, path, content=None):
        ex = super().request(method, path, content)
        if method == "POST" and path == "/v1/sessions":
            self.caption.open_packet = content
        elif method == "POST" and path.endswith("/verify"):
            self.caption.verifies.append((content, ex.body))
        return ex


def readdressed(packet: bytes, session: int) -> bytes:
    """`packet` sent to session `session` (its header names the session it belongs to)."""
    magic, version, kind, _ = _ADDRESS.unpack_from(packet)
    return _ADDRESS.pack(magic, version, kind, session) + packet[_ADDRESS.size:]


def _answer(body: bytes) -> tuple[int, int, int | None]:
    """(seq, accepted, token) of a VERDICT: what the server decided, whatever session it was."""
    _, seq, accepted, token = packets.parse_verdict(body)
    return seq, accepted, token


def record(params, params_path: str, token: str, n_clips: int) -> list[Recorded]:
    edge, _, clips = models_and_test_clips(params, n_clips, 1)
    spec = DecodeSpec.from_params(params, gate="always", threshold=None, in_flight=0, seed=0)
    srv = Server(params_path, token, extra=("--compute-slots", "1"))
    made = []
    try:
        with RecordingClient(srv.url, token) as client:
            info = client.info()
            for i, (_, lang, mel) in enumerate(tqdm(clips, desc="record", unit="caption")):
                client.caption = Recorded()
                rec = caption_remote(edge, client, info, mel, lang, build_decoder(spec), Link(params.link, seed=i),
                                     "float32", "float32")
                if rec.network["fallback"]:
                    raise RuntimeError(f"recording: clip {i} fell back to the edge ({rec.network['fallback_reasons']})")
                made.append(client.caption)
    finally:
        srv.stop()
    return made


def replay(url: str, token: str, captions: list[Recorded], clients: int, per_client: int) -> dict:
    """`clients` threads replaying `per_client` recorded captions each; verifications/s, RTTs, answers."""
    rtts: list[float] = []
    inside: list[tuple[float, float]] = []  # each VERIFY's (compute, queue) seconds as the server says them
    equal, errors = [0], []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def client_thread(c: int):
        with VerifierClient(url, token, timeout=60.0) as client:
            start.wait()
            for i in range(per_client):
                cap = captions[(c * per_client + i) % len(captions)]
                try:
                    sid, _ = client.open(cap.open_packet)
                    mine, spent, same = [], [], 0
                    for packet, want in cap.verifies:
                        ex = client.verify(sid, readdressed(packet, sid))
                        mine.append(ex.seconds)
                        spent.append((ex.compute, ex.queue))
                        same += _answer(ex.body) == _answer(want)
                    client.end(sid)
                except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
                    with lock:
                        errors.append(f"client {c} caption {i}: {type(exc).__name__}: {exc}")
                    continue
                with lock:
                    rtts.extend(mine)
                    inside.extend(spent)
                    equal[0] += same

    threads = [threading.Thread(target=client_thread, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    sent = clients * per_client
    return {"captions": sent - len(errors), "lost": len(errors), "errors_shown": errors[:5], "wall_s": wall,
            "verify_requests": len(rtts), "answers_equal": equal[0],
            "verifications_per_s": len(rtts) / wall if wall else 0.0,
            "verify_p50_ms": 1000 * float(np.percentile(rtts, 50)) if rtts else 0.0,
            "verify_p99_ms": 1000 * float(np.percentile(rtts, 99)) if rtts else 0.0,
            # where a round trip goes: the model's forward and the wait for a compute slot (the rest is
            # HTTP, the server's request handling and the clients' own threads)
            "compute_ms_mean": 1000 * float(np.mean([c for c, _ in inside])) if inside else 0.0,
            "queue_ms_mean": 1000 * float(np.mean([q for _, q in inside])) if inside else 0.0,
            "rtt_ms_mean": 1000 * float(np.mean(rtts)) if rtts else 0.0}


def run(params_path: str, n_clips: int, clients: int, per_client: int, batch: int, window_ms: float) -> dict:
    params = load_params(params_path)
    token = secrets.token_urlsafe(24)
    captions = record(params, params_path, token, n_clips)
    out = {"command": portable_command(), "clients": clients, "per_client": per_client, "recorded": len(captions),
           "recorded_verifies": sum(len(c.verifies) for c in captions), "batch": batch, "window_ms": window_ms,
           "target": THROUGHPUT_TARGET}
    for name, extra in server_kinds(batch, window_ms).items():
        srv = Server(params_path, token, extra=extra)
        try:
            out[name] = replay(srv.url, token, captions, clients, per_client)
        finally:
            srv.stop()
    return compared(out)


def markdown(r: dict) -> str:
    rows = [f"| {name} | {r[name]['captions']} | {r[name]['lost']} | {r[name]['verify_requests']} | "
            f"{r[name]['answers_equal']} | {r[name]['verifications_per_s']:.1f} | {r[name]['verify_p50_ms']:.1f} | "
            f"{r[name]['verify_p99_ms']:.1f} | {r[name]['rtt_ms_mean']:.1f} = {r[name]['compute_ms_mean']:.1f} + "
            f"{r[name]['queue_ms_mean']:.1f} + {r[name]['rtt_ms_mean'] - r[name]['compute_ms_mean'] - r[name]['queue_ms_mean']:.1f} |"
            for name in ("serialized", "batched")]
    met = "met" if r["target_met"] else "not met"
    return "\n".join([
        "# The verifier server alone, under replayed edge traffic",
        "",
        f"Made by `{r['command']}`: {r['recorded']} captions recorded from the networked edge ({r['recorded_verifies']} "
        f"VERIFY requests, every block escalated), then replayed by {r['clients']} clients on loopback, "
        f"{r['per_client']} captions each, that run no model: each request goes as soon as the previous answer is "
        f"in. Each server is `speccap serve-cloud` at 1 torch thread; batched: `--batch {r['batch']} "
        f"--batch-window-ms {r['window_ms']:g}`.",
        "",
        "| server | captions | lost | verifications | answers as recorded | verifications/s | p50 ms | p99 ms | "
        "mean ms = compute + queue + the rest |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Verifications per second, batched / serialized: **{r['ratio']:.2f}x** (target at least "
        f"{r['target']:.0f}x at no worse p99: {met}). A round trip's mean splits into the forward's seconds and "
        "the wait for a compute slot, as the server reports them (X-Speccap-Compute, X-Speccap-Queue), and the "
        "rest: HTTP, the server's request handling and the clients' threads, all on this machine's cores.",
        "",
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    server_arguments(ap, "reports/serving_replay")
    a = ap.parse_args()
    write_report(a.out, run(a.params, a.clips, a.clients, a.per_client, a.batch, a.window_ms), markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
