"""Gates: should this drafted block go to the cloud?

`never` and `always` are the edge-only / cloud-verifies-everything ends. `entropy` is UGSD's
rule (eq. 2: escalate when the block's maximum token entropy exceeds gamma); `margin`
escalates when some token's top-1 / top-2 probability gap is below delta; `logprob` when some
drafted token's log-probability is below a threshold. A learned gate implements `score`
(higher = more likely to need the cloud) and escalates above its threshold.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from .stats import Block


class Gate(ABC):
    name: str = "gate"

    @abstractmethod
    def escalate(self, block: Block) -> bool:
        ...

    def describe(self) -> dict:
        return {"gate": self.name}


class Never(Gate):
    name = "never"

    def escalate(self, block: Block) -> bool:
        return False


class Always(Gate):
    name = "always"

    def escalate(self, block: Block) -> bool:
        return True


class ScoreGate(Gate):
    """Escalate when the block's score exceeds a threshold; subclasses define the score."""

    def __init__(self, threshold: float):
        self.threshold = float(threshold)

    @abstractmethod
    def score(self, block: Block) -> float:
        ...

    def escalate(self, block: Block) -> bool:
        return len(block) > 0 and self.score(block) > self.threshold

    def describe(self) -> dict:
        return {"gate": self.name, "threshold": self.threshold}


class Entropy(ScoreGate):
    name = "entropy"

    def score(self, block: Block) -> float:
        return max(s.entropy for s in block.stats)


class _BelowThreshold(ScoreGate):
    """Escalate when some drafted token's statistic `stat` is below `value`: the score is the
    negated minimum, the threshold the negated value (so that higher still means more doubtful)."""

    stat = ""

    def __init__(self, value: float):
        super().__init__(-float(value))
        self.value = float(value)

    def score(self, block: Block) -> float:
        return -min(getattr(s, self.stat) for s in block.stats)

    def describe(self) -> dict:
        return {"gate": self.name, "threshold": self.value}


class Margin(_BelowThreshold):
    """Escalate when some token's top-1 minus top-2 probability is below delta."""

    name, stat = "margin", "margin"


class LogProb(_BelowThreshold):
    """Escalate when some drafted token's log-probability is below the threshold."""

    name, stat = "logprob", "logprob"


def make_gate(name: str, threshold: float | None = None) -> Gate:
    simple = {"never": Never, "always": Always}
    if name in simple:
        return simple[name]()
    scored = {"entropy": Entropy, "margin": Margin, "logprob": LogProb}
    if name not in scored:
        raise ValueError(f"unknown gate {name!r} (expected one of {sorted(simple) + sorted(scored)})")
    if threshold is None:
        raise ValueError(f"gate {name!r} needs a threshold")
    return scored[name](threshold)
