"""The commands that caption audio files, what a device runs: `speccap caption` (both models in this
process) and `speccap edge` (against a `speccap serve-cloud` verifier). Each reads a clip (refused by
name when it holds no speech), builds the decoder params.decode and the command line describe, and
loads the learned gate it names: `champion` from the MLflow registry, or a gate file alone (an
edge install has no MLflow: speccap.gating.gate_file)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import get_args

from .config import load_params
from .params_types import GateName


def cmd_caption(args) -> int:
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
            settings = build_decoder(spec, learned=_learned_loader(params, args.gate), head=head)
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
    unless --rank or --rule says otherwise; so does a gate file."""
    from .decoding.build import DecodeSpec
    champion = args.gate is not None and args.gate not in RULE_GATE_NAMES  # the registry's or a file's
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


def _learned_loader(params, gate: str | None):
    """How the decoder loads a learned `--gate`: `champion`, the gate holding that alias in the
    MLflow registry (gates.registry_name: needs the pipeline's install and its tracking store), or a
    gate file (what the promote stage ships: models/champion.gate.json), read alone. Either at its
    own threshold unless --threshold."""
    def load(spec):
        from .pipeline.saved import gate_from_document
        if gate == "champion":
            doc = _registry_champion(params)
        else:
            from .gating.gate_file import read_gate
            doc = read_gate(gate)
        return gate_from_document(doc, spec.threshold, doc["name"])  # a token gate escalates token by token
    return load


def _registry_champion(params) -> dict:
    from .tracking import Tracker
    try:
        tracker = Tracker(params.tracking.uri, params.tracking.experiment)
    except ModuleNotFoundError as exc:  # an edge install: no MLflow, but the promoted gate ships as a file
        raise LookupError(f"--gate champion reads the MLflow registry, which this install lacks ({exc}); pass the "
                          "promoted gate's file instead: --gate models/champion.gate.json") from None
    if tracker.champion(params.gates.registry_name) is None:
        raise LookupError(f"no gate holds alias 'champion' in registered model {params.gates.registry_name!r} at "
                          f"{tracker.uri} (run the pipeline's promote stage: dvc repro promote)")
    return tracker.load_gate(params.gates.registry_name, "champion")


def _wisv_head(params, args):
    """The head trained by the wisv_head stage (or --wisv-head)."""
    from .decoding.wisv.head import load_head
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


def cmd_edge(args) -> int:
    import torch

    from .data.features import clip_log_mel
    from .decoding.build import build_decoder
    from .decoding.link import Link
    from .models.loading import load_role
    from .serving.client import VerifierClient
    from .serving.edge import caption_remote, check_compatible
    from .serving.tokens import client_token
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
            settings = build_decoder(spec, learned=_learned_loader(params, args.gate))
            rec = caption_remote(edge, client, info, mel, args.language, settings, Link(params.link, seed=args.seed),
                                 args.wire_dtype, args.wire_dtype, emulate=args.emulate_link)
            _print_caption(args, path, rec, "networked", clip.notes)
    return 0


RULE_GATE_NAMES = get_args(GateName)


def _gate_arg(value: str) -> str:
    """A rule gate's name, `champion`, or the path of a gate file (checked to exist here, read when
    the decoder is built)."""
    if value in (*RULE_GATE_NAMES, "champion") or Path(value).is_file():
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is neither a gate ({', '.join(RULE_GATE_NAMES)}, champion) "
                                     "nor a gate file that exists")


def add_decoding_options(s) -> None:
    s.add_argument("files", nargs="+", type=Path, help="audio files (WAV, FLAC, ...)")
    s.add_argument("--language", choices=("en", "zh"), default="en", help="caption language (default en)")
    s.add_argument("--gate", type=_gate_arg, metavar="{never,always,entropy,margin,logprob,champion,FILE}",
                   help="which tokens go to the cloud (default: decode.gate; champion = the learned gate promoted "
                        "in the MLflow registry; FILE = a gate file, e.g. the promoted one, models/champion.gate.json; "
                        "a learned gate runs at its own threshold unless --threshold)")
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
