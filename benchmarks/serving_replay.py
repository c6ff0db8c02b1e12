"""The verifier server alone: recorded edge traffic replayed by clients that run no model, against the
serialized and the batching server, in one run.

    python benchmarks/serving_replay.py [--clips 10] [--clients 32] [--per-client 4] [--batch 32]
                                        [--window-ms 2] [--repeats 5] [--out reports/serving_replay]

1. Record: the first `--clips` test clips per language, each captioned once by the networked edge
   (every block escalated: gate `always`, the default L and rule) against a serialized
   `speccap serve-cloud`; every request it sends (OPEN, each VERIFY, the closing DELETE) is kept
   with the answer it got.
2. Replay: `--clients` threads, each on its own HTTP connection, replay `--per-client` recorded
   captions one after the other, each request as soon as the previous answer is in: the OPEN
   packet, every VERIFY re-addressed to the new session, then DELETE. No model runs on the client
   side, and the clients write the recorded bytes to raw sockets (httpx would cost them about a
   millisecond of CPU a request), so the server is the whole load (benchmarks/serving_batch.py
   measures it beside 32 edges drafting on the same cores).
3. Per server (serialized: `--compute-slots 1`; batching: `--batch B --batch-window-ms W`, both at
   1 torch thread, `--no-access-log`), both up at once and replayed in turn `--repeats` times:
   verifications per second, p50 / p99 of a VERIFY's round trip, how many answers equal the
   recording (accepted count and token; a batched forward may flip a near-tie), and the CPU seconds
   of the server and of the clients; each server's run of median throughput is its row.

Run where the pipeline has run (models/, data/processed/). Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
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

    def request(self, method, path, content=None, headers=None):
        ex = super().request(method, path, content, headers)
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
    srv = Server(params_path, token, extra=("--compute-slots", "1", "--no-access-log"))
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


class RawClient:
    """The bytes VerifierClient sends, written straight to a keep-alive socket: a load generator
    that leaves the cores to the server (httpx costs about a millisecond of CPU a request)."""

    def __init__(self, url: str, token: str, timeout: float = 60.0):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.head = f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\n".encode()
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, dict, bytes, float]:
        """(status, headers (lower-case names), body, seconds) of one request."""
        t = time.perf_counter()
        typed = b"Content-Type: application/octet-stream\r\n" if body else b""
        self.sock.sendall(f"{method} {path} HTTP/1.1\r\n".encode() + self.head + typed
                          + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        while b"\r\n\r\n" not in self.buf:
            self._read()
        top, self.buf = self.buf.split(b"\r\n\r\n", 1)
        status_line, *lines = top.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
        size = int(headers.get("content-length", 0))
        while len(self.buf) < size:
            self._read()
        out, self.buf = self.buf[:size], self.buf[size:]
        status = int(status_line.split()[1])
        if status >= 400:
            raise RuntimeError(f"{method} {path}: {status} {out[:200]!r}")
        return status, headers, out, time.perf_counter() - t

    def _read(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buf += chunk


def replay(url: str, token: str, captions: list[Recorded], clients: int, per_client: int) -> dict:
    """`clients` threads replaying `per_client` recorded captions each; verifications/s, RTTs, answers."""
    rtts: list[float] = []
    inside: list[tuple[float, float]] = []  # each VERIFY's (compute, queue) seconds as the server says them
    equal, errors = [0], []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1, timeout=120)  # a client that cannot connect breaks it: no hang

    def client_thread(c: int):
        client = RawClient(url, token)
        try:
            start.wait()
            for i in range(per_client):
                cap = captions[(c * per_client + i) % len(captions)]
                try:
                    sid = int(json.loads(client.request("POST", "/v1/sessions", cap.open_packet)[2])["session"])
                    mine, spent, same = [], [], 0
                    for packet, want in cap.verifies:
                        _, headers, body, seconds = client.request("POST", f"/v1/sessions/{sid}/verify",
                                                                   readdressed(packet, sid))
                        mine.append(seconds)
                        spent.append((float(headers["x-speccap-compute"]), float(headers["x-speccap-queue"])))
                        same += _answer(body) == _answer(want)
                    client.request("DELETE", f"/v1/sessions/{sid}")
                except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
                    with lock:
                        errors.append(f"client {c} caption {i}: {type(exc).__name__}: {exc}")
                    continue
                with lock:
                    rtts.extend(mine)
                    inside.extend(spent)
                    equal[0] += same
        finally:
            client.close()

    threads = [threading.Thread(target=client_thread, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.join()
    wall, client_cpu = time.perf_counter() - t0, time.process_time() - c0
    sent = clients * per_client
    return {"captions": sent - len(errors), "lost": len(errors), "errors_shown": errors[:5], "wall_s": wall,
            "clients_cpu_s": client_cpu,
            "verify_requests": len(rtts), "answers_equal": equal[0],
            "verifications_per_s": len(rtts) / wall if wall else 0.0,
            "verify_p50_ms": 1000 * float(np.percentile(rtts, 50)) if rtts else 0.0,
            "verify_p99_ms": 1000 * float(np.percentile(rtts, 99)) if rtts else 0.0,
            # where a round trip goes: the model's forward and the wait for a compute slot (the rest is
            # HTTP, the server's request handling and the clients' own threads)
            "compute_ms_mean": 1000 * float(np.mean([c for c, _ in inside])) if inside else 0.0,
            "queue_ms_mean": 1000 * float(np.mean([q for _, q in inside])) if inside else 0.0,
            "rtt_ms_mean": 1000 * float(np.mean(rtts)) if rtts else 0.0}


def _cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _model_seconds(url: str, token: str) -> dict:
    """The server's seconds in its model's prefills and verification forwards so far (/v1/health)."""
    with VerifierClient(url, token) as client:
        return client.health()["model_seconds"]


def run(params_path: str, n_clips: int, clients: int, per_client: int, batch: int, window_ms: float,
        repeats: int) -> dict:
    """Both servers up at once (the idle one costs nothing), replayed in turn `repeats` times; each
    server's run of median throughput is its row."""
    params = load_params(params_path)
    token = secrets.token_urlsafe(24)
    captions = record(params, params_path, token, n_clips)
    out = {"command": portable_command(), "clients": clients, "per_client": per_client, "recorded": len(captions),
           "recorded_verifies": sum(len(c.verifies) for c in captions), "batch": batch, "window_ms": window_ms,
           "repeats": repeats, "target": THROUGHPUT_TARGET}
    servers, runs = {}, {}
    try:
        for name, extra in server_kinds(batch, window_ms).items():
            servers[name], runs[name] = Server(params_path, token, extra=extra), []
        for _ in tqdm(range(repeats), desc="replay", unit="round"):
            for name, srv in servers.items():
                used, spent = _cpu_seconds(srv.proc.pid), _model_seconds(srv.url, token)
                runs[name].append(replay(srv.url, token, captions, clients, per_client))
                runs[name][-1]["server_cpu_s"] = _cpu_seconds(srv.proc.pid) - used
                runs[name][-1].update({f"model_{k}_s": v - spent[k] for k, v in _model_seconds(srv.url, token).items()})
    finally:
        for srv in servers.values():
            srv.stop()
    for name, made in runs.items():
        ordered = sorted(made, key=lambda x: x["verifications_per_s"])
        out[name] = ordered[len(ordered) // 2] | {"runs_verifications_per_s": [x["verifications_per_s"] for x in made]}
    return compared(out)


def markdown(r: dict) -> str:
    rows = [f"| {name} | {r[name]['captions']} | {r[name]['lost']} | {r[name]['verify_requests']} | "
            f"{r[name]['answers_equal']} | {r[name]['verifications_per_s']:.1f} | {r[name]['verify_p50_ms']:.1f} | "
            f"{r[name]['verify_p99_ms']:.1f} | {r[name]['rtt_ms_mean']:.1f} = {r[name]['compute_ms_mean']:.1f} + "
            f"{r[name]['queue_ms_mean']:.1f} + {r[name]['rtt_ms_mean'] - r[name]['compute_ms_mean'] - r[name]['queue_ms_mean']:.1f} | "
            f"{r[name]['wall_s']:.2f} | {r[name]['server_cpu_s']:.2f} | {r[name]['model_prefill_s']:.2f} | "
            f"{r[name]['model_forward_s']:.2f} | {r[name]['clients_cpu_s']:.2f} |"
            for name in ("serialized", "batched")]
    met = "met" if r["target_met"] else "not met"
    return "\n".join([
        "# The verifier server alone, under replayed edge traffic",
        "",
        f"Made by `{r['command']}`: {r['recorded']} captions recorded from the networked edge ({r['recorded_verifies']} "
        f"VERIFY requests, every block escalated), then replayed by {r['clients']} clients on loopback, "
        f"{r['per_client']} captions each, that run no model: each request goes as soon as the previous answer is "
        f"in; they write the recorded bytes straight to their sockets, so they take little of the cores. Each server "
        f"is `speccap serve-cloud --no-access-log` at 1 torch thread; batched: `--batch {r['batch']} "
        f"--batch-window-ms {r['window_ms']:g}`. Both servers replayed in turn {r['repeats']} times; each row is its "
        "server's run of median throughput (every run's: "
        + "; ".join(f"{n} " + ", ".join(f"{v:.0f}" for v in r[n]["runs_verifications_per_s"])
                    for n in ("serialized", "batched")) + " verifications/s).",
        "",
        "| server | captions | lost | verifications | answers as recorded | verifications/s | p50 ms | p99 ms | "
        "mean ms = compute + queue + the rest | wall s | server CPU s | in prefills s | in verification forwards s | "
        "clients' CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Verifications per second, batched / serialized: **{r['ratio']:.2f}x** (target at least "
        f"{r['target']:.0f}x at no worse p99: {met}). A round trip's mean splits into the forward's seconds and "
        "the wait for a compute slot, as the server reports them (X-Speccap-Compute, X-Speccap-Queue), and the "
        "rest: HTTP, the server's request handling and the clients' threads, all on this machine's cores. Batched, "
        "compute is the wait for the shared forward as well as the forward. A server whose CPU seconds come near "
        "its wall seconds is bound by its own process: its event loop and its model thread share one interpreter. "
        "The seconds in prefills (each new session's audio and prompt) and in verification forwards are the "
        "server's own account (/v1/health): batching shares the verification forwards among sessions, while "
        "every caption still opens with its own audio, and the HTTP handling is per request either way.",
        "",
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    server_arguments(ap, "reports/serving_replay")
    ap.add_argument("--repeats", type=int, default=5, help="replays of each server, in turn (the median is shown)")
    a = ap.parse_args()
    write_report(a.out, run(a.params, a.clips, a.clients, a.per_client, a.batch, a.window_ms, a.repeats), markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
