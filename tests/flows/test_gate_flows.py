"""traces -> gates -> gate_eval -> promote as Prefect flows on the tiny project, against a real
MLflow SQLite store and registry; then `speccap caption --gate champion` uses the promoted gate."""

import contextlib
import io
import json

import pandas as pd
import pytest

from speccap.data.manifest import manifest_path, read_manifest
from speccap.tracking import Tracker

from .views import check_view

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server")]


def test_gate_chain_end_to_end(own_project, tmp_path):
    from flows.gate_eval import gate_eval_flow
    from flows.gates import gates_flow
    from flows.promote import promote_flow
    from flows.traces import traces_flow
    from speccap.cli import main
    params, raw, pfile = own_project("gates-test", gates={
        # the tiny models gain little from any correction: a tenth of a point makes a mismatch critical
        "traces": {"train_clips": 4, "val_clips": 2, "block_len": 2, "critical_margin": 0.1}, "budgets": [0.3, 0.6],
        "promote_budget": 0.3, "targets": ["gain", "critical", "mismatch"],  # the main target first
        "eval_clips": 2, "dagger": {"rounds": 1, "train_clips": 2}, "verify_ranks": [1]})

    summary = traces_flow(str(pfile))
    train = pd.read_parquet(tmp_path / "data/traces/train.parquet")
    assert summary["train"]["clips"] == 8 and len(train) == summary["train"]["tokens"] > 0
    assert {"cloud_rank", "cloud_token", "mismatch", "impact", "impact_emotion", "critical", "clip_id", "x0"} \
        <= set(train.columns)
    # a rerun resumes: nothing is traced again
    traces_flow(str(pfile))
    assert (tmp_path / "data/traces/train.en.jsonl").read_text().count("\n") == 4
    # WISV's head learns from these same traces (wisv.labels: shadow), tracing nothing of its own
    from flows.wisv_head import wisv_head_flow
    head = wisv_head_flow(str(pfile))
    with_states = train[train["h_edge"].notna()]
    assert head["labels"] == "shadow" and head["train_mismatches"] == len(with_states) > 0
    assert with_states["mismatch"].all() and not any((tmp_path / "data/wisv_traces").iterdir())

    gates = gates_flow(str(pfile))
    names = [f"tok-{k}-{t}" for k in ("logistic", "lightgbm", "mlp") for t in ("gain", "critical", "mismatch")]
    assert set(names) <= set(gates["gates"]) and {"entropy", "entropy-block"} <= set(gates["gates"])
    tracker = Tracker(raw["tracking"]["uri"], "gates-test-gates")  # the gates' own experiment
    assert len(tracker.model_versions("speccap-gate")) == 9
    assert list(gates["chosen"]) == ["gain", "critical", "mismatch"]
    # one DAgger round: the main target's chosen gate decoded train and validation clips, their committed
    # captions were traced, and the gates were trained again with them
    (r,) = gates["dagger"]
    assert r["round"] == 1 and r["gate"].endswith("-gain") and r["traces"]["train"]["clips"] == 4
    assert r["traces"]["val"]["clips"] == 4 and r["train_tokens"] > len(train)
    assert (tmp_path / "data/dagger/round1/train.en.jsonl").read_text().count("\n") == 2
    assert 0.0 <= r["corrected_share_of_val_tokens"] <= 1.0
    (logged,) = [x for x in tracker.runs() if x["name"] == "dagger-round-1"]
    assert "before_auc_mismatch" in logged["metrics"] or "after_auc_mismatch" in logged["metrics"]
    chosen = set(gates["chosen"].values())
    # the R flagged tokens are judged by: decode's and greedy, each on the validation clips, one chosen per
    # language and written into every registered gate (what a deployed champion reads back)
    vr = gates["verify_rank"]
    assert vr["candidates"] == [params.decode.rank, 1] and vr["gate"] == gates["chosen"]["gain"]
    assert set(vr["chosen"]) == {"en", "zh"} and set(vr["chosen"].values()) <= {params.decode.rank, 1}
    assert {row["clips"] for per in vr["validation"].values() for row in per.values()} == {2}
    assert len(list((tmp_path / "data/verify_rank").glob("*.jsonl"))) == 4
    assert tracker.load_gate("speccap-gate", tracker.model_versions("speccap-gate")[0]["version"])[
        "verify_rank"] == vr["chosen"]

    result = gate_eval_flow(str(pfile))
    en = result["languages"]["en"]
    pending = f"{gates['chosen']['gain']} (pending)"  # the other variant, at the promote budget only
    assert set(en["gates"]) == chosen | {"entropy", "entropy-block", "oracle", "ceiling", pending}
    assert all(len(v) == 2 for n, v in en["gates"].items() if n not in ("oracle", "ceiling", pending))
    # the ceiling at each of its budgets, searched on the evaluation's clips and kept for a rerun
    assert [e["budget"] for e in en["gates"]["ceiling"]] == list(params.gates.ceiling.budgets)
    assert all(e["rho"] <= e["budget"] + 1e-9 and e["clips"] == 2 for e in en["gates"]["ceiling"])
    assert (tmp_path / "reports/gate_runs/ceiling.en.jsonl").read_text().count("\n") == 2
    assert "## The ceiling at each budget" in (tmp_path / "reports/gates/gates.md").read_text()
    assert len(en["gates"]["oracle"]) == len(en["gates"][pending]) == 1
    # every figure with its interval, the gap shares too
    e = en["gates"]["entropy"][0]
    assert e["bleu1"]["ci_low"] <= e["bleu1"]["value"] <= e["bleu1"]["ci_high"]
    assert "gap" in e["gap_closed_bleu1"]
    assert (tmp_path / "reports/gates/pareto.png").stat().st_size > 5000
    md = (tmp_path / "reports/gates/gates.md").read_text()
    assert "| en | oracle |" in md and "| en | entropy-block |" in md and "## DAgger rounds" in md
    assert "## How flagged tokens are judged" in md
    for lang, r in vr["chosen"].items():  # the token rows judge by the chosen R
        names = [p.name for p in (tmp_path / "reports/gate_runs").glob(f"ugsd-{lang}-*-tokalone-*.jsonl")]
        assert names and all(f"-rank{r}-" in n or (r == 1 and "-greedy-" in n) for n in names)
    name = sorted(chosen)[0]
    budget_runs = [r for r in tracker.runs() if r["params"].get("gate_name") == name]
    assert {r["params"]["budget"] for r in budget_runs} >= {"0.3", "0.6"}

    check_view(tracker, "gates")
    first = promote_flow(str(pfile))
    assert first["promote"] in chosen and "first champion" in first["reason"]
    champ = tracker.champion("speccap-gate")
    assert champ["tags"]["gate"] == first["promote"] and "promotion_reason" in champ["tags"]
    again = promote_flow(str(pfile))  # the same gates: nothing changes
    assert again["promote"] is None and tracker.champion("speccap-gate")["version"] == champ["version"]

    wav = read_manifest(manifest_path(params.data.processed_dir, "test", "en"))[0]["path"]
    # stdout only: capsys would also swap the stderr that Prefect's log handler holds on to
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["--params", str(pfile), "caption", wav, "--mode", "ugsd", "--gate", "champion", "--json"]) == 0
    out = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert isinstance(out["caption"], str) and "rho" in out
    assert out["transmitted"] == out["rounds"]  # token level, verify "alone": one token per round
