"""What a captioner may learn beside its captions while training: linear probes on the audio
positions of the text model's input, each with its own target and loss, discarded afterwards.

A probe sees the mean state over equal time spans of a clip's audio positions, side by side:
which sentence was said is a sequence of sounds (four spans); an emotion is heard over the whole
clip, but its course counts too (happiness rises where surprise falls: two spans); the rendered
cues (pitch, pitch range, rate, volume, contour, tremor, breathiness, harshness, pauses) include a
contour and pauses, which live in time (four spans). Span counts were chosen on one training each
(issue 17's runs), not on a difference with a confidence interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..data.emotions import EMOTIONS
from ..data.sentences import SENTENCES

# The rendered value of each continuous cue, centred and scaled to about unit spread over the
# corpus's emotion profiles (data.emotions.PROFILES), so that no one cue's error dominates the loss.
CUE_SCALES = {"pitch": (55.0, 15.0), "pitch_range": (55.0, 25.0), "rate": (170.0, 30.0), "volume": (110.0, 25.0)}
CUE_FLAGS = ("tremor", "breathiness", "harshness", "pauses")  # rendered or not
CONTOURS = ("steady", "rising", "falling")


def span_means(states: torch.Tensor, audio: torch.Tensor, spans: int) -> torch.Tensor:
    """(batch, spans x hidden): the mean state over each of `spans` equal runs of a row's audio
    positions (`audio`: (batch, seq) 0/1), in order."""
    count = audio.sum(1, keepdim=True).clamp(min=1)
    rank = audio.cumsum(1) - 1  # 0.. count-1 along each row's audio positions
    span = torch.minimum((rank * spans / count).floor().long(), torch.tensor(spans - 1))
    out = []
    for k in range(spans):
        w = audio * (span == k)
        out.append((states * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True).clamp(min=1))
    return torch.cat(out, -1)


@dataclass(frozen=True)
class ClassTarget:
    """One class per clip (an index; -1 unknown: skipped)."""
    classes: int
    spans: int

    @property
    def outputs(self) -> int:
        return self.classes

    def collate(self, values: list) -> torch.Tensor:
        return torch.tensor([-1 if v is None else v for v in values], dtype=torch.long)

    def known(self, labels: torch.Tensor) -> torch.Tensor:
        return labels >= 0

    def loss(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, labels, ignore_index=-1)


@dataclass(frozen=True)
class CueTarget:
    """The values a clip was rendered with (`cue_vector`; None unknown: skipped): a squared error
    on the continuous ones, a binary cross-entropy on the effects, a cross-entropy on the contour.
    Denser than the captions, which name rate, volume and range only now and then and only in
    bins: the audio side learns to hear what the caption's cue words, and so its emotion, rest on."""
    spans: int = 4
    outputs: int = len(CUE_SCALES) + len(CUE_FLAGS) + len(CONTOURS)

    def collate(self, values: list) -> torch.Tensor:
        width = len(CUE_SCALES) + len(CUE_FLAGS) + 1
        return torch.tensor([[math.nan] * width if v is None else list(v) for v in values], dtype=torch.float32)

    def known(self, labels: torch.Tensor) -> torch.Tensor:
        return ~torch.isnan(labels[:, 0])

    def loss(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        keep = self.known(labels)
        out, labels = out[keep], labels[keep]
        n, f = len(CUE_SCALES), len(CUE_FLAGS)
        return (F.mse_loss(out[:, :n], labels[:, :n])
                + F.binary_cross_entropy_with_logits(out[:, n: n + f], labels[:, n: n + f])
                + F.cross_entropy(out[:, n + f:], labels[:, n + f].long()))


def cue_vector(cues: dict | None) -> tuple[float, ...] | None:
    """A clip's rendered cues as CueTarget's label: the scaled continuous values, the effects as
    0/1, the contour's index. None for a clip without rendered cues (a corpus recording)."""
    if not cues or any(cues.get(k) is None for k in (*CUE_SCALES, *CUE_FLAGS, "contour")):
        return None
    scaled = [(float(cues[k]) - mid) / spread for k, (mid, spread) in CUE_SCALES.items()]
    return (*scaled, *(float(float(cues[k]) > 0) for k in CUE_FLAGS), float(CONTOURS.index(cues["contour"])))


# name -> target; TrainParams.<name>_aux weighs its loss (0 = not trained), Example.<name> holds its label
AUX_TARGETS = {"emotion": ClassTarget(len(EMOTIONS), 2), "sentence": ClassTarget(len(SENTENCES), 4),
               "cues": CueTarget()}
