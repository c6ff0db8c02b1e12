"""Plain autoregressive captioning on one model, greedy or sampled: `autoregress` is the one token
loop every single-model caption runs through (edge-only and cloud-only on the clock, `generate`,
the traces' and shadow labels' continuations, the edge's trajectory); each caller brings what it
feeds and books around it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from .base import AudioLM, Run


@dataclass
class Generation:
    caption: str
    token_ids: list[int]
    prefill_seconds: float
    decode_seconds: float
    token_seconds: list[float] = field(default_factory=list)  # wall time until each token was known

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


def pick(logits: torch.Tensor, temperature: float, rng: np.random.Generator | None) -> int:
    """Greedy at temperature 0, else a sample from softmax(logits / T) drawn with `rng`."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    return draw(torch.softmax(logits.double() / temperature, dim=-1), rng)


def draw(law: np.ndarray | torch.Tensor, rng: np.random.Generator) -> int:
    """A token drawn from `law` (weights >= 0, normalised here) with `rng`: the token
    `rng.choice(len(law), p=law / law.sum())` draws, from the same uniform number, without its checks
    of p, which took half the time of a sampled token's draw (a softmax or a lattice is a law)."""
    law = law.cpu().numpy() if isinstance(law, torch.Tensor) else law  # (a GPU's softmax: drawn here)
    return draw_from(cdfs(np.asarray(law)[None])[0], rng)


def cdfs(laws: np.ndarray) -> np.ndarray:
    """The cumulative distribution `draw` draws from, of each row of (k, V) `laws`, in one operation
    for all rows (a sampling edge's are computed once per step for every drafting loop): each row
    the bits it gets alone (a row's sum and running sum are the same along a row as of it alone)."""
    cdf = np.cumsum(laws / laws.sum(axis=1, keepdims=True), axis=1, dtype=np.float64)
    cdf /= cdf[:, -1:]
    return cdf


def draw_from(cdf: np.ndarray, rng: np.random.Generator) -> int:
    """The token `draw` gives for the law whose `cdfs` row is `cdf`."""
    return int(cdf.searchsorted(rng.random(), side="right"))


def greedy(logits: torch.Tensor) -> int:
    return int(logits.argmax())


def greedy_tokens(rows: torch.Tensor) -> list[int]:
    """The greedy token of each row of (k, V) logits (the first maximum, as `greedy` takes it): what
    a greedy loop asks its extension to summarize (models.base.Session.extend), so a batch of them
    takes one argmax per step instead of one per caption."""
    return rows.argmax(-1).tolist()


def autoregress(logits: torch.Tensor, feed: Callable[[int], torch.Tensor], eos: int, limit: int,
                choose: Callable[[torch.Tensor], int] = greedy,
                seen: Callable[[int, int, torch.Tensor], None] | None = None) -> list[int]:
    """The tokens written after `logits` (the next-token logits of what the model has read), at most
    `limit`: `choose(logits)` picks each; `seen(i, token, logits)` sees the i-th pick, the end token
    included, before it is fed; `feed(token)` feeds it and returns the next logits (or whatever else
    its `choose` reads: the extension's whole output, when the pick was asked of the extension). The
    end token is neither kept nor fed, and neither is the limit's last token fed: nothing would read
    its logits."""
    ids: list[int] = []
    while len(ids) < limit:
        tok = choose(logits)
        if seen is not None:
            seen(len(ids), tok, logits)
        if tok == eos:
            break
        ids.append(tok)
        if len(ids) == limit:
            break
        logits = feed(tok)
    return ids


def greedy_run(first: int, run: Callable[..., Run], eos: int, limit: int,
               seen: Callable[[int, int], None]) -> list[int]:
    """`autoregress`'s greedy caption after the first token `first`, its forwards asked as ONE run:
    `run(ids, steps, stop, before)` feeds `ids` and then the token each forward's summary gives
    (`Session.extend_run` with `greedy_tokens`), calling `before(run, j)` ahead of forward j's
    bookkeeping; `seen(i, token)` sees each pick in autoregress's order (the end token included;
    forward j comes after seen(j))."""
    if limit <= 0:
        return []
    if first == eos or limit == 1:
        seen(0, first)
        return [] if first == eos else [first]

    def token(made: Run, j: int) -> int:
        return first if j == 0 else made.summaries[j - 1]
    made = run([first], limit - 1, eos, lambda made, j: seen(j, token(made, j)))
    last = made.summaries[-1]
    seen(made.forwards, last)
    return [first] + made.summaries[:-1] + ([] if last == eos else [last])


def continue_greedy(lm: AudioLM, mel: np.ndarray, language: str, prefix: list[int], max_new_tokens: int) -> list[int]:
    """The caption `lm` writes greedily after `prefix` (prefix included), `max_new_tokens` in all."""
    sess = lm.start(lm.wire(mel), language)
    logits = sess.extend(list(prefix)).logits[-1] if prefix else sess.prefill_logits
    return list(prefix) + autoregress(logits, lambda tok: sess.extend([tok]).logits[-1], lm.eos_token_id,
                                      max_new_tokens - len(prefix))


def generate(lm: AudioLM, features: np.ndarray, language: str, max_new_tokens: int = 128,
             temperature: float = 0.0, seed: int = 0) -> Generation:
    rng = np.random.default_rng(seed) if temperature > 0 else None
    t0 = time.perf_counter()
    session = lm.start(lm.wire(features), language)
    t_prefill = time.perf_counter() - t0
    stamps: list[float] = []
    ids = autoregress(session.prefill_logits, lambda tok: session.extend([tok]).logits[-1], lm.eos_token_id,
                      max_new_tokens, lambda logits: pick(logits, temperature, rng),
                      lambda i, tok, logits: stamps.append(time.perf_counter() - t0))
    total = time.perf_counter() - t0
    return Generation(lm.decode(ids), ids, t_prefill, total - t_prefill, stamps)
