"""The one place that talks to MLflow.

Where runs go: $MLFLOW_TRACKING_URI if set, else `tracking.uri` from params, else a SQLite store
`mlflow.db` at the project root. A relative SQLite path is resolved against the project root,
not the working directory: DVC runs queued experiments in temporary copies of the repository
under `.dvc/tmp/exps/`, and every copy must still write to the one store of the project.
The store is never a DVC output (DVC deletes a stage's outputs before it runs).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from pathlib import Path

from .project import project_root
from .run_views import ROLE_TAG, ROW, SWEEP, VIEW_TAG, experiment_for, kind_of, view_state


def resolve_uri(uri: str | None, root: Path | None = None) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI") or uri or "sqlite:///mlflow.db"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///"):]
        return f"sqlite:///{(root or project_root()) / rel}"
    if "://" not in uri and not uri.startswith("/"):  # a bare folder: file store, relative to the root
        return str((root or project_root()) / uri)
    return uri


def _mlflow(uri: str):
    import logging

    import mlflow
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # mlflow.set_tracking_uri also writes $MLFLOW_TRACKING_URI, which resolve_uri reads as the
    # user's choice: a second Tracker in this process would then silently use the first one's
    # store. Put the variable back as the user left it.
    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before
    return mlflow


def _clean_metrics(metrics: dict) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[re.sub(r"[^A-Za-z0-9_\-. /]", "_", k)] = float(v)
    return out


def _flat(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = str(v)[:500]
    return out


# What these experiments hold: model-development runs, compared as a table and charts, not GenAI
# traces. MLflow 3 UIs that read the kind from this tag open them on their runs; 3.17's follows a
# switch kept in the browser instead, which the links of runs_page() set
_EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


class Tracker:
    """Parent run per sweep, one nested run per configuration. `view`: the kind of comparison
    (run_views.HEADLINE) whose runs page the experiment opens on; None for a reader, which
    leaves the experiment's view as the writers set it."""

    def __init__(self, uri: str | None, experiment: str, view: str | None = None):
        self.uri = resolve_uri(uri)
        if self.uri.startswith("sqlite:///"):
            Path(self.uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.mlflow = _mlflow(self.uri)
        self.experiment = experiment
        tags = dict(_EXPERIMENT_TAGS) if view is None else _EXPERIMENT_TAGS | {VIEW_TAG: view_state(view)}
        self.experiment_id = self._experiment_id(experiment, tags)

    @classmethod
    def for_stage(cls, uri: str | None, base: str, stage: str) -> Tracker:
        """The tracker of a pipeline stage: its kind's experiment (run_views.experiment_for), and its view."""
        return cls(uri, experiment_for(base, stage), view=kind_of(stage))

    def _experiment_id(self, name: str, tags: dict[str, str]) -> str:
        """Get or create; two processes starting at once against one server both get the one
        experiment (the loser of the create race reads the winner's)."""
        from mlflow.exceptions import MlflowException
        exp = self.mlflow.get_experiment_by_name(name)
        if exp is None:
            try:
                return self.mlflow.create_experiment(name, tags=tags)
            except MlflowException:
                exp = self.mlflow.get_experiment_by_name(name)
                if exp is None:
                    raise
        for k, v in tags.items():  # an experiment an older version made, or another view's
            if exp.tags.get(k) != v:
                self.mlflow.MlflowClient(self.uri).set_experiment_tag(exp.experiment_id, k, v)
        return exp.experiment_id

    @contextlib.contextmanager
    def sweep(self, name: str, params: dict, tags: dict | None = None):
        """A parent run; reused (not duplicated) when a sweep with the same key is resumed."""
        key = tags.get("sweep_key") if tags else None
        run_id = None
        if key:
            found = self.mlflow.search_runs([self.experiment_id], filter_string=f"tags.sweep_key = '{key}'",
                                            output_format="list", max_results=1)
            run_id = found[0].info.run_id if found else None
        with self.mlflow.start_run(run_id=run_id, run_name=None if run_id else name,
                                   experiment_id=self.experiment_id) as run:
            if not run_id:
                self.mlflow.log_params(_flat(params))
                self.mlflow.set_tags((tags or {}) | {ROLE_TAG: SWEEP})
            yield run.info.run_id

    def finished(self, parent_id: str) -> set[str]:
        """config ids already logged as FINISHED under this parent."""
        runs = self.mlflow.search_runs([self.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'",
                                       output_format="list")
        return {r.data.tags.get("config_id") for r in runs if r.info.status == "FINISHED"}

    def log_config(self, parent_id: str, config_id: str, name: str, params: dict, metrics: dict,
                   artifacts: list[str | os.PathLike] = (), error: str | None = None, series: dict | None = None) -> str:
        """One nested run for one configuration; FAILED with the error when it failed."""
        with self.mlflow.start_run(run_name=name, experiment_id=self.experiment_id, nested=True,
                                   parent_run_id=parent_id) as run:
            self.mlflow.set_tags({"config_id": config_id, ROLE_TAG: ROW})
            self.mlflow.log_params(_flat(params))
            if metrics:
                self.mlflow.log_metrics(_clean_metrics(metrics))
            for name_, values in (series or {}).items():  # e.g. per-position acceptance, as a stepped metric
                for step, v in enumerate(values):
                    self.mlflow.log_metric(name_, float(v), step=step)
            for a in artifacts:
                if Path(a).exists():
                    self.mlflow.log_artifact(str(a))
            if error:
                self.mlflow.set_tag("error", error[:5000])
                self.mlflow.log_text(error, "error.txt")
        if error:
            self.mlflow.MlflowClient(self.uri).set_terminated(run.info.run_id, status="FAILED")
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: dict) -> None:
        """Metrics of a run already made (a sweep's own, after its configurations)."""
        client = self.mlflow.MlflowClient(self.uri)
        for k, v in _clean_metrics(metrics).items():
            client.log_metric(run_id, k, v)

    def log_artifacts(self, run_id: str, paths: list[str | os.PathLike]) -> None:
        client = self.mlflow.MlflowClient(self.uri)
        for p in paths:
            if Path(p).is_dir():
                client.log_artifacts(run_id, str(p), artifact_path=Path(p).name)
            elif Path(p).exists():
                client.log_artifact(run_id, str(p))

    def runs(self) -> list[dict]:
        """Every run of the experiment as a plain dict (for tests and reports)."""
        out = []
        for r in self.mlflow.search_runs([self.experiment_id], output_format="list"):
            out.append({"run_id": r.info.run_id, "status": r.info.status, "name": r.info.run_name,
                        "params": dict(r.data.params), "metrics": dict(r.data.metrics), "tags": dict(r.data.tags)})
        return out


    # ---- learned gates as registered MLflow models ----
    def log_gate(self, registry_name: str, run_name: str, gate_file: str | os.PathLike, input_example,
                 params: dict, metrics: dict, artifacts: list[str | os.PathLike] = (), tags: dict | None = None,
                 parent_id: str | None = None) -> tuple[str, str]:
        """Log a gate file (speccap.gating.gate_file: the same file a device loads) as a pyfunc model
        that maps feature rows to scores and escalation decisions, and register it from the logged
        model; returns (run id, version)."""
        return self._log_registered(registry_name, run_name, "gate", _gate_pyfunc()(), {"gate": str(gate_file)},
                                    input_example, params, metrics, artifacts, tags, parent_id)

    def log_wisv_head(self, registry_name: str, run_name: str, head_file: str | os.PathLike, input_example,
                      params: dict, metrics: dict, artifacts: list[str | os.PathLike] = (),
                      tags: dict | None = None, parent_id: str | None = None) -> tuple[str, str]:
        """Log WISV's decision head (decoding.wisv.training.save_head's <head>.pt, with its <head>.json holding
        tau) as a pyfunc model that maps [edge hidden, cloud hidden, CSI] rows to P(reject) and the
        decision, and register it; returns (run id, version)."""
        return self._log_registered(registry_name, run_name, "wisv_head", _wisv_pyfunc()(),
                                    {"head": str(head_file), "meta": str(Path(head_file).with_suffix(".json"))},
                                    input_example, params, metrics, artifacts, tags, parent_id)

    def _log_registered(self, registry_name, run_name, model_name, python_model, model_artifacts: dict,
                        input_example, params, metrics, artifacts, tags, parent_id) -> tuple[str, str]:
        with self.mlflow.start_run(run_name=run_name, experiment_id=self.experiment_id,
                                   nested=parent_id is not None, parent_run_id=parent_id) as run:
            self.mlflow.log_params(_flat(params))
            self.mlflow.log_metrics(_clean_metrics(metrics))
            self.mlflow.set_tags((tags or {}) | {ROLE_TAG: ROW})
            for a in artifacts:
                if Path(a).exists():
                    self.mlflow.log_artifact(str(a))
            info = self.mlflow.pyfunc.log_model(name=model_name, python_model=python_model,
                                                artifacts=model_artifacts, input_example=input_example,
                                                pip_requirements=model_requirements())
        version = self.mlflow.register_model(info.model_uri, registry_name)
        client = self.mlflow.MlflowClient(self.uri)
        for k, v in (tags or {}).items():
            client.set_model_version_tag(registry_name, version.version, k, str(v))
        return run.info.run_id, str(version.version)

    def champion(self, registry_name: str) -> dict | None:
        """The version holding alias `champion` ({version, tags}), or None."""
        client = self.mlflow.MlflowClient(self.uri)
        try:
            v = client.get_model_version_by_alias(registry_name, "champion")
        except Exception:  # noqa: BLE001 - no such model or alias yet
            return None
        return {"version": str(v.version), "tags": dict(v.tags)}

    def promote(self, registry_name: str, version: str, reason: str) -> None:
        client = self.mlflow.MlflowClient(self.uri)
        client.set_registered_model_alias(registry_name, "champion", version)
        client.set_model_version_tag(registry_name, version, "promotion_reason", reason[:5000])

    def model_versions(self, registry_name: str) -> list[dict]:
        client = self.mlflow.MlflowClient(self.uri)
        return [{"version": str(v.version), "tags": dict(v.tags), "run_id": v.run_id}
                for v in client.search_model_versions(f"name = '{registry_name}'")]

    def load_gate(self, registry_name: str, ref: str = "champion") -> dict:
        """The gate file's document behind `models:/<name>@<alias>` (or a version number), stamped
        with the registered name, version and alias it was loaded by."""
        from .gating.gate_file import with_registry
        client = self.mlflow.MlflowClient(self.uri)
        version = client.get_model_version(registry_name, ref) if ref.isdigit() else \
            client.get_model_version_by_alias(registry_name, ref)
        uri = f"models:/{registry_name}/{ref}" if ref.isdigit() else f"models:/{registry_name}@{ref}"
        doc = self.mlflow.pyfunc.load_model(uri).unwrap_python_model().doc
        return with_registry(doc, registry_name, version.version, None if ref.isdigit() else ref)


# What a logged gate or WISV head needs to load: stated, because MLflow otherwise infers it by
# loading the model in a subprocess, ~5 s a model (7 models: ~35 s of a repro). A gate file holds
# its classifier as numbers or LightGBM's model text (gating.gate_file), the head is torch weights.
_MODEL_PACKAGES = ("mlflow", "cloudpickle", "numpy", "pandas", "lightgbm", "torch", "speccap")


def model_requirements() -> list[str]:
    """The pins of _MODEL_PACKAGES as installed here (a package that is not installed: unpinned)."""
    from importlib.metadata import PackageNotFoundError, version
    out = []
    for name in _MODEL_PACKAGES:
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            out.append(name)
    return out


def _gate_pyfunc():
    """The pyfunc class (built here: MLflow is imported only by this module)."""
    import mlflow.pyfunc

    class GateModel(mlflow.pyfunc.PythonModel):
        """Rows of token features in (the gate's columns, gating.features.token_columns), per row
        out: the token's score and whether it goes to the cloud (score > the gate's threshold, the
        one of the row's language when thresholds are per language)."""

        def load_context(self, context):
            from speccap.gating.gate_file import model_of, read_gate
            self.doc = read_gate(context.artifacts["gate"])
            self.model = model_of(self.doc, context.artifacts["gate"])

        def predict(self, context, model_input, params=None):
            import numpy as np
            import pandas as pd

            cols = list(self.model.columns)
            missing = [f for f in cols if f not in model_input.columns]
            if missing:
                raise ValueError(f"gate input lacks {len(missing)} feature column(s), first {missing[:5]}")
            out = pd.DataFrame({"score": self.model.token_scores(model_input[cols].to_numpy(np.float32))})
            thr = self.doc["threshold"]
            if isinstance(thr, dict):  # per language: the `zh` feature says which
                zh = model_input["zh"].to_numpy(float) > 0.5
                thr = np.where(zh, thr.get("zh", max(thr.values())), thr.get("en", max(thr.values())))
            out["escalate"] = out["score"] > thr
            return out

    return GateModel


def _wisv_pyfunc():
    """The WISV head's pyfunc class (built here: MLflow is imported only by this module)."""
    import mlflow.pyfunc

    class WisvHeadModel(mlflow.pyfunc.PythonModel):
        """Rows in: columns e0..e{De-1} (edge hidden state), c0..c{Dc-1} (cloud hidden state),
        csi0..csi3 (decoding.wisv.training.CSI.vector: log10 up/down Mbps, RTT/100 ms, 10 x loss) and, for a
        head that reads them, s0..s3 (decoding.wisv.training.CLOUD_SCALARS). Out per row: p_reject and reject
        (p_reject >= tau: the mismatch is repaired)."""

        def load_context(self, context):
            import json

            from speccap.decoding.wisv.head import load_head
            self.head = load_head(context.artifacts["head"])
            with open(context.artifacts["meta"]) as fh:
                self.tau = json.load(fh)["tau"]

        def predict(self, context, model_input, params=None):
            import numpy as np
            import pandas as pd
            import torch
            de, dc, dk = self.head.dims
            cols = {"e": [f"e{i}" for i in range(de)], "c": [f"c{i}" for i in range(dc)],
                    "csi": [f"csi{i}" for i in range(dk)], "s": [f"s{i}" for i in range(self.head.d_scalar)]}
            missing = [c for group in cols.values() for c in group if c not in model_input.columns]
            if missing:
                raise ValueError(f"WISV head input lacks {len(missing)} column(s), first {missing[:3]}")
            x = [torch.from_numpy(model_input[c].to_numpy(np.float32)) for c in cols.values() if c]
            with torch.no_grad():
                p = self.head(*x).numpy()
            return pd.DataFrame({"p_reject": p, "reject": p >= self.tau})

    return WisvHeadModel
