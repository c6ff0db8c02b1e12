"""The `AudioLM` interface the decoding engine talks to.

A model starts a `Session` per caption from audio features (prefill of audio + prompt). The
session holds the KV cache: `extend(ids)` runs ONE forward over new tokens and returns the
next-token logits after each of them (and the last-layer hidden states on request);
`rollback(n)` drops the last n tokens from the cache. Logits are truncated to `vocab_limit`
so that an edge / cloud pair compares distributions over the vocabulary they share.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..data.uplink import Uplink
from .learned_uplink import LearnedUplink

# a per-row function over (k, V) logits (see Session.extend)
Summarize = Callable[[torch.Tensor], list]


@dataclass
class StepOutput:
    # (n, V) float32: logits[i] is the distribution of the token AFTER the i-th input token
    logits: torch.Tensor
    # (n, H) float32 last-layer hidden states, when asked for
    hidden: torch.Tensor | None = None
    # what the caller's `summarize` made of the last position's logits, when asked for
    summary: object = None
    # with `rank_after` (a verification): ranks[i], the rank of input token i under the row before it
    # (`rank_after` for the first)
    ranks: list[int] | None = None


def fed_ranks(before: list[torch.Tensor], logits: list[torch.Tensor], fed: list[list[int]]) -> list[list[int]]:
    """For each (row before, (n, V) logits after each of `fed`'s n tokens): the rank of each fed token
    under the row before it (1 + the tokens scored strictly higher), in one pass over all of them: a
    batching executor ranks a step's verifications at once. Counts are exact, so each gets what it
    gets alone."""
    rows = torch.cat([r for b, x in zip(before, logits) for r in (b[None], x)])
    scored = [t for ids in fed for t in (*ids, 0)]  # each row's next fed token (none after the last: 0)
    own = rows.gather(1, torch.tensor(scored, device=rows.device)[:, None])
    ranks = ((rows > own).sum(1) + 1).tolist()
    out, at = [], 0
    for ids in fed:
        out.append(ranks[at:at + len(ids)])
        at += len(ids) + 1
    return out


@dataclass
class Run:
    """What a run (`Session.extend_run`) made: one forward for the ids it was given, then one for
    each token chosen from a forward's summary."""

    summaries: list  # of each forward's last position
    # the token chosen from each forward's summary while the run went on: tokens[j] was fed by forward
    # j + 1, or is the stop token that ended the run (never fed); none from the last forward of a
    # run that ran all its steps (a sampling edge draws that one when it drafts it)
    tokens: list[int]
    logits: torch.Tensor  # (V,) the last forward's last position: the next-token logits after the run
    hidden: list[torch.Tensor] | None = None  # (H,) float32 each forward's last hidden state, when asked for

    @property
    def forwards(self) -> int:
        return len(self.summaries)

    def goes_on(self, summary, hidden: torch.Tensor | None, choose: Callable[[object], int], steps: int,
                stop: int) -> bool:
        """A forward of the run is done (`summary` of its last position, its `hidden` states): keep
        them; True while the run goes on, its next token `tokens[-1]`."""
        self.summaries.append(summary)
        if self.hidden is not None:
            self.hidden.append(hidden[-1])
        if len(self.summaries) == steps:
            return False
        self.tokens.append(choose(summary))
        return self.tokens[-1] != stop


def summary_token(summary) -> int:
    """The token a greedy summary gives: the summary itself (models.generate.greedy_tokens) or its
    `token` (decoding.stats.greedy_stats)."""
    return summary if isinstance(summary, int) else summary.token


class Session(ABC):
    """The KV-cached state of one caption on one model."""

    prefill_logits: torch.Tensor  # (V,) distribution of the first caption token
    # (H,) float32 last-layer hidden state at the prompt's last position; None unless start(hidden=True)
    prefill_hidden: torch.Tensor | None
    prompt_len: int  # positions the prefill covered (prompt and audio placeholders)
    # what the start's `summarize` made of `prefill_logits` (see extend), when it was given one
    prefill_summary: object = None

    @property
    @abstractmethod
    def length(self) -> int:
        """Caption tokens in the cache (the prompt not counted)."""

    @abstractmethod
    def extend(self, token_ids: list[int], return_hidden: bool = False,
               summarize: Summarize | None = None, rank_after: torch.Tensor | None = None) -> StepOutput:
        """`summarize`: a function of (k, V) logits rows giving one result per row, applied to the
        last position's logits (`StepOutput.summary`). A batching executor calls it once for all the
        rows of a step that ask with the same function, so per-token work (a drafted token's
        statistics) is one tensor operation per step, not one per caption; it must therefore give
        each row what it gives that row alone. `rank_after`, the (V,) row before the first token (a
        verification's: the cache's last distribution): rank every token fed under the row before it
        (`StepOutput.ranks`; `fed_ranks`, once per step for a batch)."""

    def extend_run(self, token_ids: list[int], summarize: Summarize, steps: int, stop: int,
                   return_hidden: bool = False, choose: Callable[[object], int] = summary_token) -> Run:
        """Extend by `token_ids`, then by the token `choose` picks from each forward's summary (the
        greedy token, `summary_token`, or a sampling edge's draw), until `steps` forwards ran or the
        token picked is `stop` (never fed): a draft or a caption in one call. A batching executor
        continues the run at each of its steps without returning to the caller, so the caller's
        per-token work is done once per run."""
        if steps < 1:
            raise ValueError(f"a run needs at least one forward, got steps={steps}")
        run = Run([], [], None, [] if return_hidden else None)
        ids = list(token_ids)
        while True:
            out = self.extend(ids, return_hidden, summarize)
            if not run.goes_on(out.summary, out.hidden, choose, steps, stop):
                run.logits = out.logits[-1]
                return run
            ids = [run.tokens[-1]]

    @abstractmethod
    def rollback(self, n: int) -> None:
        ...


class AudioLM(ABC):
    name: str
    vocab_limit: int | None = None  # truncate logits to the vocabulary an edge/cloud pair shares
    # what this model reads in place of the clip's log-mel, computed on the edge (a cloud trained on a
    # coarser uplink carries it from its checkpoint; every other model reads the log-mel itself)
    uplink: Uplink | LearnedUplink = Uplink()
    # what an edge sends its cloud through when it computes it itself (a networked edge): a learned
    # uplink's encoder shipped with the edge model; the log-mel otherwise
    sends: Uplink | LearnedUplink = Uplink()

    @property
    @abstractmethod
    def tokenizer(self):
        ...

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Logit width after truncation."""

    @property
    @abstractmethod
    def eos_token_id(self) -> int:
        ...

    @property
    @abstractmethod
    def device(self) -> torch.device:
        ...

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype:
        ...

    @abstractmethod
    def start(self, features: np.ndarray, language: str, hidden: bool = False,
              summarize: Summarize | None = None) -> Session:
        """Prefill audio features (n_mels, frames) and the prompt for `language`; with `hidden`, keep
        the last-layer state at the prompt's last position (`prefill_hidden`); with `summarize`,
        summarize the first token's logits as `Session.extend` does its last position's
        (`prefill_summary`: a batching executor does it for the step's starts at once)."""

    def wire(self, features: np.ndarray) -> np.ndarray:
        """What the edge sends this model for a clip's log-mel: the input of `start`."""
        return self.uplink.encode(features)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)


def shared_vocab(a: AudioLM, b: AudioLM) -> int:
    """Restrict both models to the vocabulary they share (Qwen sizes differ only by padding rows)."""
    n = min(a.vocab_size, b.vocab_size)
    a.vocab_limit = b.vocab_limit = n
    return n
