"""The cloud's half of speculative decoding for one caption, with no notion of where it runs.

The in-process loops (engine.py, pipelined.py) hold one `CloudSession` per caption next to the
edge; the verifier server (speccap.serving) holds one per open network session. Both run the
same code, so a caption verified over a socket is the caption verified in-process.
"""

from __future__ import annotations

import numpy as np
import torch

from ..models.base import AudioLM
from .cost import Work, timed
from .verify import Rule, Verdict


class CloudSession:
    """The cloud model's session for one caption, opened on the first verification. With `cache` its
    KV cache persists across rounds; without, audio and prefix are re-encoded every round (the
    published implementation's behaviour, kept as the baseline). `rng` (seeded) drives sampling rules."""

    def __init__(self, lm: AudioLM, features: np.ndarray, language: str, rule: Rule, seed: int = 0,
                 cache: bool = True):
        self.lm, self.features, self.language, self.cache = lm, features, language, cache
        self.rule = rule.for_caption()  # a rule that counts within a caption starts afresh
        self.rng = np.random.default_rng(seed)
        self.sess = None
        self.last: torch.Tensor | None = None  # distribution after the last token in its cache
        self.rows: torch.Tensor | None = None  # the last round's rows (for trace collection)
        self.ranks: list[int] = []  # the last round's rank of each draft token under its row
        # the last round's last-layer hidden state of each draft token (when the rule or a trace asks)
        self.hidden: torch.Tensor | None = None
        self.keep_hidden = rule.needs_hidden

    def prefill(self, measure=timed) -> tuple[float, int]:
        """Encode the audio and prompt now (the server does it when a session opens, which also
        checks the features); returns the compute seconds and the positions run."""
        self.sess, dt = measure(self.lm.start, self.features, self.language,
                                work=Work("cloud", self.features.shape[-1], prefill=True))
        self.last = self.sess.prefill_logits
        return dt, self.sess.prompt_len

    def verify(self, sync: list[int], prefix: list[int], draft: list[int], q: list[torch.Tensor] | None, eos: int,
               measure=timed, edge_hidden: list | None = None, csi=None) -> tuple[Verdict, float, int]:
        """One round: ONE forward over `sync` (committed tokens it has not seen) + the draft, the
        rule's verdict, and the cache cropped past the rejected tokens. `prefix` is the whole caption
        before the block (fed instead of `sync` when the cache is not kept). `measure(fn, *args)`
        returns (output, seconds) for each model call. A WISV rule also gets the edge's hidden states
        of the draft and the channel state `csi`. Returns the verdict, the compute seconds and the
        token positions the model ran over."""
        rows, spent, positions = self.forward(sync, prefix, draft, measure)
        return self.judge(draft, q, eos, edge_hidden, csi), spent, positions

    def forward(self, sync: list[int], prefix: list[int], draft: list[int], measure=timed):
        """A round's first half: the forward, leaving `rows` (row i scores draft token i) and `hidden`.
        Returns (rows, compute seconds, positions). The verifier server stops here when WISV must ask
        the edge for hidden states first (the selective protocol), and concludes on the answer."""
        spent, positions = 0.0, 0
        if self.sess is None or not self.cache:
            dt, n = self.prefill(measure)
            spent += dt
            positions += n
            if not self.cache:
                sync = prefix  # a fresh cache needs the whole caption so far again
        fed = list(sync) + list(draft)
        # the ranks of the fed tokens come with the forward (a batching executor ranks a step's
        # verifications at once): what the rank rules read of the rows
        out, dt = measure(self.sess.extend, fed, self.keep_hidden, None, self.last,
                          work=Work("cloud", len(fed), self.sess.length))
        spent += dt
        positions += len(sync) + len(draft)
        rows = torch.cat([self.last[None], out.logits])[len(sync):]  # row i scores draft token i
        self.rows = rows
        self.ranks = out.ranks[len(sync):]
        self.hidden = out.hidden[len(sync):] if self.keep_hidden else None  # state after reading draft token i
        return rows, spent, positions

    def judge(self, draft: list[int], q: list[torch.Tensor] | None, eos: int, edge_hidden: list | None = None,
              csi=None) -> Verdict:
        """A round's second half: the rule's verdict on the last forward's rows (WISV's with the
        edge's hidden states and the channel state), and the cache cropped past the rejected tokens.
        The verifier server calls it when WISV's hidden states arrive after its question."""
        if self.rule.needs_hidden:
            verdict = self.rule.verify_hidden(list(draft), self.rows, edge_hidden, self.hidden, csi, eos)
        else:
            verdict = self.rule.verify(list(draft), self.rows, q or None, eos, self.rng, self.ranks)
        self.sess.rollback(len(draft) - verdict.accepted)
        self.last = self.rows[verdict.accepted]
        return verdict
