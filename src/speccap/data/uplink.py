"""What the edge sends the cloud in place of the audio (params `uplink`).

The edge computes the clip's log-mel (`features:` params) for its own model. What goes up to the
cloud is that log-mel or a coarser view of it, computed from it on the device: mel bands pooled into
`bands` groups and `merge` frames into one (both in the power domain, so a pooled value is what a
wider mel filter over a longer frame would measure), optionally with each band's mean and spread
over the clip removed (`normalize: clip`: the long-term spectral balance that names a voice). The
result is rounded to float16, as it crosses the link, in-process too: the cloud reads exactly the
bytes a networked edge sends. The cloud must be trained on the same view (the `train` stage trains
the embedded cloud on it; a real checkpoint reads only the plain log-mel).

With `bits` below 16 each row of the view is quantised instead (`quantise`): `bits`-bit codes on a
lattice lo + code x 2^e per row, lo and e chosen per clip. The step is a power of two and lo a
multiple of it, so the lattice's values are exact in float32 and quantising them again gives the
same values: what the edge computes here is what the cloud reads from the packet (decoding.packets).

The identity (all bands, merge 1, no normalisation, 16 bits) returns the features untouched: what the
edge has always sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..params_types import Normalize

NORM_EPS = 1e-3  # a band that never moves in a clip is sent as zeros, not blown up
BITS = (2, 3, 4, 5, 6, 7, 8, 16)  # per value sent: 16 = float16, fewer = quantised codes
_E_MIN = -24  # the finest step a row is quantised at (a row that never moves: its value, exactly)


def quantise(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes (rows, frames) uint8, lows (rows,) float32, exponents (rows,) int8): each row of `x` on
    the lattice low + code x 2^exponent, the smallest power-of-two step whose 2^bits - 1 codes span
    the row, low a multiple of the step at or below its minimum, each value rounded to the nearest."""
    if bits not in BITS or bits == 16:
        raise ValueError(f"uplink.bits: {bits} (codes of 2 to 8 bits are quantised; 16 sends float16)")
    x = np.asarray(x, dtype=np.float64)
    lo, hi = x.min(1), x.max(1)
    span_steps = (1 << bits) - 2  # one step kept for low rounding down
    with np.errstate(divide="ignore"):
        e = np.ceil(np.log2(np.maximum(hi - lo, 0.0) / span_steps))
        # low = k x 2^e with |k| < 2^23: exact in float32, and so is every low + code x 2^e
        e = np.maximum(e, np.ceil(np.log2(np.abs(lo) + np.abs(hi) + 1e-30)) - 23)
    e = np.clip(np.nan_to_num(e, neginf=_E_MIN), _E_MIN, 127).astype(np.int8)
    step = np.exp2(e.astype(np.float64))[:, None]
    low = np.floor(lo[:, None] / step) * step
    codes = np.clip(np.rint((x - low) / step), 0, (1 << bits) - 1).astype(np.uint8)
    return codes, low[:, 0].astype(np.float32), e


def dequantise(codes: np.ndarray, lows: np.ndarray, exponents: np.ndarray) -> np.ndarray:
    """The float32 values `quantise` coded (exact: each is a small multiple of a power of two)."""
    step = np.exp2(np.asarray(exponents, dtype=np.float64))[:, None]
    return (np.asarray(lows, dtype=np.float64)[:, None] + codes.astype(np.float64) * step).astype(np.float32)


@dataclass(frozen=True)
class Uplink:
    bands: int | None = None  # None: every mel band of the features
    merge: int = 1  # frames averaged into one
    normalize: Normalize = "none"
    bits: int = 16  # per value sent (BITS): 16 = float16, fewer = quantised (`quantise`)
    learned: ClassVar[bool] = False  # a hand-made view (speccap.models.learned_uplink: a learned one)
    digest: ClassVar[str] = ""  # what names a learned encoder's weights; a view is named by its fields

    def __post_init__(self):
        if self.bands is not None and self.bands < 1:
            raise ValueError(f"uplink.bands: {self.bands} (expected a positive count, or null for every band)")
        if self.merge < 1:
            raise ValueError(f"uplink.merge: {self.merge} (expected a positive count of frames)")
        if self.normalize not in ("none", "clip"):
            raise ValueError(f"uplink.normalize: {self.normalize!r} (expected 'none' or 'clip')")
        if self.bits not in BITS:
            raise ValueError(f"uplink.bits: {self.bits} (expected one of {BITS})")

    @classmethod
    def from_params(cls, spec) -> "Uplink":
        """From the params section (`Params.uplink`)."""
        return cls(spec.bands, spec.merge, spec.normalize, spec.bits)

    def to_dict(self) -> dict:
        return {"bands": self.bands, "merge": self.merge, "normalize": self.normalize, "bits": self.bits}

    @property
    def identity(self) -> bool:
        return self.bands is None and self.merge == 1 and self.normalize == "none" and self.bits == 16

    @property
    def wire_dtype(self) -> str:
        """How the values cross the link (decoding.packets.features_packet)."""
        return "float16" if self.bits == 16 else f"q{self.bits}"

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
        text += ", clip-normalised" if self.normalize == "clip" else ""
        return text + (f", {self.bits}-bit" if self.bits < 16 else "")

    def bytes_per_second(self, n_mels: int, sample_rate: int, hop: int) -> float:
        """Bytes of values per second of audio, `bits` each (a quantised clip adds 5 bytes a row)."""
        return self.bits / 8 * self.rows(n_mels) * sample_rate / (hop * self.merge)

    def encode(self, features: np.ndarray) -> np.ndarray:
        """(n_mels, frames) log-mel -> (rows, ceil(frames / merge)) float32 holding float16 values, or
        the quantised values with `bits` below 16."""
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
        if self.bits < 16:
            return dequantise(*quantise(out, self.bits))
        return out.astype(np.float16).astype(np.float32)
