"""DVC stage `train`: tokenizer + edge and cloud captioners of the embedded default, as a Prefect flow."""

from prefect import flow, task

from flows import stage_main
from speccap.config import load_params
from speccap.models.captioners import train_captioners


@task(name="train-captioners", retries=1)
def train_task(params_path: str | None) -> dict:
    # a retry resumes from the last checkpoint (same settings -> same fingerprint)
    return train_captioners(load_params(params_path))


@flow(name="speccap-train")
def train_flow(params_path: str | None = None) -> dict:
    report = train_task(params_path)
    return {role: {k: v for k, v in report[role].items() if k not in ("history", "size")} for role in ("edge", "cloud")}


if __name__ == "__main__":
    stage_main(train_flow, "train")
