"""The networked edge-cloud split on this machine: equivalence, overhead, load, faults, a shaped link.

    python benchmarks/serving.py [--params params.yaml] [--clips 20] [--clients 16] [--per-client 20]
                                 [--out reports/serving]

The verifier runs as `speccap serve-cloud` in its own process (the embedded cloud model of the
pipeline, models/cloud); the edge (models/edge) runs here. Sections, all on loopback unless said:

1. equivalence and overhead: test clips (--clips per language) with the default decode settings,
   in-process vs networked with float32 and float16 on the wire: identical captions, wall time per
   caption, network seconds per request, HTTP bytes vs the packets' bytes, the link model's prediction.
2. load: --clients edge clients x --per-client captions at once against one server, and one client
   alone for comparison: errors, lost captions, p50/p99 verification latency, captions/s, tokens/s.
3. faults: the server is killed (SIGKILL) in the middle of a 4 x 10 load: every caption must still
   finish (fallback to the edge, flagged); restarted, new captions verify again. Clients that vanish
   with open sessions: time until the server has freed them (--idle-seconds 2).
4. shaped link (root with network namespaces only; skipped otherwise): the server in namespace
   sc-cloud behind scripts/netem_link.sh (2 Mbit/s up, 10 Mbit/s down): measured network time
   per caption next to the link model's prediction for the same packets and rates.

Writes <out>.json, <out>.md and <out>.png (verification latency CDF; measured vs predicted).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from common import mean, models_and_test_clips
from tqdm import tqdm

from speccap.config import LinkConfig, load_params
from speccap.decoding.build import DecodeSpec, build_decoder
from speccap.decoding.engine import speculative
from speccap.decoding.link import Link
from speccap.serving.client import VerifierClient, wait_until_up
from speccap.serving.edge import caption_remote, check_compatible
from speccap.serving.load import run_load

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`speccap serve-cloud` in a subprocess (optionally inside a network namespace)."""

    def __init__(self, params_path, token: str, host="127.0.0.1", port=None, netns=None, idle_seconds=120.0,
                 extra: tuple[str, ...] = ()):
        self.host, self.port = host, port or free_port()
        self.url = f"http://{host}:{self.port}"
        cmd = [shutil.which("speccap") or "speccap", "--params", str(params_path), "serve-cloud", "--host", host,
               "--port", str(self.port), "--threads", "1", "--idle-seconds", str(idle_seconds),
               "--max-sessions-per-client", "256", *extra]
        if netns:
            cmd = ["ip", "netns", "exec", netns] + cmd
        self.log = open(f"/tmp/speccap-serve-{self.port}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=os.environ | {"SPECCAP_TOKEN": token})
        try:
            wait_until_up(self.url, token, 120, alive=lambda: self.proc.poll() is None)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; see {self.log.name}") from None

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


def section_equivalence(edge, cloud, clips, make_settings, link_cfg, client, info) -> dict:
    rows = {"float32": [], "float16": []}
    for i, (_, lang, mel) in enumerate(tqdm(clips, desc="equivalence", unit="clip")):
        ref = speculative(edge, cloud, mel, lang, make_settings(), Link(link_cfg, seed=i))
        for dtype, out in rows.items():
            got = caption_remote(edge, client, info, mel, lang, make_settings(), Link(link_cfg, seed=i), dtype, dtype)
            n = got.network
            out.append({"same": got.token_ids == ref.token_ids, "wall_in_process": ref.wall_time,
                        "wall_networked": got.wall_time, "requests": n["requests"], "net_time": n["net_time"],
                        "server_compute": n["server_compute"], "http_up": n["http_bytes_up"],
                        "http_down": n["http_bytes_down"], "payload_up": got.bytes_up, "payload_down": got.bytes_down,
                        "link_model_time": n["link_model_time"], "fallback": n["fallback"]})
    out = {}
    for dtype, rs in rows.items():
        req = sum(r["requests"] for r in rs)
        out[dtype] = {
            "clips": len(rs), "identical": sum(r["same"] for r in rs), "fallback": sum(r["fallback"] for r in rs),
            "wall_in_process_s": mean([r["wall_in_process"] for r in rs]),
            "wall_networked_s": mean([r["wall_networked"] for r in rs]),
            "net_ms_per_request": 1000 * sum(r["net_time"] for r in rs) / max(req, 1),
            "requests_per_caption": req / max(len(rs), 1),
            "payload_up_B": mean([r["payload_up"] for r in rs]), "http_up_B": mean([r["http_up"] for r in rs]),
            "payload_down_B": mean([r["payload_down"] for r in rs]), "http_down_B": mean([r["http_down"] for r in rs]),
            "link_model_s": mean([r["link_model_time"] for r in rs])}
    return out


def section_faults(params_path, token, edge, jobs, make_settings, link_cfg) -> dict:
    srv = Server(params_path, token)
    port = srv.port
    result = {}
    done, lock = [0], __import__("threading").Lock()

    def kill_halfway(n):  # SIGKILL once half of the captions are done: the rest are mid-caption or not begun
        with lock:
            done[0] += n
            if done[0] == 20:
                srv.kill()
    summary, caps, errors = run_load(edge, srv.url, token, jobs, make_settings, link_cfg, clients=4, per_client=10,
                                     timeout=10, progress=kill_halfway)
    result["killed"] = {**summary, "captions_flagged": sum(c.fallback > 0 for c in caps),
                        "captions_verified_before": sum(c.fallback == 0 for c in caps), "error_list": errors[:3]}
    srv.stop()
    srv = Server(params_path, token, port=port)  # restarted on the same address
    summary, caps, errors = run_load(edge, srv.url, token, jobs, make_settings, link_cfg, clients=1, per_client=5)
    result["restarted"] = {**summary, "captions_flagged": sum(c.fallback > 0 for c in caps)}
    srv.stop()
    # vanished clients: sessions opened and never closed
    srv = Server(params_path, token, idle_seconds=2.0)
    from speccap.decoding import packets
    with VerifierClient(srv.url, token) as c:
        for mel, lang in jobs[:8]:
            c.open(packets.open_packet(mel, lang, "greedy"))
        opened = c.health()["sessions"]
        t = time.perf_counter()
        while c.health()["sessions"] and time.perf_counter() - t < 30:
            time.sleep(0.1)
        result["vanished"] = {"sessions_left_open": opened, "idle_seconds": 2.0,
                              "freed_after_s": time.perf_counter() - t, "sessions_now": c.health()["sessions"],
                              "expired_total": c.health()["expired_total"]}
    srv.stop()
    return result


NETEM = ROOT / "scripts" / "netem_link.sh"


def shaped_link_up(up_mbit: int = 2, down_mbit: int = 10) -> tuple[str | None, str]:
    """Bring up the namespace link (the server's side is namespace sc-cloud at 10.77.0.2). Returns
    (why it is skipped, or None; what the script said). Take it down with shaped_link_down()."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return "needs root, iproute2 and tc", ""
    shaped_link_down()
    up = subprocess.run([str(NETEM), "up", "--rtt-ms", "0", "--up-mbit", str(up_mbit), "--down-mbit", str(down_mbit)],
                        capture_output=True, text=True)
    if up.returncode != 0:
        return f"network namespaces unavailable: {up.stderr.strip()[:200]}", ""
    return None, up.stderr.strip()


def shaped_link_down() -> None:
    subprocess.run([str(NETEM), "down"], capture_output=True)


def section_shaped(params_path, token, edge, clips, make_settings, info_check) -> dict | None:
    skipped, note = shaped_link_up()
    if skipped:
        return {"skipped": skipped}
    try:
        srv = Server(params_path, token, host="10.77.0.2", netns="sc-cloud")
        link_cfg = LinkConfig(name="shaped", uplink_mbps=2.0, downlink_mbps=10.0, rtt_ms=0.0, overhead_bytes=0)
        rows = []
        with VerifierClient(srv.url, token, timeout=30) as c:
            info = c.info()
            info_check(info)
            for i, (_, lang, mel) in enumerate(tqdm(clips, desc="shaped link", unit="clip")):
                rec = caption_remote(edge, c, info, mel, lang, make_settings(), Link(link_cfg, seed=i))
                n = rec.network
                # the link model charged the packets' bytes; HTTP adds headers, TCP/IP adds ~52 B a segment
                wire_up = n["http_bytes_up"] + 52 * (n["http_bytes_up"] // 1448 + 2 * n["requests"])
                rows.append({"measured": n["net_time"], "predicted": n["link_model_time"],
                             "predicted_http": wire_up * 8 / 2e6 + n["http_bytes_down"] * 8 / 10e6,
                             "requests": n["requests"]})
        srv.stop()
    finally:
        shaped_link_down()
    return {"note": note, "uplink_mbit": 2, "downlink_mbit": 10, "clips": len(rows), "rows": rows,
            "measured_s": mean([r["measured"] for r in rows]), "predicted_s": mean([r["predicted"] for r in rows]),
            "predicted_http_s": mean([r["predicted_http"] for r in rows])}


def run(params_path, n_clips, clients, per_client, out: Path) -> dict:
    params = load_params(params_path)
    edge, cloud, clips = models_and_test_clips(params, n_clips, 1)
    decode = dataclasses.replace(params.decode, in_flight=0)

    def make_settings():
        return build_decoder(DecodeSpec.from_params(params, decode, seed=0))
    link_cfg = params.link
    token = secrets.token_urlsafe(24)
    res = {"decode": {"gate": decode.gate, "threshold": decode.threshold, "block_len": decode.block_len,
                      "rule": decode.rule}, "cpus": os.cpu_count()}

    srv = Server(params_path, token)
    try:
        with VerifierClient(srv.url, token) as client:
            info = client.info()
            check_compatible(edge, info)
            res["equivalence"] = section_equivalence(edge, cloud, clips, make_settings, link_cfg, client, info)
        jobs = [(mel, lang) for _, lang, mel in clips]
        one, one_caps, _ = run_load(edge, srv.url, token, jobs, make_settings, link_cfg, clients=1,
                                    per_client=per_client)
        with tqdm(total=clients * per_client, desc=f"load {clients}x{per_client}", unit="caption") as bar:
            many, many_caps, errors = run_load(edge, srv.url, token, jobs, make_settings, link_cfg, clients=clients,
                                               per_client=per_client, progress=bar.update)
        res["load"] = {"one_client": one, "many_clients": many, "errors": errors[:5]}
        rtts = {"1 client": [r for c in one_caps for r in c.verify_rtts],
                f"{clients} clients": [r for c in many_caps for r in c.verify_rtts]}
    finally:
        srv.stop()
    res["faults"] = section_faults(params_path, token, edge, [(mel, lang) for _, lang, mel in clips], make_settings,
                                   link_cfg)
    res["shaped"] = section_shaped(params_path, token, edge, clips[: max(4, n_clips // 2)], make_settings,
                                   lambda info: check_compatible(edge, info))
    write(res, rtts, out)
    return res


def write(res: dict, rtts: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    plot(res, rtts, out)
    write_md(res, out)


def plot(res: dict, rtts: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, xs in rtts.items():
        xs = np.sort(np.asarray(xs) * 1000)
        axes[0].plot(xs, np.arange(1, len(xs) + 1) / max(len(xs), 1), label=name)
    axes[0].set(xscale="log", xlabel="verification round trip (ms, loopback)", ylabel="share of requests",
                title="verification latency")
    axes[0].legend()
    sh = res.get("shaped") or {}
    if sh.get("rows"):
        m = [r["measured"] for r in sh["rows"]]
        axes[1].scatter([r["predicted"] for r in sh["rows"]], m, label="link model (packets)")
        axes[1].scatter([r["predicted_http"] for r in sh["rows"]], m, marker="x", label="packets + HTTP/TCP bytes")
        top = max(m + [r["predicted_http"] for r in sh["rows"]]) * 1.1
        axes[1].plot([0, top], [0, top], "k:", lw=1)
        axes[1].set(xlabel="predicted network seconds per caption", ylabel="measured",
                    title="shaped link: 2 Mbit/s up, 10 Mbit/s down")
        axes[1].legend()
    else:
        axes[1].text(0.5, 0.5, f"shaped link skipped:\n{sh.get('skipped', '')}", ha="center", va="center", wrap=True)
        axes[1].set_axis_off()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


def write_md(res: dict, out: Path) -> None:
    eq, load, faults = res["equivalence"], res["load"], res["faults"]
    one, many = load["one_client"], load["many_clients"]
    lines = [
        "# The networked split: verifier server and edge client on this machine",
        "",
        f"`python benchmarks/serving.py` ({res['cpus']} CPUs; embedded models; decode: gate {res['decode']['gate']} "
        f"{res['decode']['threshold']}, L {res['decode']['block_len']}, rule {res['decode']['rule']}). The server is "
        "`speccap serve-cloud` in its own process (1 model thread, 1 compute slot); the edge runs in the benchmark "
        "process. Loopback unless said.",
        "",
        "## Equivalence and overhead",
        "",
        "| wire dtype | clips | identical to in-process | fallback | wall in-process (s) | wall networked (s) | "
        "network ms / request | requests / caption | packet bytes up | HTTP bytes up | packet bytes down | "
        "HTTP bytes down |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for dtype, r in eq.items():
        lines.append(f"| {dtype} | {r['clips']} | {r['identical']} | {r['fallback']} | {r['wall_in_process_s']:.3f} | "
                     f"{r['wall_networked_s']:.3f} | {r['net_ms_per_request']:.2f} | {r['requests_per_caption']:.1f} | "
                     f"{r['payload_up_B']:.0f} | {r['http_up_B']:.0f} | {r['payload_down_B']:.0f} | "
                     f"{r['http_down_B']:.0f} |")
    lines += [
        "",
        "float32 features give the in-process captions exactly (the in-process cloud reads the float32 "
        "features); float16 halves the feature upload and may change a caption where the cloud's argmax is "
        "close. Network ms / request is the round trip minus the server's compute and queue time: HTTP, "
        "(de)serialization and the socket.",
        "",
        "## Load",
        "",
        "| clients x captions | captions | lost | errors | fallback blocks | wall (s) | captions/s | "
        "verified tokens/s | verify p50 (ms) | verify p99 (ms) | caption p50 (s) | caption p99 (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in (one, many):
        lines.append(f"| {r['clients']} x {r['per_client']} | {r['captions']} | {r['lost']} | {r['errors']} | "
                     f"{r['fallback_blocks']} | {r['wall_s']:.1f} | {r['captions_per_s']:.2f} | "
                     f"{r['verified_tokens_per_s']:.0f} | {r['verify_p50_ms']:.1f} | {r['verify_p99_ms']:.1f} | "
                     f"{r['caption_p50_s']:.2f} | {r['caption_p99_s']:.2f} |")
    k, rs, v = faults["killed"], faults["restarted"], faults["vanished"]
    lines += [
        "",
        f"With {many['clients']} clients on {res['cpus']} CPUs, {many['clients']} edge threads and the server share "
        f"the machine: captions/s stays near the single client's ({many['captions_per_s']:.1f} vs "
        f"{one['captions_per_s']:.1f}) while each request waits its turn for a CPU, which is the p99. On two "
        "machines the edges would draft in parallel and the server's single compute slot would be the limit.",
        "",
        "## Faults",
        "",
        f"- Server killed (SIGKILL) when 20 of the captions of a 4 x 10 load had finished: {k['captions']} of 40 "
        f"captions finished, {k['lost']} lost, "
        f"{k['errors']} errors; {k['captions_flagged']} captions flagged with {k['fallback_blocks']} blocks kept on "
        f"the edge; {k['captions_verified_before']} were verified in full before the kill.",
        f"- Restarted on the same port: {rs['captions']} new captions, {rs['captions_flagged']} flagged "
        f"({rs['fallback_blocks']} fallback blocks).",
        f"- {v['sessions_left_open']} sessions left open by vanished clients were freed {v['freed_after_s']:.1f} s "
        f"after they were last used (idle lifetime {v['idle_seconds']:g} s); sessions open now: {v['sessions_now']}.",
        "",
        "## Shaped link",
        ""]
    sh = res["shaped"]
    if sh.get("rows"):
        lines += [
            f"Server in network namespace `sc-cloud` behind `scripts/netem_link.sh up --up-mbit 2 --down-mbit 10` "
            f"({sh['clips']} clips). " + " ".join((sh["note"] or "").splitlines()),
            "",
            "| network seconds per caption | value |", "| --- | --- |",
            f"| measured (round trips minus server compute) | {sh['measured_s']:.3f} |",
            f"| link model on the packets' bytes | {sh['predicted_s']:.3f} |",
            f"| link model on the HTTP + TCP/IP bytes | {sh['predicted_http_s']:.3f} |",
            "",
            "The link model charges the wire-format packets; the real link also carries HTTP headers and TCP/IP "
            "headers, which is the gap between the first two rows."]
    else:
        lines.append(f"Skipped: {sh.get('skipped')}.")
    lines += ["", "![latency and shaped link](serving.png)", ""]
    out.with_suffix(".md").write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--clips", type=int, default=20, help="test clips per language (default 20)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--per-client", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("reports/serving"))
    ap.add_argument("--rewrite-md", action="store_true", help="only rewrite <out>.md from <out>.json")
    a = ap.parse_args(argv)
    if a.rewrite_md:
        write_md(json.loads(a.out.with_suffix(".json").read_text()), a.out)
        return 0
    res = run(a.params, a.clips, a.clients, a.per_client, a.out)
    print(json.dumps({k: res[k] for k in ("equivalence", "load")}, indent=1)[:3000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
