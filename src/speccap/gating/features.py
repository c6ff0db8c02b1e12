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
