import subprocess
import sys

import pytest

from speccap.config import params_from_dict
from speccap.data.manifest import ManifestError
from speccap.data.mer2024 import Mer2024Error
from speccap.data.trace_pool import TracePoolError
from speccap.models.checkpoint_paths import ModelLoadError
from speccap.preflight import check_stage


def _mer(tmp_path, **data):
    return params_from_dict({"data": {"source": "mer2024", "processed_dir": str(tmp_path / "proc"), **data},
                             "models": {"edge": {"backend": "qwen2_5_omni", "path": str(tmp_path / "edge")},
                                        "cloud": {"backend": "qwen2_5_omni", "path": str(tmp_path / "cloud")}}})


def test_each_missing_input_is_named_before_the_stage_starts(tmp_path):
    with pytest.raises(Mer2024Error, match="^data.mer2024.path: not set"):
        check_stage(_mer(tmp_path), "prepare")
    (tmp_path / "mer").mkdir()
    (tmp_path / "mer" / "final-EMER-reason.csv").write_text("name,chinese,english\n")
    with pytest.raises(TracePoolError, match="^data.trace_pool.path: trace pool folder .*nope not found"):
        check_stage(_mer(tmp_path, mer2024={"path": str(tmp_path / "mer")},
                         trace_pool={"path": str(tmp_path / "nope")}), "prepare")
    with pytest.raises(ModelLoadError, match="^models.edge.path: checkpoint folder .*edge not found"):
        check_stage(_mer(tmp_path), "decode")
    (tmp_path / "edge").mkdir()
    (tmp_path / "cloud").mkdir()
    # no pool: the gates learn from folds of the referenced clips, which prepare has not written yet
    with pytest.raises(ManifestError, match="test.en.jsonl: no test clips to cross-fit over"):
        check_stage(_mer(tmp_path), "trace_refs")
    with pytest.raises(ManifestError, match="^data.cross_fit.when: never, data.trace_pool.path: not set"):
        check_stage(_mer(tmp_path, cross_fit={"when": "never"}), "trace_refs")
    check_stage(_mer(tmp_path), "decode")  # the checkpoint folders exist: nothing to say


@pytest.mark.parametrize("stage", ["prepare", "featurize", "report", "headline"])
def test_the_stages_that_run_no_model_start_without_torch(stage):
    # every flow imports the preflight; these stages' main processes run no model, and torch and
    # transformers took 4 to 6 of their seconds before any work
    code = f"import sys, flows.{stage}; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
