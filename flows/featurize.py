"""DVC stage `featurize`: manifests -> log-mel + prosody features, as a Prefect flow."""

from prefect import flow, task

from flows import stage_main
from speccap.config import load_params
from speccap.data.featurize import featurize


@task(name="featurize-clips", retries=1)
def featurize_task(params_path: str | None) -> dict:
    # a retry resumes: finished clips are on disk and are not computed again
    return featurize(load_params(params_path))


@flow(name="speccap-featurize")
def featurize_flow(params_path: str | None = None) -> dict:
    report = featurize_task(params_path)
    return {k: v for k, v in report.items() if k != "skipped"} | {"skipped": len(report["skipped"])}


if __name__ == "__main__":
    stage_main(featurize_flow, "featurize")
