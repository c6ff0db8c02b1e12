"""Markdown tables for the reports (one implementation for every report module)."""

from __future__ import annotations

from collections.abc import Callable


def md_table(header: list[str], rows: list[list], fmt: Callable[[object], str] = str) -> str:
    """A Markdown table (no trailing newline); `fmt` renders each cell."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows])


def interval_text(m: dict, digits: int = 1) -> str:
    """'value [ci_low, ci_high]' of an interval dict (metrics.bootstrap)."""
    return f"{m['value']:.{digits}f} [{m['ci_low']:.{digits}f}, {m['ci_high']:.{digits}f}]"
