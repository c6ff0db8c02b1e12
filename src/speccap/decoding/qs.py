"""Lossless quantize-then-sample verification (Q-S) and its naive sample-then-quantize twin (S-Q).

Speculative sampling needs the cloud to know q(d), the edge's probability of each drafted token,
and the exact residual max(p - q, 0) on a rejection: the whole draft distribution. Sent densely
(float16 x V per token) that dwarfs the token ids. Q-S sends a coarse, exact version instead:

1. the edge quantizes its distribution on the lattice {b / l : b integer >= 0, sum b = l}
   (b = floor(l q), then the l - sum b missing units go to the largest residues l q - b);
2. it SAMPLES the draft token from the quantized q_hat (not from q);
3. it sends q_hat sparsely: its non-zero entries as (token id, count b) pairs;
4. the cloud accepts with min(1, p(d) / q_hat(d)) and on rejection samples norm(max(p - q_hat, 0)).

Because the token was drawn from exactly the q_hat the cloud divides by, the standard argument
holds with q_hat in place of q: the output is distributed exactly as the cloud's p, whatever l.
A coarser lattice only lowers the acceptance rate; it never biases the output. S-Q samples from q
and sends q_hat: the cloud then divides by the wrong probabilities and the output drifts from p
(tests show both).

Sparse payload after a VERIFY: the block's level l (u16; the adaptive policy changes it per
round), then per draft token nnz u16 and nnz pairs of (id at ceil(log2 V) bits, count at
ceil(log2(l + 1)) bits), bit-packed: 16 + nnz (ceil(log2 V) + ceil(log2(l + 1))) bits a token,
nnz <= min(l, V).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np
import torch

from . import packets
from .policies import LengthPolicy
from .verify import SpecSampling


def lattice_counts(q, level: int) -> np.ndarray:
    """Integer counts b >= 0 with sum b = level closest to level * q (largest-remainder rounding)."""
    x = np.asarray(q.double().numpy() if isinstance(q, torch.Tensor) else q, dtype=np.float64)
    if x.ndim != 1 or not x.size:
        raise ValueError("quantize needs one finite, non-negative distribution")
    return lattice_rows(x[None], level)[0]


def lattice_rows(laws: np.ndarray, level: int) -> np.ndarray:
    """`lattice_counts` of each row of (k, V) float64 `laws`, in one operation for all rows (a Q-S
    edge's are computed once per step for every drafting loop): each row the counts it gets alone."""
    if level < 1:
        raise ValueError(f"lattice level must be >= 1, got {level}")
    total = laws.sum(axis=1, keepdims=True) if laws.ndim == 2 and laws.size else np.array([[np.nan]])
    if not np.isfinite(total).all() or not laws.min() >= 0:  # (a NaN or infinity makes the sum one)
        raise ValueError("quantize needs one finite, non-negative distribution")
    x = level * laws / total
    b = np.floor(x).astype(np.int64)
    missing = level - b.sum(axis=1)
    if missing.max() > 0:  # the `missing` largest remainders get a unit; ties go to the lower token id
        # (what a stable sort of the remainders gives, without one: over Qwen's 151k-token vocabulary
        # the sort took 23 ms per drafted token). Each row's k-th largest remainder is among its
        # `most` largest, k <= `most` <= the level; top-k finds them for all rows at once, where
        # numpy's partition along the rows is many times slower at that vocabulary.
        rem = x - b
        most = int(missing.max())
        top = torch.topk(torch.from_numpy(rem), most, dim=1).values.numpy()  # descending
        kth = top[np.arange(len(rem)), np.clip(missing - 1, 0, most - 1)][:, None]
        above = rem > kth
        ties = rem == kth
        wanted = (missing - above.sum(axis=1))[:, None]
        if (ties.sum(axis=1, keepdims=True) > wanted).any():  # more ties than units left: lowest ids first
            ties &= np.cumsum(ties, axis=1) <= wanted
        b += (missing[:, None] > 0) & (above | ties)
    return b


def quantize(q, level: int) -> torch.Tensor:
    """q_hat = b / level on the lattice (float64)."""
    return torch.from_numpy(lattice_counts(q, level) / level)


def count_bits(level: int) -> int:
    return max(1, math.ceil(math.log2(level + 1)))


def sparse_bits(nnz: int, vocab: int, level: int) -> int:
    """Bits of one token's sparse q_hat on the wire."""
    return 16 + nnz * (packets.id_bits(vocab) + count_bits(level))


def pack_lattice(q_hat: torch.Tensor, level: int) -> bytes:
    """One token's q_hat as nnz u16 + bit-packed (id, count) pairs."""
    return pack_lattices([q_hat], level)


def pack_lattices(q_hats, level: int) -> bytes:
    """Each token's q_hat packed as `pack_lattice` packs it, one after the other, with one pass over
    the whole block for the counts and their bits."""
    if not len(q_hats):
        return b""
    counts = np.rint(np.stack([x.double().numpy() for x in q_hats]) * level).astype(np.int64)
    if (counts.sum(axis=1) != level).any() or (counts < 0).any():
        raise ValueError(f"not a point of the level-{level} lattice")
    token, ids = np.nonzero(counts)  # each token's non-zero ids, ascending, token after token
    vb, cb = packets.id_bits(counts.shape[1]), count_bits(level)
    bits = np.concatenate([(ids[:, None] >> np.arange(vb - 1, -1, -1)) & 1,
                           (counts[token, ids][:, None] >> np.arange(cb - 1, -1, -1)) & 1], axis=1).astype(np.uint8)
    out, start = [], 0
    for nnz in np.bincount(token, minlength=len(counts)).tolist():
        out.append(struct.pack("<H", nnz) + np.packbits(bits[start:start + nnz].reshape(-1)).tobytes())
        start += nnz
    return b"".join(out)


def unpack_block(data: bytes, n_draft: int, vocab: int) -> tuple[int, list[torch.Tensor]]:
    """(level, q_hat per draft token) from a Q-S payload; an error on anything left over or missing."""
    if len(data) < 2:
        raise packets.PacketError("Q-S payload: missing lattice level")
    (level,) = struct.unpack_from("<H", data)
    if level < 1:
        raise packets.PacketError("Q-S payload: lattice level 0")
    rest, out = data[2:], []
    for _ in range(n_draft):
        q, rest = unpack_lattice(rest, vocab, level)
        out.append(q)
    if rest:
        raise packets.PacketError(f"Q-S payload: {len(rest)} bytes after the {n_draft} distributions")
    return level, out


def unpack_lattice(data: bytes, vocab: int, level: int) -> tuple[torch.Tensor, bytes]:
    """(q_hat, the bytes after it) from a packed token; an error unless it is a lattice point."""
    if len(data) < 2:
        raise packets.PacketError("lattice q: missing entry count")
    (nnz,) = struct.unpack_from("<H", data)
    vb, cb = packets.id_bits(vocab), count_bits(level)
    need = math.ceil(nnz * (vb + cb) / 8)
    if len(data) < 2 + need:
        raise packets.PacketError(f"lattice q: {nnz} entries need {need} bytes, got {len(data) - 2}")
    flat = np.unpackbits(np.frombuffer(data[2:2 + need], dtype=np.uint8))[: nnz * (vb + cb)].reshape(nnz, vb + cb)
    ids = flat[:, :vb].astype(np.int64) @ (1 << np.arange(vb - 1, -1, -1))
    counts = flat[:, vb:].astype(np.int64) @ (1 << np.arange(cb - 1, -1, -1))
    if (ids >= vocab).any() or counts.sum() != level or len(set(ids.tolist())) != nnz:
        raise packets.PacketError(f"lattice q: not a level-{level} distribution over {vocab} tokens")
    q = np.zeros(vocab)
    q[ids] = counts / level
    return torch.from_numpy(q), data[2 + need:]


@dataclass(frozen=True)
class Lattice:
    """A Q-S edge's lattice at one level, taken of every drafting row's law in one operation per step
    (`decoding.stats.sampled_rows`): the rows' counts, and the laws their tokens are drawn from (the
    lattice points; S-Q: the laws themselves)."""

    level: int
    sample_quantized: bool

    def __call__(self, laws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        counts = lattice_rows(laws, self.level)
        return counts, counts / self.level if self.sample_quantized else laws


class QuantizeSample(SpecSampling):
    """Q-S(l): speculative sampling against the quantized draft distribution the token was drawn from."""

    name = "qs"
    sample_quantized = True  # the edge draws the draft token from q_hat

    def __init__(self, level: int = 16, temperature: float = 1.0):
        super().__init__(temperature)
        if level < 1:
            raise ValueError(f"Q-S needs a lattice level >= 1, got {level}")
        self.level = int(level)
        self.nnz: dict[int, list[int]] = {}

    def lattice(self) -> Lattice:
        """What the edge takes of each row's law at the current level, once per step for all rows."""
        return Lattice(self.level, self.sample_quantized)

    def edge_distribution(self, p: torch.Tensor) -> torch.Tensor:
        """What the edge sends (and, for Q-S, samples from): p quantized at the current level."""
        return self.take(lattice_counts(p, self.level))

    def take(self, counts: np.ndarray) -> torch.Tensor:
        """The lattice point of a drafted token's law, from its counts at the current level (what
        `edge_distribution` gives), its entries counted for the adaptive policy's payload estimate."""
        n = self.nnz.setdefault(self.level, [0, 0])
        n[0] += int(np.count_nonzero(counts))
        n[1] += 1
        return torch.from_numpy(counts / self.level)  # quantize(p, level)

    def mean_nnz(self, level: int, vocab: int) -> float:
        s, n = self.nnz.get(level, (0, 0))
        return s / n if n else float(min(level, vocab))

    def q_payload(self, q: list[torch.Tensor]) -> bytes:
        return struct.pack("<H", self.level) + pack_lattices(q, self.level)

    def describe(self) -> dict:
        return {"rule": self.name, "temperature": self.temperature, "level": self.level}


class SampleQuantize(QuantizeSample):
    """S-Q(l), the naive order: the token is drawn from q, then q_hat is sent. Biased; kept to show it."""

    name = "sq"
    sample_quantized = False


class QSAdaptive(LengthPolicy):
    """Per round, the draft length L and lattice level l that maximize expected committed tokens per
    second, from what the edge knows now:

        E(L, a_l) = (1 - a_l^(L+1)) / (1 - a_l)       accepted prefix plus the cloud's token
        T(L, l)   = L T_edge + T_up(L, l) + T_cloud + T_down

    a_l: the acceptance rate seen at level l (Beta(2, 1) prior: optimistic, so every level is tried);
    T_edge, T_cloud: running means measured this caption; T_up, T_down: the link's current rate
    (the Markov channel's state) and RTT over the real packet sizes, the q payload from the mean
    number of non-zero lattice entries seen at l. Sets `rule.level` for the block it sizes."""

    name = "qs_adaptive"

    def __init__(self, rule: QuantizeSample, link, vocab: int, levels=(2, 4, 8, 16, 32, 64), l_max: int = 8,
                 overhead_bytes: int | None = None):
        if not levels or min(levels) < 1 or l_max < 1:
            raise ValueError("QSAdaptive needs levels >= 1 and l_max >= 1")
        self.rule, self.link, self.vocab = rule, link, vocab
        self.levels, self.l_max = tuple(sorted(levels)), l_max
        self.overhead = link.p.overhead_bytes if overhead_bytes is None else overhead_bytes
        self.accepted = {lv: 2.0 for lv in self.levels}  # Beta(2, 1) per level
        self.checked = {lv: 3.0 for lv in self.levels}
        self.t_edge, self.t_cloud = 1e-3, 1e-2  # priors until measured
        self.chosen: tuple[int, int] | None = None

    def _seconds(self, level: int) -> list[float]:
        """T(L, l) of every L from 1 to l_max, at level l (what holds for every L, once)."""
        vb = packets.id_bits(self.vocab)
        q_bytes = 2 + math.ceil(self.rule.mean_nnz(level, self.vocab) * (vb + count_bits(level)) / 8)
        down = 12 + 4 + math.ceil(vb / 8) + self.overhead
        rtt = self.link.rtt_s
        up_rate, down_rate = self.link.rate_now("up"), self.link.rate_now("down")
        out = []
        for length in range(1, self.l_max + 1):
            up = 12 + 5 + math.ceil(length * vb / 8) + length * q_bytes + self.overhead
            out.append(length * self.t_edge + rtt / 2 + 8 * up / up_rate + self.t_cloud
                       + rtt / 2 + 8 * down / down_rate)
        return out

    def plan(self) -> tuple[int, int, float]:
        """(L, l, expected committed tokens per second) of the best setting now."""
        best = (1, self.levels[0], -1.0)
        for level in self.levels:
            a = min(self.accepted[level] / self.checked[level], 0.999)
            for length, seconds in enumerate(self._seconds(level), start=1):
                rate = (1 - a ** (length + 1)) / (1 - a) / seconds
                if rate > best[2]:
                    best = (length, level, rate)
        return best

    def next_length(self) -> int:
        length, level, _ = self.plan()
        self.rule.level = level
        self.chosen = (length, level)
        return length

    def update(self, drafted, accepted, escalated, corrected) -> None:
        if not escalated or self.chosen is None:
            return
        level = self.chosen[1]
        self.accepted[level] += accepted
        self.checked[level] += accepted + int(corrected)

    def observe(self, rec) -> None:
        """Running compute estimates from the caption's record so far."""
        if rec.drafted:
            self.t_edge = max(rec.edge_compute - rec.prefill_time, 0.0) / rec.drafted or self.t_edge
        if rec.rounds:
            self.t_cloud = rec.cloud_compute / rec.rounds or self.t_cloud

    def describe(self) -> dict:
        return {"policy": self.name, "levels": list(self.levels), "l_max": self.l_max}
