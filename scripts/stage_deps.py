"""Each DVC stage's code dependencies, derived from the code: the import closure of its flow module
inside this project (`src/speccap`, `flows`), every import counted, including those inside
functions. dvc.yaml's `src/` and `flows/` deps are this list, written by this script, never by hand:

    python scripts/stage_deps.py          # rewrite dvc.yaml's code deps
    python scripts/stage_deps.py --check  # exit 1 and name every difference (tests/test_stage_deps.py)

The other deps (data, models, resolved/<stage>.json) stay as dvc.yaml lists them.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import yaml

from speccap.params_reads import NOT_RESULTS as PARAMS_NOT_RESULTS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"speccap": Path("src/speccap"), "flows": Path("flows")}
# Code a stage imports on purpose without its outputs depending on it, as files (the one list, with
# the reasons, is speccap.params_reads.NOT_RESULTS: their reads of params do not count either).
NOT_RESULTS = {f"src/{m.replace('.', '/')}.py": why for m, why in PARAMS_NOT_RESULTS.items()}
# Stages whose command is not a flow module: their code deps are listed here.
BY_HAND = {"resolve": ["src/speccap/config.py", "src/speccap/params_schema.py", "src/speccap/params_types.py",
                       "src/speccap/params_cluster.py", "src/speccap/params_uplink.py",
                       "src/speccap/stage_params.py"]}
CODE_PREFIXES = ("src/", "flows/")


def module_file(root: Path, module: str) -> Path | None:
    """The project file of a dotted module name (a module or a package's __init__), or None."""
    top, *rest = module.split(".")
    if top not in PACKAGES:
        return None
    base = PACKAGES[top].joinpath(*rest)
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if (root / cand).exists():
            return cand
    return None


def module_of(path: Path) -> str:
    for top, base in PACKAGES.items():
        if path.is_relative_to(base):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join([top, *parts])
    raise ValueError(f"{path}: not in the project's packages")


def imported_modules(root: Path, path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it, with relative names made absolute; for
    `from X import name`, X.name too when that is a module."""
    tree = ast.parse((root / path).read_text(encoding="utf-8"), filename=str(path))
    here = module_of(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def closure(root: Path, start: str) -> set[str]:
    """The project files `start` (a dotted module) imports, directly or not, with the package
    __init__ files Python runs on the way; as paths relative to the root."""
    todo, seen = [start], set()
    while todo:
        mod = todo.pop()
        parts = mod.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            f = module_file(root, ".".join(parts[:i]))
            if f is not None and f.as_posix() not in seen:
                seen.add(f.as_posix())
                if f.as_posix() not in NOT_RESULTS:  # nor what it imports for its own sake
                    todo += [m for m in imported_modules(root, f) if module_file(root, m) is not None]
    return seen


def derived(root: Path = ROOT) -> dict[str, list[str]]:
    """stage -> its code deps (sorted), for every stage of dvc.yaml."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    out = {}
    for name, st in stages.items():
        if name in BY_HAND:
            out[name] = sorted(BY_HAND[name])
            continue
        m = re.fullmatch(r"python -m (flows\.\w+)", st["cmd"].strip())
        if not m:
            raise SystemExit(f"dvc.yaml: stage {name}: command {st['cmd']!r} is not `python -m flows.<module>`; "
                             "list its code deps in scripts/stage_deps.py BY_HAND")
        out[name] = collapse(root, {f for f in closure(root, m.group(1)) if f not in NOT_RESULTS})
    return out


def collapse(root: Path, files: set[str]) -> list[str]:
    """`files` sorted, with a folder named instead of its files when it holds no other Python file
    (DVC hashes the whole folder: the same dependency, and a readable dvc.yaml)."""
    out = set(files)
    for d in sorted({str(Path(f).parent) for f in files}, key=lambda x: -x.count("/")):
        inside = {p.relative_to(root).as_posix() for p in (root / d).rglob("*.py")}
        if inside and inside <= files and d not in ("src/speccap", "flows"):
            out = {f for f in out if not f.startswith(d + "/")} | {d}
    return sorted(out)


def declared(text: str) -> dict[str, list[str]]:
    """stage -> the code deps dvc.yaml's text lists."""
    stages = yaml.safe_load(text)["stages"]
    return {name: sorted(d for d in st.get("deps", []) if isinstance(d, str) and d.startswith(CODE_PREFIXES))
            for name, st in stages.items()}


def differences(text: str, want: dict[str, list[str]]) -> list[str]:
    have = declared(text)
    lines = []
    for stage, deps in want.items():
        missing, extra = sorted(set(deps) - set(have.get(stage, []))), sorted(set(have.get(stage, [])) - set(deps))
        if missing:
            lines.append(f"dvc.yaml: stage {stage} does not list code it runs: {', '.join(missing)}")
        if extra:
            lines.append(f"dvc.yaml: stage {stage} lists code it does not import: {', '.join(extra)}")
    return lines


def rewrite(text: str, want: dict[str, list[str]]) -> str:
    """dvc.yaml's text with each stage's code deps replaced by `want`'s, placed where the first of
    them was (else at the end of its deps), every other line kept."""
    out, stage, in_deps, placed = [], None, False, False
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"^  (\w+):\s*$", line):
            stage, in_deps, placed = m.group(1), False, False
        elif re.match(r"^    deps:\s*$", line):
            in_deps = True
        elif re.match(r"^    \w+:", line):
            in_deps = False
        item = re.match(r"^(\s+)- (\S+)\s*$", line) if in_deps else None
        if item and item.group(2).startswith(CODE_PREFIXES):
            if not placed:
                out += [f"{item.group(1)}- {d}" for d in want[stage]]
                placed = True
            continue
        out.append(line)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if in_deps and item and not placed and not re.match(r"^\s+- ", nxt):  # the deps' last line
            out += [f"{item.group(1)}- {d}" for d in want[stage]]
            placed = True
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="say what differs and exit 1 instead of rewriting")
    args = ap.parse_args()
    path = ROOT / "dvc.yaml"
    text, want = path.read_text(), derived()
    if args.check:
        diff = differences(text, want)
        print("\n".join(diff) or "dvc.yaml: every stage lists the code it runs")
        sys.exit(1 if diff else 0)
    path.write_text(rewrite(text, want))
    assert not differences(path.read_text(), want)


if __name__ == "__main__":
    main()
