"""The train stage of the embedded default: tokenizer + edge and cloud captioners in `models/`."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch

from ..config import Params
from ..data.emotions import EMOTIONS
from ..data.featurize import load_clip_features
from ..data.manifest import manifest_path, read_manifest
from ..data.sentences import sentence_index
from ..data.uplink import Uplink
from ..fanout import fan_out, usable_cores
from .aux_targets import cue_vector
from .configs import build_model
from .learned_uplink import ENCODER_FILE, UPLINK_FILE, EncoderShape, LearnedUplink, TrainingFront
from .loading import SENT_DIR, embedded_prompt
from .thinker import ThinkerLM
from .tokenizer import load_tokenizer, save_tokenizer, special_ids, train_tokenizer
from .train import Example, fingerprint, train_captioner

ROLES = ("edge", "cloud")


LOG_MEL = Uplink()  # the view the edge reads itself


def load_examples(params: Params, split: str, tokenizer, uplink: Uplink = LOG_MEL) -> list[Example]:
    """Clips of `split` in every caption language, with features (as `uplink` sends them) and
    tokenized references."""
    processed = params.data.processed_dir
    out = []
    for lang in params.data.languages:
        path = manifest_path(processed, split, lang)
        if not path.exists():
            continue
        for rec in read_manifest(path):
            try:
                mel, _ = load_clip_features(processed, rec["id"])
            except FileNotFoundError:
                continue  # skipped by featurize (reported there)
            caps = [tokenizer.encode(r, add_special_tokens=False) for r in rec["references"]]
            emotion = EMOTIONS.index(rec["emotion"]) if rec.get("emotion") in EMOTIONS else -1
            cues = rec.get("cues") or {}
            out.append(Example(rec["id"], torch.from_numpy(uplink.encode(mel)).to(torch.float16), caps, lang, emotion,
                               sentence_index(cues.get("text_en")), cue_vector(cues), rec.get("speaker")))
    return out


def build_tokenizer(params: Params):
    texts = []
    for lang in params.data.languages:
        for rec in read_manifest(manifest_path(params.data.processed_dir, "train", lang)):
            texts.extend(rec["references"])
    if not texts:
        raise ValueError(f"{params.data.processed_dir}: no training captions to build a tokenizer from")
    return train_tokenizer(texts, params.models.tokenizer_vocab)


def _train_role(job: tuple[Params, str, bool]) -> dict:
    """Train one embedded role in this (worker) process and save it; returns its report entry.

    Each role trains in a process of its own, with its own fixed thread count and deterministic
    kernels, so the same seed and features give bit-identical weights on every run, and edge and
    cloud train side by side on two cores."""
    params, role, progress = job
    spec = getattr(params.models, role)
    torch.set_num_threads(spec.train.threads)
    torch.use_deterministic_algorithms(True)
    models_dir = Path(params.models.dir)
    tokenizer = load_tokenizer(models_dir / "tokenizer")
    # the cloud reads what the edge sends it (a learned encoder's output: trained here with it from the
    # log-mel); the edge reads its own log-mel
    learned = params.uplink.learned if role == "cloud" else None
    uplink = Uplink.from_params(params.uplink) if role == "cloud" and not learned else LOG_MEL
    train = load_examples(params, "train", tokenizer, uplink)
    val = load_examples(params, "val", tokenizer, uplink)
    if not train or not val:
        raise ValueError(f"{params.data.processed_dir}: need featurized train and val clips (have {len(train)}, {len(val)})")
    special = special_ids(tokenizer)
    n_mels = params.features.n_mels
    model = build_model(spec.family, len(tokenizer), spec.size, special,
                        learned.rows if learned else uplink.rows(n_mels), params.seed)
    front = None if learned is None else TrainingFront.build(
        EncoderShape(n_mels, learned.rows, learned.hidden, params.uplink.merge, params.uplink.normalize,
                     params.uplink.bits),
        learned.adversary, [e.speaker for e in train], params.seed)
    lm = ThinkerLM(model, tokenizer, embedded_prompt(tokenizer), special.eos, name=f"{role}:embedded")
    sent = json.dumps(dataclasses.asdict(params.uplink), sort_keys=True) if learned else \
        (None if uplink.identity else json.dumps(uplink.to_dict(), sort_keys=True))
    fp = fingerprint(spec.size, spec.train, params.seed, spec.family,
                     [e.clip_id for e in train] + [str(params.features.hop_length), str(len(tokenizer))]
                     + ([] if sent is None else [sent]))
    out_dir = models_dir / role
    result = train_captioner(lm, train, val, spec.train, params.seed, out_dir, fp, desc=f"train {role}",
                             progress=progress, front=front)
    model.save_pretrained(str(out_dir))
    for stale in (UPLINK_FILE, ENCODER_FILE):  # a cloud trained on another uplink before
        (out_dir / stale).unlink(missing_ok=True)
    if front is not None:
        uplink = LearnedUplink.trained(front.encoder)
        uplink.save(out_dir)
    elif not uplink.identity:
        (out_dir / UPLINK_FILE).write_text(json.dumps(uplink.to_dict(), indent=1))
    (out_dir / "checkpoint.pt").unlink(missing_ok=True)  # finished: the resume point is no longer needed
    return {"role": role, "clips": (len(train), len(val)), "backend": "embedded", "family": spec.family,
            **({} if uplink.identity else {"uplink": uplink.to_dict()}),
            **({} if front is None else {"uplink_parameters": sum(p.numel() for p in front.encoder.parameters())}),
            "parameters": lm.num_parameters(),
            "size": spec.size.__dict__, "threads": spec.train.threads, **result}


def side_by_side(params: Params, roles: list[str]) -> int:
    """How many roles train at once: as many as the cores hold at their thread counts. More threads
    than cores slows every one of them (measured: the cloud at 2 threads beside the edge at 1 on
    2 cores, 1.18 s a step against 0.51 s alone), so on 2 cores two 2-thread roles take turns."""
    if not roles:
        return 1
    cores = usable_cores()
    widest = max(getattr(params.models, role).train.threads for role in roles)
    return max(1, min(len(roles), cores // widest))


def _note_checkpoint(out_dir: Path, entry: dict) -> None:
    """A real checkpoint is not trained here: its folder under models/ names it instead (the stage's
    outputs exist either way, and change when the checkpoint path does)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in out_dir.iterdir():  # an embedded model trained here before would otherwise linger
        if f.is_file():
            f.unlink()
    (out_dir / "source.json").write_text(json.dumps(entry, indent=1))


def ship_uplink(models_dir: Path) -> None:
    """A learned uplink's encoder goes with the edge model (`models/edge/uplink/`): the edge sends through
    it, and a networked edge has nothing else to compute it with. Removed when the cloud reads no learned one."""
    shipped = models_dir / "edge" / SENT_DIR
    shutil.rmtree(shipped, ignore_errors=True)
    if (models_dir / "cloud" / ENCODER_FILE).is_file():
        shipped.mkdir(parents=True)
        for name in (UPLINK_FILE, ENCODER_FILE):
            shutil.copy2(models_dir / "cloud" / name, shipped / name)


def train_captioners(params: Params, progress: bool = True, roles=ROLES) -> dict:
    """The tokenizer and the embedded roles; with real checkpoints for every role, nothing is trained
    and no train split is needed (MER2024 has none)."""
    models_dir = Path(params.models.dir)
    tok_dir = models_dir / "tokenizer"
    embedded = [role for role in roles if getattr(params.models, role).backend == "embedded"]
    report: dict = {}
    for role in roles:
        spec = getattr(params.models, role)
        if spec.backend != "embedded":
            report[role] = {"backend": spec.backend, "path": spec.path, "trained": False}
            _note_checkpoint(models_dir / role, report[role])
    if embedded:
        tokenizer = build_tokenizer(params)
        save_tokenizer(tokenizer, tok_dir)
        report["tokenizer_vocab"] = len(load_tokenizer(tok_dir))  # exactly what inference will load
    else:
        _note_checkpoint(tok_dir, {"tokenizer": "each checkpoint's own", "trained": False})
    # each role's process loads the clips itself (and refuses an empty split)
    jobs = [(params, role, progress) for role in embedded]
    report["side_by_side"] = side_by_side(params, embedded)  # 1: the roles took turns
    for result in fan_out(_train_role, jobs, report["side_by_side"], stage="train",
                          key=lambda job: f"the {job[1]} model"):
        report["train_clips"], report["val_clips"] = result.pop("clips")
        report[result.pop("role")] = result
    if "cloud" in embedded:
        ship_uplink(models_dir)
    (models_dir / "train_report.json").write_text(json.dumps(report, indent=1))
    return report
