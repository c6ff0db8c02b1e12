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

Batch invariance (`Invariant`). On a GPU a row's logits can depend on the batch it was stepped in:
the kernels a matrix product or an attention runs, and the order they sum in, are chosen by the
shape, and the shape follows how many rows ask and how long the longest is. A caption then depends
on which captions shared its steps (in bfloat16 a batched row's argmax disagreed with its own
sequence's in 12% of rows, reports/batched_step_cuda_7b.md). Under `Invariant(rows, span)` every
step runs at one shape whatever asks: all `rows` rows, `MAX_TOKENS` tokens each (a wider request as
successive steps of `MAX_TOKENS`), attention over `span` slots; and each clip is prefilled alone.
What a row computes then depends on its own tokens only, so a caption is the same in a batch of
32, of 1, or beside any other captions; the price is the padding a full-width step computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batched_step import BatchedCache, BatchedStep

# tokens one row asks in a step at most for a graph: drafts and verifications are short
MAX_TOKENS = 16


def _bucket(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True)
class Invariant:
    """Batch-invariant stepping (module docstring): every step over `rows` rows of `span` slots."""
    rows: int  # rows of the pool: at least the batch, and the same for every run meant to agree
    span: int  # slots per row: the longest prompt + the longest caption + MAX_TOKENS

    def __post_init__(self):
        if self.rows < 1 or self.span < MAX_TOKENS:
            raise ValueError(f"batch-invariant stepping needs at least 1 row and {MAX_TOKENS} slots, got "
                             f"{self.rows} rows and {self.span} slots")

    @classmethod
    def covering(cls, rows: int, longest_prompt: int, max_new_tokens: int) -> Invariant:
        """Room for a caption of `max_new_tokens` after a prompt of `longest_prompt` positions, with
        the last step's padding."""
        return cls(rows, longest_prompt + max_new_tokens + 2 * MAX_TOKENS)


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

    def __init__(self, step: BatchedStep, capture: bool, fixed: bool = False):
        self.step, self.capture = step, capture
        self.fixed = fixed  # one shape for every step: all rows, MAX_TOKENS tokens (Invariant)
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.layout: tuple | None = None
        self.pool = torch.cuda.graph_pool_handle() if capture else None  # one memory pool for every shape
        self.captured = 0  # graphs captured (a new layout captures its shapes again)
        self.replayed = 0
        self.eager = 0  # steps wider than MAX_TOKENS

    def shape(self, cache: BatchedCache, top: int, n: int) -> tuple[int, int] | None:
        """(rows, tokens) a step of rows 0..top-1 asking up to `n` tokens runs at (fixed: the tokens
        its steps of MAX_TOKENS write); None: eagerly."""
        if self.fixed:
            return cache.rows, -(-n // MAX_TOKENS) * MAX_TOKENS
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
        if self.fixed and n > MAX_TOKENS:  # the one shape, step after step: causal attention makes it one step
            parts = [self.run(cache, [r[c: c + MAX_TOKENS] for r in rows],
                              [min(max(k - c, 0), MAX_TOKENS) for k in counts]) for c in range(0, n, MAX_TOKENS)]
            return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)
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
