"""DVC stage `headline`: reports/headline.json, what `dvc metrics show` and `dvc exp show` print
(speccap.pipeline.headline), from the report, gate evaluation and promotion of the same run."""

from prefect import flow

from flows import stage_main
from speccap.config import load_params
from speccap.pipeline.headline import write_headline


@flow(name="speccap-headline")
def headline_flow(params_path: str | None = None) -> dict:
    return write_headline(load_params(params_path).data.languages)


if __name__ == "__main__":
    stage_main(headline_flow, "headline")
