"""A clock that does not depend on the machine's load: each model call charged by a cost function of
(model, positions run, positions cached), fitted to timed single-sequence calls.

Measured compute moves with whatever else runs on the machine, and the loops that decide by time
(the pipelined loop's draft-ahead rule, adaptive Q-S) then decide differently from run to run.
Charged by a fitted model instead, every clock of a caption is a function of its calls alone: the
same calls, the same times, on any load. The fit is calibrated once on the machine (`calibrate`),
kept as JSON, and read back by every run that should agree.

    prefill seconds = a + b * audio frames                    (the audio encoder and the prompt)
    extend seconds  = a + b * new + c * new * (cached + new)  (per-call overhead, per-token work,
                                                               attention over the cache)

Coefficients are fitted by non-negative least squares, so no term ever gives a call negative time.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy.optimize import nnls

ROLES = ("edge", "cloud")


class Work(NamedTuple):
    """One model call as the cost model sees it (a tuple: a caption makes one per forward, and the
    cost model keys its charges by it)."""

    role: str  # "edge" or "cloud"
    new: int  # audio frames for a prefill, tokens for an extend
    cached: int = 0  # positions in the cache before the call (prompt included)
    prefill: bool = False


def _features(w: Work) -> list[float]:
    if w.prefill:
        return [1.0, float(w.new)]
    return [1.0, float(w.new), float(w.new * (w.cached + w.new))]


class CostModel:
    """Seconds per model call; `coef[role]["prefill" | "extend"]`: the coefficients of `_features`."""

    def __init__(self, coef: dict[str, dict[str, list[float]]]):
        self.coef = coef
        # each call's charge, computed once: a caption charges the same few shapes of call again and
        # again, and a dot product's setup costs more than the lookup
        self._charged: dict[Work, float] = {}

    # two models with the same coefficients are one (a decoder spec holding either is the same spec);
    # unpickled in a worker, a model is that process's shared one, its charges cached there
    def _key(self) -> tuple:
        return tuple((role, tuple(c["prefill"]), tuple(c["extend"])) for role, c in sorted(self.coef.items()))

    def __eq__(self, other) -> bool:
        return isinstance(other, CostModel) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self):
        return _shared, (CostModel, self._key())

    def seconds(self, w: Work) -> float:
        s = self._charged.get(w)
        if s is None:
            c = self.coef[w.role]["prefill" if w.prefill else "extend"]
            s = self._charged[w] = float(np.dot(c, _features(w)))
        return s

    @classmethod
    def fit(cls, samples: list[tuple[Work, float]]) -> CostModel:
        coef: dict[str, dict[str, list[float]]] = {}
        for role in sorted({w.role for w, _ in samples}):
            for kind, prefill in (("prefill", True), ("extend", False)):
                rows = [(w, t) for w, t in samples if w.role == role and w.prefill == prefill]
                if not rows:
                    raise ValueError(f"cost model: no timed {kind} calls of the {role} model to fit")
                x = np.array([_features(w) for w, _ in rows])
                y = np.array([t for _, t in rows])
                coef.setdefault(role, {})[kind] = nnls(x, y)[0].tolist()
        return cls(coef)

    def to_json(self) -> dict:
        return {"form": {"prefill": "a + b*frames", "extend": "a + b*new + c*new*(cached+new)"}, "coef": self.coef}

    @classmethod
    def from_params(cls, cost) -> CostModel | None:
        """params' `decode.cost` (None: the measured clock)."""
        if cost is None:
            return None
        return _shared(cls, tuple((role, tuple(getattr(cost, role).prefill), tuple(getattr(cost, role).extend))
                                  for role in ROLES))

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"cost model {path} does not exist (calibrate one: benchmarks/cost_model.py)")
        data = json.loads(path.read_text())
        missing = [r for r in ROLES if r not in data.get("coef", {})]
        if missing:
            raise ValueError(f"cost model {path}: no coefficients for {', '.join(missing)}")
        return cls(data["coef"])


@functools.lru_cache(maxsize=8)
def _shared(cls, coef: tuple) -> CostModel:
    """One model per set of coefficients: every caption of a run reads the same params, so they
    share one (and its charges computed so far)."""
    return cls({role: {"prefill": list(prefill), "extend": list(extend)} for role, prefill, extend in coef})


def timed(fn, *args, work: Work | None = None):
    """Run fn(*args); return (output, wall seconds). (`work`: what a charging clock would read.)"""
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def calibrate(models: dict, clips: list[tuple[np.ndarray, str]], sizes=(1, 2, 4, 8), steps: int = 4,
              step_len: int = 16, repeats: int = 3) -> tuple[CostModel, list[tuple[Work, float]]]:
    """Time single-sequence calls of each model (`models`: role -> AudioLM) on `clips` ((log-mel,
    language)): the prefill, then extends of each size in `sizes` at `steps` cache lengths `step_len`
    apart (each rolled back, so they all see the same cache). The median of `repeats` timings per
    call. Returns the fitted model and the timed calls."""
    samples: list[tuple[Work, float]] = []
    for role, lm in models.items():
        ids = [t for t in range(10, 10 + step_len) if t != lm.eos_token_id]
        for mel, language in clips:
            features = lm.wire(mel)  # what this model reads (a cloud: what the edge sends it)
            times = []
            for _ in range(repeats):
                sess, dt = timed(lm.start, features, language)
                times.append(dt)
            samples.append((Work(role, int(features.shape[-1]), 0, prefill=True), statistics.median(times)))
            for _ in range(steps):
                for n in sizes:
                    w = Work(role, n, sess.length)
                    times = []
                    for _ in range(repeats):
                        _, dt = timed(sess.extend, (ids * n)[:n])
                        sess.rollback(n)
                        times.append(dt)
                    samples.append((w, statistics.median(times)))
                sess.extend(ids)  # the next cache length
    return CostModel.fit(samples), samples
