"""The `speccap` command.

  speccap prepare      render the synthetic corpus (or validate a local MER2024 copy) into manifests
  speccap featurize    log-mel + prosody features for every manifest clip
  speccap train        train the tokenizer and the embedded edge and cloud captioners
  speccap caption      caption audio files: edge-only, cloud-only or speculative (ugsd)
  speccap score        score a JSONL of captions against a manifest (BLEU-1/4, METEOR, ROUGE-L)
  speccap show         print a few clips of a manifest with their cue values and references
  speccap resolve      write resolved/<stage>.json: the params each DVC stage uses, profile applied
  speccap calibrate    time both models' calls here and print the fitted cost model (params decode.cost)
  speccap serve-cloud  run the cloud model as a verifier server (HTTP, bearer token, optional TLS)
  speccap edge         caption audio files on the edge, verifying blocks against a `serve-cloud` server

Every command reads its knobs from params.yaml (`--params` or $SPECCAP_PARAMS).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .caption_commands import add_decoding_options, cmd_caption, cmd_edge
from .config import ConfigError, load_params
from .fanout import WorkerDied
from .numba_cache import NumbaCacheError


def _cmd_prepare(args) -> int:
    from .data.prepare import prepare
    report = prepare(load_params(args.params), progress=not args.quiet)
    print(json.dumps({k: v for k, v in report.items() if k != "skipped"}, ensure_ascii=False))
    for s in report["skipped"]:
        print(f"skipped {s['id']}: {s['reason']}", file=sys.stderr)
    return 0


def _cmd_featurize(args) -> int:
    from .data.featurize import featurize
    report = featurize(load_params(args.params), progress=not args.quiet)
    print(json.dumps({k: v for k, v in report.items() if k != "skipped"}))
    for s in report["skipped"]:
        print(f"skipped {s['id']}: {s['reason'] if 'reason' in s else s['skip']}", file=sys.stderr)
    return 0


def _cmd_train(args) -> int:
    from .models.captioners import train_captioners
    report = train_captioners(load_params(args.params), progress=not args.quiet)
    print(json.dumps({r: {k: v for k, v in report[r].items() if k not in ("history", "size")}
                      for r in ("edge", "cloud")}, indent=1))
    return 0


def _cmd_serve_cloud(args) -> int:
    import logging

    import torch

    from .models.loading import load_role
    from .serving.server import serve
    from .serving.sessions import Limits
    from .serving.tokens import load_tokens
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.batch < 1 or args.batch_window_ms < 0:  # before the model loads
        raise ValueError(f"--batch must be at least 1 (got {args.batch}) and --batch-window-ms at least 0 "
                         f"(got {args.batch_window_ms})")
    tokens = load_tokens(args.token_file)
    limits = Limits(max_payload_bytes=args.max_payload_bytes, max_block=args.max_block,
                    max_sessions_per_client=args.max_sessions_per_client, idle_seconds=args.idle_seconds)
    torch.set_num_threads(args.threads)
    params = load_params(args.params)
    cloud = load_role(params, "cloud")
    head = None
    if args.wisv_head is not None or args.wisv:  # the head sessions opened with the wisv rule judge with
        from .decoding.wisv.head import load_head
        from .pipeline.saved import head_path
        head = load_head(args.wisv_head or head_path(params))
    serve(cloud, tokens, limits, args.host, args.port, args.certfile, args.keyfile, args.compute_slots, head,
          args.batch, args.batch_window_ms, access_log=not args.no_access_log)
    return 0


def _cmd_score(args) -> int:
    from .data.manifest import read_jsonl, read_manifest
    from .metrics.caption import score_captions
    manifest = {r["id"]: r for r in read_manifest(args.manifest)}
    captions = read_jsonl(args.captions)
    missing = [c.get("id") for c in captions if c.get("id") not in manifest]
    if missing:
        raise SystemExit(f"{args.captions}: {len(missing)} caption id(s) not in {args.manifest}, e.g. {missing[:3]}")
    language = manifest[captions[0]["id"]]["language"]
    scores = score_captions([c.get("caption", "") for c in captions],
                            [manifest[c["id"]]["references"] for c in captions], language,
                            [manifest[c["id"]].get("emotion") for c in captions])
    print(json.dumps(scores.summary(), indent=1))
    return 0


def _cmd_show(args) -> int:
    from .data.manifest import read_manifest
    for rec in read_manifest(args.manifest)[: args.n]:
        cues = rec.get("cues") or {}
        keys = ("emotion", "gender", "pitch", "pitch_range", "rate", "volume", "contour", "tremor",
                "breathiness", "harshness", "pauses")
        print(f"{rec['id']}  {rec['duration']:.2f} s  " + "  ".join(f"{k}={cues[k]}" for k in keys if k in cues))
        for ref in rec["references"]:
            print(f"   - {ref}")
    return 0


def _cmd_resolve(args) -> int:
    from .stage_params import write_resolved
    for path in write_resolved(load_params(args.params), args.out):
        print(path)
    return 0


def _cmd_calibrate(args) -> int:
    import yaml

    from .data.featurize import load_clip_features
    from .data.manifest import manifest_path, read_manifest
    from .decoding.cost import ROLES, calibrate
    from .models.loading import load_role
    params = load_params(args.params)
    clips = [(load_clip_features(params.data.processed_dir, r["id"])[0], lang) for lang in params.data.languages
             for r in read_manifest(manifest_path(params.data.processed_dir, "test", lang))[: args.clips]]
    model, samples = calibrate({role: load_role(params, role) for role in ROLES}, clips)
    print(f"# {len(samples)} timed calls on {len(clips)} test clips; paste into params.yaml", file=sys.stderr)
    print(yaml.safe_dump({"decode": {"cost": model.coef}}, default_flow_style=None, sort_keys=False), end="")
    return 0


def _add_serve_cloud(sub) -> None:
    """The `serve-cloud` subcommand and its options."""
    s = sub.add_parser("serve-cloud", help="serve the cloud model as a verifier (see docs/serving.md)",
                       description="Load the cloud model (models.cloud params) and verify drafted blocks for edge "
                                   "clients over HTTP(S). Every request needs a bearer token: $SPECCAP_TOKEN, or "
                                   "--token-file with one token per line (or client:token, for per-client limits).")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; use TLS beyond it)")
    s.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    s.add_argument("--token-file", type=Path, help="bearer tokens, one per line (default: $SPECCAP_TOKEN)")
    s.add_argument("--certfile", help="TLS certificate (PEM); with --keyfile the server speaks HTTPS")
    s.add_argument("--keyfile", help="TLS private key (PEM)")
    s.add_argument("--max-block", type=int, default=32, help="longest draft block accepted (default 32)")
    s.add_argument("--max-payload-bytes", type=int, default=4 << 20, help="largest request body (default 4 MiB)")
    s.add_argument("--max-sessions-per-client", type=int, default=64, help="open sessions per client (default 64)")
    s.add_argument("--idle-seconds", type=float, default=120.0,
                   help="a session unused this long is closed and its KV cache freed (default 120)")
    s.add_argument("--compute-slots", type=int, default=1, help="model calls run at once (default 1)")
    s.add_argument("--batch", type=int, default=1, help="verify up to this many sessions' requests in one forward")
    s.add_argument("--batch-window-ms", type=float, default=2.0, help="how long a request waits for others (2)")
    s.add_argument("--threads", type=int, default=4, help="CPU threads for the model (default 4)")
    s.add_argument("--no-access-log", action="store_true",
                   help="log no line per request (under hundreds of requests a second, the log is a share of "
                        "the server's CPU)")
    s.add_argument("--wisv", action="store_true", help="serve WISV verification with the head the wisv_head stage "
                                                       "trained (models/wisv/head.pt)")
    s.add_argument("--wisv-head", type=Path, help="serve WISV verification with this decision head")
    s.set_defaults(func=_cmd_serve_cloud)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speccap", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--params", default=None, help="params file (default: $SPECCAP_PARAMS or ./params.yaml)")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("prepare", help="build the corpus and its manifests (data.* params)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_cmd_prepare)
    s = sub.add_parser("featurize", help="compute log-mel and prosody features (features.* params)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_cmd_featurize)
    s = sub.add_parser("train", help="train the tokenizer and the embedded captioners (models.* params)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_cmd_train)
    s = sub.add_parser("caption", help="caption audio files (any rate, mono or stereo) with one model")
    add_decoding_options(s)
    s.add_argument("--mode", choices=("edge", "cloud", "ugsd"), default="edge",
                   help="edge-only, cloud-only, or gated speculative decoding (default edge)")
    s.add_argument("--in-flight", type=int, help="pipelined verification: blocks in flight while the edge drafts "
                                                 "ahead (0 = blocking loop; default: decode.in_flight)")
    s.set_defaults(func=cmd_caption)

    _add_serve_cloud(sub)

    s = sub.add_parser("edge", help="caption audio files on the edge against a verifier server",
                       description="The edge half over the network: drafts with the edge model (models.edge), "
                                   "escalates gated blocks to `speccap serve-cloud` at --server. Only features and "
                                   "token ids leave the machine. When the server is unreachable the blocks stay on "
                                   "the edge (flagged in the output), so every file gets a caption.")
    add_decoding_options(s)
    s.add_argument("--server", required=True, help="verifier URL, e.g. http://127.0.0.1:8765")
    s.add_argument("--token-file", type=Path, help="file whose first line is the bearer token (default: $SPECCAP_TOKEN)")
    s.add_argument("--cafile", help="CA bundle or self-signed certificate to trust for an https:// server")
    s.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for one answer (default 10)")
    s.add_argument("--retries", type=int, default=2, help="retries when the server cannot be reached (default 2)")
    s.add_argument("--wire-dtype", choices=("float16", "float32"), default="float16",
                   help="precision of the features (and spec_sampling's q rows) on the wire; float32 gives "
                        "captions identical to the in-process loop (default float16, half the bytes)")
    s.add_argument("--emulate-link", action="store_true",
                   help="also wait the link model's time (params link:) for every packet, on top of the real socket")
    s.set_defaults(func=cmd_edge)

    s = sub.add_parser("score", help="score captions (JSONL with id, caption) against a manifest")
    s.add_argument("manifest", type=Path, help="manifest JSONL, e.g. data/processed/manifests/test.en.jsonl")
    s.add_argument("captions", type=Path, help="JSONL with one {\"id\": ..., \"caption\": ...} per line")
    s.set_defaults(func=_cmd_score)
    s = sub.add_parser("show", help="print clips of a manifest with cue values and references")
    s.add_argument("manifest", type=Path)
    s.add_argument("-n", type=int, default=3, help="how many clips (default 3)")
    s.set_defaults(func=_cmd_show)
    s = sub.add_parser("resolve", help="write the params each DVC stage uses, profile applied (the `resolve` "
                       "stage: a stage re-runs only when its own resolved values change)")
    s.add_argument("--out", type=Path, default=Path("resolved"), help="folder (default resolved/)")
    s.set_defaults(func=_cmd_resolve)
    s = sub.add_parser("calibrate", help="fit the clock's cost model to timed calls of both models (decode.cost)")
    s.add_argument("--clips", type=int, default=4, help="test clips per language timed (default 4)")
    s.set_defaults(func=_cmd_calibrate)
    return p


# the install a command needs beyond the core (pyproject's extras), named when a module of it is missing
ROLE_OF = {"caption": "edge", "edge": "edge", "serve-cloud": "cloud"}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ModuleNotFoundError as exc:  # an install for another role (e.g. a device's: speccap[edge])
        role = ROLE_OF.get(args.command, "pipeline")
        print(f"speccap {args.command}: error: {exc} (this command needs pip install 'speccap[{role}]')",
              file=sys.stderr)
        return 2
    # AudioError, ModelLoadError; ConnectionError: the verifier could not be reached or refused (speccap edge)
    except (ConfigError, FileNotFoundError, ValueError, LookupError, ConnectionError) as exc:
        print(f"speccap {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (WorkerDied, NumbaCacheError) as exc:  # the stage's earlier results are kept; the message says what next
        print(f"speccap {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
