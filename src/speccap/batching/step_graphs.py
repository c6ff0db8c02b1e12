"""The batched step at a few fixed shapes, captured as CUDA graphs and replayed.

On a GPU one decoding step is dozens of small kernels per layer, each launched from Python: at
B = 32 the 7B-shaped step took 83.6 ms launched one by one and 14.9 ms replayed from a captured graph
(reports/batched_step_cuda_7b.md). A graph replays one shape with the tensors it was captured on, so
a step here is padded to a bucket: the rows up to the next power of two (within the cache), the
tokens per row up to the next power of two (at most `MAX_TOKENS`), and attention reads the cache's
whole capacity (masked) rather than up to the longest row. Inputs are copied into the static tensors
the graph reads; outputs are copied out of the ones it writes (the next replay overwrites them). A
graph belongs to one cache layout: growing the cache or adding rows makes new tensors, and every
graph made over the old ones is dropped. A step wider than `MAX_TOKENS` runs eagerly.

Padding is what the eager step already does for rows that ask fewer tokens: a padded row or token
writes keys past its row's length, where no query looks (batching.batched_step). Its rounding can
differ from the eager step's (a longer masked span, another kernel for another shape), so the fixed
shapes are a setting of their own (RowPool's `graphs`) and the eager step stays the default off CUDA.
Off CUDA, or with `capture=False`, the same fixed-shape step runs eagerly: that is how the tests on
CPU hold the bucketing and padding to the eager step's results.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batched_step import BatchedCache, BatchedStep

# tokens one row asks in a step at most for a graph: drafts and verifications are short
MAX_TOKENS = 16


def _bucket(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass
class _Graph:
    """One captured shape: its static inputs, outputs and the graph (None: not captured, run eagerly)."""
    ids: torch.Tensor  # (rows, tokens) long
    counts: torch.Tensor  # (rows,) long
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    graph: "torch.cuda.CUDAGraph | None" = None


class StepGraphs:
    """`run(cache, rows, counts)`: `step.step` at a bucketed shape, replayed from a captured graph
    where `capture` (a CUDA model), else run eagerly at that shape."""

    def __init__(self, step: BatchedStep, capture: bool):
        self.step, self.capture = step, capture
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.layout: tuple | None = None
        self.pool = torch.cuda.graph_pool_handle() if capture else None  # one memory pool for every shape
        self.captured = 0  # graphs captured (a new layout captures its shapes again)
        self.replayed = 0
        self.eager = 0  # steps wider than MAX_TOKENS

    def shape(self, cache: BatchedCache, top: int, n: int) -> tuple[int, int] | None:
        """(rows, tokens) a step of rows 0..top-1 asking up to `n` tokens runs at; None: eagerly."""
        if n > MAX_TOKENS:
            return None
        return min(_bucket(top), cache.rows), _bucket(n)

    def run(self, cache: BatchedCache, rows: list[list[int]], counts: list[int]
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (len(rows), n, vocab) and hidden states (len(rows), n, hidden) of the step over rows
        0..len(rows)-1 of `cache` (`rows[b]`: row b's tokens padded to n, `counts[b]` of them real),
        as `BatchedStep.step` gives them; the cache must hold `shape`'s rows x tokens past every row's
        length in that bucket."""
        top, n = len(rows), len(rows[0])
        shape = self.shape(cache, top, n)
        device = cache.lengths.device
        if shape is None:
            self.eager += 1
            return self.step.step(torch.tensor(rows, device=device), torch.tensor(counts, device=device),
                                  cache.head(top))
        layout = (cache.rows, cache.capacity, cache.keys[0].data_ptr(), cache.lengths.data_ptr())
        if layout != self.layout:  # the tensors the graphs read are gone
            self.graphs, self.layout = {}, layout
        g = self.graphs.get(shape)
        fresh = g is None
        if fresh:
            g = self.graphs[shape] = _Graph(torch.zeros(shape, dtype=torch.long, device=device),
                                            torch.zeros(shape[0], dtype=torch.long, device=device))
        padded = [r + [0] * (shape[1] - n) for r in rows] + [[0] * shape[1]] * (shape[0] - top)
        g.ids.copy_(torch.tensor(padded, device=device))
        g.counts.copy_(torch.tensor(counts + [0] * (shape[0] - top), device=device))
        view = cache.head(shape[0])
        if not self.capture:
            logits, hidden = self.step.step(g.ids, g.counts, view, span=cache.capacity)
            return logits[:top, :n], hidden[:top, :n]
        if fresh:
            return self._capture(g, view, top, n)
        g.graph.replay()
        self.replayed += 1
        return g.logits[:top, :n].clone(), g.hidden[:top, :n].clone()

    def _capture(self, g: _Graph, view: BatchedCache, top: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run this step once for real (on a side stream, as capture asks: it also warms the kernels)
        and capture it; the capture itself runs nothing, so the cache advances once."""
        device = view.lengths.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            logits, hidden = self.step.step(g.ids, g.counts, view, span=view.capacity)
        torch.cuda.current_stream(device).wait_stream(side)
        g.graph = torch.cuda.CUDAGraph()
        # thread_local: the server's request threads may touch the device while this thread captures
        with torch.cuda.graph(g.graph, pool=self.pool, capture_error_mode="thread_local"):
            g.logits, g.hidden = self.step.step(g.ids, g.counts, view, span=view.capacity)
        self.captured += 1
        return logits[:top, :n], hidden[:top, :n]
