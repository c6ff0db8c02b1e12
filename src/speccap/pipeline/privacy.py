"""What the uplink reveals about the speech (DVC stage `privacy`): speech rebuilt from what the edge
sends, and who is speaking.

The edge sends the clip's log-mel (`features:` params, float16 on the wire) with its first
escalation. For that representation and coarser candidates (`privacy.candidates`: fewer mel bands,
frames merged), an eavesdropper who learns nothing rebuilds a waveform (the mel filterbank
inverted, then Griffin-Lim) and STOI scores it against the original (near 0.8 the words are
understood); the clip against itself 0.2 s late is the floor. Who is speaking: a logistic regression
on each clip's per-band mean and spread, trained on train clips, names the voice of every test
clip, against the share of the commonest voice. A spectral representation is what Griffin-Lim was
made for, so it is the attacker here; a learned one would only rebuild more.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..config import Params
from ..data.audio_io import read_audio
from ..data.features import log_mel
from ..data.manifest import manifest_path, read_manifest
from ..fanout import fan_out
from ..metrics.bootstrap import mean_interval

SHIFT_S = 0.2  # the floor: a clip against itself this late (the same voice, the words misaligned)
GL_ITERS = 64


@dataclass(frozen=True)
class Wire:
    """One representation the edge could send: a log-mel with these bands and this hop, float16."""

    n_mels: int
    hop: int
    sent: bool = False  # what the edge sends today

    @property
    def name(self) -> str:
        return f"log-mel {self.n_mels} bands, hop {self.hop}" + (" (what the edge sends)" if self.sent else "")

    def encode(self, x: np.ndarray, sr: int, n_fft: int) -> np.ndarray:
        return log_mel(x, sr, self.n_mels, n_fft, self.hop).astype(np.float16)  # as it crosses the link

    def bytes_per_second(self, sr: int) -> float:
        return 2.0 * self.n_mels * sr / self.hop


def wires(params: Params) -> list[Wire]:
    """Today's log-mel first, then the candidates of `privacy.candidates` ([bands, frames merged])."""
    f = params.features
    return [Wire(f.n_mels, f.hop_length, sent=True)] + [
        Wire(bands, merged * f.hop_length) for bands, merged in params.privacy.candidates]


def rebuild(rep: np.ndarray, wire: Wire, sr: int, n_fft: int) -> np.ndarray:
    """The attacker: undo the log scale, invert the mel filterbank, Griffin-Lim the phase."""
    import librosa
    mel = 10.0 ** (4.0 * rep.astype(np.float32) - 4.0)  # features.log_mel's scale, undone
    # frames further apart than the window leave gaps: the attacker widens its window to cover them
    win = n_fft if wire.hop <= n_fft else 2 * wire.hop
    mag = librosa.feature.inverse.mel_to_stft(mel, sr=sr, n_fft=win, power=2.0, htk=False, norm="slaney",
                                              fmin=0.0, fmax=sr / 2)
    return librosa.griffinlim(mag, n_iter=GL_ITERS, hop_length=wire.hop, win_length=win, n_fft=win,
                              window="hann", center=True, random_state=0)


def stoi(ref: np.ndarray, deg: np.ndarray, sr: int) -> float:
    from pystoi import stoi as _stoi
    n = min(len(ref), len(deg))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pystoi warns on clips shorter than its 30-frame window
        return float(_stoi(ref[:n], deg[:n], sr, extended=False))


def _score_clip(item: tuple) -> dict:
    """STOI of the speech rebuilt from each wire, and the floor, for one clip (a fan-out task)."""
    clip_id, path, wire_list, sr, n_fft = item
    x = read_audio(path, target_sr=sr).samples
    shift = int(SHIFT_S * sr)
    floor = stoi(x, np.concatenate([np.zeros(shift, np.float32), x])[: len(x)], sr)
    return {"id": clip_id, "floor": floor,
            "stoi": [stoi(x, rebuild(w.encode(x, sr, n_fft), w, sr, n_fft), sr) for w in wire_list]}


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


def voice_id(wire: Wire, train: list[tuple], test: list[tuple], sr: int, n_fft: int, seed: int) -> dict:
    """How often a classifier on the wire names the voice of a test clip, against the commonest voice's
    share. `train`/`test`: (speaker, samples). Not measured (reason given) without two voices to tell apart."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if len({s for s, _ in train}) < 2 or not test:
        return {"measured": False, "why": "the train and test clips do not name two or more voices "
                                          "(manifest field `speaker`)"}

    def rows(clips):
        reps = [wire.encode(x, sr, n_fft).astype(np.float32) for _, x in clips]
        return np.array([np.concatenate([r.mean(1), r.std(1)]) for r in reps]), np.array([s for s, _ in clips])
    xtr, ytr = rows(train)
    xte, yte = rows(test)
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed)).fit(xtr, ytr)
    hits = 100.0 * (clf.predict(xte) == yte)
    _, counts = np.unique(yte, return_counts=True)
    return {"measured": True, "accuracy": mean_interval(hits, seed), "majority": float(100 * counts.max() / counts.sum()),
            "voices": int(len(counts)), "train_clips": len(ytr), "test_clips": len(yte)}


def _voiced(recs: list[dict], sr: int) -> list[tuple]:
    return [(r["speaker"], read_audio(r["path"], target_sr=sr).samples) for r in recs if r.get("speaker")]


def measure(params: Params, workers: int) -> dict:
    """Every wire's rebuilt-speech STOI (on `privacy.clips` test clips per language) and voice
    identification (trained on `privacy.train_clips` per language, tested on every test clip)."""
    f, sr, seed = params.features, params.features.sample_rate, params.seed
    wire_list = wires(params)
    scored = _split(params, "test", params.privacy.clips)
    if not scored:
        raise ValueError(f"privacy: no test clips in {params.data.processed_dir} for {list(params.data.languages)}")
    items = [(r["id"], r["path"], tuple(wire_list), sr, f.n_fft) for r in scored]
    per_clip = sorted(fan_out(_score_clip, items, workers if workers > 1 else 0, stage="privacy", key=lambda i: i[0]),
                      key=lambda c: c["id"])
    train = _voiced(_split(params, "train", params.privacy.train_clips, required=False), sr)
    test = _voiced(_split(params, "test", 0), sr)  # 0 = every test clip
    out = {"clips": len(per_clip), "languages": list(params.data.languages), "gl_iterations": GL_ITERS,
           "floor": mean_interval([c["floor"] for c in per_clip], seed), "wires": []}
    for i, w in enumerate(wire_list):
        out["wires"].append({"name": w.name, "n_mels": w.n_mels, "hop": w.hop, "sent": w.sent,
                             "bytes_per_second": w.bytes_per_second(sr),
                             "stoi": mean_interval([c["stoi"][i] for c in per_clip], seed),
                             "voice_id": voice_id(w, train, test, sr, f.n_fft, seed)})
    return out
