"""A learned uplink: a small encoder on the edge maps the clip's log-mel to what is sent, and the cloud
is trained to caption from it (params `uplink.learned`).

The hand-made views (speccap.data.uplink) pool the log-mel; this one is learned with the cloud, end
to end from the caption loss: a convolution over 3 frames of every mel band into `hidden` channels,
then one over `merge` frames at stride `merge` into `rows` values per sent frame (the rate: rows x
frames x bits), bounded by tanh, optionally with each row's clip mean and spread removed
(`normalize: clip`). The values go up as float16, or with `bits` below 16 as the hand-made views'
codes (data.uplink.quantise): the encoder's output is then quantised in its forward, so the cloud
trains on exactly what it will read, the gradient passing the rounding unchanged (straight through).

With `adversary` > 0, speaker classifiers learn to name the voice from every sent frame and from the
clip's statistics while the encoder gets their gradient reversed (times `adversary`), so the
encoder is pushed to send what names the voice least for the caption it keeps.

`LearnedUplink` has the hand-made view's interface (`encode`, `rows`, `name`, `to_dict`, ...), so the
decoding loops, the server and the privacy stage treat both alike. Its weights are saved beside the
cloud that reads them and shipped with the edge model (`models/edge/uplink/`); the digest of the
weights names it, so an edge and a server holding different encoders refuse each other by name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..data.uplink import dequantise, quantise
from ..params_types import Normalize

UPLINK_FILE = "uplink.json"  # beside a captioner's weights: what it reads in place of the log-mel
ENCODER_FILE = "uplink_encoder.safetensors"
NORM_EPS = 1e-3


@dataclass(frozen=True)
class EncoderShape:
    n_mels: int  # mel bands of the features it reads (features.n_mels)
    rows: int  # values sent per frame
    hidden: int
    merge: int  # log-mel frames per sent frame
    normalize: Normalize = "none"
    bits: int = 16  # per value sent: 16 = float16, fewer = codes on data.uplink's lattice

    def describe(self) -> dict:
        """The shape as uplink.json and the digest hold it (`bits` only when below 16, so a float16
        encoder keeps the name it had before codes existed)."""
        out = dict(self.__dict__)
        if self.bits == 16:
            del out["bits"]
        return out


class UplinkEncoder(torch.nn.Module):
    """(n_mels, frames) log-mel -> (rows, ceil(frames / merge)); the same for a clip alone or in a batch of
    training clips (each clip is encoded on its own: no padding reaches another clip's values)."""

    def __init__(self, shape: EncoderShape):
        super().__init__()
        self.shape = shape
        self.inner = torch.nn.Conv1d(shape.n_mels, shape.hidden, 3, padding=1, padding_mode="replicate")
        self.out = torch.nn.Conv1d(shape.hidden, shape.rows, shape.merge, stride=shape.merge)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.gelu(self.inner(mel[None]))
        short = -x.shape[-1] % self.shape.merge  # the last sent frame merges what is left, edge repeated
        if short:
            x = torch.nn.functional.pad(x, (0, short), mode="replicate")
        z = torch.tanh(self.out(x))[0]
        if self.shape.normalize == "clip":
            z = (z - z.mean(1, keepdim=True)) / (z.std(1, keepdim=True, unbiased=False) + NORM_EPS)
        if self.shape.bits == 16:
            return z
        coded = torch.from_numpy(dequantise(*quantise(z.detach().numpy(), self.shape.bits)))
        # training: the coded values forward, the gradient straight through the rounding
        return z + (coded - z).detach() if z.requires_grad else coded


class _Reverse(torch.autograd.Function):
    """Identity forward; the gradient times -weight backward (the encoder learns against the classifier)."""

    @staticmethod
    def forward(ctx, x, weight: float):
        ctx.weight = weight
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -ctx.weight * grad, None


class SpeakerAdversary(torch.nn.Module):
    """Names the voice two ways, as the privacy stage's classifiers do: from every sent frame (the
    log-probabilities averaged over the clip's frames) and from the clip's statistics per row (level,
    spread, movement, 10th and 90th percentiles); each through a reversed gradient of `weight`."""

    def __init__(self, rows: int, speakers: int, weight: float, hidden: int = 64):
        super().__init__()
        self.weight = weight
        self.net = torch.nn.Sequential(torch.nn.Linear(rows, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, speakers))
        self.clip = torch.nn.Linear(5 * rows, speakers)

    @staticmethod
    def statistics(z: torch.Tensor) -> torch.Tensor:
        """(rows, frames) -> (5 rows): what pipeline.privacy.clip_statistics reads, differentiably."""
        moves = (z[:, 1:] - z[:, :-1]).abs().mean(1) if z.shape[1] > 1 else torch.zeros_like(z[:, 0])
        return torch.cat([z.mean(1), z.std(1, unbiased=False), moves, torch.quantile(z, 0.1, dim=1),
                          torch.quantile(z, 0.9, dim=1)])

    def loss(self, sent: list[torch.Tensor], speakers: list[int]) -> torch.Tensor | None:
        known = [(_Reverse.apply(z, self.weight), s) for z, s in zip(sent, speakers) if s >= 0]
        if not known:
            return None
        who = torch.tensor([s for _, s in known])
        frames = torch.stack([self.net(z.T).log_softmax(-1).mean(0) for z, _ in known])
        clips = torch.stack([self.clip(self.statistics(z)).log_softmax(-1) for z, _ in known])
        return torch.nn.functional.nll_loss(frames, who) + torch.nn.functional.nll_loss(clips, who)


def digest(encoder: UplinkEncoder) -> str:
    """The encoder's name on the wire: its shape and weights, hashed."""
    h = hashlib.sha256(json.dumps(encoder.shape.describe(), sort_keys=True).encode())
    for key, value in sorted(encoder.state_dict().items()):
        h.update(key.encode())
        h.update(value.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


@dataclass(frozen=True, eq=False)
class LearnedUplink:
    encoder: UplinkEncoder = field(repr=False)
    digest: str = ""

    identity = False
    learned = True

    @classmethod
    def trained(cls, encoder: UplinkEncoder) -> "LearnedUplink":
        encoder.eval()
        return cls(encoder, digest(encoder))

    def __eq__(self, other) -> bool:
        return isinstance(other, LearnedUplink) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    @property
    def shape(self) -> EncoderShape:
        return self.encoder.shape

    @property
    def merge(self) -> int:
        return self.shape.merge

    @property
    def normalize(self) -> Normalize:
        return self.shape.normalize

    @property
    def bits(self) -> int:
        return self.shape.bits

    @property
    def wire_dtype(self) -> str:
        """How the values cross the link (decoding.packets.features_packet), as a hand-made view's."""
        return "float16" if self.bits == 16 else f"q{self.bits}"

    def rows(self, n_mels: int) -> int:
        if n_mels != self.shape.n_mels:
            raise ValueError(f"uplink: the learned encoder {self.digest} reads {self.shape.n_mels} mel bands, the "
                             f"features have {n_mels} (features.n_mels)")
        return self.shape.rows

    def frames(self, n_frames: int) -> int:
        return -(-n_frames // self.merge)

    def name(self, n_mels: int, hop: int) -> str:
        text = f"learned {self.rows(n_mels)} rows, hop {hop * self.merge}"
        text += (", clip-normalised" if self.normalize == "clip" else "") + (f", {self.bits}-bit" if self.bits < 16 else "")
        return text + f" ({self.digest})"

    def bytes_per_second(self, n_mels: int, sample_rate: int, hop: int) -> float:
        return self.bits / 8 * self.rows(n_mels) * sample_rate / (hop * self.merge)

    def to_dict(self) -> dict:
        return {"learned": self.shape.describe(), "digest": self.digest}

    @torch.no_grad()
    def encode(self, features: np.ndarray) -> np.ndarray:
        """(n_mels, frames) log-mel -> (rows, frames') float32 holding float16 values, or the codes'
        values with `bits` below 16, as the hand-made views."""
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] == 0:
            raise ValueError(f"uplink: features must be (n_mels, frames) with frames, got shape {x.shape}")
        self.rows(x.shape[0])
        z = self.encoder(torch.from_numpy(x)).numpy()
        return z if self.bits < 16 else z.astype(np.float16).astype(np.float32)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.encoder.state_dict().items()}, str(folder / ENCODER_FILE))
        (folder / UPLINK_FILE).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, folder: Path, described: dict) -> "LearnedUplink":
        """The encoder `described` (an UPLINK_FILE's content) from its weights in `folder`; a ValueError
        when the weights are missing or are not the ones described."""
        weights = folder / ENCODER_FILE
        if not weights.is_file():
            raise ValueError(f"{weights}: missing (the learned uplink {described.get('digest')}'s weights)")
        encoder = UplinkEncoder(EncoderShape(**described["learned"]))
        encoder.load_state_dict(load_file(str(weights)))
        out = cls.trained(encoder)
        if out.digest != described.get("digest"):
            raise ValueError(f"{weights}: these weights are encoder {out.digest}, {folder / UPLINK_FILE} names "
                             f"{described.get('digest')}")
        return out


class TrainingFront(torch.nn.Module):
    """What the cloud's training adds in front of it for a learned uplink: the encoder, and the speaker
    adversary when asked for. A module of the model while it trains, so the optimiser, the checkpoint
    and its resume carry them like the model's own weights."""

    def __init__(self, encoder: UplinkEncoder, adversary: SpeakerAdversary | None = None,
                 speakers: tuple[str, ...] = ()):
        super().__init__()
        self.encoder, self.adversary = encoder, adversary
        self.speaker_index = {s: i for i, s in enumerate(speakers)}

    @classmethod
    def build(cls, shape: EncoderShape, adversary: float, speakers: list[str | None], seed: int) -> "TrainingFront":
        """The encoder of `shape`, and with `adversary` > 0 a classifier of the train clips' `speakers`
        (a clip with none is not in its loss); initial weights from `seed`."""
        torch.manual_seed(seed)
        encoder = UplinkEncoder(shape)
        names = tuple(sorted({s for s in speakers if s}))
        if adversary > 0 and len(names) < 2:
            raise ValueError("uplink.learned.adversary: the train clips name fewer than two voices (manifest field "
                             "`speaker`), so there is no voice to hide; set adversary to 0")
        adv = SpeakerAdversary(shape.rows, len(names), adversary) if adversary > 0 else None
        return cls(encoder, adv, names)

    def features(self, examples) -> list[torch.Tensor]:
        """What each example's log-mel (`Example.mel`) sends."""
        return [self.encoder(e.mel.float()) for e in examples]

    def loss(self, sent: list[torch.Tensor], examples) -> torch.Tensor | None:
        """The adversary's loss on what was sent (None without an adversary or a known voice)."""
        if self.adversary is None:
            return None
        return self.adversary.loss(sent, [self.speaker_index.get(e.speaker, -1) for e in examples])
