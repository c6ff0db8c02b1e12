"""dvc.yaml's code deps are each stage's import closure (scripts/stage_deps.py), so an edit re-runs
every stage whose code it is, and the check fails when one is missing."""

import importlib.util
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("stage_deps", ROOT / "scripts" / "stage_deps.py")
stage_deps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stage_deps)

DECODING_STAGES = ("decode", "trace_refs", "traces", "gates", "gate_eval", "promote", "wisv_head", "wisv_eval")


def test_dvc_yaml_lists_exactly_the_code_each_stage_runs():
    assert stage_deps.differences((ROOT / "dvc.yaml").read_text(), stage_deps.derived()) == []


def test_an_edit_of_the_model_code_reruns_every_stage_that_decodes():
    declared = stage_deps.declared((ROOT / "dvc.yaml").read_text())
    for stage in DECODING_STAGES:
        deps = declared[stage]
        # the loops, the batching executor and the rows it steps (some imported inside functions only)
        for code in ("src/speccap/models/fast_step.py", "src/speccap/batching/batched_step.py",
                     "src/speccap/batching/row_pool.py", "src/speccap/decoding/engine.py",
                     "src/speccap/decoding/halves.py", "src/speccap/batching/lockstep.py"):
            assert any(code == d or code.startswith(d + "/") for d in deps), (stage, code)
    assert "src/speccap/models/fast_step.py" not in declared["report"]


def test_a_removed_dependency_is_named():
    text = (ROOT / "dvc.yaml").read_text()
    cut = text.replace("      - src/speccap/pipeline/wisv.py\n", "", 1)
    assert cut != text
    diff = stage_deps.differences(cut, stage_deps.derived())
    assert len(diff) == 1 and "does not list code it runs: src/speccap/pipeline/wisv.py" in diff[0]


def test_imports_inside_functions_and_relative_ones_are_followed(tmp_path):
    files = {
        "flows/__init__.py": "",
        "flows/x.py": "def main():\n    from speccap.a import f\n    return f()\n",
        "src/speccap/__init__.py": "",
        "src/speccap/a.py": "from . import b\nfrom .tracking import log\n\ndef f():\n    return b.g()\n",
        "src/speccap/b.py": "def g():\n    from .c import h\n    return h()\n",
        "src/speccap/c.py": "def h():\n    return 1\n",
        "src/speccap/tracking.py": "from .unrelated import z\n",
        "src/speccap/unrelated.py": "z = 0\n",
        "dvc.yaml": textwrap.dedent("""\
            stages:
              x:
                cmd: python -m flows.x
                deps:
                  - data/in
                  - flows/x.py
                outs:
                  - out
            """),
    }
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    want = stage_deps.derived(tmp_path)
    # the logging module is read on purpose without being a result, and so is what it imports
    assert want["x"] == ["flows/__init__.py", "flows/x.py", "src/speccap/__init__.py", "src/speccap/a.py",
                         "src/speccap/b.py", "src/speccap/c.py"]
    text = (tmp_path / "dvc.yaml").read_text()
    assert "src/speccap/c.py" in stage_deps.differences(text, want)[0]
    fixed = stage_deps.rewrite(text, want)
    assert stage_deps.differences(fixed, want) == [] and "  - data/in\n" in fixed and "  - out\n" in fixed


def _dvc(cwd: Path, *args: str) -> str:
    done = subprocess.run(["dvc", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"dvc {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout


@pytest.mark.parametrize("ignore", [True, False])
def test_bytecode_in_a_code_folder_never_makes_a_stage_stale(tmp_path, ignore):
    """Two stages list source folders (src/speccap/metrics, src/speccap/gating): whatever imports
    them (the tests, another Python version) writes __pycache__/ there. With the project's
    .dvcignore the stage stays up to date; without it the same bytecode makes it stale."""
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=tmp_path, check=True, timeout=60)
    if ignore:
        shutil.copy(ROOT / ".dvcignore", tmp_path / ".dvcignore")
    code = tmp_path / "src" / "pkg"
    code.mkdir(parents=True)
    (code / "mod.py").write_text("X = 1\n")
    (tmp_path / "dvc.yaml").write_text("stages:\n  s:\n    cmd: python -c \"open('out', 'w').write('1')\"\n"
                                       "    deps:\n      - src/pkg\n    outs:\n      - out\n")
    _dvc(tmp_path, "repro", "-q")
    cache = code / "__pycache__"
    cache.mkdir()
    (cache / "mod.cpython-311.pyc").write_bytes(b"\x00" * 16)
    (cache / "mod.cpython-313.pyc").write_bytes(b"\x01" * 16)  # another Python
    stale = "changed deps" in _dvc(tmp_path, "status")
    assert stale is not ignore
