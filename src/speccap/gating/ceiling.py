"""The ceiling at a budget: how good a caption any token gate could make with a given number of the
cloud's corrections, found with the cloud's answers known.

The oracle that verifies every token writes, at each position, the edge's greedy token unless the
cloud ranks it worse than R (a mismatch), and then the cloud's own token. A gate at a budget can
afford only some of those corrections. Which ones matter is not which come first: a correction
changes everything the edge writes after it, so the only way to know what one buys is to finish
the caption with it. A *plan* names the mismatches to correct by their order of appearance (0 is
the first mismatch the caption meets, whether corrected or not); the caption a plan writes is
exactly what the blocking loop writes with gate `always` and `Rank` holding that plan
(decoding.verify.Rank, `plan`): every position drafted by the edge, no bonus tokens, so corrected /
drafted is the share a gate would have sent.

The search is greedy by measured effect on the finished caption: start from the edge's caption
(empty plan), try adding each mismatch of the current caption to the plan, keep the one whose
finished caption scores best, repeat. Each clip gives a curve, the best caption found with at
most k corrections for k = 0..K; `allocate` then spends a language's budget where it buys the
most, across clips, as a gate with one threshold over all tokens also may. Being greedy, the
search finds a lower bound on the true ceiling: a gate can beat it only where the search missed a
better plan.

Both models keep one KV-cached session per clip: a candidate shares the current caption's tokens
up to its mismatch, so each try costs the rest of the caption, not a new prefill.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..decoding.verify import cloud_rank
from ..models.base import AudioLM


@dataclass(frozen=True)
class Trajectory:
    """A caption written under a plan: its tokens (the end token not included), whether it ended
    with the end token, and each mismatch met on the way as (position, the cloud's token)."""

    plan: frozenset[int]
    tokens: tuple[int, ...]
    ended: bool
    mismatches: tuple[tuple[int, int], ...]

    @property
    def drafted(self) -> int:
        """Positions the edge drafted: every token, and the end token when the caption ended."""
        return len(self.tokens) + self.ended

    @property
    def corrected(self) -> int:
        return sum(1 for j in self.plan if j < len(self.mismatches))


class PlanWalker:
    """Captions of one clip under plans, each continuing from the longest prefix the two sessions
    already hold."""

    def __init__(self, edge: AudioLM, cloud: AudioLM, features: np.ndarray, language: str, rank: int,
                 max_new_tokens: int):
        if rank < 1:
            raise ValueError(f"a mismatch is a token ranked worse than R >= 1 by the cloud; got R = {rank}")
        self.rank, self.limit, self.eos = rank, max_new_tokens, edge.eos_token_id
        # the edge's and the cloud's KV-cached session of this clip
        self.edge_cloud = (edge.start(edge.wire(features), language), cloud.start(cloud.wire(features), language))
        self.held: list[int] = []  # the caption tokens both sessions hold

    def _after(self, prefix: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The edge's and the cloud's next-token logits after `prefix`, the sessions made to hold it."""
        if not prefix:
            for s in self.edge_cloud:
                s.rollback(s.length)
            self.held = []
            return tuple(s.prefill_logits for s in self.edge_cloud)
        same = 0
        for a, b in zip(self.held, prefix):
            if a != b:
                break
            same += 1
        same = min(same, len(prefix) - 1)  # at least one token fed: its logits are the ones wanted
        out = []
        for s in self.edge_cloud:
            s.rollback(s.length - same)
            out.append(s.extend(prefix[same:]).logits[-1])
        self.held = list(prefix)
        return out[0], out[1]

    def walk(self, plan: frozenset[int], base: Trajectory | None = None, start: int = 0) -> Trajectory:
        """The caption `plan` writes. With `base` (a caption under a plan that agrees with `plan` on
        ordinals below `start`), its tokens before its mismatch `start` are reused."""
        tokens: list[int] = []
        met: list[tuple[int, int]] = []
        if base is not None and start < len(base.mismatches):
            pos, fix = base.mismatches[start]
            tokens, met = list(base.tokens[:pos]), list(base.mismatches[:start])
            if start in plan:  # the mismatch the continuation starts from is met and settled here
                met.append((pos, fix))
                if fix == self.eos:
                    return Trajectory(plan, tuple(tokens), True, tuple(met))
                tokens.append(fix)
                if len(tokens) >= self.limit:
                    return Trajectory(plan, tuple(tokens), False, tuple(met))
        edge_logits, cloud_logits = self._after(tokens)
        while True:
            draft = int(torch.argmax(edge_logits))
            token = draft
            if cloud_rank(cloud_logits, draft) > self.rank:
                fix = int(torch.argmax(cloud_logits))
                if len(met) in plan:
                    token = fix
                met.append((len(tokens), fix))
            if token == self.eos:
                return Trajectory(plan, tuple(tokens), True, tuple(met))
            tokens.append(token)
            if len(tokens) >= self.limit:
                return Trajectory(plan, tuple(tokens), False, tuple(met))
            edge_logits, cloud_logits = (s.extend([token]).logits[-1] for s in self.edge_cloud)
            self.held = list(tokens)


def greedy_curve(walker: PlanWalker, score: Callable[[Trajectory], float], steps: int,
                 patience: int = 2) -> list[Trajectory]:
    """The best caption found with at most k corrections, k = 0..`steps`: each step adds to the
    current plan the mismatch whose finished caption scores best, and the curve keeps the best
    caption so far (a gate may send fewer than it may). It ends early when the caption runs out of
    mismatches, or after `patience` steps in a row that found nothing better."""
    current = walker.walk(frozenset())
    curve, scores = [current], [score(current)]
    best, best_score, stale = current, scores[0], 0
    for _ in range(steps):
        if stale >= patience:
            break
        # latest position first: each try rolls the sessions back, and the prefix before it stays valid
        candidates = [j for j in range(len(current.mismatches)) if j not in current.plan][::-1]
        if not candidates:
            break
        tried = [walker.walk(current.plan | {j}, current, j) for j in candidates]
        values = [score(t) for t in tried]
        pick = int(np.argmax(values))
        current = tried[pick]
        if values[pick] > best_score:
            best, best_score, stale = current, values[pick], 0
        else:
            stale += 1
        curve.append(best)
    return curve


def allocate(curves: list[list[float]], drafted: list[list[int]], corrected: list[list[int]],
             budget: float) -> list[int]:
    """For each clip, which point of its curve to take so that the corrections sent over all clips
    stay within `budget` x the tokens drafted, spending each correction where it buys the most: the
    steps of each clip's upper concave hull, taken by gain per correction, while they fit."""
    segments = []  # (-gain per correction, clip, point it leads to)
    for c, values in enumerate(curves):
        for a, b in _hull_steps(values, corrected[c]):
            cost = corrected[c][b] - corrected[c][a]
            segments.append((-(values[b] - values[a]) / cost, c, a, b))
    heapq.heapify(segments)
    at = [0] * len(curves)
    sent = sum(corrected[c][0] for c in range(len(curves)))
    tokens = sum(drafted[c][0] for c in range(len(curves)))
    while segments:
        gain, c, a, b = heapq.heappop(segments)
        if gain >= 0 or at[c] != a:
            continue  # no gain, or a step of a clip whose earlier step did not fit
        s = sent + corrected[c][b] - corrected[c][a]
        t = tokens + drafted[c][b] - drafted[c][a]
        if s > budget * t:
            continue
        at[c], sent, tokens = b, s, t
    return at


def _hull_steps(values: list[float], cost: list[int]) -> list[tuple[int, int]]:
    """The upper concave hull of (cost, value) from point 0, as consecutive (from, to) index pairs of
    points with more cost (decreasing gain per unit of cost)."""
    hull = [0]
    for i in range(1, len(values)):
        if cost[i] <= cost[hull[-1]]:
            continue
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b lies on or below the line from a to i: drop it
            if (values[b] - values[a]) * (cost[i] - cost[a]) <= (values[i] - values[a]) * (cost[b] - cost[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    return list(zip(hull, hull[1:]))


__all__ = ["PlanWalker", "Trajectory", "allocate", "greedy_curve"]
