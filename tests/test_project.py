"""Reports name places without naming the machine: a path inside the project is relative, one
outside it is `<its last part>`, and no committed file a command made holds a machine's path."""

import re
import subprocess
from pathlib import Path

from speccap.project import portable_arg, portable_command, portable_path

ROOT = Path(__file__).resolve().parents[1]
# an absolute path of some machine's scratch or home folders, or a URI holding one
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(tmp|root|home|Users|work|var/folders|private|mnt|scratch)/|sqlite:////|file:///")
# code and scripts may name such folders as defaults or scratch space; what they write may not
CODE = re.compile(r"(\.py|\.sh|^\.ci/run|^Makefile)$")


def test_paths_become_relative_inside_the_project_and_named_outside(tmp_path):
    root = tmp_path / "proj"
    (root / "reports").mkdir(parents=True)
    assert portable_path(root / "reports" / "x.md", root) == "reports/x.md"
    assert portable_path(root, root) == "."
    assert portable_path(tmp_path / "scratch" / "bench_b", root) == "<bench_b>"
    assert portable_path("reports/x.md", root) == "reports/x.md"  # relative: as given
    assert portable_arg(f"sqlite:///{root}/mlflow.db", root) == "sqlite:///mlflow.db"
    assert portable_arg(f"--out={root}/reports/p", root) == "--out=reports/p"
    assert portable_arg("--clips", root) == "--clips" and portable_arg("http://host:5000", root) == "http://host:5000"
    cmd = portable_command(["benchmarks/pipeline.py", "--keep", str(tmp_path / "bench_b"), "--out",
                            str(root / "reports" / "pipeline")], root)
    assert cmd == "python benchmarks/pipeline.py --keep <bench_b> --out reports/pipeline"
    assert not MACHINE_PATH.search(cmd)


def test_no_committed_file_holds_a_path_of_the_machine_that_made_it():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        path = ROOT / name
        if CODE.search(name) or not path.is_file() or path.suffix in (".png", ".whl", ".pt", ".pkl"):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{name}:{n}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


def test_the_check_finds_a_machine_path():
    assert MACHINE_PATH.search('"command": "python benchmarks/pipeline.py --keep /tmp/bench_b"')
    assert MACHINE_PATH.search('"tracking_uri": "sqlite:////tmp/bench_b/mlflow.db"')
    assert not MACHINE_PATH.search("queued runs copy the repo under .dvc/tmp/exps/ first")
