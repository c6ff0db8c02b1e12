"""Training of the embedded captioners: teacher forcing on (audio features + prompt -> caption).

Deterministic from the seed (step budget, not a wall-clock one; fixed data order and reference
choice), early stopping on validation loss, a checkpoint at every evaluation that a rerun with
the same settings resumes from (a changed setting starts afresh: the checkpoint carries a
fingerprint of what it was trained on).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..config import ThinkerSize, TrainParams
from .aux_targets import AUX_TARGETS, span_means
from .learned_uplink import TrainingFront
from .thinker import ThinkerLM


@dataclass
class Example:
    clip_id: str
    mel: torch.Tensor  # (n_mels, frames) float16
    captions: list[list[int]]  # token ids of each reference
    language: str
    emotion: int = -1  # index in data.emotions.EMOTIONS, -1 unknown (the auxiliary loss skips it)
    sentence: int = -1  # index in data.sentences.SENTENCES of what is said, -1 unknown (likewise)
    cues: tuple[float, ...] | None = None  # aux_targets.cue_vector of the rendered cues, None unknown
    speaker: str | None = None  # the voice (manifest field `speaker`), for a learned uplink's adversary


def make_batch(lm: ThinkerLM, examples: list[Example], choice: list[int],
               sent: list[torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Right-padded batch: prompt (with audio placeholders) + caption + eos; loss only on the caption.
    `sent`: what each example's features became on a learned uplink (default: `Example.mel`)."""
    pad = lm.pad_token_id
    mels = sent if sent is not None else [e.mel.float() for e in examples]
    t_max = max(m.shape[1] for m in mels)
    feats = torch.zeros(len(examples), mels[0].shape[0], t_max)
    fmask = torch.zeros(len(examples), t_max, dtype=torch.long)
    rows, targets = [], []
    for i, (e, c, mel) in enumerate(zip(examples, choice, mels)):
        t = mel.shape[1]
        feats[i, :, :t] = mel
        fmask[i, :t] = 1
        prompt = lm.prompt_ids(t, e.language)
        cap = e.captions[c] + [lm.eos_token_id]
        rows.append(prompt + cap)
        targets.append([-100] * len(prompt) + cap)
    length = max(map(len, rows))
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)
    attn = torch.zeros((len(rows), length), dtype=torch.long)
    for i, (r, t) in enumerate(zip(rows, targets)):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(t)] = torch.tensor(t)
        attn[i, : len(r)] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": attn, "input_features": feats,
            "feature_attention_mask": fmask,
            **{name: target.collate([getattr(e, name) for e in examples]) for name, target in AUX_TARGETS.items()}}


def batch_loss(lm: ThinkerLM, batch: dict[str, torch.Tensor],
               probes: dict[str, tuple[torch.nn.Module, float]] | None = None) -> torch.Tensor:
    """Caption cross-entropy, plus for each auxiliary target in `probes` (name -> (linear probe,
    weight)) its weight x the target's loss of the probe on the text model's input embeddings at
    the audio positions, averaged over the target's time spans (aux_targets.AUX_TARGETS; clips
    whose target is unknown are skipped, and a batch with none skips the target)."""
    model = lm.model
    positions, _ = model.model.get_rope_index(batch["input_ids"], None, None, batch["attention_mask"], False,
                                              batch["feature_attention_mask"].sum(-1), None)
    probes = {name: pw for name, pw in (probes or {}).items()
              if pw[1] > 0 and bool(AUX_TARGETS[name].known(batch[name]).any())}
    aux = bool(probes)
    out = model(input_ids=batch["input_ids"], input_features=batch["input_features"],
                feature_attention_mask=batch["feature_attention_mask"], attention_mask=batch["attention_mask"],
                position_ids=positions, use_cache=False, output_hidden_states=aux)
    logits = out.logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             batch["labels"][:, 1:].reshape(-1), ignore_index=-100)
    if aux:
        audio = (batch["input_ids"] == lm.audio_id).float()
        for name, (probe, weight) in probes.items():
            target = AUX_TARGETS[name]
            pooled = span_means(out.hidden_states[0], audio, target.spans)
            loss = loss + weight * target.loss(probe(pooled.float()), batch[name])
    return loss


def step_loss(lm: ThinkerLM, chunk: list[Example], choice: list[int], probes: dict,
              front: TrainingFront | None) -> torch.Tensor:
    """One training batch's loss: the caption's (and the probes'), and a learned uplink's adversary's."""
    sent = front.features(chunk) if front is not None else None
    loss = batch_loss(lm, make_batch(lm, chunk, choice, sent), probes)
    adversary = front.loss(sent, chunk) if front is not None else None
    return loss if adversary is None else loss + adversary


@torch.no_grad()
def validation_loss(lm: ThinkerLM, examples: list[Example], batch_size: int, front: TrainingFront | None = None) -> float:
    """The caption's loss alone (a learned uplink's adversary not counted: early stopping keeps the best captioner)."""
    lm.model.eval()
    total, count = 0.0, 0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i: i + batch_size]
        batch = make_batch(lm, chunk, [0] * len(chunk), front.features(chunk) if front is not None else None)
        n = int((batch["labels"][:, 1:] != -100).sum())
        total += float(batch_loss(lm, batch)) * n
        count += n
    return total / max(count, 1)


def bucketed_order(train: list[Example], batch_size: int, rng: np.random.Generator, pool: int = 16) -> list[int]:
    """One epoch's order: shuffle, sort each pool of `pool` batches by audio length, cut into
    batches, shuffle the batches. Batches of similar lengths waste little compute on padding."""
    perm = rng.permutation(len(train))
    batches = []
    span = batch_size * pool
    for i in range(0, len(perm), span):
        group = sorted(perm[i: i + span].tolist(), key=lambda j: train[j].mel.shape[1])
        batches += [group[k: k + batch_size] for k in range(0, len(group), batch_size)]
    batches = [b for b in batches if len(b) == batch_size] or batches
    return [j for b in (batches[k] for k in rng.permutation(len(batches))) for j in b]


def fingerprint(size: ThinkerSize, train: TrainParams, seed: int, family: str, data_ids: list[str]) -> str:
    blob = json.dumps([asdict(size), asdict(train), seed, family, data_ids], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _lr_at(step: int, t: TrainParams) -> float:
    """Linear warm-up, then cosine decay to 10% over the step budget."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    progress = (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps)
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def attach_training_aids(model: torch.nn.Module, settings: TrainParams, seed: int,
                         front: TrainingFront | None) -> dict[str, tuple[torch.nn.Module, float]]:
    """Modules trained, checkpointed and resumed with the model and dropped from the saved captioner:
    a linear probe per auxiliary target with a weight (returned, name -> (probe, weight)), and a
    learned uplink's `front`."""
    probes = {}
    for name, target in AUX_TARGETS.items():
        weight = getattr(settings, f"{name}_aux")
        if weight > 0:
            torch.manual_seed(seed)  # the probe's initial weights, before the optimizer that trains them
            probe = torch.nn.Linear(target.spans * model.config.get_text_config().hidden_size, target.outputs)
            model.add_module(f"_{name}_probe", probe)
            probes[name] = (probe, weight)
    if front is not None:
        model.add_module("_uplink_front", front)
    return probes


def train_captioner(lm: ThinkerLM, train: list[Example], val: list[Example], settings: TrainParams, seed: int,
                    out_dir: str | os.PathLike, fp: str, desc: str = "train", progress: bool = True,
                    front: TrainingFront | None = None) -> dict:
    """Train `lm.model` in place (and `front`, a learned uplink's encoder, with it); keep the
    best-validation weights; return a report."""
    torch.set_num_threads(settings.threads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = out_dir / "checkpoint.pt"
    model = lm.model
    probes = attach_training_aids(model, settings, seed, front)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=settings.lr, betas=(0.9, 0.98))
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    state = {"step": 0, "best_loss": float("inf"), "best_step": 0, "bad_evals": 0, "history": [], "seconds": 0.0,
             "order": []}  # what is left of this epoch's shuffled order: part of the resume point
    best_weights = copy.deepcopy(model.state_dict())
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        if ckpt.get("fingerprint") == fp:
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            best_weights = ckpt["best_weights"]
            state = ckpt["state"]
            rng.bit_generator.state = ckpt["rng"]
            torch.set_rng_state(ckpt["torch_rng"])
    bar = tqdm(total=settings.max_steps, initial=state["step"], desc=desc, unit="step", disable=not progress)
    start = time.perf_counter() - state["seconds"]
    model.train()
    stopped_early = state.get("stopped_early", False)
    while state["step"] < settings.max_steps and not stopped_early:
        if len(state["order"]) < settings.batch_size:
            state["order"] = bucketed_order(train, settings.batch_size, rng)
        idx, state["order"] = state["order"][: settings.batch_size], state["order"][settings.batch_size:]
        chunk = [train[i] for i in idx]
        choice = [int(rng.integers(len(e.captions))) for e in chunk]
        for group in opt.param_groups:
            group["lr"] = _lr_at(state["step"], settings)
        loss = step_loss(lm, chunk, choice, probes, front)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        bar.update()
        bar.set_postfix(loss=f"{loss.item():.3f}", best=f"{state['best_loss']:.3f}")
        if state["step"] % settings.eval_every == 0 or state["step"] == settings.max_steps:
            vl = validation_loss(lm, val, settings.batch_size, front)
            model.train()
            state["history"].append({"step": state["step"], "train_loss": loss.item(), "val_loss": vl,
                                     "seconds": time.perf_counter() - start})
            if vl < state["best_loss"] - 1e-4:
                state.update(best_loss=vl, best_step=state["step"], bad_evals=0)
                best_weights = copy.deepcopy(model.state_dict())
            else:
                state["bad_evals"] += 1
                stopped_early = state["bad_evals"] >= settings.patience
                state["stopped_early"] = stopped_early
            state["seconds"] = time.perf_counter() - start
            tmp = ckpt_path.with_suffix(".part")
            torch.save({"fingerprint": fp, "model": model.state_dict(), "optimizer": opt.state_dict(),
                        "best_weights": best_weights, "state": state, "rng": rng.bit_generator.state,
                        "torch_rng": torch.get_rng_state()}, tmp)
            os.replace(tmp, ckpt_path)
    bar.close()
    model.load_state_dict(best_weights)
    for name in probes:  # a training aid only: the saved captioner is the plain HF model
        del model._modules[f"_{name}_probe"]
    if front is not None:  # saved apart, as what the edge sends
        del model._modules["_uplink_front"]
    model.eval()
    return {"steps": state["step"], "best_step": state["best_step"], "best_val_loss": state["best_loss"],
            "stopped_early": stopped_early, "train_seconds": state["seconds"], "history": state["history"]}
