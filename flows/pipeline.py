"""The first five stages as one Prefect flow, what a deployment schedules: prepare -> featurize ->
train -> decode -> report (`python -m flows.pipeline`). The trace, gate and WISV stages after them
run from dvc.yaml (`dvc repro`)."""

from prefect import flow

from flows.decode import decode_flow
from flows.featurize import featurize_flow
from flows.prepare import prepare_flow
from flows.report import report_flow
from flows.train import train_flow
from speccap.config import materialize


@flow(name="speccap-pipeline")
def pipeline_flow(params_path: str | None = None, overrides: dict | None = None) -> dict:
    """`overrides`: dotted params keys on top of the file (a deployment's parameters)."""
    params_path = materialize(params_path, overrides)
    out = {"prepare": prepare_flow(params_path), "featurize": featurize_flow(params_path)}
    out["train"] = train_flow(params_path)
    out["decode"] = decode_flow(params_path)
    out["report"] = report_flow(params_path)
    return out


if __name__ == "__main__":
    print(pipeline_flow())
