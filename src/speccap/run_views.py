"""Where the project's MLflow runs are compared, and how the MLflow UI opens on them.

One experiment per kind of comparison, so each runs page holds runs that compare with each other:
the decode sweep (and the traces) in `tracking.experiment`, the gates' training, evaluation and
promotion in "<experiment>-gates", the WISV head and its evaluation in "<experiment>-wisv", what the
uplink reveals in "<experiment>-privacy".

Each experiment carries a view of its runs page that the UI restores from a link (MLflow's shared
view state: an experiment tag holding the page's JSON state, named by `viewStateShareKey` in the
link). The view lists the runs that are rows of a comparison (one per configuration, gate or head;
not the sweep runs that group them, which the page would otherwise show collapsed) with the headline
columns first. No MLflow import here: tracking.py writes the tag.
"""

from __future__ import annotations

import json

STAGE_EXPERIMENTS = {"gates": "gates", "gate_eval": "gates", "promote": "gates", "wisv_head": "wisv",
                     "wisv_eval": "wisv", "privacy": "privacy"}

# A run's role, as tag `ROLE_TAG`: a row of a comparison, or a sweep grouping rows
ROLE_TAG, ROW, SWEEP = "role", "row", "sweep"

# What a reader compares first, per kind of comparison ("" = the decode sweep): the settings
# that tell rows apart, then quality with its 95% interval, the escalation rate and the time
_QUALITY = ["bleu1", "bleu1_ci_low", "bleu1_ci_high", "emotion_hit_rate", "emotion_hit_rate_ci_low",
            "emotion_hit_rate_ci_high", "rho", "total_time"]
HEADLINE = {
    "": {"params": ["language", "method", "gate", "block_len", "threshold", "rank"], "metrics": _QUALITY},
    "gates": {"params": ["language", "gate_name", "budget", "threshold", "kind", "target"],
              "metrics": [*_QUALITY, "auc_critical", "auc_mismatch"]},
    "wisv": {"params": ["language", "gate", "block_len", "link", "rule"],
             "metrics": [*_QUALITY, "ttft", "otps", "val_auc"]},
    # what an eavesdropper rebuilds from each uplink representation
    "privacy": {"params": ["representation", "bands", "merge", "normalize", "hop"],
                "metrics": ["stoi", "stoi_ci_low", "stoi_ci_high", "voice_id", "voice_id_ci_low", "voice_id_ci_high",
                            "commonest_voice", "speaker_eer", "bytes_per_second"]},
}
VIEW_KEY = "speccap"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"


def kind_of(stage: str) -> str:
    """The kind of comparison a stage's runs belong to ("" = the decode sweep's)."""
    return STAGE_EXPERIMENTS.get(stage, "")


def experiment_for(base: str, stage: str) -> str:
    """The experiment a stage logs its runs to (`base`: tracking.experiment)."""
    kind = kind_of(stage)
    return f"{base}-{kind}" if kind else base


def _column(group: str, key: str) -> str:
    return f"{group}.`{key}`"  # the UI's column keys


def view_state(kind: str) -> str:
    """The runs page's state for one kind of comparison, as the UI reads it from VIEW_TAG."""
    cols = HEADLINE[kind]
    return json.dumps({
        "searchFilter": f"tags.{ROLE_TAG} = '{ROW}'",
        "orderByKey": _column("tags", "mlflow.runName"), "orderByAsc": True,
        "selectedColumns": [*(_column("metrics", m) for m in cols["metrics"]),
                            *(_column("params", p) for p in cols["params"])],
    }, separators=(",", ":"))


def runs_page(ui: str, experiment_id: str) -> str:
    """The MLflow UI's page of an experiment's runs in its model-training views (the UI chooses
    between those and its GenAI views by a switch it keeps in the browser, GenAI unless
    `workflowType` in the link says), opened on the experiment's view."""
    return (f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            f"&viewStateShareKey={VIEW_KEY}")


def compare_page(ui: str, experiment_id: str, run_ids: list[str]) -> str:
    """The MLflow UI's side-by-side view of `run_ids` (params, every metric, plots)."""
    runs = ",".join(f'"{r}"' for r in run_ids)
    return f'{ui.rstrip("/")}/#/compare-runs?runs=[{runs}]&experiments=["{experiment_id}"]&workflowType=machine_learning'
