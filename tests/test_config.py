import json
from pathlib import Path

import pytest
import yaml

from speccap.config import ConfigError, load_params, params_from_dict


def test_repository_params_load_and_ci_profile_overrides(tmp_path):
    p = load_params("params.yaml")
    assert p.data.synthetic.test_per_language == 332
    text = open("params.yaml").read().replace("profile: default", "profile: ci")
    (tmp_path / "p.yaml").write_text(text)
    ci = load_params(tmp_path / "p.yaml")
    assert ci.data.synthetic.train_per_language < p.data.synthetic.train_per_language
    assert ci.features == p.features  # untouched sections stay


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="data.synthetic.trian_per_language"):
        params_from_dict({"data": {"synthetic": {"trian_per_language": 3}}})


def test_wrong_type_and_choice_are_named():
    with pytest.raises(ConfigError, match="features.hop_length"):
        params_from_dict({"features": {"hop_length": "fast"}})
    with pytest.raises(ConfigError, match="data.source"):
        params_from_dict({"data": {"source": "youtube"}})
    with pytest.raises(ConfigError, match="data.languages"):
        params_from_dict({"data": {"languages": ["fr"]}})


def test_unknown_profile_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="profile"):
        params_from_dict({"profile": "huge"})
    with pytest.raises(ConfigError, match="not found"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_params(bad)


def _resolved(raw, tmp_path, name):
    from speccap.stage_params import write_resolved
    out = tmp_path / name
    write_resolved(params_from_dict(raw), out)
    return {f.stem: f.read_text() for f in sorted(out.glob("*.json"))}


def test_each_stage_sees_only_its_resolved_params(tmp_path):
    base = {"profile": "default", "profiles": {"ci": {"sweep": {"clips": 5}}}}
    ref = _resolved(base, tmp_path, "a")
    stages = yaml.safe_load((Path(__file__).resolve().parents[1] / "dvc.yaml").read_text())["stages"]
    assert set(ref) == set(stages) - {"resolve"}  # a resolved file for every stage dvc.yaml runs
    # editing a profile that is not selected changes nothing any stage uses
    other = dict(base, profiles={"ci": {"sweep": {"clips": 7}, "models": {"edge": {"train": {"max_steps": 3}}}}})
    assert _resolved(other, tmp_path, "b") == ref
    # selecting it changes exactly the stages its overrides reach
    ci = _resolved(dict(other, profile="ci"), tmp_path, "c")
    # (the test clips' count: the sweep's, and those the gates are cross-fitted on or evaluated on)
    assert sorted(s for s in ref if ci[s] != ref[s]) == ["decode", "gate_eval", "gates", "trace_refs", "train",
                                                         "wisv_eval"]
    # a draft length: decode and report only
    new_l = _resolved(dict(base, decode={"block_len": 7}), tmp_path, "d")
    assert sorted(s for s in ref if new_l[s] != ref[s]) == ["decode", "report"]
    assert json.loads(new_l["decode"])["decode"]["block_len"] == 7
    # a sampling temperature: every stage whose captions it changes (wisv_eval's edge and cloud runs too)
    hot = _resolved(dict(base, decode={"temperature": 0.5}), tmp_path, "e")
    assert sorted(s for s in ref if hot[s] != ref[s]) == ["decode", "gate_eval", "gates", "promote", "report",
                                                          "trace_refs", "wisv_eval"]


def test_resolved_files_are_rewritten_only_when_they_change(tmp_path):
    from speccap.stage_params import write_resolved
    p = params_from_dict({})
    write_resolved(p, tmp_path)
    stamps = {f.name: f.stat().st_mtime_ns for f in tmp_path.glob("*.json")}
    import time
    time.sleep(0.01)
    write_resolved(params_from_dict({"link": {"rtt_ms": 5.0}}), tmp_path)
    changed = {f.name for f in tmp_path.glob("*.json") if f.stat().st_mtime_ns != stamps[f.name]}
    assert changed == {"decode.json", "report.json", "gate_eval.json", "promote.json", "wisv_eval.json"}


def test_overrides_apply_after_the_profile_and_materialize_to_an_equal_file(tmp_path):
    import dataclasses

    from speccap.config import ConfigError, load_params, materialize
    p = load_params("params.yaml", {"profile": "ci", "decode.block_len": 7, "cluster.executor": "dask"})
    assert p.decode.block_len == 7 and p.sweep.clips == 20 and p.cluster.executor == "dask"  # ci's clips kept
    path = materialize("params.yaml", {"profile": "ci", "decode.block_len": 7, "cluster.executor": "dask"}, tmp_path)
    assert dataclasses.replace(p, profile="default") == load_params(path)
    assert materialize("params.yaml", None) == "params.yaml"
    with pytest.raises(ConfigError, match="decode.blok_len"):
        load_params("params.yaml", {"decode.blok_len": 7})
    with pytest.raises(ConfigError, match="cluster.executor"):
        load_params("params.yaml", {"cluster.executor": "mpi"})


def test_wisv_settings_are_checked_and_named():
    p = params_from_dict({})
    assert set(p.wisv.channels) == {"up20-rtt5", "up20-rtt50", "up500-rtt5", "up500-rtt50", "markov"}
    assert p.wisv.channels["markov"].markov.bad_mbps == 0.35
    with pytest.raises(ConfigError, match="wisv.protocol"):
        params_from_dict({"wisv": {"protocol": "both"}})
    with pytest.raises(ConfigError, match="wisv.tau"):
        params_from_dict({"wisv": {"tau": 2.0}})
    with pytest.raises(ConfigError, match="wisv.critical_weight"):
        params_from_dict({"wisv": {"critical_weight": -1.0}})
    for bad in ([1, 2], [2, 2], []):  # R = 1 is greedy, already in the evaluation
        with pytest.raises(ConfigError, match="wisv.verify_ranks"):
            params_from_dict({"wisv": {"verify_ranks": bad}})
    assert params_from_dict({"wisv": {"verify_ranks": [3, 2]}}).wisv.verify_ranks == (3, 2)
    with pytest.raises(ConfigError, match="wisv.channels.slow"):
        params_from_dict({"wisv": {"channels": {"slow": {"uplink_mbps": 0.0}}}})
    with pytest.raises(ConfigError, match="wisv.channels.slow.rtt"):
        params_from_dict({"wisv": {"channels": {"slow": {"rtt": 5}}}})
