"""Mismatch traces: what the cloud thinks of every drafted token, and what a wrong one costs.

Speculative decoding runs with the cloud verifying every block (gate `always`, the rank rule).
For each drafted token a row holds the gate features (gating.features), the cloud's verdict on it
(its rank under the cloud, the cloud's argmax at that position, mismatch = rank > R) and, at each
block's first rejected token (the one the rule replaces), an impact label in the AutoJudge manner:
the caption is finished twice by the cloud, once keeping the draft token and once with the cloud's
token, both are scored against the references, and the mismatch is critical when keeping the
draft token costs more than `critical_margin` quality points (quality = mean of BLEU-1, METEOR and
ROUGE-L, x100). Tokens after a block's first rejection were conditioned on a rejected token: their
mismatch label is kept, their impact is not defined (NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import LinkConfig
from ..decoding.build import DecodeSpec, build_decoder
from ..decoding.engine import speculative
from ..decoding.link import Link
from ..decoding.stats import cloud_scalars
from ..decoding.verify import cloud_rank
from ..metrics.caption import score_captions
from ..models.base import AudioLM
from ..models.generate import continue_greedy
from .features import FEATURES, block_features

NO_LINK = LinkConfig(name="none", uplink_mbps=1e6, downlink_mbps=1e6, rtt_ms=0.0, overhead_bytes=0)


def verifying_every_block(block_len: int = 5, rank: int = 2, max_new_tokens: int = 128) -> DecodeSpec:
    """The decoder a trace runs: every block of `block_len` drafted tokens verified by the rank-`rank`
    rule (R: a mismatch is a token that rule would replace)."""
    return DecodeSpec(gate="always", threshold=None, rule="rank", rank=rank, block_len=block_len,
                      max_new_tokens=max_new_tokens)


@dataclass(frozen=True)
class TraceSettings:
    decoder: DecodeSpec = verifying_every_block()
    critical_margin: float = 1.0  # quality points (x100) the draft token must cost to be critical
    # keep the edge's and the cloud's last-layer hidden state at each judged mismatch (WISV's head
    # reads them); rank 1 then makes every mismatch a greedy-verification one, as WISV localizes them
    hidden: bool = False


def quality_parts(captions: list[str], references: list[str], language: str,
                  emotion: str | None = None) -> list[tuple[float, float]]:
    """Per caption: (mean of sentence BLEU-1, METEOR and ROUGE-L x100, emotion hit 0/1; 0 without a
    label)."""
    s = score_captions(captions, [references] * len(captions), language,
                       None if emotion is None else [emotion] * len(captions))
    return [((r["bleu1"] + r["meteor"] + r["rouge_l"]) / 3, float(r.get("emotion_hit", 0.0))) for r in s.per_caption]


def quality(caption: str, references: list[str], language: str) -> float:
    """Mean of sentence BLEU-1, METEOR and ROUGE-L (x100) of one caption."""
    return quality_parts([caption], references, language)[0][0]


def trace_caption(edge: AudioLM, cloud: AudioLM, mel: np.ndarray, language: str, references: list[str],
                  settings: TraceSettings) -> tuple[list[dict], str]:
    """The trace rows of one clip and the caption the loop produced."""
    decoder = settings.decoder
    if decoder.gate != "always" or decoder.rule != "rank" or not decoder.block_len:
        raise ValueError(f"a trace verifies every fixed-length block by the rank rule (verifying_every_block), not "
                         f"gate {decoder.gate!r}, rule {decoder.rule!r}, L = {decoder.block_len}")
    rows: list[dict] = []
    blocks = []

    def observe(block, cloud_rows, verdict, committed, cloud_hidden):
        first_reject = verdict.accepted if verdict.corrected else None
        feats = block_features(block)
        b = len(blocks)
        blocks.append((block, list(committed), first_reject, verdict.token if verdict.corrected else None))
        for i, tok in enumerate(block.tokens):
            rank = cloud_rank(cloud_rows[i], tok)
            row = dict(zip(FEATURES, (float(x) for x in feats[i])))
            row.update(block=b, i=i, pos=block.start + i, token=tok, cloud_rank=rank,
                       cloud_argmax=int(cloud_rows[i].argmax()),
                       mismatch=rank > decoder.rank, after_reject=first_reject is not None and i > first_reject,
                       first_reject=first_reject == i, impact=np.nan, critical=np.nan)
            # WISV's head judges a token's content, not where the caption ends: none for end-of-caption mismatches
            if settings.hidden and first_reject == i and block.hidden[i] is not None and \
                    row["cloud_argmax"] != cloud.eos_token_id:
                row.update(h_edge=block.hidden[i].tolist(), h_cloud=cloud_hidden[i].half().float().tolist(),
                           c_scalars=cloud_scalars(cloud_rows[i], tok).tolist())
            rows.append(row)

    # every block verified, the observer reading the cloud's view of each
    rec = speculative(edge, cloud, mel, language, build_decoder(decoder, observer=observe, trace_hidden=settings.hidden),
                      Link(NO_LINK))
    # impact of each block's first rejected token: finish with the draft token vs the cloud's
    row_at = {(r["block"], r["i"]): r for r in rows}
    for b, (block, committed, first_reject, correction) in enumerate(blocks):
        for i in range(len(block) if first_reject is None else first_reject):
            row_at[(b, i)]["impact"], row_at[(b, i)]["critical"] = 0.0, 0.0  # accepted: nothing to repair
        if first_reject is None:
            continue
        prefix = committed + block.tokens[:first_reject]
        draft = block.tokens[first_reject]
        keep = [] if draft == edge.eos_token_id else continue_greedy(cloud, mel, language, prefix + [draft],
                                                            decoder.max_new_tokens)
        fix = [] if correction == cloud.eos_token_id else continue_greedy(cloud, mel, language, prefix + [correction],
                                                                 decoder.max_new_tokens)
        q_keep = quality(cloud.decode(keep or prefix), references, language)
        q_fix = quality(cloud.decode(fix or prefix), references, language)
        r = row_at[(b, first_reject)]
        r["impact"] = q_fix - q_keep
        r["critical"] = float(q_fix - q_keep > settings.critical_margin)
    return rows, rec.caption
