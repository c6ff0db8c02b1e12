"""On-policy traces: the cloud shadows the edge's own caption, and each mismatch is judged by how a
deployed token gate would go on.

A token gate mostly follows the edge's trajectory, and after a verified token the edge finishes
the caption. So a clip's trace is:

1. the edge writes its caption greedily (the edge-only caption), keeping per token what a token
   gate reads (gating.features.token_rows: its uncertainty, the token, its hidden state before it);
2. ONE cloud forward over the prompt and that caption scores every edge token at once: its rank
   under the cloud and the cloud's own token there; a mismatch is a token the rank rule would
   replace (rank > R), the end of the caption included;
3. every mismatch, not only the first, is judged on its own: the token is corrected and the edge
   finishes the caption from there ("fix"), against the edge's caption as it is ("keep"). Its
   impact is the quality gained, where quality is the mean of BLEU-1, METEOR, ROUGE-L and the
   emotion hit (x100, so naming the clip's emotion counts like the other three); the mismatch is
   critical when the impact exceeds `critical_margin`.

Impact of a matching token is 0 (there is nothing to correct).

WISV's head learns from the same judged mismatches (wisv.labels: shadow): each one the caption read
as the edge drafted it also keeps both models' states after the token and the cloud's scalars
about it (what the rule reads, decoding/wisv/rule.py).

DAgger. The edge-only caption is where a gate starts, not where a deployed one goes: after its
first correction the loop leaves the edge's own trajectory. So later rounds trace the caption the
loop really committed under the current gate (`committed`): at each position, what the edge drafted
given the committed prefix (its greedy token, with what a token gate reads there) is judged the
same way, "keep" being that draft with the edge finishing from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..decoding.stats import Block, audio_summary, cloud_scalars, tempered_entropies, token_stats
from ..decoding.verify import cloud_rank
from ..models.base import AudioLM
from ..models.generate import autoregress, continue_greedy, greedy
from .features import token_rows
from .traces import quality_parts


@dataclass(frozen=True)
class ShadowSettings:
    rank: int = 2  # R: a mismatch is a token the rank rule would replace
    critical_margin: float = 1.0  # quality points (x100) a correction must gain to be critical
    max_new_tokens: int = 128
    # the entropy of the edge's distribution at each of these temperatures, per token (column
    # entropy_at): what the entropy gate's temperature is tuned on
    entropy_temperatures: tuple[float, ...] = ()


def impact(fix: tuple[float, float], keep: tuple[float, float], with_emotion: bool) -> float:
    """Quality gained by the correction: the mean of the BLEU-1, METEOR, ROUGE-L and (with a label)
    100 x emotion-hit differences."""
    if not with_emotion:
        return fix[0] - keep[0]
    return (3 * (fix[0] - keep[0]) + 100 * (fix[1] - keep[1])) / 4


def edge_trajectory(edge: AudioLM, mel: np.ndarray, language: str, max_new_tokens: int,
                    temperatures=(), entropies: list | None = None) -> Block:
    """The edge's greedy caption as one block: tokens (the end token included when it comes),
    their statistics and the hidden state before each (block.context), as a token gate sees them
    in the loop; with `entropies`, each token's entropies at `temperatures` appended to it."""
    block = Block(start=0, audio=audio_summary(mel), language=language)
    sess = edge.start(mel, language, hidden=True)
    state = [sess.prefill_hidden]  # the state after what the cache holds

    def seen(_, tok, logits):
        stats, _ = token_stats(logits, tok)
        if entropies is not None:
            entropies.append(tempered_entropies(logits, temperatures))
        block.tokens.append(tok)
        block.stats.append(stats)
        block.context.append(state[0].half().float().cpu())  # as EdgeHalf keeps it

    def feed(tok):
        out = sess.extend([tok], True)
        state[0] = out.hidden[-1]
        return out.logits[-1]
    autoregress(sess.prefill_logits, feed, edge.eos_token_id, max_new_tokens, greedy, seen)
    return block


def trajectory_block(edge: AudioLM, mel: np.ndarray, language: str, committed: list[int],
                     max_new_tokens: int, temperatures=(), entropies: list | None = None) -> Block:
    """What the edge drafted at each position of a committed caption (token ids, no end token): its
    greedy token given the committed prefix, with the statistics and the hidden state before it
    that a token gate reads there, and one position past the caption (the end it drafted, or the
    token the cloud replaced by the end) unless the caption is `max_new_tokens` long. One
    teacher-forced pass over the caption: everything a gate reads at a position comes from the
    committed prefix before it. With `entropies`, each position's entropies at `temperatures`
    appended to it."""
    block = Block(start=0, audio=audio_summary(mel), language=language)
    sess = edge.start(mel, language, hidden=True)
    rows, states = [sess.prefill_logits], [sess.prefill_hidden]
    if committed:
        out = sess.extend(list(committed), True)
        rows += [out.logits[k] for k in range(len(committed))]
        states += [out.hidden[k] for k in range(len(committed))]
    n = len(committed) + (len(committed) < max_new_tokens)
    for j in range(n):
        tok = int(rows[j].argmax())
        stats, _ = token_stats(rows[j], tok)
        if entropies is not None:
            entropies.append(tempered_entropies(rows[j], temperatures))
        block.tokens.append(tok)
        block.stats.append(stats)
        block.context.append(states[j].half().float().cpu())
    return block


def _wisv_inputs(label: dict, block: Block, cloud_states, logits, kept: bool, eos: int) -> None:
    """What WISV's head reads at this mismatch, as the rule would see it (decoding.wisv.training): the edge's
    state after the draft token (the state before the next one), the cloud's state after reading
    it, and the cloud's scalars about it. Only where the caption read the edge's own draft (both
    states are then about that token) and not about the caption's end (WISV never judges one)."""
    j = label["pos"]
    if not kept or label["token"] == eos or label["cloud_token"] == eos or cloud_states is None \
            or j + 1 >= len(block.context) or j >= len(cloud_states):
        return
    label.update(h_edge=block.context[j + 1].tolist(), h_cloud=cloud_states[j].half().float().tolist(),
                 c_scalars=cloud_scalars(logits, label["token"]).tolist())


def shadow_caption(edge: AudioLM, cloud: AudioLM, mel: np.ndarray, language: str, references: list[str],
                   emotion: str | None, settings: ShadowSettings,
                   committed: list[int] | None = None) -> tuple[np.ndarray, list[dict], str]:
    """One clip's trace: (token feature rows, one label dict per token, the caption traced). Without
    `committed`, the edge's own caption; with it, the caption a gated loop committed (DAgger)."""
    eos = edge.eos_token_id
    temps, entropies = settings.entropy_temperatures, []
    if committed is None:
        block = edge_trajectory(edge, mel, language, settings.max_new_tokens, temps, entropies)
        path = [t for t in block.tokens if t != eos]
    else:
        block = trajectory_block(edge, mel, language, committed, settings.max_new_tokens, temps, entropies)
        path = list(committed)
    dim = int(block.context[0].shape[-1]) if block.context else 0
    x = token_rows(block, dim, eos)
    # the cloud's view of every edge draft, from one forward over the caption
    csess = cloud.start(cloud.wire(mel), language)
    rows, cloud_states = [csess.prefill_logits], None
    if len(block) > 1:
        out = csess.extend(path[: len(block) - 1], True)
        rows += [out.logits[k] for k in range(len(block) - 1)]
        cloud_states = out.hidden  # [k]: the cloud's state after reading path[k]
    # was the edge's draft kept (the end drafted where the caption ends counts)? "keep" after a position
    # where the caption left the edge's drafts is not the caption itself
    kept = [path[j] == tok if j < len(path) else tok == eos for j, tok in enumerate(block.tokens)]
    last_departure = max((j for j, k in enumerate(kept) if not k), default=-1)
    labels, fixes = [], []
    for j, tok in enumerate(block.tokens):
        rank = cloud_rank(rows[j], tok)
        correction = int(rows[j].argmax())
        labels.append({"pos": j, "token": tok, "eos": eos, "cloud_rank": rank, "cloud_token": correction,
                       "mismatch": rank > settings.rank, "impact": 0.0, "impact_quality": 0.0,
                       "impact_emotion": 0.0, "critical": False, "kept": kept[j]})
        if temps:
            labels[j]["entropy_at"] = entropies[j]
        if rank > settings.rank:
            _wisv_inputs(labels[j], block, cloud_states, rows[j], kept[j], eos)
            prefix = path[:j]
            fix = prefix if correction == eos else continue_greedy(edge, mel, language, prefix + [correction],
                                                          settings.max_new_tokens)
            if j > last_departure:
                keep = path  # the edge's own continuation from here is the caption itself
            else:
                keep = prefix if tok == eos else continue_greedy(edge, mel, language, prefix + [tok], settings.max_new_tokens)
            fixes.append((j, fix, keep))
    if fixes:
        texts = list(dict.fromkeys(edge.decode(ids) for _, fix, keep in fixes for ids in (fix, keep)))
        scored = dict(zip(texts, quality_parts(texts, references, language, emotion)))
        for j, fix, keep in fixes:
            fixed, as_is = scored[edge.decode(fix)], scored[edge.decode(keep)]
            gain = impact(fixed, as_is, emotion is not None)
            labels[j].update(impact=gain, impact_quality=fixed[0] - as_is[0],
                             impact_emotion=fixed[1] - as_is[1], critical=gain > settings.critical_margin)
    return x, labels, edge.decode(path)
