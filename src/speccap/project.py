"""Where the project is, and how a report names places without naming the machine that made it.

Committed reports say which command made them and where their runs went. An absolute path in
them would be the path of one machine (a scratch clone under /tmp, a home folder), true nowhere
else: inside the project it is written relative to the project, outside it by its last part in
angle brackets (`<bench_b>`: a folder the reader supplies)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

_EXPS = re.compile(r"^(.*?)/\.dvc/tmp/exps/")


def project_root(start: str | os.PathLike | None = None) -> Path:
    """The repository a process works for, also from inside a DVC temporary experiment copy."""
    here = Path(start or os.getcwd()).resolve()
    m = _EXPS.match(str(here) + "/")
    if m:
        return Path(m.group(1))
    for p in (here, *here.parents):
        if (p / "dvc.yaml").exists() or (p / ".git").exists():
            return p
    return here


def portable_path(path: str | os.PathLike, root: Path | None = None) -> str:
    """`path` as a report may name it: relative inside the project, `<last part>` outside it."""
    p = Path(path)
    if not p.is_absolute():
        return str(path)
    root = (root or project_root()).resolve()
    p = p.resolve()
    if p == root:
        return "."
    if p.is_relative_to(root):
        return str(p.relative_to(root))
    return f"<{p.name}>"


def portable_arg(arg: str, root: Path | None = None) -> str:
    """One command-line word: an absolute path, `--opt=/abs/path` or `sqlite:////abs/path` with
    its path made portable; any other word as it is."""
    for prefix in ("sqlite:///",):
        if arg.startswith(prefix + "/"):
            return prefix + portable_path(arg[len(prefix):], root)
    opt, eq, value = arg.partition("=")
    if eq and value.startswith("/") and opt.startswith("-"):
        return f"{opt}={portable_path(value, root)}"
    return portable_path(arg, root) if arg.startswith("/") else arg


def portable_command(argv: list[str] | None = None, root: Path | None = None) -> str:
    """The command this process runs (`python` and sys.argv by default), as a report records it."""
    argv = sys.argv if argv is None else argv
    return " ".join(["python", *(portable_arg(a, root) for a in argv)])
