"""The sessions of one thinker as rows of one batched KV cache, stepped together.

Sessions start together: one HF forward over the audio and prompts of every clip asking (`prefill`,
padded to the longest), each clip's cache then moved into a free row of the pool's `BatchedCache`.
From there a session's extensions are requests
(row, tokens) that `run` packs with every other row's into one `BatchedStep` forward, and a rollback
is that row's length going down. Rows are handed out lowest first and a step runs over the rows up
to the highest one asking, so a half-empty pool pays for the rows in use, not for its size (the
server's pools: when few of those ask, over copies of the asking rows alone, `compact`).

What a row computes is its sequence's own step within float rounding (tests/models/test_batched_step
holds it); the executor that decides which requests meet in a step is batching.lockstep.
"""

from __future__ import annotations

import functools
import heapq
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..models import fast_step
from ..models.base import AudioLM
from ..models.language_mask import BLOCKED_LOGIT
from ..models.thinker import Prompt, ThinkerLM, prefill
from .batched_step import BatchedCache, BatchedStep
from .step_graphs import MAX_TOKENS, Invariant, StepGraphs


@dataclass
class Prefilled:
    """A session's start in a row of the pool: what `Session` exposes after its prefill."""

    row: int
    prefill_logits: torch.Tensor  # (V,) the first caption token's distribution, blocked ids masked
    prefill_hidden: torch.Tensor | None  # (H,) the state at the prompt's last position, when asked for
    prompt_len: int
    blocked: torch.Tensor  # token ids the caption's language may not use


# when a step over few rows runs over copies of them alone (RowPool's `compact`)
COMPACT = ("off", "bitwise", "rounding")

# slots a row is given beyond its prompt when it moves in; a longer caption grows the cache
_ROOM = 160


def _guarded(method):
    """`method` holding the pool's lock, in inference mode (a tensor made there cannot be written
    outside it, so the cache is made, grown and written there throughout)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.lock, torch.inference_mode():
            return method(self, *args, **kwargs)
    return run


def batchable(lm: AudioLM) -> bool:
    """Whether `lm`'s sessions can share a batched step (a Qwen2.5-Omni thinker the fast step
    supports); any other model's sessions run one forward each."""
    return isinstance(lm, ThinkerLM) and lm.use_fast_step and fast_step.supports(lm.model)


class RowPool:
    """Up to `rows` sessions of `lm` in one batched KV cache. `graphs`: step at a few fixed shapes,
    replayed from captured CUDA graphs on a GPU (batching.step_graphs); None: where the model is on
    CUDA (elsewhere the eager step, whose shapes follow the rows asking). `invariant`: every step at
    one shape and every clip prefilled alone, so a caption does not depend on its batch
    (step_graphs.Invariant: its rows, at least `rows`, and its span are the pool's, never grown).
    `compact` (eager steps): a step that at most three quarters of the rows up to the highest asking
    ask for runs over copies of those rows alone, written back after it, not over every row between.
    "bitwise" (the batching executor): only where each row's numbers are then the full step's bit
    for bit (`BatchedStep.exact_from`: one thread, products over enough rows), so no output of the
    pipeline depends on it; "rounding" (the verifier server, whose sessions hold their rows while
    their clients draft): wherever it pays, each row's numbers the full step's within a matrix
    product's rounding, which follows the product's shape; "off": never."""

    def __init__(self, lm: ThinkerLM, rows: int, graphs: bool | None = None, invariant: Invariant | None = None,
                 compact: str = "off"):
        if not batchable(lm):
            raise ValueError(f"{lm.name}: its sessions cannot share a batched step (not a Qwen2.5-Omni thinker "
                             f"on the fast step)")
        if rows < 1:
            raise ValueError(f"a row pool needs at least one row, got {rows}")
        if invariant is not None and rows > invariant.rows:
            raise ValueError(f"a batch of {rows} does not fit batch-invariant stepping over {invariant.rows} rows")
        if compact not in COMPACT:
            raise ValueError(f"compact must be one of {COMPACT}, got {compact!r}")
        self.lm, self.invariant, self.compact = lm, invariant, compact
        self.step = BatchedStep(lm.model)
        cuda = torch.device(lm.device).type == "cuda"
        fixed = invariant is not None or (cuda if graphs is None else graphs)
        self.graphs = StepGraphs(self.step, capture=cuda, fixed=invariant is not None) if fixed else None
        if invariant is not None:
            rows = invariant.rows
        with torch.inference_mode():  # see _guarded
            self.cache = BatchedCache(self.step, rows, _ROOM if invariant is None else invariant.span)
            # each row's blocked ids (its caption's language) as a mask over the logits: every row's
            # are masked in one operation per step, not one per caption
            self.blocked = torch.zeros((rows, self.step.lm_head.shape[0]), dtype=torch.bool, device=lm.device)
        self.lengths = [0] * rows  # positions each row holds: the cache's lengths, readable without a device read
        # positions rolled back from each row since the cache's lengths were last written: a loop
        # rolls back between forwards, and the next forward writes them all in one operation
        self.rolled: dict[int, int] = {}
        self.free = list(range(rows))  # a heap: the lowest free row is handed out first
        # the verifier server's request threads roll rows back and free them while its executor's
        # thread steps (batching.gather): every use of the cache holds this (reentrant: a session
        # freed by the garbage collector in the middle of a step releases its row in that thread)
        self.lock = threading.RLock()
        self.steps = 0  # forwards run (one per `run`)
        self.asked = 0  # requests they served
        self.compacted = 0  # forwards run over copies of the asking rows alone (`compact`)
        # seconds spent in the pool's forwards (`run`) and prefills, setup included, and in the
        # statistics of each step's rows the executor computes (`summary`, batching.lockstep): what a
        # profile of the executor holds against the loops' own time (benchmarks/batched_decode.py)
        self.seconds = {"run": 0.0, "prefill": 0.0, "summary": 0.0}

    @property
    def rows(self) -> int:
        return self.cache.rows

    @_guarded
    def prefill(self, asks: list[tuple[np.ndarray, str, bool]]) -> list[Prefilled]:
        """Start a session for each (features (n_mels, frames), language, hidden) in ONE forward of
        the model (audio encoder and prompt, padded to the longest) and move each into a free row.
        What `ThinkerLM.start` computes for each clip alone, within float rounding; `hidden`: keep the
        last-layer state at the prompt's last position."""
        t0 = time.perf_counter()
        if self.lm.prompts is not None or self.invariant is not None:
            # each clip alone: kept prompts are computed alone, and a batch prefill's shapes follow
            # the longest clip asking with it
            get = self.lm.prompts.get if self.lm.prompts is not None else Prompt.alone
            rows = [(get(self.lm, f, language, h), 0) for f, language, h in asks]
        else:  # one forward for all, row i of it each
            start = prefill(self.lm, [(f, language) for f, language, _ in asks], any(h for _, _, h in asks))
            rows = [(Prompt(start.out.past_key_values, start.first_logits(self.lm, i),
                            start.first_hidden(i) if h else None, start.lengths[i], start.deltas[i], start.blocked[i]), i)
                    for i, (_, _, h) in enumerate(asks)]
        made = []
        for p, source in rows:
            row = self._free_row(p.length)
            self.cache.load_row(row, p.kv, p.delta, source=source, length=p.length)
            self.lengths[row] = p.length
            self.blocked[row] = False
            self.blocked[row, p.blocked] = True
            # copies: neither a batch's outputs nor a kept prompt are one session's to hold or change
            made.append(Prefilled(row, p.first_logits.clone(),
                                  p.first_hidden.clone() if p.first_hidden is not None else None, p.length, p.blocked))
        self.seconds["prefill"] += time.perf_counter() - t0
        return made

    def _free_row(self, prompt_len: int) -> int:
        """The lowest free row, with room for `prompt_len` positions and a caption."""
        if not self.free and self.invariant is not None:
            raise RuntimeError(f"all {self.rows} rows of batch-invariant stepping are in use: give it more rows "
                               "than captions decoded at once (a loop may hold two sessions)")
        if not self.free:  # a loop holding two sessions at once (a new one before the old is dropped)
            more = self.rows
            self.cache.add_rows(more)
            self.blocked = torch.cat([self.blocked, torch.zeros_like(self.blocked)])
            self.lengths += [0] * more
            self.free = list(range(self.rows - more, self.rows))
        self._room(prompt_len + MAX_TOKENS, _capacity(prompt_len + _ROOM))
        return heapq.heappop(self.free)

    def _room(self, need: int, grown: int) -> None:
        """Slots for `need` positions per row: the cache grown to `grown`, or, at a fixed span, an
        error when they do not fit."""
        if self.invariant is None:
            self.cache.grow(grown)
        elif need > self.cache.capacity:
            raise ValueError(f"a row would reach {need} positions, over the {self.cache.capacity} slots of "
                             "batch-invariant stepping: give its span room for the longest prompt and caption")

    @_guarded
    def release(self, row: int) -> None:
        self.rolled.pop(row, None)
        self.cache.lengths[row] = 0
        self.lengths[row] = 0
        heapq.heappush(self.free, row)

    def length(self, row: int) -> int:
        """Positions row `row` holds (prompt included)."""
        with self.lock:
            return self.lengths[row]

    @_guarded
    def rollback(self, row: int, n: int) -> None:
        if n < 0 or n > self.lengths[row]:
            raise ValueError(f"cannot roll row {row} back by {n}: it holds {self.lengths[row]} tokens")
        self.lengths[row] -= n
        self.rolled[row] = self.rolled.get(row, 0) + n

    def _write_rollbacks(self) -> None:
        """The rollbacks since the last forward, written to the cache's lengths at once."""
        if self.rolled:
            rows = torch.tensor(list(self.rolled), device=self.cache.lengths.device)
            self.cache.lengths[rows] -= torch.tensor(list(self.rolled.values()), device=rows.device,
                                                     dtype=self.cache.lengths.dtype)
            self.rolled.clear()

    @_guarded
    def run(self, asks: list[tuple[int, list[int]]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One forward for every (row, tokens) in `asks` (one request per row); returns each one's
        (logits (n, V) float32 over the shared vocabulary with its blocked ids masked, as a session's
        `extend` gives them, and last hidden states (n, hidden)), in the order asked: views of the
        batch's outputs (a caller that keeps one copies it, so as not to keep the whole batch alive)."""
        t0 = time.perf_counter()
        self._write_rollbacks()
        top = max(row for row, _ in asks) + 1
        n = max(len(ids) for _, ids in asks)
        # padding writes past a row's end too, in every row the step runs over
        wide, deep = (self.graphs and self.graphs.shape(self.cache, top, n)) or (top, n)
        need = max(self.lengths[:wide]) + deep
        self._room(need, _capacity(need))
        if self._compacts(len(asks), n, top):
            logits, hidden, at = self._run_taken(asks, n, top)
            self.compacted += 1
        else:
            at = {row: row for row, _ in asks}
            rows = [[0] * n for _ in range(top)]  # built in Python, made a tensor once
            counts = [0] * top
            for row, toks in asks:
                rows[row][: len(toks)] = toks
                counts[row] = len(toks)
            if self.graphs is not None:
                logits, hidden = self.graphs.run(self.cache, rows, counts)
            else:
                device = self.cache.lengths.device
                logits, hidden = self.step.step(torch.tensor(rows, device=device),
                                                torch.tensor(counts, device=device), self.cache.head(top))
            logits = logits[..., : self.lm.vocab_size].float()
            logits.masked_fill_(self.blocked[:top, None, : self.lm.vocab_size], BLOCKED_LOGIT)
        for row, toks in asks:
            self.lengths[row] += len(toks)
        self.steps += 1
        self.asked += len(asks)
        made = [(logits[at[row], : len(toks)], hidden[at[row], : len(toks)]) for row, toks in asks]
        self.seconds["run"] += time.perf_counter() - t0
        return made

    def _compacts(self, asks: int, n: int, top: int) -> bool:
        """Whether a step of `asks` rows' requests (the longest `n` tokens) runs over copies of them
        alone rather than over the `top` rows: where it pays (at most three quarters of them ask:
        beyond, the copies cost more than the rows skipped) and `compact` allows it."""
        if self.compact == "off" or self.graphs is not None or 4 * asks > 3 * top:
            return False
        if self.compact == "rounding":
            return True
        least = self.step.exact_from()
        return least is not None and asks * n >= least

    def _run_taken(self, asks: list[tuple[int, list[int]]], n: int, top: int):
        """`run`'s forward over the asking rows alone, taken out of the cache and written back:
        (logits, hidden, {row: its index in them}). Attention reads as many slots as the step over
        the `top` rows would (a reduction's rounding follows its length)."""
        order = sorted(row for row, _ in asks)
        at = {row: i for i, row in enumerate(order)}
        device = self.cache.lengths.device
        ids, counts = [[0] * n for _ in order], [0] * len(order)
        for row, toks in asks:
            ids[at[row]][: len(toks)] = toks
            counts[at[row]] = len(toks)
        idx = torch.tensor(order, device=device)
        span = max(self.lengths[:top]) + n
        part = self.cache.take(idx, span)
        start = part.lengths.clone()
        logits, hidden = self.step.step(torch.tensor(ids, device=device), torch.tensor(counts, device=device), part,
                                        span)
        self.cache.put(idx, part, start, n)
        logits = logits[..., : self.lm.vocab_size].float()
        logits.masked_fill_(self.blocked[idx][:, None, : self.lm.vocab_size], BLOCKED_LOGIT)
        return logits, hidden, at


def _capacity(need: int) -> int:
    """Slots for `need` positions, rounded up to a multiple of 64 (few regrowths, little waste)."""
    return -(-need // 64) * 64
