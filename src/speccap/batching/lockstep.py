"""The batching executor: up to B caption loops at once, their model calls packed into one forward
per model per step.

The loops (edge-only, cloud-only, the blocking loop with block and token gates, the pipelined loop,
WISV, Q-S, the oracle, trace collection) are plain code that calls its models' sessions. Here each
loop runs in a greenlet of its own on models whose sessions are rows of a shared `RowPool`: an
extension hands its tokens to the executor and waits; when every running loop waits, the executor
runs one forward per model over all their requests and resumes each loop with its own rows, in the
order the loops started. A session's start is a request too: the clips starting in a step share
one prefill forward (audio encoder and prompt). A loop therefore asks for model work and receives
its result, written once for both executors: called directly, it is the single executor (`speccap
caption`, a stage with batch 1); through `Lockstep.map`, the batching one. A rollback changes a
row's length and needs no forward.

Which requests meet in a step depends only on the jobs and B, never on timing, so a batched run
decodes the same way every time. Its clocks cannot be measured (a caption's forwards are shared), so
a batched run charges every model call by a cost model (decoding.cost): callers pass one.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch
from greenlet import getcurrent, greenlet

from ..models.base import AudioLM, Run, Session, StepOutput, Summarize, fed_ranks, summary_token
from .row_pool import Prefilled, RowPool, batchable
from .step_graphs import Invariant


class _Ask:
    """A loop's pending extension: tokens for a row of a pool, what to make of the last position's
    logits (`summarize`, see Session.extend), if anything, and the row to rank the tokens after
    (`rank_after`, a verification's), if any. A run's ask
    (`Session.extend_run`: `steps` set) is asked again in place at the next step with the token
    its summary gave (`follow`), until the run ends: the loop resumes once per run."""

    __slots__ = ("pool", "row", "ids", "summarize", "rank_after", "steps", "stop", "choose", "made")

    def __init__(self, pool: RowPool, row: int, ids: list[int], summarize: Summarize | None = None,
                 rank_after: torch.Tensor | None = None, steps: int | None = None, stop: int = -1,
                 hidden: bool = False, choose: Callable[[object], int] = summary_token):
        self.pool, self.row, self.ids, self.summarize, self.rank_after = pool, row, ids, summarize, rank_after
        self.steps, self.stop, self.choose = steps, stop, choose
        self.made = None if steps is None else Run([], [], None, [] if hidden else None)  # a run's, so far

    def follow(self, out: tuple) -> bool:
        """A run's forward is done (`out`: its logits, hidden states and summary): keep what the run
        returns of it; True while the run goes on (its next token is asked in place)."""
        logits, hidden, summary, _ = out
        # copies: the step's outputs are views of the whole batch's
        kept = hidden[-1:].clone().float() if self.made.hidden is not None else None
        if self.made.goes_on(summary, kept, self.choose, self.steps, self.stop):
            self.ids = [self.made.tokens[-1]]
            return True
        self.made.logits = logits[-1].clone()
        return False

    @staticmethod
    def run(pool: RowPool, asks: list[_Ask]) -> list:
        """(logits, hidden, summary, ranks or None) for each ask: one forward, then one
        `summarize` call per function over the last positions of every row that asked with it, and
        one ranking (`fed_ranks`) of every ask's tokens that asked for it."""
        outs = pool.run([(a.row, a.ids) for a in asks])
        made = _summaries(pool, [a.summarize for a in asks], [logits[-1] for logits, _ in outs])
        ranked: list = [None] * len(asks)
        verifying = [i for i, a in enumerate(asks) if a.rank_after is not None]
        if verifying:
            t0 = time.perf_counter()
            each = fed_ranks([asks[i].rank_after for i in verifying], [outs[i][0] for i in verifying],
                             [asks[i].ids for i in verifying])
            for i, r in zip(verifying, each):
                ranked[i] = r
            pool.seconds["summary"] += time.perf_counter() - t0
        return [(logits, hidden, summary, r) for (logits, hidden), summary, r in zip(outs, made, ranked)]


def _summaries(pool: RowPool, fns: list[Summarize | None], rows: list[torch.Tensor]) -> list:
    """fns[i](rows[i]) for each row whose function is given (None for the others): one call per
    function over all the rows that ask with it."""
    made: list = [None] * len(rows)
    by_fn: dict[Summarize, list[int]] = {}
    for i, fn in enumerate(fns):
        if fn is not None:
            by_fn.setdefault(fn, []).append(i)
    if not by_fn:
        return made
    t0 = time.perf_counter()
    for fn, idx in by_fn.items():
        last = torch.stack([rows[i] for i in idx])
        if pool.invariant is not None:  # a reduction's order follows its shape: one shape for any batch
            last = torch.cat([last, last.new_zeros((pool.rows - len(idx), last.shape[1]))])
        for i, summary in zip(idx, fn(last)):
            made[i] = summary
    pool.seconds["summary"] += time.perf_counter() - t0
    return made


class _Start:
    """A loop's pending session start: a clip's features for a pool's prefill, and what to make of
    the first token's logits (`summarize`), if anything."""

    __slots__ = ("pool", "features", "language", "hidden", "summarize")

    def __init__(self, pool: RowPool, features: np.ndarray, language: str, hidden: bool,
                 summarize: Summarize | None = None):
        self.pool, self.features, self.language, self.hidden = pool, features, language, hidden
        self.summarize = summarize

    @staticmethod
    def run(pool: RowPool, asks: list[_Start]) -> list:
        starts = pool.prefill([(a.features, a.language, a.hidden) for a in asks])
        made = _summaries(pool, [a.summarize for a in asks], [start.prefill_logits for start in starts])
        return [(start, summary) for start, summary in zip(starts, made)]


class _Score:
    """A loop's pending gate scoring: feature rows for a gate's model (`token_scores`)."""

    __slots__ = ("pool", "rows")

    def __init__(self, model, rows: np.ndarray):
        self.pool, self.rows = model, rows

    @staticmethod
    def run(model, asks: list[_Score]) -> list[np.ndarray]:
        """Every ask's scores from ONE call over all their rows."""
        scores = model.token_scores(np.concatenate([a.rows for a in asks]))
        return np.split(scores, np.cumsum([len(a.rows) for a in asks])[:-1])


class SteppedScorer:
    """A gate's model whose scoring goes through `executor.ask`: the rows the loops ask for in a
    step are scored in one call. Anything else is the model's own."""

    def __init__(self, model, executor: Lockstep):
        self.model, self.executor = model, executor

    def __getattr__(self, name):
        return getattr(self.model, name)

    def token_scores(self, x: np.ndarray) -> np.ndarray:
        return self.executor.ask(_Score(self.model, np.asarray(x, dtype=np.float32)))


class Lockstep:
    """Runs jobs `batch` at a time (`map`), on the models `wrap` returns; `graphs` and `invariant`
    as RowPool's."""

    def __init__(self, batch: int, graphs: bool | None = None, invariant: Invariant | None = None):
        if batch < 1:
            raise ValueError(f"the batch must be at least 1 caption, got {batch}")
        self.batch, self.graphs, self.invariant = batch, graphs, invariant
        self.hub: greenlet | None = None  # the greenlet running `map`, while it runs
        self.pools: list[RowPool] = []

    def wrap(self, lm: AudioLM) -> AudioLM:
        """`lm` with its sessions as rows of a pool stepped by this executor; a model whose sessions
        cannot share a step is returned as it is (its forwards then run one at a time)."""
        return stepped(lm, self, self.batch, self.pools, self.graphs, self.invariant, compact="bitwise")

    def scorer(self, model):
        """`model` (a gate's) scoring with the other loops' rows in one call per step, where that
        gives every row the bits it gets alone (`model.exact_in_batch`); else `model` as it is."""
        return SteppedScorer(model, self) if getattr(model, "exact_in_batch", False) else model

    def ask(self, ask: _Ask | _Start | _Score):
        """A loop's model call: parks the loop until the next step (outside `map`, runs at once)."""
        if self.hub is None or getcurrent() is self.hub:
            while (out := settled(ask, ask.run(ask.pool, [ask])[0])) is GOES_ON:
                pass
            return out
        return self.hub.switch(ask)  # a failed call is thrown in here (map)

    def map(self, fn: Callable, jobs: Iterable) -> Iterator:
        """fn(job) for every job, `batch` loops at a time; yields each result as its loop ends (the
        order is the same on every run). A job that raises stops the batch with its exception, as
        it would stop a loop over the jobs one at a time."""
        if self.hub is not None:
            raise RuntimeError("this executor is already running a batch")
        self.hub = getcurrent()
        queue = deque(jobs)
        live: list[tuple[greenlet, _Ask | _Start | _Score]] = []  # each running loop and its pending call
        try:
            while queue or live:
                while queue and len(live) < self.batch:  # a finished loop's place goes to the next job
                    g = greenlet(fn)
                    out = g.switch(queue.popleft())
                    if g.dead:
                        yield out
                    else:
                        live.append((g, out))
                if not live:
                    continue
                live, ended = _step(live)
                yield from ended
        finally:
            self.hub = None


def _step(live: list[tuple[greenlet, object]]) -> tuple[list, list]:
    """One step of the running loops: one forward per model over their calls, then, while some
    wait on a gate's scoring, those scored (one call per gate model) and resumed: scoring is no
    model work, so every loop meets the others at the next forward as if it had scored alone.
    Returns the loops still running with their next calls, and the results of those that ended,
    in the loops' order."""
    pending: list = list(live)
    ended = []
    now = range(len(live))
    while now:
        results = step_all([pending[k][1] for k in now])
        for k, res in zip(now, results):
            g, ask = pending[k]
            if isinstance(res, Exception):  # a call that failed raises inside its loop, where its own handling sees it
                out = g.throw(res)
            elif (res := settled(ask, res)) is GOES_ON:  # a run goes on at the next step, without its loop
                continue
            else:
                out = g.switch(res)
            pending[k] = None if g.dead else (g, out)
            if g.dead:
                ended.append((k, out))
        now = [k for k, p in enumerate(pending) if p is not None and isinstance(p[1], _Score)]
    return [p for p in pending if p is not None], [out for _, out in sorted(ended, key=lambda e: e[0])]


# what `settled` says of a run that goes on
GOES_ON = object()


def settled(ask, out):
    """What the caller of `ask` gets for `out`, the result of its forward: `out` itself, or for a
    run (`Session.extend_run`) the whole run once it ended; `GOES_ON` while it goes on (its next
    token asked in place at the next step, the caller not resumed)."""
    if isinstance(ask, _Ask) and ask.steps is not None:
        return GOES_ON if ask.follow(out) else ask.made
    return out


def step_all(asks: list[_Ask | _Start | _Score]) -> list:
    """One forward per pool and kind of call over `asks` (at most one per row); each one's result,
    in order, or the exception its call raised: a forward that fails runs again call by call, so
    one caption's bad input fails that caption only (a failed forward changes no row's length)."""
    results: list = [None] * len(asks)
    groups: dict[tuple[int, type], list[int]] = {}
    for i, ask in enumerate(asks):
        groups.setdefault((id(ask.pool), type(ask)), []).append(i)
    for (_, kind), idx in groups.items():
        group = [asks[i] for i in idx]
        try:
            outs = kind.run(group[0].pool, group)
        except Exception as exc:  # noqa: BLE001 - handed to the loop that asked, as a call alone would raise
            outs = [exc] if len(group) == 1 else step_all_alone(group)
        for i, out in zip(idx, outs):
            results[i] = out
    return results


def step_all_alone(asks: list[_Ask | _Start | _Score]) -> list:
    """Each call in a forward of its own: its result, or the exception it raised."""
    outs = []
    for ask in asks:
        try:
            outs.append(ask.run(ask.pool, [ask])[0])
        except Exception as exc:  # noqa: BLE001 - handed to the loop that asked
            outs.append(exc)
    return outs


def stepped(lm: AudioLM, executor, rows: int, pools: list[RowPool], graphs: bool | None = None,
            invariant: Invariant | None = None, compact: str = "off") -> AudioLM:
    """`lm` with its sessions as rows of a new pool (`rows` to start with, added to `pools`, stepping
    with `graphs`, `invariant` and `compact` as RowPool's) whose calls go through `executor.ask`; a
    model whose sessions cannot share a step, as it is."""
    if not batchable(lm):
        return lm
    pool = RowPool(lm, rows, graphs, invariant, compact)
    pools.append(pool)
    return SteppedLM(lm, pool, executor)


def decode_all(edge: AudioLM, cloud: AudioLM, fn: Callable, jobs: list, batch: int,
               graphs: bool | None = None, invariant: Invariant | None = None) -> list:
    """[fn(edge, cloud, job) for job in jobs], `batch` jobs at a time through a `Lockstep` stepping
    with `graphs` and `invariant` (batch 1 without `invariant`: one at a time, on the models
    themselves); in the jobs' order."""
    if batch <= 1 and invariant is None:
        return [fn(edge, cloud, job) for job in jobs]
    ex = Lockstep(batch, graphs, invariant)
    e, c = ex.wrap(edge), ex.wrap(cloud)
    out = dict(ex.map(lambda ij: (ij[0], fn(e, c, ij[1])), list(enumerate(jobs))))
    return [out[i] for i in range(len(jobs))]


class SteppedLM(AudioLM):
    """An `AudioLM` whose sessions are rows of `pool`, started and extended through `executor`
    (a `Lockstep`, or the server's `gather.Gather`)."""

    def __init__(self, lm: AudioLM, pool: RowPool, executor):
        self.lm, self.pool, self.executor = lm, pool, executor
        self.name = lm.name

    def __getattr__(self, name):  # anything else is the model's own (tests read e.g. `.model`)
        return getattr(self.lm, name)

    @property
    def vocab_limit(self):
        return self.lm.vocab_limit

    @property
    def uplink(self):
        return self.lm.uplink

    @property
    def tokenizer(self):
        return self.lm.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.lm.vocab_size

    @property
    def eos_token_id(self) -> int:
        return self.lm.eos_token_id

    @property
    def device(self) -> torch.device:
        return self.lm.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm.dtype

    def start(self, features: np.ndarray, language: str, hidden: bool = False,
              summarize: Summarize | None = None) -> Session:
        return SteppedSession(self, *self.executor.ask(_Start(self.pool, features, language, hidden, summarize)))


class SteppedSession(Session):
    """A session in a row of its model's pool; the row is freed with the session."""

    def __init__(self, owner: SteppedLM, start: Prefilled, summary=None):
        self.lm, self.pool, self.executor = owner.lm, owner.pool, owner.executor
        self.prefill_summary = summary
        self.row, self.blocked = start.row, start.blocked
        self.prefill_logits, self.prefill_hidden = start.prefill_logits, start.prefill_hidden
        self.prompt_len = start.prompt_len
        weakref.finalize(self, self.pool.release, self.row)

    @property
    def length(self) -> int:
        return self.pool.length(self.row) - self.prompt_len

    def extend(self, token_ids: list[int], return_hidden: bool = False,
               summarize: Summarize | None = None, rank_after: torch.Tensor | None = None) -> StepOutput:
        if not token_ids:
            raise ValueError("extend() needs at least one token")
        logits, hidden, summary, ranked = self.executor.ask(_Ask(self.pool, self.row, list(token_ids), summarize,
                                                                 rank_after))
        return StepOutput(logits.clone(), hidden.clone().float() if return_hidden else None, summary, ranked)

    def extend_run(self, token_ids: list[int], summarize: Summarize, steps: int, stop: int,
                   return_hidden: bool = False, choose: Callable[[object], int] = summary_token) -> Run:
        if not token_ids:
            raise ValueError("extend_run() needs at least one token")
        if steps < 1:
            raise ValueError(f"a run needs at least one forward, got steps={steps}")
        return self.executor.ask(_Ask(self.pool, self.row, list(token_ids), summarize, None, steps, stop, return_hidden,
                                      choose))

    def rollback(self, n: int) -> None:
        if n < 0 or n > self.length:
            raise ValueError(f"cannot roll back {n} tokens: the session holds {self.length} caption tokens")
        self.pool.rollback(self.row, n)
