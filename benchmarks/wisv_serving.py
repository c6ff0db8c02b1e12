"""WISV over the network: `speccap serve-cloud --wisv` (the head the wisv_head stage trained) and the
networked edge, against the in-process loop, for the full- and the selective-hidden protocol.

1. equivalence on loopback: the first N test clips per language (default 20, so 40 captions), every
   block verified (gate `always`, L = the first of wisv.block_lens), tau = wisv.tau: networked
   captions equal to in-process ones; requests, HIDDEN requests and HTTP bytes per caption.
2. shaped link (root with network namespaces only; skipped otherwise): the server in namespace
   sc-cloud behind scripts/netem_link.sh (2 Mbit/s up, 10 Mbit/s down), each protocol's measured
   network seconds per caption next to the link model's prediction for the same packets.

Run where the pipeline has run (models/, models/wisv/head.pt, data/processed/):

    python benchmarks/wisv_serving.py [--clips 20] [--out reports/wisv_serving]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import secrets
import sys
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import mean, models_and_test_clips
from serving import Server, shaped_link_down, shaped_link_up

from speccap.config import LinkConfig, load_params
from speccap.decoding.build import DecodeSpec, build_decoder
from speccap.decoding.engine import speculative
from speccap.decoding.link import Link
from speccap.decoding.wisv.head import load_head
from speccap.pipeline.saved import head_path
from speccap.serving.client import VerifierClient
from speccap.serving.edge import caption_remote, check_compatible

ROOT = Path(__file__).resolve().parents[1]
PROTOCOLS = ("full", "selective")


def captions(edge, cloud, head, clips, params, decode, client, info, link_cfg, protocol, compare=True) -> dict:
    rows = []
    spec = DecodeSpec.from_params(params, decode, rule="wisv", wisv_protocol=protocol)
    for i, (_, lang, mel) in enumerate(tqdm(clips, desc=f"wisv {protocol}", unit="clip")):
        # over the network the server holds the head
        got = caption_remote(edge, client, info, mel, lang, build_decoder(spec), Link(link_cfg, seed=i), "float32",
                             "float32")
        n = got.network
        row = {"requests": n["requests"], "hidden_requests": got.hidden_requests, "rounds": got.rounds,
               "http_up": n["http_bytes_up"], "http_down": n["http_bytes_down"], "payload_up": got.bytes_up,
               "net_time": n["net_time"], "link_model_time": n["link_model_time"], "fallback": n["fallback"]}
        if compare:
            ref = speculative(edge, cloud, mel, lang, build_decoder(spec, head=head), Link(link_cfg, seed=i))
            row["same"] = got.token_ids == ref.token_ids
            row["tolerated"] = ref.tolerated
        rows.append(row)
    out = {k: mean([r[k] for r in rows]) for k in rows[0] if k != "same"}
    out["clips"] = len(rows)
    if compare:
        out["identical"] = sum(r["same"] for r in rows)
    return out


def shaped(params_path, params, token, edge, cloud, head, clips, decode) -> dict:
    skipped, note = shaped_link_up()
    if skipped:
        return {"skipped": skipped}
    out = {"note": note, "uplink_mbit": 2, "downlink_mbit": 10}
    try:
        srv = Server(params_path, token, host="10.77.0.2", netns="sc-cloud", extra=("--wisv",))
        link_cfg = LinkConfig(name="shaped", uplink_mbps=2.0, downlink_mbps=10.0, rtt_ms=0.0, overhead_bytes=0)
        try:
            with VerifierClient(srv.url, token, timeout=30) as c:
                info = c.info()
                check_compatible(edge, info)
                for protocol in PROTOCOLS:
                    out[protocol] = captions(edge, cloud, head, clips, params, decode, c, info, link_cfg, protocol,
                                             compare=False)
        finally:
            srv.stop()
    finally:
        shaped_link_down()
    return out


def write_md(res: dict, out: Path) -> None:
    lines = ["# WISV over the network", "",
             f"Made by `python benchmarks/wisv_serving.py` ({res['clips_per_language']} test clips per language, "
             f"every block verified, L = {res['block_len']}, tau {res['tau']:g}; the head of models/wisv/head.pt, "
             "served by `speccap serve-cloud --wisv`; features in float32).", "",
             "## Loopback: networked vs in-process", "",
             "| protocol | captions identical | requests / caption | HIDDEN requests / caption | rounds / caption | "
             "HTTP bytes up / caption | fallbacks |", "|---|---|---|---|---|---|---|"]
    for p in PROTOCOLS:
        r = res["loopback"][p]
        lines.append(f"| {p} | {r['identical']} / {r['clips']} | {r['requests']:.1f} | {r['hidden_requests']:.2f} | "
                     f"{r['rounds']:.1f} | {r['http_up']:.0f} | {r['fallback']:.0f} |")
    sh = res["shaped"]
    lines += ["", "## Shaped link", ""]
    if "skipped" in sh:
        lines.append(f"Skipped: {sh['skipped']}.")
    else:
        lines += [f"Server in network namespace `sc-cloud` behind `scripts/netem_link.sh up --up-mbit 2 --down-mbit 10`. "
                  f"{sh['note']}", "",
                  "| protocol | network s / caption, measured | link model on the packets | requests / caption | "
                  "HTTP bytes up / caption |", "|---|---|---|---|---|"]
        for p in PROTOCOLS:
            r = sh[p]
            lines.append(f"| {p} | {r['net_time']:.3f} | {r['link_model_time']:.3f} | {r['requests']:.1f} | "
                         f"{r['http_up']:.0f} |")
        lines += ["", "Measured = round trips minus the server's compute; the link model charges the wire-format "
                  "packets (HTTP and TCP/IP headers come on top). The embedded models' hidden states are small "
                  f"(edge {res['hidden_edge']} values), so full-hidden costs little here; for a 7B edge see the "
                  "protocol table of reports/wisv/wisv.md."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--clips", type=int, default=20, help="test clips per language (default 20)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "wisv_serving")
    args = ap.parse_args()
    params = load_params(args.params)
    head = load_head(head_path(params))
    edge, cloud, clips = models_and_test_clips(params, args.clips, 1)
    length = params.wisv.block_lens[0]
    decode = dataclasses.replace(params.decode, gate="always", block_len=length, in_flight=0)
    token = secrets.token_urlsafe(24)
    res = {"clips_per_language": args.clips, "block_len": length, "tau": params.wisv.tau,
           "hidden_edge": params.models.edge.size.text_hidden, "loopback": {}}
    srv = Server(args.params, token, extra=("--wisv",))
    try:
        with VerifierClient(srv.url, token) as client:
            info = client.info()
            check_compatible(edge, info)
            for protocol in PROTOCOLS:
                res["loopback"][protocol] = captions(edge, cloud, head, clips, params, decode, client, info,
                                                     params.link, protocol)
    finally:
        srv.stop()
    res["shaped"] = shaped(args.params, params, token, edge, cloud, head, clips[: max(4, len(clips) // 4)], decode)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    write_md(res, args.out)
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
