import pandas as pd
import pytest

from speccap.pipeline.gates_stage import read_traces


def test_missing_traces_name_the_file_and_the_stage_that_makes_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"data/traces/train\.parquet.*dvc repro traces"):
        read_traces("train")


def test_traces_are_read_back_as_the_traces_stage_wrote_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "traces").mkdir(parents=True)
    table = pd.DataFrame({"clip_id": ["a", "a"], "pos": [0, 1], "x0": [0.5, 1.5]})
    table.to_parquet(tmp_path / "data" / "traces" / "val.parquet", index=False)
    pd.testing.assert_frame_equal(read_traces("val"), table)
