"""The package's import graph, every import counted (inside functions too): no circles, and each
layer imports only the layers below it: flows, cli -> caption_commands, preflight -> pipeline -> tracking
(the one MLflow module) -> serving, gating -> decoding, batching -> models, metrics -> data -> config and the
shared utilities."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("stage_deps", ROOT / "scripts" / "stage_deps.py")
stage_deps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stage_deps)

# lower number = lower layer; a module may import its own package and any lower layer
LAYERS = {"config": 0, "params_schema": 0, "params_types": 0, "params_cluster": 0, "params_uplink": 0, "stage_params": 0, "params_reads": 0,
          "fanout": 0, "numba_cache": 0, "kernels": 0, "run_views": 0, "project": 0, "speccap": 0,
          "data": 1, "models": 2, "metrics": 2, "decoding": 3, "batching": 3, "gating": 4, "serving": 4, "tracking": 5,
          "pipeline": 6, "preflight": 7, "caption_commands": 7, "cli": 8, "flows": 9}


def _graph() -> dict[str, set[str]]:
    files = [p.relative_to(ROOT) for base in ("src/speccap", "flows") for p in (ROOT / base).rglob("*.py")]
    graph = {}
    for f in files:
        mod = stage_deps.module_of(f)
        deps = {stage_deps.module_of(found) for name in stage_deps.imported_modules(ROOT, f)
                if (found := stage_deps.module_file(ROOT, name)) is not None}
        graph[mod] = {d for d in deps if d != mod and not mod.startswith(d + ".")}  # a package's own __init__
    return graph


def _layer(mod: str) -> str:
    parts = mod.split(".")
    return "flows" if parts[0] == "flows" else (parts[1] if len(parts) > 1 else "speccap")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10_000)

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_each_layer_imports_only_lower_ones():
    def upward(m: str, d: str) -> bool:  # the layer-0 utilities may use each other
        lm, ld = LAYERS[_layer(m)], LAYERS[_layer(d)]
        return _layer(m) != _layer(d) and (ld > lm or (ld == lm and lm > 0))
    bad = [f"{m} -> {d}" for m, deps in _graph().items() for d in sorted(deps) if upward(m, d)]
    assert bad == []


def test_the_checks_see_a_circle_and_an_upward_import():
    graph = _graph()
    graph["speccap.data.manifest"] = graph["speccap.data.manifest"] | {"speccap.pipeline.sweep"}
    assert any("speccap.data.manifest" in c for c in _cycles(graph))
    assert LAYERS[_layer("speccap.pipeline.sweep")] > LAYERS[_layer("speccap.data.manifest")]


def test_modules_and_functions_stay_small():
    """One job per module: no module of the package or the flows over 400 lines, no function over 80."""
    import ast
    big = []
    for base in ("src/speccap", "flows"):
        for p in (ROOT / base).rglob("*.py"):
            text = p.read_text()
            if len(text.splitlines()) > 400:
                big.append(f"{p.relative_to(ROOT)}: {len(text.splitlines())} lines")
            big += [f"{p.relative_to(ROOT)}: {node.name}() {node.end_lineno - node.lineno + 1} lines"
                    for node in ast.walk(ast.parse(text))
                    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 80]
    assert big == []
