import pytest

from .daemons import slurm_cluster


@pytest.fixture(scope="session")
def prefect_server():
    """One temporary Prefect server (own SQLite) for the flow tests (each module uses it), stopped
    while pytest still owns the log streams."""
    from prefect.testing.utilities import prefect_test_harness
    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def own_project(tiny_project, tmp_path, monkeypatch):
    """The tiny project's params with its own copy of the models and its own MLflow store in
    tmp_path (the working directory): `make(experiment, **sections)` writes tmp_path/params.yaml
    with those sections replaced and returns (params, raw params, its path)."""
    import shutil

    import yaml
    params, _, params_file = tiny_project

    def make(experiment: str, **sections):
        raw = yaml.safe_load(params_file.read_text())
        shutil.copytree(params.models.dir, tmp_path / "models")
        raw["models"]["dir"] = str(tmp_path / "models")
        raw["tracking"] = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": experiment}
        raw.update(sections)
        pfile = tmp_path / "params.yaml"
        pfile.write_text(yaml.safe_dump(raw))
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        return params, raw, pfile
    return make


@pytest.fixture
def slurm(monkeypatch):
    """A one-node Slurm cluster of the test's own (daemons.slurm_cluster); its clients find it through
    $SLURM_CONF, set here for this process and the ones it starts."""
    with slurm_cluster() as conf:
        monkeypatch.setenv("SLURM_CONF", str(conf))
        yield conf
