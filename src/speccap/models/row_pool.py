"""The sessions of one thinker as rows of one batched KV cache, stepped together.

A session starts as it does alone (`ThinkerLM.start`: HF's forward over audio and prompt), then its
cache moves into a free row of the pool's `BatchedCache`. From there its extensions are requests
(row, tokens) that `run` packs with every other row's into one `BatchedStep` forward, and a rollback
is that row's length going down. Rows are handed out lowest first and a step runs over the rows up
to the highest one asking, so a half-empty pool pays for the rows in use, not for its size.

What a row computes is its sequence's own step within float rounding (tests/models/test_batched_step
holds it); the executor that decides which requests meet in a step is decoding.lockstep.
"""

from __future__ import annotations

import heapq

import torch

from . import fast_step
from .base import AudioLM
from .batched_step import BatchedCache, BatchedStep
from .thinker import ThinkerLM, ThinkerSession

# slots a row is given beyond its prompt when it moves in; a longer caption grows the cache
_ROOM = 160


def batchable(lm: AudioLM) -> bool:
    """Whether `lm`'s sessions can share a batched step (a Qwen2.5-Omni thinker the fast step
    supports); any other model's sessions run one forward each."""
    return isinstance(lm, ThinkerLM) and lm.use_fast_step and fast_step.supports(lm.model)


class RowPool:
    """Up to `rows` sessions of `lm` in one batched KV cache."""

    def __init__(self, lm: ThinkerLM, rows: int):
        if not batchable(lm):
            raise ValueError(f"{lm.name}: its sessions cannot share a batched step (not a Qwen2.5-Omni thinker "
                             f"on the fast step)")
        if rows < 1:
            raise ValueError(f"a row pool needs at least one row, got {rows}")
        self.lm = lm
        self.step = BatchedStep(lm.model)
        # made, grown and written in inference mode throughout (a tensor made there cannot be
        # written outside it)
        with torch.inference_mode():
            self.cache = BatchedCache(self.step, rows, _ROOM)
        self.free = list(range(rows))  # a heap: the lowest free row is handed out first
        self.steps = 0  # forwards run (one per `run`)
        self.asked = 0  # requests they served

    @property
    def rows(self) -> int:
        return self.cache.rows

    @torch.inference_mode()
    def admit(self, sess: ThinkerSession) -> int:
        """Move a prefilled session's cache into a free row; returns the row."""
        if not self.free:  # a loop holding two sessions at once (a new one before the old is dropped)
            more = self.rows
            self.cache.add_rows(more)
            self.free = list(range(self.rows - more, self.rows))
        self.cache.grow(_capacity(sess.cache.get_seq_length() + _ROOM))
        row = heapq.heappop(self.free)
        self.cache.load_row(row, sess.cache, sess.rope_delta)
        return row

    @torch.inference_mode()
    def release(self, row: int) -> None:
        self.cache.lengths[row] = 0
        heapq.heappush(self.free, row)

    def length(self, row: int) -> int:
        """Positions row `row` holds (prompt included)."""
        return int(self.cache.lengths[row])

    @torch.inference_mode()
    def rollback(self, row: int, n: int) -> None:
        self.cache.rollback(row, n)

    @torch.inference_mode()
    def run(self, asks: list[tuple[int, list[int]]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One forward for every (row, tokens) in `asks` (one request per row); returns each one's
        (logits (n, vocab), last hidden states (n, hidden)), in the order asked: views of the batch's
        outputs (a caller that keeps one copies it, so as not to keep the whole batch alive)."""
        top = max(row for row, _ in asks) + 1
        n = max(len(ids) for _, ids in asks)
        self.cache.grow(_capacity(int((self.cache.lengths[:top] + n).max())))  # padding writes past a row's end too
        view = self.cache.head(top)
        ids = torch.zeros((top, n), dtype=torch.long)
        counts = torch.zeros(top, dtype=torch.long)
        for row, toks in asks:
            ids[row, : len(toks)] = torch.tensor(toks)
            counts[row] = len(toks)
        device = self.cache.lengths.device
        logits, hidden = self.step.step(ids.to(device), counts.to(device), view)
        self.steps += 1
        self.asked += len(asks)
        return [(logits[row, : len(toks)], hidden[row, : len(toks)]) for row, toks in asks]


def _capacity(need: int) -> int:
    """Slots for `need` positions, rounded up to a multiple of 64 (few regrowths, little waste)."""
    return -(-need // 64) * 64
