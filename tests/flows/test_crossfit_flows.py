"""Cross-fitting as the flows run it: the referenced (test) clips are the only clips with references;
trace_refs -> traces -> gates -> gate_eval on the tiny project, against a real MLflow store."""

import json
import shutil

import pandas as pd
import pytest

from speccap.config import load_params
from speccap.data.manifest import manifest_path, read_manifest, write_jsonl
from speccap.pipeline.splits import folds_of, val_fold
from speccap.pipeline.trace_refs import build_trace_refs

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server")]


def test_each_clip_is_evaluated_by_gates_that_never_saw_it(own_project, tmp_path):
    from flows.gate_eval import gate_eval_flow
    from flows.gates import gates_flow
    from flows.traces import traces_flow
    params, raw, pfile = own_project("crossfit-test", gates={
        "traces": {"train_clips": 0, "val_clips": 0, "block_len": 2, "critical_margin": 0.1},
        "budgets": [0.3, 0.5], "promote_budget": 0.3, "targets": ["gain", "critical"], "kinds": ["logistic"],
        "baselines": ["entropy"], "eval_clips": 0, "detail_clips": 0, "dagger": {"rounds": 0},
        "verify_ranks": []})
    # every clip of the tiny corpus becomes a referenced test clip: no train or val split of its own
    proc = tmp_path / "proc"
    shutil.copytree(params.data.processed_dir, proc)
    for lang in params.data.languages:
        recs = [r | {"split": "test"} for s in ("train", "val", "test")
                for r in read_manifest(manifest_path(params.data.processed_dir, s, lang))]
        write_jsonl(manifest_path(proc, "test", lang), recs)
        for s in ("train", "val"):
            manifest_path(proc, s, lang).unlink()
    raw["data"] |= {"processed_dir": str(proc), "cross_fit": {"when": "always", "folds": 3}}
    pfile.write_text(json.dumps(raw))
    params = load_params(pfile)

    report = build_trace_refs(params, None)
    assert report["cross_fit_folds"] == 3
    ids = {lang: [r["id"] for r in read_manifest(manifest_path(proc, "test", lang))] for lang in params.data.languages}
    fold = {lang: folds_of(ids[lang], 3) for lang in ids}
    for lang, of in fold.items():  # the shipped gates: validated on fold 0, trained on the others
        assert report["splits"][f"val.{lang}"]["clips"] == sum(f == 0 for f in of.values())
        assert report["splits"][f"train.{lang}"]["clips"] == sum(f != 0 for f in of.values())

    def clips_in(folds_wanted) -> int:
        return sum(f in folds_wanted for of in fold.values() for f in of.values())

    traces_flow(str(pfile))
    gates = gates_flow(str(pfile))
    cf = gates["cross_fit"]
    assert cf["folds"] == 3 and [p["fold"] for p in cf["per_fold"]] == [0, 1, 2]
    for p in cf["per_fold"]:  # trained on the one fold left, thresholded on the next, its own fold unseen
        assert p["val_fold"] == val_fold(p["fold"], 3)
        assert p["train_clips"] == clips_in({0, 1, 2} - {p["fold"], p["val_fold"]})
        assert p["val_clips"] == clips_in({p["val_fold"]})
        assert (tmp_path / f"models/gates/folds/{p['fold']}/tok-logistic-critical.gate.json").exists()

    result = gate_eval_flow(str(pfile))
    summary = json.loads((tmp_path / "reports/gates/summary.json").read_text())
    gated = [r for r in summary["configs"] if r.get("folds")]
    assert gated and all(r["status"] == "FINISHED" for r in gated)
    for row in gated:
        # pooled over the folds: every referenced clip once, each from the run of its own fold's gate
        lang_ids = ids[row["language"]]
        assert row["clips"] == len(lang_ids) and sorted(row["clip_stats"]["ids"]) == sorted(lang_ids)
        assert set(row["folds"]) == {"0", "1", "2"}
        for f, run in row["folds"].items():
            records = [json.loads(x) for x in (tmp_path / f"reports/gate_runs/{run['config_id']}.jsonl")
                       .read_text().splitlines()]
            assert {r["id"] for r in records} == {i for i in lang_ids if fold[row["language"]][i] == int(f)}
            if " (" not in row["gate_name"]:  # its own fold's threshold at the row's budget, not the shipped gate's
                own = json.loads((tmp_path / f"models/gates/folds/{f}/gates.json").read_text())
                thresholds = own["gates"][row["gate_name"]]["thresholds"]
                assert run["threshold"] == thresholds[str(row["budget"])][row["language"]]
    # one pooled row per gate, budget and language: two budgets are two rows, never one of twice the clips
    keys = [(r["gate_name"], r["budget"], r["language"]) for r in gated]
    assert len(keys) == len(set(keys)) and {r["budget"] for r in gated} == {0.3, 0.5}
    assert "Cross-fitted over 3 folds" in (tmp_path / "reports/gates/gates.md").read_text()
    en = result["languages"]["en"]
    assert set(en["gates"]) >= {"entropy", "oracle", gates["chosen"]["gain"]}
    assert all(e["clips"] == len(ids["en"]) for e in en["gates"][gates["chosen"]["gain"]])
    assert pd.read_parquet(tmp_path / "data/traces/train.parquet")["clip_id"].nunique() == clips_in({1, 2})
