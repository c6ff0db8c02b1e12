"""What the edge sends the cloud in place of the audio (params `uplink`).

The edge computes the clip's log-mel (`features:` params) for its own model. What goes up to the
cloud is that log-mel or a coarser view of it, computed from it on the device: mel bands pooled into
`bands` groups and `merge` frames into one (both in the power domain, so a pooled value is what a
wider mel filter over a longer frame would measure), optionally with each band's mean and spread
over the clip removed (`normalize: clip`: the long-term spectral balance that names a voice). The
result is rounded to float16, as it crosses the link, in-process too: the cloud reads exactly the
bytes a networked edge sends. The cloud must be trained on the same view (the `train` stage trains
the embedded cloud on it; a real checkpoint reads only the plain log-mel).

The identity (all bands, merge 1, no normalisation) returns the features untouched: what the edge
has always sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..params_types import Normalize

NORM_EPS = 1e-3  # a band that never moves in a clip is sent as zeros, not blown up


@dataclass(frozen=True)
class Uplink:
    bands: int | None = None  # None: every mel band of the features
    merge: int = 1  # frames averaged into one
    normalize: Normalize = "none"
    learned: ClassVar[bool] = False  # a hand-made view (speccap.models.learned_uplink: a learned one)
    digest: ClassVar[str] = ""  # what names a learned encoder's weights; a view is named by its fields

    def __post_init__(self):
        if self.bands is not None and self.bands < 1:
            raise ValueError(f"uplink.bands: {self.bands} (expected a positive count, or null for every band)")
        if self.merge < 1:
            raise ValueError(f"uplink.merge: {self.merge} (expected a positive count of frames)")
        if self.normalize not in ("none", "clip"):
            raise ValueError(f"uplink.normalize: {self.normalize!r} (expected 'none' or 'clip')")

    @classmethod
    def from_params(cls, spec) -> "Uplink":
        """From the params section (`Params.uplink`)."""
        return cls(spec.bands, spec.merge, spec.normalize)

    def to_dict(self) -> dict:
        return {"bands": self.bands, "merge": self.merge, "normalize": self.normalize}

    @property
    def identity(self) -> bool:
        return self.bands is None and self.merge == 1 and self.normalize == "none"

    def rows(self, n_mels: int) -> int:
        """Rows of what is sent for features of `n_mels` bands."""
        if self.bands is not None and self.bands > n_mels:
            raise ValueError(f"uplink.bands: {self.bands} exceeds the features' {n_mels} mel bands (features.n_mels)")
        return n_mels if self.bands is None else self.bands

    def band_edges(self, n_mels: int) -> np.ndarray:
        """Where each pooled band starts among the features' mel bands, and where the last ends."""
        return np.linspace(0, n_mels, self.rows(n_mels) + 1).round().astype(int)

    def frames(self, n_frames: int) -> int:
        return -(-n_frames // self.merge)

    def name(self, n_mels: int, hop: int) -> str:
        text = f"log-mel {self.rows(n_mels)} bands, hop {hop * self.merge}"
        return text + (", clip-normalised" if self.normalize == "clip" else "")

    def bytes_per_second(self, n_mels: int, sample_rate: int, hop: int) -> float:
        """float16 values per second of audio, 2 bytes each."""
        return 2.0 * self.rows(n_mels) * sample_rate / (hop * self.merge)

    def encode(self, features: np.ndarray) -> np.ndarray:
        """(n_mels, frames) log-mel -> (rows, ceil(frames / merge)) float32 holding float16 values."""
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] == 0:
            raise ValueError(f"uplink: features must be (n_mels, frames) with frames, got shape {x.shape}")
        if self.identity:
            return features
        power = 10.0 ** (4.0 * x - 4.0)  # features.log_mel's scale, undone
        if self.rows(x.shape[0]) != x.shape[0]:
            edges = self.band_edges(x.shape[0])
            power = np.add.reduceat(power, edges[:-1], axis=0) / np.diff(edges)[:, None]
        if self.merge > 1:
            starts = np.arange(0, power.shape[1], self.merge)
            counts = np.diff(np.append(starts, power.shape[1]))
            power = np.add.reduceat(power, starts, axis=1) / counts[None, :]
        out = (np.log10(np.maximum(power, 1e-10)) + 4.0) / 4.0
        if self.normalize == "clip":
            out = (out - out.mean(1, keepdims=True)) / (out.std(1, keepdims=True) + NORM_EPS)
        return out.astype(np.float16).astype(np.float32)
