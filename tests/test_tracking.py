from pathlib import Path

from speccap.tracking import Tracker, project_root, resolve_uri


def test_project_root_from_a_dvc_experiment_copy(tmp_path):
    repo = tmp_path / "repo"
    copy = repo / ".dvc" / "tmp" / "exps" / "tmpab12cd" / "sub"
    copy.mkdir(parents=True)
    (repo / "dvc.yaml").write_text("stages: {}\n")
    (copy.parent / "dvc.yaml").write_text("stages: {}\n")  # the copy has its own dvc.yaml: still the repo wins
    assert project_root(copy) == repo
    assert project_root(repo) == repo


def test_relative_sqlite_uri_points_at_the_project_root(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_uri("sqlite:///mlflow.db", root=tmp_path) == f"sqlite:///{tmp_path}/mlflow.db"
    assert resolve_uri("sqlite:////abs/x.db", root=tmp_path) == "sqlite:////abs/x.db"
    assert resolve_uri("http://127.0.0.1:5000", root=tmp_path) == "http://127.0.0.1:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://10.0.0.1:5000")
    assert resolve_uri("sqlite:///mlflow.db", root=tmp_path) == "http://10.0.0.1:5000"


def test_parent_and_nested_runs_failed_runs_and_resume(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    t = Tracker(f"sqlite:///{tmp_path / 'm.db'}", "exp")
    (tmp_path / "records.jsonl").write_text('{"id": "a"}\n')
    with t.sweep("sweep-1", {"decode": {"rank": 2}}, {"sweep_key": "k1"}) as parent:
        t.log_config(parent, "cfg-a", "edge-en", {"method": "edge"}, {"bleu1": 50.0, "nan": float("nan")},
                     artifacts=[tmp_path / "records.jsonl"], series={"position_acceptance": [0.9, 0.5]})
        t.log_config(parent, "cfg-b", "ugsd-en", {"method": "ugsd"}, {}, error="boom: it broke")
    with t.sweep("sweep-1", {}, {"sweep_key": "k1"}) as again:
        assert again == parent  # resumed, not duplicated
        assert t.finished(parent) == {"cfg-a"}
    runs = {r["name"]: r for r in t.runs()}
    assert runs["edge-en"]["status"] == "FINISHED" and runs["edge-en"]["metrics"]["bleu1"] == 50.0
    assert runs["edge-en"]["metrics"]["position_acceptance"] == 0.5  # last step of the series
    assert "nan" not in runs["edge-en"]["metrics"]
    assert runs["ugsd-en"]["status"] == "FAILED" and "boom" in runs["ugsd-en"]["tags"]["error"]
    assert runs["sweep-1"]["params"]["decode.rank"] == "2"
    assert Path(tmp_path / "m.db").exists()
