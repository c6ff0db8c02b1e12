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


def _cmd_caption(args) -> int:
    import torch

    from .data.features import clip_log_mel
    from .decoding.build import build_decoder
    from .decoding.engine import cloud_only, edge_only, speculative
    from .decoding.link import Link
    from .models.base import shared_vocab
    from .models.loading import load_role
    params = load_params(args.params)
    spec = _decode_spec(params, args)
    torch.set_num_threads(args.threads)
    _quiet_loading()
    edge = load_role(params, "edge") if args.mode in ("edge", "ugsd") else None
    cloud = load_role(params, "cloud") if args.mode in ("cloud", "ugsd") else None
    if edge is not None and cloud is not None:
        shared_vocab(edge, cloud)
    head = _wisv_head(params, args) if args.mode == "ugsd" and spec.rule == "wisv" else None
    for path in args.files:
        clip = _read_speech(path, params)
        mel = clip_log_mel(clip.samples, params.features)
        link = Link(params.link, seed=args.seed)
        if args.mode == "edge":
            rec = edge_only(edge, mel, args.language, spec.max_new_tokens, spec.temperature, args.seed,
                            spec.edge_time_scale, spec.cost)
        elif args.mode == "cloud":
            rec = cloud_only(cloud, mel, args.language, link, spec.max_new_tokens, spec.temperature, args.seed,
                             spec.cloud_time_scale, spec.cost)
        else:
            settings = build_decoder(spec, learned=_champion_loader(params), head=head)
            rec = speculative(edge, cloud, mel, args.language, settings, link)
        _print_caption(args, path, rec, args.mode, clip.notes)
    return 0


def _quiet_loading() -> None:
    """No progress bars while the models load: a caption's stderr holds its notes and errors alone."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()


def _read_speech(path, params):
    """The clip at `path`, or an AudioError naming it when it cannot be read or holds no speech
    (speccap.data.speech: a constant offset, stationary noise, near-silence)."""
    from .data.audio_io import AudioError, read_audio
    from .data.speech import check_speech
    clip = read_audio(path, max_seconds=params.data.max_clip_seconds)
    found = check_speech(clip.samples, clip.sample_rate)
    if not found.has_speech:
        raise AudioError(path, f"no speech to caption: {found.found()}")
    return clip


def _decode_spec(params, args):
    """The decoder params.decode describes with the command line's decoding options on top. The
    champion judges its flagged tokens by the R it carries for the language (chosen on validation)
    unless --rank or --rule says otherwise."""
    from .decoding.build import DecodeSpec
    champion = args.gate == "champion"
    overrides = {k: v for k, v in (("gate", args.gate), ("threshold", args.threshold),
                                   ("block_len", args.block_len), ("rank", args.rank), ("rule", args.rule),
                                   ("temperature", args.temperature), ("in_flight", getattr(args, "in_flight", None)),
                                   ("qs_level", args.qs_level), ("tau", args.tau), ("seed", args.seed))
                 if v is not None}
    if args.gate in ("never", "always") or (champion and args.threshold is None):
        overrides["threshold"] = None  # no threshold, or the champion's own
    if champion and args.rank is None and args.rule is None:
        overrides["gate_rank"] = args.language
    return DecodeSpec.from_params(params, **overrides)


def _champion_loader(params):
    """How the decoder loads `--gate champion`: the gate holding alias `champion` in the MLflow
    registry (gates.registry_name), at its own threshold unless --threshold."""
    def load(spec):
        from .pipeline.saved import gate_from_saved
        from .tracking import Tracker
        tracker = Tracker(params.tracking.uri, params.tracking.experiment)
        if tracker.champion(params.gates.registry_name) is None:
            raise LookupError(f"no gate holds alias 'champion' in registered model {params.gates.registry_name!r} at "
                              f"{tracker.uri} (run the pipeline's promote stage: dvc repro promote)")
        saved = tracker.load_gate(params.gates.registry_name, "champion")
        return gate_from_saved(saved, spec.threshold, "champion")  # a token gate escalates token by token
    return load


def _wisv_head(params, args):
    """The head trained by the wisv_head stage (or --wisv-head)."""
    from .decoding.decision_head import load_head
    from .pipeline.saved import head_path
    return load_head(args.wisv_head or head_path(params))


def _print_caption(args, path, rec, mode: str, notes) -> None:
    if args.json:
        metrics = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in rec.metrics().items()}
        print(json.dumps({"file": str(path), "caption": rec.caption, "mode": mode, "language": args.language,
                          "notes": notes, **metrics}, ensure_ascii=False), flush=True)
        return
    for note in notes:  # what was done to the input (trimmed, resampled, ...): said, never silent
        print(f"{path}: note: {note}", file=sys.stderr, flush=True)
    m = rec.metrics()
    extra = f"  [rho {m['rho']:.2f}, {m['rounds']} rounds]" if mode in ("ugsd", "networked") else ""
    if m.get("in_flight"):
        extra += f" [pipelined: {m['wasted']} drafted tokens thrown away, waited {m['wait_time']:.3f} s]"
    if mode == "networked":
        extra += (f" [network {m['net_rtt']:.3f} s measured vs {m['link_model_time']:.3f} s link model, "
                  f"{m['http_bytes_up']} B up]")
        if m["fallback"]:
            extra += f" [CLOUD UNREACHABLE: {m['fallback']} block(s) kept on the edge: {m['fallback_reasons'][0]}]"
    clock = "measured" if mode == "networked" else "modelled"
    print(f"{path}: {rec.caption}\n  ({m['tokens']} tokens, {m['total_time']:.3f} s {clock}){extra}", flush=True)


def _cmd_serve_cloud(args) -> int:
    import logging

    import torch

    from .models.loading import load_role
    from .serving.server import load_tokens, serve
    from .serving.sessions import Limits
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
        from .decoding.decision_head import load_head
        from .pipeline.saved import head_path
        head = load_head(args.wisv_head or head_path(params))
    serve(cloud, tokens, limits, args.host, args.port, args.certfile, args.keyfile, args.compute_slots, head,
          args.batch, args.batch_window_ms)
    return 0


def _cmd_edge(args) -> int:
    import torch

    from .data.features import clip_log_mel
    from .decoding.build import build_decoder
    from .decoding.link import Link
    from .models.loading import load_role
    from .serving.client import VerifierClient
    from .serving.edge import caption_remote, check_compatible
    from .serving.server import client_token
    params = load_params(args.params)
    spec = _decode_spec(params, args)
    torch.set_num_threads(args.threads)
    _quiet_loading()
    edge = load_role(params, "edge")
    with VerifierClient(args.server, client_token(args.token_file), args.timeout, args.retries,
                        cafile=args.cafile) as client:
        info = client.info()  # fails here, clearly, on a wrong URL, token or certificate
        check_compatible(edge, info)
        for path in args.files:
            clip = _read_speech(path, params)
            mel = clip_log_mel(clip.samples, params.features)
            # wisv: the server holds the head; the edge sends tau, the channel and the states
            settings = build_decoder(spec, learned=_champion_loader(params))
            rec = caption_remote(edge, client, info, mel, args.language, settings, Link(params.link, seed=args.seed),
                                 args.wire_dtype, args.wire_dtype, emulate=args.emulate_link)
            _print_caption(args, path, rec, "networked", clip.notes)
    return 0


def _add_decoding_options(s) -> None:
    s.add_argument("files", nargs="+", type=Path, help="audio files (WAV, FLAC, ...)")
    s.add_argument("--language", choices=("en", "zh"), default="en", help="caption language (default en)")
    s.add_argument("--gate", choices=("never", "always", "entropy", "margin", "logprob", "champion"),
                   help="which blocks go to the cloud (default: decode.gate; champion = the learned gate promoted "
                        "in the MLflow registry, at its own threshold unless --threshold)")
    s.add_argument("--threshold", type=float, help="gate threshold (entropy gamma, margin delta, log-prob)")
    s.add_argument("--block-len", type=int, help="draft length L; 0 = UGSD adaptive (default: decode.block_len)")
    s.add_argument("--rule", choices=("greedy", "rank", "spec_sampling", "qs", "sq", "wisv"),
                   help="verification rule (qs: lossless quantize-then-sample, needs --temperature > 0; wisv: "
                        "greedy localization with the CSI-aware head tolerating some mismatches, in-process only)")
    s.add_argument("--tau", type=float, help="wisv: tolerate a mismatch when P(reject) < tau (default: wisv.tau)")
    s.add_argument("--wisv-head", type=Path, help="wisv: the decision head (default: models/wisv/head.pt)")
    s.add_argument("--qs-level", type=int, help="lattice level of qs / sq (default: qs.level)")
    s.add_argument("--rank", type=int, help="R of the rank rule")
    s.add_argument("--temperature", type=float, help="0 = greedy; > 0 = sampling (default: decode.temperature)")
    s.add_argument("--seed", type=int, default=0, help="sampling and link seed")
    s.add_argument("--threads", type=int, default=2, help="CPU threads (the papers' edge has 2)")
    s.add_argument("--json", action="store_true", help="one JSON object per file with the caption and timings")


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
    _add_decoding_options(s)
    s.add_argument("--mode", choices=("edge", "cloud", "ugsd"), default="edge",
                   help="edge-only, cloud-only, or gated speculative decoding (default edge)")
    s.add_argument("--in-flight", type=int, help="pipelined verification: blocks in flight while the edge drafts "
                                                 "ahead (0 = blocking loop; default: decode.in_flight)")
    s.set_defaults(func=_cmd_caption)

    _add_serve_cloud(sub)

    s = sub.add_parser("edge", help="caption audio files on the edge against a verifier server",
                       description="The edge half over the network: drafts with the edge model (models.edge), "
                                   "escalates gated blocks to `speccap serve-cloud` at --server. Only features and "
                                   "token ids leave the machine. When the server is unreachable the blocks stay on "
                                   "the edge (flagged in the output), so every file gets a caption.")
    _add_decoding_options(s)
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
    s.set_defaults(func=_cmd_edge)

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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    # AudioError, ModelLoadError; ConnectionError: the verifier could not be reached or refused (speccap edge)
    except (ConfigError, FileNotFoundError, ValueError, LookupError, ConnectionError) as exc:
        print(f"speccap {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (WorkerDied, NumbaCacheError) as exc:  # the stage's earlier results are kept; the message says what next
        print(f"speccap {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
