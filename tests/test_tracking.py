import os
from pathlib import Path

import pytest

from speccap.project import project_root
from speccap.tracking import Tracker, resolve_uri


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
    # the UI opens it on its runs (a model-development experiment), also one an older version made untagged
    kind = "mlflow.experimentKind"
    assert t.mlflow.get_experiment(t.experiment_id).tags[kind] == "custom_model_development"
    old = t.mlflow.create_experiment("untagged")
    assert kind not in t.mlflow.get_experiment(old).tags
    assert Tracker(t.uri, "untagged").experiment_id == old
    assert t.mlflow.get_experiment(old).tags[kind] == "custom_model_development"


def _gate_file(tmp_path, threshold=0.5, name="gate.gate.json"):
    """A token gate file (the gates stage's format): its score rises with the hidden state's first value."""
    from speccap.gating.gate_file import gate_document, write_gate
    from speccap.gating.token_gates import fit_token_gate

    from .gating.test_token_gates import DIM, EOS, _data
    x, labels = _data(1500, 0)
    model = fit_token_gate(x, labels, "lightgbm", "critical", DIM, EOS)
    return write_gate(tmp_path / name, gate_document(model, "g", {"0.1": {"en": 0.5, "zh": 0.5}}, threshold, 0.1,
                                                     "alone"))


@pytest.mark.e2e
def test_gate_registry_alias_and_mlflow_models_serve(tmp_path, monkeypatch):
    """A gate file logged as a pyfunc model and registered from the logged model; alias `champion`;
    loaded back as the same document; and served by `mlflow models serve` on loopback: post
    token feature rows, get scores and decisions."""
    import json
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    import pandas as pd

    from speccap.gating.features import token_columns
    from speccap.gating.gate_file import model_of, read_gate
    from speccap.tracking import Tracker

    from .gating.test_token_gates import DIM
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "registry-test")
    rows = pd.DataFrame([{c: 0.0 for c in token_columns(DIM)} | {"h0": h} for h in (-1.0, 0.0, 3.0, -2.0)])
    gate_file = _gate_file(tmp_path)
    _, version = tracker.log_gate("gate-test", "g", gate_file, rows, {"kind": "lightgbm"}, {"auc": 0.9},
                                  tags={"gate": "g", "gates_key": "k1"})
    assert tracker.champion("gate-test") is None
    # registered from the logged model (models:/m-...), as MLflow 3 resolves models:/name@alias
    client = tracker.mlflow.MlflowClient(uri)
    source = client.get_model_version("gate-test", version).source
    assert source.startswith("models:/m-"), source
    assert client.get_logged_model(source.removeprefix("models:/")).name == "gate"
    # its requirements are stated (not inferred by loading it in a subprocess): installed pins
    import importlib.metadata

    from mlflow.artifacts import download_artifacts
    reqs = Path(download_artifacts(f"models:/gate-test/{version}/requirements.txt", dst_path=str(tmp_path / "req")))
    lines = reqs.read_text().split()
    for package in ("lightgbm", "speccap"):
        assert f"{package}=={importlib.metadata.version(package)}" in lines, lines
    tracker.promote("gate-test", version, "first")
    assert tracker.champion("gate-test") == {"version": version, "tags": {"gate": "g", "gates_key": "k1",
                                                                           "promotion_reason": "first"}}
    saved = tracker.load_gate("gate-test", "champion")
    assert saved == read_gate(gate_file) | {"registry": {"name": "gate-test", "version": version, "alias": "champion"}}
    local = model_of(saved).token_scores(rows[list(token_columns(DIM))].to_numpy("float32"))
    assert local[2] > 0.5 > local[0]  # the hidden state that marks critical tokens
    # per-language thresholds: the `zh` feature column picks the row's threshold
    per_lang = _gate_file(tmp_path, {"en": 1.0, "zh": 0.0}, "per_lang.gate.json")
    _, v2 = tracker.log_gate("gate-test", "g2", per_lang, rows, {"kind": "lightgbm"}, {})
    mixed = rows.assign(zh=[1.0, 1.0, 0.0, 0.0])
    decided = tracker.mlflow.pyfunc.load_model(f"models:/gate-test/{v2}").predict(mixed)
    assert decided["escalate"].tolist() == [True, True, False, False]  # zh: always; en: never

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri)
    mlflow_cli = [sys.executable, "-m", "mlflow"]
    proc = subprocess.Popen(mlflow_cli + ["models", "serve", "-m", "models:/gate-test@champion", "--env-manager",
                                          "local", "--host", "127.0.0.1", "-p", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=1)
                break
            except OSError:  # not listening yet (URLError is one)
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                time.sleep(0.5)
        body = json.dumps({"dataframe_split": rows.to_dict(orient="split")}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                     headers={"Content-Type": "application/json"})
        preds = json.loads(urllib.request.urlopen(req, timeout=30).read())["predictions"]
        served = pd.DataFrame(preds)
        assert served["score"].round(6).tolist() == pd.Series(local).round(6).tolist()
        assert served["escalate"].tolist() == [bool(x > 0.5) for x in local]
        bad = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"dataframe_split": {"columns": ["entropy"], "data": [[1.0]]}}).encode())
        try:
            urllib.request.urlopen(bad, timeout=30)
            raise AssertionError("a request without the feature columns was accepted")
        except urllib.error.HTTPError as exc:
            assert exc.code in (400, 422, 500)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_two_trackers_in_one_process_keep_their_own_stores(tmp_path, monkeypatch):
    # mlflow.set_tracking_uri writes $MLFLOW_TRACKING_URI; that must not become the next Tracker's store
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    a = Tracker(f"sqlite:///{tmp_path / 'a.db'}", "one")
    assert "MLFLOW_TRACKING_URI" not in os.environ
    b = Tracker(f"sqlite:///{tmp_path / 'b.db'}", "two")
    assert b.uri.endswith("b.db")
    with b.sweep("s", {"x": 1}, {"sweep_key": "k"}):
        pass
    assert len(b.runs()) == 1 and a.uri.endswith("a.db")
    # the user's own setting still wins, and stays as it was
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'c.db'}")
    c = Tracker(f"sqlite:///{tmp_path / 'b.db'}", "three")
    assert c.uri.endswith("c.db") and os.environ["MLFLOW_TRACKING_URI"].endswith("c.db")


def test_a_stage_tracker_writes_its_view_and_tags_rows(tmp_path, monkeypatch):
    import json

    from speccap.run_views import HEADLINE, ROLE_TAG, ROW, SWEEP, VIEW_TAG
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    gates = Tracker.for_stage(uri, "exp", "gate_eval")
    assert gates.experiment == "exp-gates"
    view = json.loads(gates.mlflow.get_experiment(gates.experiment_id).tags[VIEW_TAG])
    assert view["selectedColumns"][-1] == f"params.`{HEADLINE['gates']['params'][-1]}`"
    with gates.sweep("gate_eval-sweep", {}, {"sweep_key": "k"}) as parent:
        gates.log_config(parent, "c", "ugsd-en-g", {"budget": 0.1}, {"bleu1": 1.0})
    roles = {r["name"]: r["tags"][ROLE_TAG] for r in gates.runs()}
    assert roles == {"gate_eval-sweep": SWEEP, "ugsd-en-g": ROW}
    # a reader leaves the view as the stages wrote it; the decode sweep's experiment has its own
    Tracker(uri, "exp-gates")
    assert json.loads(gates.mlflow.get_experiment(gates.experiment_id).tags[VIEW_TAG]) == view
    decode = Tracker.for_stage(uri, "exp", "decode")
    assert decode.experiment == "exp" and VIEW_TAG in decode.mlflow.get_experiment(decode.experiment_id).tags
    assert json.loads(decode.mlflow.get_experiment(decode.experiment_id).tags[VIEW_TAG]) != view
