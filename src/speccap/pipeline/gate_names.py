"""The names of the gate evaluation's rows: the oracle (every token judged, the first k corrections
at a budget), the ceiling (pipeline.ceiling), a rule baseline at temperature 1 beside its tuned row,
and the two metrics every row is held to."""

from __future__ import annotations

ORACLE = "oracle"
CEILING = "ceiling"
KEYS = (("bleu1", "BLEU-1"), ("emotion_hit_rate", "emotion hit"))


def oracle_name(k: int | None = None) -> str:
    return ORACLE if k is None else f"{ORACLE} (first {k})"


def is_oracle(name: str) -> bool:
    return name == ORACLE or name.startswith(f"{ORACLE} (first ")


def untuned_name(rule: str) -> str:
    """A rule baseline's row at temperature 1, shown where tuning chose another (shown, not a target)."""
    return f"{rule} (T = 1)"
