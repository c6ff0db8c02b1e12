"""What a stage's experiment view (speccap.run_views) would show, checked against the runs a real
flow logged: a view naming a column no run logs, or a filter that hides the rows, fails here."""

import json

from speccap.run_views import HEADLINE, ROLE_TAG, ROW, VIEW_TAG
from speccap.tracking import Tracker


def check_view(tracker: Tracker, kind: str) -> None:
    """The experiment's view is `kind`'s; its filter keeps exactly the rows (runs tagged as rows,
    none of the sweeps that group them); every headline column is logged by some row."""
    view = json.loads(tracker.mlflow.get_experiment(tracker.experiment_id).tags[VIEW_TAG])
    runs = tracker.runs()
    shown = tracker.mlflow.search_runs([tracker.experiment_id], filter_string=view["searchFilter"],
                                       output_format="list")
    rows = {r["run_id"] for r in runs if r["tags"].get(ROLE_TAG) == ROW}
    assert rows and {r.info.run_id for r in shown} == rows
    assert len(rows) < len(runs)  # the sweeps are hidden, not shown
    logged = {group: set().union(*(r[group] for r in runs if r["run_id"] in rows)) for group in ("metrics", "params")}
    for group in ("metrics", "params"):
        assert set(HEADLINE[kind][group]) <= logged[group], (kind, group, set(HEADLINE[kind][group]) - logged[group])
    assert view["selectedColumns"][0] == f"metrics.`{HEADLINE[kind]['metrics'][0]}`"
