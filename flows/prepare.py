"""DVC stage `prepare`: corpus -> WAVs + manifests, as a Prefect flow."""

from prefect import flow, task

from flows import stage_main
from speccap.config import load_params
from speccap.data.prepare import prepare


@task(name="prepare-corpus")
def prepare_task(params_path: str | None) -> dict:
    return prepare(load_params(params_path))


@flow(name="speccap-prepare")
def prepare_flow(params_path: str | None = None) -> dict:
    report = prepare_task(params_path)
    return {k: v for k, v in report.items() if k != "skipped"} | {"skipped": len(report["skipped"])}


if __name__ == "__main__":
    stage_main(prepare_flow, "prepare")
