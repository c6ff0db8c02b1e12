"""The features a learned gate reads for each drafted token: what the edge knows when it decides.

One row per drafted token of a block: the edge's own uncertainty about it (entropy, top-1
probability, top-1 - top-2 margin, the chosen token's log-probability, its rank under the edge),
where it sits (position in the block, block length, position in the caption), how the block has
been going (the highest entropy so far in the block, the change of top-1 probability from the
previous token: a block that turns unsure mid-way), how the caption has been going (the share of
escalated tokens the cloud accepted so far), and the clip (an audio summary from the log-mel,
the language). The same function builds training rows from traces and inference rows at run time,
so the two cannot drift apart.
"""

from __future__ import annotations

import math

import numpy as np

from ..decoding.stats import Block

AUDIO = ("audio_energy", "audio_energy_std", "audio_energy_slope", "audio_centroid", "audio_centroid_std",
         "audio_voiced")
FEATURES = ("entropy", "top1", "margin", "logprob", "log_rank", "pos_in_block", "block_len", "pos_in_caption",
            "block_max_entropy", "top1_change", "accept_rate", "has_accept_rate", "zh") + AUDIO


def block_features(block: Block) -> np.ndarray:
    """(len(block), len(FEATURES)) float32 rows, one per drafted token."""
    n = len(block)
    rows = np.zeros((n, len(FEATURES)), dtype=np.float32)
    audio = tuple(block.audio) + (0.0,) * (len(AUDIO) - len(block.audio))
    max_ent, prev_top1 = 0.0, None
    for i, s in enumerate(block.stats):
        max_ent = max(max_ent, s.entropy)
        rows[i] = (s.entropy, s.top1, s.margin, max(s.logprob, -50.0), math.log(s.rank), i, n, block.start + i,
                   max_ent, 0.0 if prev_top1 is None else s.top1 - prev_top1,
                   1.0 if block.accept_rate is None else block.accept_rate, block.accept_rate is not None,
                   block.language == "zh") + audio[:len(AUDIO)]
        prev_top1 = s.top1
    return rows


# ---- token level: what a token gate reads as each token is drafted ----
# Only what belongs to the token itself, so that rows from the edge's own trajectory (on-policy
# traces, gating.shadow) and rows at run time (a pending block that restarts after every
# verification) mean the same: the edge's uncertainty about the token, where it sits in the
# caption, whether it ends the caption, the clip, the token's id (LightGBM reads it as a
# category) and the edge's last-layer hidden state BEFORE the token (block.context: the state whose
# distribution drafted it, float16 values). Read before the token is fed back, so a gate decides
# without an edge forward, and a token the cloud replaces never costs one. The state after the
# token ranked critical mismatches no better on the traces (benchmarks/gate_hidden.py).
TOKEN_SCALARS = ("entropy", "top1", "margin", "logprob", "log_rank", "pos_in_caption", "is_end", "zh") + AUDIO


def hidden_names(dim: int) -> tuple[str, ...]:
    return tuple(f"h{k}" for k in range(dim))


def token_rows(block: Block, dim: int, eos: int, first: int = 0) -> np.ndarray:
    """(len(block) - first, len(TOKEN_SCALARS) + 1 + dim) float32 rows: the scalars, the token id,
    the hidden state before the token (`dim` values from block.context)."""
    n = len(block) - first
    rows = np.zeros((max(n, 0), len(TOKEN_SCALARS) + 1 + dim), dtype=np.float32)
    audio = tuple(block.audio) + (0.0,) * (len(AUDIO) - len(block.audio))
    for r, i in enumerate(range(first, len(block))):
        s = block.stats[i]
        rows[r, :len(TOKEN_SCALARS)] = (s.entropy, s.top1, s.margin, max(s.logprob, -50.0), math.log(s.rank),
                                        block.start + i, block.tokens[i] == eos, block.language == "zh") + \
            audio[:len(AUDIO)]
        rows[r, len(TOKEN_SCALARS)] = block.tokens[i]
        h = block.context[i] if i < len(block.context) else None
        if h is not None and dim:
            rows[r, len(TOKEN_SCALARS) + 1:] = np.asarray(h, dtype=np.float32)[:dim]
    return rows


def token_columns(dim: int) -> tuple[str, ...]:
    return TOKEN_SCALARS + ("token",) + hidden_names(dim)
