"""On-policy traces: the cloud shadows the edge's own caption, and each mismatch is judged by how a
deployed token gate would go on.

A token gate mostly follows the edge's trajectory, and after a verified token the edge finishes
the caption. So a clip's trace is:

1. the edge writes its caption greedily (the edge-only caption), keeping per token what a token
   gate reads (gating.features.token_rows: its uncertainty, the token, its hidden state);
2. ONE cloud forward over the prompt and that caption scores every edge token at once: its rank
   under the cloud and the cloud's own token there; a mismatch is a token the rank rule would
   replace (rank > R), the end of the caption included;
3. every mismatch, not only the first, is judged on its own: the token is corrected and the edge
   finishes the caption from there ("fix"), against the edge's caption as it is ("keep"). Its
   impact is the quality gained, where quality is the mean of BLEU-1, METEOR, ROUGE-L and the
   emotion hit (x100, so naming the clip's emotion counts like the other three); the mismatch is
   critical when the impact exceeds `critical_margin`.

Impact of a matching token is 0 (there is nothing to correct).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..decoding.stats import Block, audio_summary, token_stats
from ..decoding.verify import cloud_rank
from ..models.base import AudioLM
from .features import token_rows
from .traces import finish, quality_parts


@dataclass(frozen=True)
class ShadowSettings:
    rank: int = 2  # R: a mismatch is a token the rank rule would replace
    critical_margin: float = 1.0  # quality points (x100) a correction must gain to be critical
    max_new_tokens: int = 128


def impact(fix: tuple[float, float], keep: tuple[float, float], with_emotion: bool) -> float:
    """Quality gained by the correction: the mean of the BLEU-1, METEOR, ROUGE-L and (with a label)
    100 x emotion-hit differences."""
    if not with_emotion:
        return fix[0] - keep[0]
    return (3 * (fix[0] - keep[0]) + 100 * (fix[1] - keep[1])) / 4


def edge_trajectory(edge: AudioLM, mel: np.ndarray, language: str, max_new_tokens: int) -> Block:
    """The edge's greedy caption as one block: tokens (the end token included when it comes),
    their statistics and hidden states as a token gate sees them in the loop."""
    block = Block(start=0, audio=audio_summary(mel), language=language)
    sess = edge.start(mel, language)
    logits = sess.prefill_logits
    while len(block) < max_new_tokens:
        tok = int(logits.argmax())
        stats, _ = token_stats(logits, tok)
        block.tokens.append(tok)
        block.stats.append(stats)
        if tok == edge.eos_token_id:
            block.hidden.append(None)
            break
        out = sess.extend([tok], True)
        logits = out.logits[-1]
        block.hidden.append(out.hidden[-1].half().float())
    return block


def shadow_caption(edge: AudioLM, cloud: AudioLM, mel: np.ndarray, language: str, references: list[str],
                   emotion: str | None, settings: ShadowSettings) -> tuple[np.ndarray, list[dict], str]:
    """One clip's trace: (token feature rows, one label dict per token, the edge's caption)."""
    block = edge_trajectory(edge, mel, language, settings.max_new_tokens)
    eos = edge.eos_token_id
    dim = next((int(h.shape[-1]) for h in block.hidden if h is not None), 0)
    x = token_rows(block, dim, eos)
    # the cloud's view of every edge token, from one forward over the caption
    csess = cloud.start(mel, language)
    rows = [csess.prefill_logits]
    if len(block) > 1:
        out = csess.extend(block.tokens[:-1])
        rows += [out.logits[k] for k in range(len(block) - 1)]
    caption_ids = [t for t in block.tokens if t != eos]
    labels, fixes = [], []
    for j, tok in enumerate(block.tokens):
        rank = cloud_rank(rows[j], tok)
        correction = int(rows[j].argmax())
        labels.append({"pos": j, "token": tok, "eos": eos, "cloud_rank": rank, "cloud_token": correction,
                       "mismatch": rank > settings.rank, "impact": 0.0, "impact_quality": 0.0,
                       "impact_emotion": 0.0, "critical": False})
        if rank > settings.rank:
            prefix = block.tokens[:j]
            fixes.append((j, prefix if correction == eos else
                          finish(edge, mel, language, prefix + [correction], settings.max_new_tokens)))
    if fixes:
        parts = quality_parts([edge.decode(caption_ids)] + [edge.decode(ids) for _, ids in fixes], references,
                              language, emotion)
        for (j, _), fixed in zip(fixes, parts[1:]):
            gain = impact(fixed, parts[0], emotion is not None)
            labels[j].update(impact=gain, impact_quality=fixed[0] - parts[0][0],
                             impact_emotion=fixed[1] - parts[0][1], critical=gain > settings.critical_margin)
    return x, labels, edge.decode(caption_ids)
