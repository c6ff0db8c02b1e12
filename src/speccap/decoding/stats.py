"""Per-token uncertainty of a drafted block: what the gates and learned gates read; and what the
cloud's verify forward says about a draft token (what WISV's head reads)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..models.generate import cdfs


@dataclass
class TokenStats:
    token: int
    # nats, of the edge's next-token distribution (eq. 1 of UGSD); a tuned entropy gate reads it at its
    # own temperature (softmax(logits / T): the drafting edge computes it so)
    entropy: float
    top1: float  # probability of the most likely token
    margin: float  # top-1 minus top-2 probability
    logprob: float  # log-probability of the drafted token
    rank: int  # rank of the drafted token under the edge itself (1 = its argmax)


@dataclass
class Block:
    """A drafted block: the tokens, their edge statistics, and their edge distributions (for
    spec_sampling). `start` is the caption position of the first token."""

    start: int
    tokens: list[int] = field(default_factory=list)
    stats: list[TokenStats] = field(default_factory=list)
    q: list[torch.Tensor] = field(default_factory=list)  # (V,) probabilities the tokens were drawn from
    # (H,) edge last-layer hidden state of each drafted token, as it travels (float16 values; None
    # for an end-of-sequence token, which is never fed back): WISV and its traces read these
    hidden: list[torch.Tensor | None] = field(default_factory=list)
    # (H,) edge last-layer hidden state BEFORE each drafted token (the state whose distribution drafted
    # it; float16 values): what a learned token gate reads, known before the token is fed back
    context: list[torch.Tensor] = field(default_factory=list)
    # context a learned gate reads: the share of escalated draft tokens the cloud accepted so far in
    # this caption (None before the first verdict), a summary of the clip's audio, the language
    accept_rate: float | None = None
    audio: Sequence[float] = ()  # audio_summary's numbers (a caption's loop passes a ClipAudio)
    language: str = ""

    def __len__(self) -> int:
        return len(self.tokens)


def _entropy(logp: torch.Tensor, p: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy in nats of each row of log-probabilities (the last dimension); `p`: logp.exp(), where
    the caller has it already."""
    return -((logp.exp() if p is None else p) * logp).nan_to_num().sum(-1)


def tempered_entropies(logits: torch.Tensor, temperatures) -> list[float]:
    """The entropy of softmax(logits / T) for each T: what tuning the entropy gate's temperature
    reads (the traces keep one per T of the grid)."""
    x = logits.double()
    return [float(_entropy(torch.log_softmax(x / t, dim=-1))) for t in temperatures]


def token_stats(logits: torch.Tensor, token: int, temperature: float = 1.0,
                entropy_temperature: float | None = None) -> tuple[TokenStats, torch.Tensor]:
    """Statistics of one drafted token and the distribution it was drawn from (softmax(logits / T));
    the entropy at `entropy_temperature` instead when one is given (a tuned entropy gate's)."""
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits.double() / t, dim=-1)
    p = logp.exp()
    top2 = torch.topk(p, 2)
    lp = float(logp[token])
    rank = int((logp > lp).sum()) + 1
    entropy = float(_entropy(logp, p)) if entropy_temperature is None else tempered_entropies(logits, [entropy_temperature])[0]
    stats = TokenStats(token, entropy, float(top2.values[0]), float(top2.values[0] - top2.values[1]), lp, rank)
    return stats, p


def greedy_stats(logits: torch.Tensor, entropy_temperature: float | None = None) -> list[TokenStats]:
    """The statistics `token_stats` gives the greedy token of each row of (k, V) logits, at
    temperature 1, in one tensor operation for all rows: what a drafting edge asks its extension to
    summarize (models.base.Session.extend), so a batch of loops pays once per step. Each row gets
    the same numbers as `token_stats` on it alone: the token as `pick` takes it (the first
    maximum of the float32 logits), every other number in float64."""
    tok = logits.argmax(-1)
    logp = torch.log_softmax(logits.double(), dim=-1)
    p = logp.exp()
    top2 = torch.topk(p, 2, dim=-1).values
    lp = logp.gather(-1, tok[:, None])
    entropy = _entropy(logp, p) if entropy_temperature is None else \
        _entropy(torch.log_softmax(logits.double() / entropy_temperature, dim=-1))
    numbers = torch.stack([entropy, top2[:, 0], top2[:, 0] - top2[:, 1], lp[:, 0]], -1).tolist()
    # rank 1, as `token_stats` counts it: subtracting one number from every logit never puts one
    # above another that was not already (a NaN compares above nothing)
    return [TokenStats(t, *row, 1) for t, row in zip(tok.tolist(), numbers)]


@functools.cache
def greedy_summary(entropy_temperature: float | None = None):
    """`greedy_stats` with the entropy at `entropy_temperature`, as ONE function per temperature: a
    batching executor summarizes the loops that pass the same function together."""
    if entropy_temperature is None:
        return greedy_stats
    return functools.partial(greedy_stats, entropy_temperature=entropy_temperature)


@dataclass(frozen=True)
class SampledRow:
    """What a sampling edge needs of one row of next-token logits before it draws, computed with
    every row of a batch at once (`sampled_rows`): the law it draws from, and the statistics of the
    distribution at its temperature that do not depend on the token drawn."""
    draw: torch.Tensor  # softmax(logits / T), float64: what models.generate.pick draws from
    logp: torch.Tensor  # log_softmax(logits / T), float64
    p: torch.Tensor  # its exp: the distribution a drafted token's q is (token_stats' second value)
    entropy: float  # at the entropy temperature when one is given
    top1: float
    margin: float
    # the cumulative law the token is drawn with (models.generate.draw_from): of `draw`, or, with a
    # Q-S `lattice`, of the law it says the token is drawn from
    cdf: np.ndarray
    lattice: Callable | None = None  # the Q-S lattice these rows were taken at (decoding.qs.Lattice)
    counts: np.ndarray | None = None  # with `lattice`: `draw`'s lattice point, as integer counts

    def stats(self, token: int) -> tuple[TokenStats, torch.Tensor]:
        """`token_stats` of `token` drawn from this row: the same numbers, and its distribution."""
        logp = self.logp.numpy()  # (sampled_rows keeps its rows on the CPU)
        lp = float(logp[token])
        return TokenStats(token, self.entropy, self.top1, self.margin, lp, int(np.count_nonzero(logp > lp)) + 1), self.p


def sampled_rows(logits: torch.Tensor, temperature: float, entropy_temperature: float | None = None,
                 lattice: Callable | None = None) -> list[SampledRow]:
    """`SampledRow` of each row of (k, V) logits drawn from at `temperature` (> 0), in one tensor
    operation per quantity for all rows: what a sampling edge asks its extension to summarize, so
    a batch of loops pays once per step. Each row gets the numbers `pick` and `token_stats` give it
    alone. `lattice(laws)` (a Q-S edge's, decoding.qs.Lattice) gives the rows' lattice counts and
    the laws their tokens are drawn from."""
    x = logits.double() / temperature
    draw = torch.softmax(x, dim=-1)
    logp = torch.log_softmax(x, dim=-1)
    p = logp.exp()
    top2 = torch.topk(p, 2, dim=-1).values
    entropy = _entropy(logp, p) if entropy_temperature is None else \
        _entropy(torch.log_softmax(logits.double() / entropy_temperature, dim=-1))
    numbers = torch.stack([entropy, top2[:, 0], top2[:, 0] - top2[:, 1]], -1).tolist()
    # on the CPU, where a loop draws from them (one copy for all rows, from a GPU)
    draw, logp, p = draw.cpu(), logp.cpu(), p.cpu()
    counts, drawn = lattice(draw.numpy()) if lattice is not None else (None, draw.numpy())
    cdf = cdfs(drawn)
    return [SampledRow(draw[i], logp[i], p[i], *numbers[i], cdf[i], lattice, None if counts is None else counts[i])
            for i in range(len(numbers))]


@functools.cache
def sampled_summary(temperature: float, entropy_temperature: float | None = None, lattice: Callable | None = None):
    """`sampled_rows` at these temperatures (and Q-S lattice), as ONE function per setting (see
    greedy_summary)."""
    return functools.partial(sampled_rows, temperature=temperature, entropy_temperature=entropy_temperature,
                             lattice=lattice)


def audio_summary(mel) -> tuple[float, ...]:
    """A few numbers about the clip from its log-mel (what the edge has anyway): loudness level and
    spread, its trend over the clip, spectral balance (centroid in mel bins, normalized) and its
    spread, and the share of frames well above the clip's quiet floor (a voicing proxy)."""
    m = np.asarray(mel, dtype=np.float64)
    if m.ndim != 2 or m.shape[1] == 0:
        return (0.0,) * 6
    energy = m.mean(axis=0)
    w = np.exp(m - m.max(axis=0, keepdims=True))
    centroid = (w * np.arange(m.shape[0])[:, None]).sum(axis=0) / w.sum(axis=0) / m.shape[0]
    t = np.linspace(-1, 1, len(energy))
    slope = float((t * (energy - energy.mean())).sum() / max((t * t).sum(), 1e-9))
    floor = np.percentile(energy, 10)
    return (float(energy.mean()), float(energy.std()), slope, float(centroid.mean()), float(centroid.std()),
            float((energy > floor + 0.5 * (energy.max() - floor)).mean()))


class ClipAudio(Sequence):
    """audio_summary(mel), computed when first read: every block of a caption carries it, but only
    a learned gate's features and the traces read it, so the other decoders never pay for it."""

    __slots__ = ("_mel", "_values")

    def __init__(self, mel):
        self._mel, self._values = mel, None

    def _read(self) -> tuple[float, ...]:
        if self._values is None:
            self._values, self._mel = audio_summary(self._mel), None
        return self._values

    def __getitem__(self, i):
        return self._read()[i]

    def __len__(self) -> int:
        return len(self._read())


# What the cloud's verify forward says about a draft token, for free: its log-probability under the
# cloud (floored), the cloud's top-1 probability and entropy, and the log of the token's rank
CLOUD_SCALARS = ("cloud_logp_draft", "cloud_top1", "cloud_entropy", "cloud_log_rank")


def cloud_scalars(logits: torch.Tensor, token: int) -> np.ndarray:
    """CLOUD_SCALARS of `token` from the cloud's logits at its position (the traces and the rule
    call this same function, so training and serving read the same numbers)."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    p = logp.exp()
    lp = float(logp[token])
    rank = int((logp > lp).sum()) + 1
    return np.array([max(lp, -30.0), float(p.max()), float(-(p * logp).nan_to_num().sum()), math.log(rank)],
                    dtype=np.float32)
