"""Draft-length policies: how many tokens the edge drafts before the gate looks at the block."""

from __future__ import annotations

from abc import ABC, abstractmethod


class LengthPolicy(ABC):
    name = "policy"

    @abstractmethod
    def next_length(self) -> int:
        ...

    def update(self, drafted: int, accepted: int, escalated: bool, corrected: bool) -> None:  # noqa: B027 - optional hook
        """Told after each block what became of it."""

    def observe(self, rec) -> None:  # noqa: B027 - optional hook
        """Told after each verification the caption's record so far (for policies that plan
        with measured compute times)."""

    def describe(self) -> dict:
        return {"policy": self.name}


class Fixed(LengthPolicy):
    name = "fixed"

    def __init__(self, length: int):
        if length < 1:
            raise ValueError(f"draft length must be >= 1, got {length}")
        self.length = int(length)

    def next_length(self) -> int:
        return self.length

    def describe(self) -> dict:
        return {"policy": self.name, "block_len": self.length}


class UGSDAdaptive(LengthPolicy):
    """UGSD's rule: Lbase first; Lmin after a corrected block; Lmax after two fully accepted
    blocks in a row; else Lbase. A block the gate kept local counts as accepted."""

    name = "adaptive"

    def __init__(self, l_min: int = 3, l_base: int = 5, l_max: int = 7):
        if not 1 <= l_min <= l_base <= l_max:
            raise ValueError(f"need 1 <= Lmin <= Lbase <= Lmax, got {l_min}, {l_base}, {l_max}")
        self.l_min, self.l_base, self.l_max = l_min, l_base, l_max
        self._next = l_base
        self._clean_streak = 0

    def next_length(self) -> int:
        return self._next

    def update(self, drafted, accepted, escalated, corrected) -> None:
        if corrected:
            self._clean_streak = 0
            self._next = self.l_min
            return
        self._clean_streak += 1
        self._next = self.l_max if self._clean_streak >= 2 else self.l_base

    def describe(self) -> dict:
        return {"policy": self.name, "l_min": self.l_min, "l_base": self.l_base, "l_max": self.l_max}
