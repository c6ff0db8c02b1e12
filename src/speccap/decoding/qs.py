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

Sparse payload per draft token: nnz u16, then nnz pairs of (id at ceil(log2 V) bits, count at
ceil(log2(l + 1)) bits), bit-packed, so bits = 16 + nnz (ceil(log2 V) + ceil(log2(l + 1))) with
nnz <= min(l, V).
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch

from . import packets
from .verify import SpecSampling


def lattice_counts(q, level: int) -> np.ndarray:
    """Integer counts b >= 0 with sum b = level closest to level * q (largest-remainder rounding)."""
    if level < 1:
        raise ValueError(f"lattice level must be >= 1, got {level}")
    x = np.asarray(q.double().numpy() if isinstance(q, torch.Tensor) else q, dtype=np.float64)
    if x.ndim != 1 or not np.isfinite(x).all() or (x < 0).any():
        raise ValueError("quantize needs one finite, non-negative distribution")
    x = level * x / x.sum()
    b = np.floor(x).astype(np.int64)
    missing = level - int(b.sum())
    if missing > 0:  # stable: ties go to the lower token id, so edge and tests agree
        order = np.argsort(-(x - b), kind="stable")
        b[order[:missing]] += 1
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
    counts = np.rint(q_hat.double().numpy() * level).astype(np.int64)
    if counts.sum() != level or (counts < 0).any():
        raise ValueError(f"not a point of the level-{level} lattice")
    ids = np.flatnonzero(counts)
    vb, cb = packets.id_bits(len(counts)), count_bits(level)
    bits = ((ids[:, None] >> np.arange(vb - 1, -1, -1)) & 1).astype(np.uint8)
    cnt = ((counts[ids][:, None] >> np.arange(cb - 1, -1, -1)) & 1).astype(np.uint8)
    return struct.pack("<H", len(ids)) + np.packbits(np.concatenate([bits, cnt], axis=1).reshape(-1)).tobytes()


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


class QuantizeSample(SpecSampling):
    """Q-S(l): speculative sampling against the quantized draft distribution the token was drawn from."""

    name = "qs"
    sample_quantized = True  # the edge draws the draft token from q_hat

    def __init__(self, level: int = 16, temperature: float = 1.0):
        super().__init__(temperature)
        if level < 1:
            raise ValueError(f"Q-S needs a lattice level >= 1, got {level}")
        self.level = int(level)

    def edge_distribution(self, p: torch.Tensor) -> torch.Tensor:
        """What the edge sends (and, for Q-S, samples from): p quantized at the current level."""
        return quantize(p, self.level)

    def q_payload(self, q: list[torch.Tensor]) -> bytes:
        return b"".join(pack_lattice(x, self.level) for x in q)

    def describe(self) -> dict:
        return {"rule": self.name, "temperature": self.temperature, "level": self.level}


class SampleQuantize(QuantizeSample):
    """S-Q(l), the naive order: the token is drawn from q, then q_hat is sent. Biased; kept to show it."""

    name = "sq"
    sample_quantized = False
