"""What the uplink reveals about the speech (DVC stage `privacy`): speech rebuilt from what the edge
sends, and who is speaking.

The edge sends the cloud a view of the clip's log-mel (`uplink:` params, speccap.data.uplink): the
log-mel itself by default, float16 on the wire, or a learned encoder's output (`uplink.learned`,
speccap.models.learned_uplink: the one trained with the cloud in models/cloud). For that and the
candidates of `privacy.candidates` (bands pooled, frames merged, each band's clip level and spread
removed), two eavesdroppers rebuild a waveform, and the stronger counts:
- one that learns nothing but typical levels: every pooled value spread back over its bands and
  frames, a normalised view scaled back by the levels typical of train clips (a learned encoding has
  no bands to spread: this one does not apply to it);
- one that learns to invert the view: a ridge map, fitted on the train clips' (view, log-mel) pairs,
  from the spread-back view around each frame to the frame's log-mel; against a learned encoding (its
  rows stretched over the frames), which no linear map undoes, a two-layer network fitted the same way.
Then the mel filterbank inverted and Griffin-Lim; STOI scores it against the original (near 0.8 the
words are understood), and the clip against itself 0.2 s late is the floor. Who is speaking: two
classifiers retrained on each view of the train clips, and the stronger counts: a logistic
regression on each clip's per-band statistics (level, spread, movement, low and high percentiles),
and one on single frames whose log-probabilities are summed over the clip. They name the voice of
every test clip (against the share of the commonest voice), and their posteriors verify pairs of
test clips as the same voice or not (equal error rate).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from ..config import Params
from ..data.audio_io import read_audio
from ..data.features import log_mel
from ..data.manifest import manifest_path, read_manifest
from ..data.uplink import Uplink
from ..fanout import fan_out
from ..metrics.bootstrap import mean_interval, statistic_interval
from ..models.learned_uplink import LearnedUplink
from ..models.loading import read_uplink

SHIFT_S = 0.2  # the floor: a clip against itself this late (the same voice, the words misaligned)
GL_ITERS = 64
FRAMES_PER_CLIP = 8  # frames of each train clip the frame classifier learns from (spread over the clip)
# the learned inverter: frames of the spread-back view either side of the one it rebuilds, this many apart
INVERTER_CONTEXT, INVERTER_STRIDE = 1, 2
INVERTER_RIDGE = 1e-3  # per train frame: the map shrinks toward the spread-back view's own frame
INVERTER_FRAMES = 60_000  # train frames it is fitted on at most (spread over the clips)
NETWORK_HIDDEN, NETWORK_STEPS, NETWORK_BATCH = 256, 4000, 512  # the inverter against a learned encoding
EER_RESAMPLES = 200  # an equal error rate over all pairs per resample: fewer resamples than a mean's
ATTACKERS = ("spread back", "learned inverter")  # who rebuilds speech; the stronger counts


@dataclass(frozen=True)
class Wire:
    """One uplink measured: the view, the features it is computed from, and whether the edge sends it."""

    uplink: Uplink | LearnedUplink
    n_mels: int
    hop: int
    sent: bool = False  # what the edge sends (params `uplink`)

    @property
    def name(self) -> str:
        return self.uplink.name(self.n_mels, self.hop) + (" (what the edge sends)" if self.sent else "")

    def log_mel(self, x: np.ndarray, sr: int, n_fft: int) -> np.ndarray:
        """The features the view is computed from (the edge's own, `features:` params)."""
        return log_mel(x, sr, self.n_mels, n_fft, self.hop)

    def view(self, mel: np.ndarray) -> np.ndarray:
        """What crosses the link for the clip's log-mel, as float32: float16 values, or a quantised
        uplink's (exact in float32, not all in float16)."""
        out = self.uplink.encode(mel)
        return out if self.uplink.bits < 16 else np.asarray(out, np.float16).astype(np.float32)

    def encode(self, x: np.ndarray, sr: int, n_fft: int) -> np.ndarray:
        return self.view(self.log_mel(x, sr, n_fft))

    def unnormalised(self) -> "Wire":
        """The view before the clip's levels are removed (and before its values are quantised): what
        the attacker's prior of typical band levels is taken from."""
        return Wire(Uplink(self.uplink.bands, self.uplink.merge), self.n_mels, self.hop)

    def bytes_per_second(self, sr: int) -> float:
        return self.uplink.bytes_per_second(self.n_mels, sr, self.hop)


def wires(params: Params) -> list[Wire]:
    """The uplink the edge sends first, then the other candidates of `privacy.candidates`."""
    f = params.features
    sent = read_uplink(Path(params.models.dir) / "cloud") if params.uplink.learned else Uplink.from_params(params.uplink)
    others = [Uplink.from_params(c) for c in params.privacy.candidates]
    return [Wire(sent, f.n_mels, f.hop_length, sent=True)] + [
        Wire(u, f.n_mels, f.hop_length) for u in dict.fromkeys(others) if u != sent]


def levels(reps: list[np.ndarray]) -> np.ndarray:
    """(2, rows): the per-band level and spread typical of un-normalised views (the attacker's prior)."""
    return np.stack([np.mean([r.mean(1) for r in reps], 0), np.mean([r.std(1) for r in reps], 0)])


def spread_back(rep: np.ndarray, wire: Wire, n_frames: int, prior: np.ndarray | None = None) -> np.ndarray:
    """The log-mel an attacker who learns nothing but typical levels reads from a view: a normalised view
    scaled back by `prior` (`levels` of train clips), each pooled value spread over its bands and
    (linearly) over its frames."""
    v = rep.astype(np.float32)
    if wire.uplink.normalize == "clip" and prior is not None:
        v = v * prior[1][:, None] + prior[0][:, None]
    if not wire.uplink.learned:  # a learned encoding's rows are not bands: only stretched over the frames
        v = np.repeat(v, np.diff(wire.uplink.band_edges(wire.n_mels)), axis=0)  # every mel band takes its group's value
    merge = wire.uplink.merge
    if merge > 1 or v.shape[1] != n_frames:
        centres = (np.arange(v.shape[1]) + 0.5) * merge - 0.5
        v = np.stack([np.interp(np.arange(n_frames), centres, row) for row in v])
    return v


def griffin_lim(log_mel: np.ndarray, hop: int, sr: int, n_fft: int) -> np.ndarray:
    """A waveform from a log-mel: the log scale undone, the mel filterbank inverted, Griffin-Lim for the phase."""
    import librosa
    mel = 10.0 ** (4.0 * log_mel - 4.0)  # features.log_mel's scale, undone
    mag = librosa.feature.inverse.mel_to_stft(mel, sr=sr, n_fft=n_fft, power=2.0, htk=False, norm="slaney",
                                              fmin=0.0, fmax=sr / 2)
    return librosa.griffinlim(mag, n_iter=GL_ITERS, hop_length=hop, win_length=n_fft, n_fft=n_fft,
                              window="hann", center=True, random_state=0)


def rebuild(rep: np.ndarray, wire: Wire, n_frames: int, sr: int, n_fft: int, prior: np.ndarray | None = None,
            inverter: np.ndarray | None = None) -> np.ndarray:
    """Speech rebuilt from a view: spread back (`spread_back`), through the learned `inverter` when given."""
    v = spread_back(rep, wire, n_frames, prior)
    return griffin_lim(v if inverter is None else invert(inverter, v), wire.hop, sr, n_fft)


def _context(v: np.ndarray) -> np.ndarray:
    """(frames, bands x (2 INVERTER_CONTEXT + 1) + 1): each frame with its neighbours INVERTER_STRIDE
    apart (the clip's edges repeated) and a constant."""
    pad = INVERTER_CONTEXT * INVERTER_STRIDE
    padded = np.pad(v, ((0, 0), (pad, pad)), mode="edge")
    n = v.shape[1]
    cols = [padded[:, k * INVERTER_STRIDE:k * INVERTER_STRIDE + n] for k in range(2 * INVERTER_CONTEXT + 1)]
    return np.hstack([np.concatenate(cols, 0).T, np.ones((n, 1), v.dtype)])


def _training_frames(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(frames, context) inputs and (frames, n_mels) targets: at most INVERTER_FRAMES, spread over the clips."""
    step = -(-sum(m.shape[1] for _, m in pairs) // INVERTER_FRAMES)  # every step-th frame of each clip
    return (np.concatenate([_context(v)[::step] for v, _ in pairs]),
            np.concatenate([m.T[::step] for _, m in pairs]))


def fit_inverter(pairs: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The learned attacker's map from the spread-back view around a frame to the frame's log-mel,
    fitted by ridge regression on train clips' (spread-back view, log-mel) pairs."""
    x, y = (a.astype(np.float64) for a in _training_frames(pairs))
    return np.linalg.solve(x.T @ x + INVERTER_RIDGE * len(x) * np.eye(x.shape[1]), x.T @ y).astype(np.float32)


def fit_network_inverter(pairs: list[tuple[np.ndarray, np.ndarray]], seed: int,
                         steps: int = NETWORK_STEPS) -> torch.nn.Module:
    """The learned attacker against a learned encoding: a two-layer network from the same inputs to the
    same targets as `fit_inverter`'s map, fitted for the least squared error (Adam, a fixed number of steps)."""
    x, y = (torch.from_numpy(a.astype(np.float32)) for a in _training_frames(pairs))
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], NETWORK_HIDDEN), torch.nn.GELU(),
                              torch.nn.Linear(NETWORK_HIDDEN, NETWORK_HIDDEN), torch.nn.GELU(),
                              torch.nn.Linear(NETWORK_HIDDEN, y.shape[1]))
    with torch.no_grad():
        net[-1].bias.copy_(y.mean(0))  # start from the mean frame
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    order = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        if not batches:  # a fresh shuffle of every frame, cut into batches
            batches = list(torch.randperm(len(x), generator=order).split(NETWORK_BATCH))
        idx = batches.pop()
        loss = torch.nn.functional.mse_loss(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


def invert(inverter: np.ndarray | torch.nn.Module, v: np.ndarray) -> np.ndarray:
    context = _context(v.astype(np.float32))
    if isinstance(inverter, np.ndarray):
        return (context @ inverter).T
    with torch.no_grad():
        return inverter(torch.from_numpy(context)).numpy().T


def stoi(ref: np.ndarray, deg: np.ndarray, sr: int) -> float:
    from pystoi import stoi as _stoi
    n = min(len(ref), len(deg))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pystoi warns on clips shorter than its 30-frame window
        return float(_stoi(ref[:n], deg[:n], sr, extended=False))


def _score_clip(item: tuple) -> dict:
    """STOI of the speech each attacker rebuilds from each wire, and the floor, for one clip (a fan-out task)."""
    clip_id, path, wire_list, priors, inverters, sr, n_fft = item
    x = read_audio(path, target_sr=sr).samples
    shift = int(SHIFT_S * sr)
    floor = stoi(x, np.concatenate([np.zeros(shift, np.float32), x])[: len(x)], sr)
    mel = wire_list[0].log_mel(x, sr, n_fft)
    return {"id": clip_id, "floor": floor,
            "stoi": [{a: stoi(x, rebuild(w.view(mel), w, mel.shape[1], sr, n_fft, prior, inverse), sr)
                      for a, inverse in zip(ATTACKERS, (None, inverter))
                      if inverse is not None or (a == ATTACKERS[0] and not w.uplink.learned)}
                     for w, prior, inverter in zip(wire_list, priors, inverters)]}


def _split(params: Params, split: str, per_language: int, required: bool = True) -> list[dict]:
    """The first `per_language` clips (0 = all) of a split per language. A train split may be absent
    (MER2024 without a trace pool has only its referenced test clips): then there are none."""
    recs = []
    for lang in params.data.languages:
        path = manifest_path(params.data.processed_dir, split, lang)
        if not path.exists():
            if not required:
                continue
            raise FileNotFoundError(f"privacy: no {split} manifest for {lang} at {path} (run: dvc repro prepare)")
        recs += read_manifest(path)[:per_language or None]
    return recs


def clip_statistics(rep: np.ndarray) -> np.ndarray:
    """Per band: level, spread, mean movement frame to frame, 10th and 90th percentiles."""
    moves = np.abs(np.diff(rep, axis=1)).mean(1) if rep.shape[1] > 1 else np.zeros(rep.shape[0], rep.dtype)
    return np.concatenate([rep.mean(1), rep.std(1), moves, np.percentile(rep, 10, 1), np.percentile(rep, 90, 1)])


def _frames(rep: np.ndarray, n: int) -> np.ndarray:
    """Up to `n` frames spread evenly over the clip, as rows."""
    return rep[:, np.unique(np.linspace(0, rep.shape[1] - 1, n).round().astype(int))].T


def voice_id(train: list[tuple], test: list[tuple], seed: int) -> dict:
    """How often the stronger of two classifiers names the voice of a test clip, against the commonest
    voice's share, and how well the stronger one's posteriors verify two test clips as one voice (equal
    error rate %). `train`/`test`: (speaker, view). Not measured (reason given) without two voices."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if len({s for s, _ in train}) < 2 or not test:
        return {"measured": False, "why": "the train and test clips do not name two or more voices "
                                          "(manifest field `speaker`)"}
    ytr, yte = np.array([s for s, _ in train]), np.array([s for s, _ in test])

    def fit(x, y):
        return make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000, random_state=seed)).fit(x, y)
    per_clip = fit(np.array([clip_statistics(r) for _, r in train]), ytr)
    frames = [_frames(r, FRAMES_PER_CLIP) for _, r in train]
    per_frame = fit(np.concatenate(frames), np.repeat(ytr, [len(f) for f in frames]))
    # each test clip's log-posterior over the train voices: a clip's own, or its frames' mean
    log_post = {"clip statistics": per_clip.predict_log_proba(np.array([clip_statistics(r) for _, r in test])),
                "frames": np.array([per_frame.predict_log_proba(r.T).mean(0) for _, r in test])}
    classes = {"clip statistics": per_clip.classes_, "frames": per_frame.classes_}
    attackers = {k: 100.0 * (classes[k][lp.argmax(1)] == yte) for k, lp in log_post.items()}
    best = max(attackers, key=lambda k: attackers[k].mean())
    _, counts = np.unique(yte, return_counts=True)
    return {"measured": True, "accuracy": mean_interval(attackers[best], seed), "attacker": best,
            "accuracy_by_attacker": {k: float(v.mean()) for k, v in attackers.items()},
            "majority": float(100 * counts.max() / counts.sum()),
            "voices": int(len(counts)), "train_clips": len(ytr), "test_clips": len(yte)} | verification(log_post, yte, seed)


def equal_error_rate(scores: np.ndarray, same: np.ndarray) -> float:
    """%: where the share of same-voice pairs scored below a threshold equals the share of other-voice
    pairs scored above it (NaN without pairs of both kinds)."""
    n_same, n_other = int(same.sum()), int((~same).sum())
    if not n_same or not n_other:
        return float("nan")
    order = np.argsort(-scores, kind="stable")
    accepted_same = np.cumsum(same[order]) / n_same
    accepted_other = np.cumsum(~same[order]) / n_other
    i = int(np.argmin(np.abs((1 - accepted_same) - accepted_other)))
    return float(100 * ((1 - accepted_same[i]) + accepted_other[i]) / 2)


def verification(log_post: dict[str, np.ndarray], speakers: np.ndarray, seed: int) -> dict:
    """Same voice or not, for every pair of test clips, scored by the cosine of the two clips' square-root
    posteriors; the attacker with the lower equal error rate counts (its interval: clips resampled)."""
    def pairs(emb: np.ndarray, idx: np.ndarray) -> float:
        e, who = emb[idx], speakers[idx]
        upper = np.triu(np.ones((len(idx), len(idx)), bool), 1) & (idx[:, None] != idx[None, :])
        return equal_error_rate((e @ e.T)[upper], (who[:, None] == who[None, :])[upper])

    embeddings = {}
    for k, lp in log_post.items():
        root = np.exp((lp - lp.max(1, keepdims=True)) / 2)
        embeddings[k] = root / np.linalg.norm(root, axis=1, keepdims=True)
    n = len(speakers)
    eers = {k: pairs(e, np.arange(n)) for k, e in embeddings.items()}
    best = min(eers, key=lambda k: eers[k])
    return {"eer": statistic_interval(n, lambda idx: pairs(embeddings[best], idx), seed, EER_RESAMPLES),
            "eer_attacker": best, "eer_by_attacker": eers}


def named_by_the_caption(recs: list[dict]) -> dict:
    """How often a voice is named by one who knows only what a correct caption states of the speaker:
    the spoken language and the gender (the commonest voice of each pair guessed). The cloud must learn
    both from the uplink to caption the clip, so no uplink that keeps the captions can hide the voice
    below this."""
    groups: dict[tuple, dict[str, int]] = {}
    for r in recs:
        if r.get("speaker") and r.get("gender") and r.get("speech_language"):
            counts = groups.setdefault((r["speech_language"], r["gender"]), {})
            counts[r["speaker"]] = counts.get(r["speaker"], 0) + 1
    total = sum(sum(c.values()) for c in groups.values())
    if not total:
        return {"measured": False, "why": "the test clips do not name speaker, gender and spoken language"}
    return {"measured": True, "accuracy": 100.0 * sum(max(c.values()) for c in groups.values()) / total,
            "groups": len(groups)}


def _mels(recs: list[dict], wire: Wire, sr: int, n_fft: int) -> list[tuple]:
    """(speaker or None, log-mel) of each clip."""
    return [(r.get("speaker"), wire.log_mel(read_audio(r["path"], target_sr=sr).samples, sr, n_fft)) for r in recs]


def _attacks(per_clip: list[dict], i: int, seed: int) -> dict:
    """Wire i's rebuilt-speech STOI by each attacker, and the stronger one's as its STOI."""
    by = {a: mean_interval([c["stoi"][i][a] for c in per_clip], seed) for a in ATTACKERS if a in per_clip[0]["stoi"][i]}
    best = max(by, key=lambda a: by[a]["value"])
    return {"stoi": by[best], "stoi_attacker": best, "stoi_by_attacker": by}


def measure(params: Params, workers: int) -> dict:
    """Every wire's rebuilt-speech STOI by both attackers (on `privacy.clips` test clips per language; the
    inverter fitted on `privacy.train_clips` per language) and voice identification and verification
    (trained on those train clips, tested on every test clip)."""
    f, sr, seed = params.features, params.features.sample_rate, params.seed
    wire_list = wires(params)
    scored = _split(params, "test", params.privacy.clips)
    if not scored:
        raise ValueError(f"privacy: no test clips in {params.data.processed_dir} for {list(params.data.languages)}")
    train_all = _mels(_split(params, "train", params.privacy.train_clips, required=False), wire_list[0], sr, f.n_fft)
    train = [(s, m) for s, m in train_all if s]
    test_recs = _split(params, "test", 0)  # 0 = every test clip
    test = [(s, m) for s, m in _mels(test_recs, wire_list[0], sr, f.n_fft) if s]
    # what a normalised view removed, as typical train clips have it (none without train clips)
    priors = [levels([w.unnormalised().view(m) for _, m in train_all])
              if w.uplink.normalize == "clip" and not w.uplink.learned and train_all else None for w in wire_list]
    inverters = [(partial(fit_network_inverter, seed=seed) if w.uplink.learned else fit_inverter)(
        [(spread_back(w.view(m), w, m.shape[1], prior), m) for _, m in train_all])
        if train_all else None for w, prior in zip(wire_list, priors)]
    items = [(r["id"], r["path"], tuple(wire_list), tuple(priors), tuple(inverters), sr, f.n_fft) for r in scored]
    per_clip = sorted(fan_out(_score_clip, items, workers if workers > 1 else 0, stage="privacy", key=lambda i: i[0]),
                      key=lambda c: c["id"])
    out = {"clips": len(per_clip), "languages": list(params.data.languages), "gl_iterations": GL_ITERS,
           "floor": mean_interval([c["floor"] for c in per_clip], seed), "inverter_train_clips": len(train_all),
           "named_by_the_caption": named_by_the_caption(test_recs), "wires": []}
    for i, w in enumerate(wire_list):
        out["wires"].append({"name": w.name, **w.uplink.to_dict(), "merge": w.uplink.merge,
                             "normalize": w.uplink.normalize, "n_mels": w.n_mels, "hop": w.hop, "sent": w.sent,
                             "rows": w.uplink.rows(w.n_mels), "bytes_per_second": w.bytes_per_second(sr),
                             **_attacks(per_clip, i, seed),
                             "voice_id": voice_id([(s, w.view(m)) for s, m in train],
                                                  [(s, w.view(m)) for s, m in test], seed)})
    return out
