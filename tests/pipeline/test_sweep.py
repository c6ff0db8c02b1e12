import dataclasses
import json

import pytest

from speccap.batching.step_graphs import MAX_TOKENS
from speccap.config import load_params, params_from_dict
from speccap.pipeline import workers
from speccap.pipeline.splits import eval_clips
from speccap.pipeline.sweep import (
    RunConfig,
    build_configs,
    config_key,
    run_config,
    summarize,
    ugsd_config,
)
from speccap.pipeline.workers import Pool


def test_configs_cover_baselines_l_sweep_and_gates():
    p = params_from_dict({"sweep": {"block_lens": [3, 5, 0], "gates": {"entropy": [0.5, 1.0], "margin": [0.3]}},
                          "decode": {"gate": "entropy", "threshold": 1.0, "block_len": 5}})
    names = [c.name for c in build_configs(p)]
    assert names.count("edge-en") == 1 and "cloud-zh" in names
    ugsd_en = [n for n in names if n.startswith("ugsd-en")]
    # L in {3, 5, adaptive} at entropy 1.0, plus entropy 0.5 and margin 0.3 at L = 5 (entropy 1.0 L5 once)
    assert sorted(ugsd_en) == sorted(["ugsd-en-entropy1-L3-rank2", "ugsd-en-entropy1-L5-rank2",
                                      "ugsd-en-entropy1-Ladapt-rank2", "ugsd-en-entropy0.5-L5-rank2",
                                      "ugsd-en-margin0.3-L5-rank2"])


def test_the_headline_three_run_on_all_clips_the_details_on_fewer(tiny_project):
    import dataclasses

    from speccap.pipeline.sweep import default_config, is_headline, sweep_clips
    params = tiny_project[0]
    params = dataclasses.replace(params, sweep=dataclasses.replace(params.sweep, detail_clips=2))
    configs = build_configs(params)
    clips_of = sweep_clips(params)
    for lang in ("en", "zh"):
        assert default_config(params, lang) in configs
    sizes = {c.name: len(clips_of(c)) for c in configs}
    headline = {c.name for c in configs if is_headline(c, params)}
    assert headline == {f"{m}-{lang}" for m in ("edge", "cloud") for lang in ("en", "zh")} | {
        "ugsd-en-entropy3-L2-rank2", "ugsd-zh-entropy3-L2-rank2"}
    assert {sizes[n] for n in headline} == {3} and {sizes[n] for n in sizes if n not in headline} == {2}
    # the detail clips are the first of the headline ones: what is left out is the tail
    other = next(c for c in configs if not is_headline(c, params))
    assert [x["id"] for x in clips_of(other)] == [x["id"] for x in eval_clips(params, other.language)][:2]
    # 0 = every configuration on every clip, as before
    assert {len(sweep_clips(tiny_project[0])(c)) for c in configs} == {3}


def test_pipelined_configs_sit_next_to_the_blocking_one():
    p = params_from_dict({"sweep": {"block_lens": [3], "gates": {}, "in_flight": [1, 4]},
                          "decode": {"gate": "entropy", "threshold": 1.0, "block_len": 5}})
    ugsd_zh = [c for c in build_configs(p) if c.method == "ugsd" and c.language == "zh"]
    assert sorted(c.name for c in ugsd_zh) == sorted([
        "ugsd-zh-entropy1-L3-rank2", "ugsd-zh-entropy1-L5-rank2", "ugsd-zh-entropy1-L5-rank2-N1",
        "ugsd-zh-entropy1-L5-rank2-N4"])
    with pytest.raises(Exception, match="in_flight"):
        params_from_dict({"sweep": {"in_flight": [-1]}})


def test_config_key_changes_with_what_the_records_depend_on():
    p = params_from_dict({})
    c = ugsd_config(p, "en", gate="entropy", threshold=1.0, block_len=5, rule="rank", rank=2)
    k = config_key(c, p, "fp", ["a", "b"])
    assert k != config_key(c, p, "fp2", ["a", "b"]) != config_key(c, p, "fp", ["a"])
    assert k != config_key(c, params_from_dict({"link": {"rtt_ms": 5.0}}), "fp", ["a", "b"])
    assert k == config_key(c, params_from_dict({}), "fp", ["a", "b"])
    # edge-only and cloud-only do not depend on the gate or L: a change of those keeps their records
    other_l = params_from_dict({"decode": {"block_len": 7}})
    assert k != config_key(c, other_l, "fp", ["a", "b"])
    for method in ("edge", "cloud"):
        ref = RunConfig(method, "en")
        assert config_key(ref, p, "fp", ["a"]) == config_key(ref, other_l, "fp", ["a"])
        assert config_key(ref, p, "fp", ["a"]) != config_key(ref, params_from_dict({"decode": {"temperature": 0.7}}),
                                                            "fp", ["a"])
        # their times are charged by the cost model once one is set: a new charge, new records
        per_call = {"prefill": [1e-3, 1e-5], "extend": [2e-4, 5e-5, 0.0]}
        costed = params_from_dict({"decode": {"cost": {"edge": per_call, "cloud": per_call}}})
        assert config_key(ref, p, "fp", ["a"]) != config_key(ref, costed, "fp", ["a"])


def test_records_are_written_as_they_come_and_a_rerun_resumes(tiny_project, tmp_path):
    params, _, params_file = tiny_project
    pool = Pool(str(params_file), workers=0, threads=1)
    clips = eval_clips(params, "en")
    cfg = ugsd_config(params, "en", gate="entropy", threshold=3.0, block_len=2, rule="rank", rank=2)
    path = tmp_path / "cfg.jsonl"
    calls = []
    records = run_config(cfg, clips, pool, path, progress=lambda: calls.append(1))
    assert len(records) == len(clips) == 3 and len(calls) == 3
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2]) + "\n" + lines[2][:10])  # the last record was torn by a crash
    calls.clear()
    again = run_config(cfg, clips, pool, path, progress=lambda: calls.append(1))
    assert len(calls) == 1 and [r["caption"] for r in again] == [r["caption"] for r in records]
    s = summarize(cfg, again, clips)
    for key in ("bleu1", "meteor", "rouge_l", "rho", "aal", "total_time", "ttft", "otps", "bytes_up", "cpu_percent"):
        assert key in s
    assert 0 <= s["rho"] <= 1 and isinstance(s["position_acceptance"], list)


def test_a_job_carries_its_decoder_and_the_worker_runs_it_as_built(tiny_project, tmp_path):
    params, _, params_file = tiny_project
    pool = Pool(str(params_file), workers=0, threads=1)
    clips = eval_clips(params, "en")[:2]
    every = dict(gate="always", threshold=None, block_len=2, rule="greedy")
    full = run_config(ugsd_config(params, "en", **every), clips, pool, tmp_path / "full.jsonl")
    assert max(r["tokens"] for r in full) > 3
    # a spec the worker's params do not describe (3 new tokens): the worker runs it, not its params
    short = run_config(ugsd_config(params, "en", **every, max_new_tokens=3), clips, pool, tmp_path / "short.jsonl")
    assert all("error" not in r and r["tokens"] <= 3 for r in short), short
    with pytest.raises(ValueError, match="UGSD runs a decoder spec"):
        RunConfig("ugsd", "en")
    with pytest.raises(ValueError, match="edge- and cloud-only run none"):
        RunConfig("edge", "en", ugsd_config(params, "en", **every).spec)
    with pytest.raises(ValueError, match="unknown method 'both'"):
        RunConfig("both", "en")


def test_failed_captions_fail_the_configuration_with_the_reason(tiny_project, tmp_path):
    params, _, params_file = tiny_project
    pool = Pool(str(params_file), workers=0, threads=1)
    clips = [{"id": "no-such-clip", "references": ["x"], "emotion": None}]
    records = run_config(RunConfig("edge", "en"), clips, pool, tmp_path / "bad.jsonl")
    assert "error" in records[0] and "no-such-clip" in records[0]["error"]
    with pytest.raises(RuntimeError, match="1 of 1 captions failed"):
        summarize(RunConfig("edge", "en"), records, clips)
    # error records are retried on the next run, not kept
    assert json.loads((tmp_path / "bad.jsonl").read_text().splitlines()[0])["id"] == "no-such-clip"


def test_qs_configurations_sit_next_to_dense_speculative_sampling_and_old_keys_stay():
    p = params_from_dict({"sweep": {"qs_levels": [4, 0], "qs_temperature": 0.8}, "decode": {"block_len": 5}})
    sampled = [c for c in build_configs(p) if c.language == "en" and "temperature" in c.to_dict()]
    assert [c.name for c in sampled] == ["ugsd-en-always-L5-spec_sampling-T0.8", "ugsd-en-always-L5-qs4-T0.8",
                                         "ugsd-en-always-Lqsadapt-qs-T0.8"]
    # configurations without the new fields hash as before (their records stay valid)
    old = ugsd_config(p, "en", gate="entropy", threshold=1.0, block_len=5, rule="rank", rank=2)
    assert set(old.to_dict()) == {"method", "language", "gate", "threshold", "block_len", "rule", "rank", "in_flight"}
    # the entropy gate at a tuned temperature: its own name and key, the untuned one's unchanged
    tuned = old.with_spec(gate_temperature=0.5)
    assert tuned.name == "ugsd-en-entropy1@T0.5-L5-rank2" and tuned.to_dict()["gate_temperature"] == 0.5
    assert config_key(tuned, p, "fp", ["a"]) != config_key(old, p, "fp", ["a"])
    with pytest.raises(Exception, match="qs_temperature"):
        params_from_dict({"sweep": {"qs_levels": [4], "qs_temperature": 0.0}})


def test_qs_adaptive_configuration_runs_in_a_worker(tiny_project, tmp_path):
    params, _, params_file = tiny_project
    pool = Pool(str(params_file), workers=0, threads=1)
    clips = eval_clips(params, "en")[:2]
    for level in (4, 0):
        lattice = {"qs_adaptive": True} if level == 0 else {"qs_level": level}
        cfg = ugsd_config(params, "en", gate="always", threshold=None, block_len=3, rule="qs", temperature=1.0, **lattice)
        records = run_config(cfg, clips, pool, tmp_path / f"qs{level}.jsonl")
        assert all("error" not in r for r in records), records
        s = summarize(cfg, records, clips)
        assert s["rho"] == 1.0 and s["rounds"] >= 1


def test_wisv_configurations_run_on_their_channel_and_old_keys_stay():
    from speccap.pipeline.sweep import link_config
    from speccap.pipeline.wisv import wisv_configs
    p = params_from_dict({"wisv": {"block_lens": [4]}, "data": {"languages": ["en"]}})
    configs = wisv_configs(p)
    names = [c.name for c in configs if c.channel == "markov"]
    assert names == ["ugsd-en-always-L4-greedy@markov", "ugsd-en-always-L4-rank2@markov",
                     "ugsd-en-always-L4-rank3@markov", "ugsd-en-always-L4-wisv@markov"]
    assert len(configs) == 2 + 4 * 5
    wisv = next(c for c in configs if c.spec and c.spec.rule == "wisv" and c.channel == "up20-rtt5")
    assert link_config(p, wisv).rtt_ms == 5.0 and link_config(p, RunConfig("edge", "en")) == p.link
    # the channel is part of the key; a configuration without one hashes as before
    keys = {config_key(c, p, "fp", ["a"]) for c in configs}
    assert len(keys) == len(configs)
    every = dict(gate="always", threshold=None, block_len=4, rule="greedy")
    plain = ugsd_config(p, "en", **every)
    assert "channel" not in plain.to_dict() and "tau" not in plain.to_dict()
    with pytest.raises(ValueError, match="no channel 'lunar'"):
        link_config(p, ugsd_config(p, "en", "lunar", **every))


def test_channel_free_configurations_relink_from_the_first_channel():
    from speccap.pipeline.sweep import relink_source, relinkable
    from speccap.pipeline.wisv import wisv_configs
    p = params_from_dict({"wisv": {"block_lens": [4]}, "data": {"languages": ["en"]}})
    configs = wisv_configs(p)
    first = next(iter(p.wisv.channels))
    sources = {c: relink_source(c, p) for c in configs}
    # greedy and rank off the first channel relink from it; WISV reads the channel and decodes everywhere
    assert {c.name for c, s in sources.items() if s is not None} == {
        c.name for c in configs if c.spec and c.spec.rule in ("greedy", "rank") and c.channel != first}
    assert all(s == dataclasses.replace(c, channel=first) for c, s in sources.items() if s is not None)
    # the pipelined loop, a window the policy picks, or no named channel: decoded as before
    every = dict(gate="always", threshold=None, rule="greedy")
    for cfg in (ugsd_config(p, "en", "markov", **every, block_len=4, in_flight=2),
                ugsd_config(p, "en", "markov", **every, block_len=0),
                ugsd_config(p, "en", **every, block_len=4)):
        assert not relinkable(cfg) and relink_source(cfg, p) is None


def test_relinking_needs_the_source_records(tiny_project, tmp_path):
    from speccap.pipeline.sweep import relinked
    from speccap.pipeline.workers import Loaded
    p = params_from_dict({})
    cfg = ugsd_config(p, "en", "markov", gate="always", threshold=None, block_len=4, rule="greedy")
    link = p.wisv.channels["markov"]
    with pytest.raises(RuntimeError, match="lacks 2 of its captions.*run that configuration first"):
        run_config(cfg, [{"id": "a"}, {"id": "b"}], Loaded(), tmp_path / "m.jsonl",
                   relink_from=(tmp_path / "absent.jsonl", link, 0))
    assert list(relinked(cfg, [], tmp_path / "absent.jsonl", link, 0)) == []


class _Reversed:
    """A pool whose workers finish in the opposite order to the jobs'."""

    def imap(self, jobs):
        for cfg, clip_id in reversed(list(jobs)):
            yield {"id": clip_id, "caption": f"caption of {clip_id}", "method": cfg.method}


def test_a_finished_log_holds_its_clips_in_their_order_whatever_order_the_workers_finished_in(tmp_path):
    clips = [{"id": c} for c in ("c", "a", "d", "b")]
    path = tmp_path / "edge.jsonl"
    path.write_text(json.dumps({"id": "d", "caption": "kept  as written"}) + "\n"  # on record from an earlier run
                    + json.dumps({"id": "z", "caption": "a clip this run does not have"}) + "\n")
    records = run_config(RunConfig("edge", "en"), clips, _Reversed(), path)
    assert [r["id"] for r in records] == ["c", "a", "d", "b"]
    lines = path.read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["c", "a", "d", "b"]  # "z" is no output of this run
    assert lines[2] == json.dumps({"id": "d", "caption": "kept  as written"})  # each line's bytes kept
    before = path.stat().st_mtime_ns
    run_config(RunConfig("edge", "en"), clips, _Reversed(), path)  # nothing to do, nothing rewritten
    assert path.stat().st_mtime_ns == before


def _dies_on_one_clip(w, job):
    """caption_one, except that the worker given the clip named in $SPECCAP_TEST_DIE_ON dies."""
    import os
    import signal

    from speccap.pipeline.workers import caption_one
    if job[1] == os.environ.get("SPECCAP_TEST_DIE_ON"):
        os.kill(os.getpid(), getattr(signal, os.environ["SPECCAP_TEST_SIGNAL"]))
    return caption_one(w, job)


@pytest.mark.e2e
@pytest.mark.parametrize("sig", ["SIGKILL"])  # both signals: tests/test_fanout.py
def test_a_dying_sweep_worker_stops_the_configuration_and_keeps_its_records(tiny_project, tmp_path, monkeypatch, sig):
    import time

    from speccap.data.manifest import manifest_path, read_manifest
    from speccap.fanout import WorkerDied
    params, _, params_file = tiny_project
    clips = [c for split in ("train", "val", "test") for c in read_manifest(manifest_path(params.data.processed_dir, split, "en"))]
    assert len(clips) == 9
    monkeypatch.setenv("SPECCAP_TEST_DIE_ON", clips[5]["id"])
    monkeypatch.setenv("SPECCAP_TEST_SIGNAL", sig)
    cfg = ugsd_config(params, "en", gate="entropy", threshold=3.0, block_len=2, rule="rank", rank=2)
    path = tmp_path / "cfg.jsonl"
    pool = Pool(str(params_file), workers=2, threads=1, fn=_dies_on_one_clip, stage="decode")
    t0 = time.monotonic()
    with pytest.raises(WorkerDied) as err:
        run_config(cfg, clips, pool, path)
    pool.close()
    assert time.monotonic() - t0 < 60
    e = err.value
    assert e.stage == "decode" and e.item == f"clip {clips[5]['id']} of {cfg.name}" and f"killed by {sig}" in str(e)
    kept = path.read_text().splitlines()
    assert len(kept) == e.done >= 1
    # the re-run captions only what is missing
    monkeypatch.delenv("SPECCAP_TEST_DIE_ON")
    pool = Pool(str(params_file), workers=2, threads=1, stage="decode")
    calls = []
    records = run_config(cfg, clips, pool, path, progress=lambda: calls.append(1))
    pool.close()
    assert len(records) == 9 and len(calls) == 9 - len(kept)


def test_a_batched_worker_writes_the_records_of_a_single_one(tiny_project, tmp_path):
    """Workers decoding `sweep.batch` captions at once (the edge's forwards shared; the tiny cloud, a
    Qwen3-Omni-MoE thinker, takes HF's forward alone) write the records the one-at-a-time worker
    does, clocks included: both charge by the same cost model."""
    import yaml
    params, _, params_file = tiny_project
    raw = yaml.safe_load(params_file.read_text())
    per_call = {"prefill": [1e-3, 1e-5], "extend": [2e-4, 5e-5, 1e-7]}
    raw["decode"]["cost"] = {"edge": per_call, "cloud": per_call}
    records = {}
    # (batch, sweep.invariant_rows, sweep.prompt_cache_mb): batch-invariant stepping runs a batch of 1
    # through the executor too; kept prompts are each computed alone, as the one-at-a-time worker's
    for batch, rows, kept in ((1, 0, 0), (2, 0, 0), (2, 0, 1), (1, 4, 1), (2, 4, 1)):
        raw["sweep"]["batch"], raw["sweep"]["invariant_rows"], raw["sweep"]["prompt_cache_mb"] = batch, rows, kept
        path = tmp_path / f"params{batch}-{rows}-{kept}.yaml"
        path.write_text(yaml.safe_dump(raw))
        stage = load_params(str(path))
        pool = Pool.for_stage(stage, str(path), "decode")
        assert pool.lockstep == (batch > 1 or rows > 0)
        ugsd = dict(gate="entropy", threshold=1.0, block_len=2, rule="rank", rank=2)
        for cfg in (RunConfig("edge", "en"), ugsd_config(stage, "en", **ugsd), ugsd_config(stage, "en", **ugsd, in_flight=2)):
            made = run_config(cfg, eval_clips(params, "en"), pool, tmp_path / f"{batch}-{rows}-{kept}-{cfg.name}.jsonl")
            records[batch, rows, kept, cfg.name] = [{k: v for k, v in r.items() if k not in
                                               ("wall_time", "model_time", "cpu_percent", "ram_gb")} for r in made]
        edge, cloud = workers.worker().edge, workers.worker().cloud
        assert (edge.prompts is not None) == (cloud.prompts is not None) == bool(kept)
        if kept:  # the edge decodes every clip in all three configurations, the cloud in two: each
            # clip's prompt computed once per model
            assert edge.prompts.hits == 2 * edge.prompts.misses > 0 and cloud.prompts.hits == cloud.prompts.misses
        ex = workers.stepped(batch)[0] if pool.lockstep else None
        if batch > 1:  # the edge's forwards really were shared
            assert any(p.asked > p.steps for p in ex.pools)
        if rows:
            inv = ex.invariant
            assert inv is not None and inv.rows == rows and all(p.rows == rows for p in ex.pools)
            assert all(set(p.graphs.graphs) == {(rows, MAX_TOKENS)} for p in ex.pools if p.steps)
    for (_, _, _, name), recs in records.items():
        assert all("error" not in r for r in recs), recs
        assert recs == records[1, 0, 0, name]


def test_batch_invariant_rows_must_hold_the_batch():
    per_call = {"prefill": [1e-3, 1e-5], "extend": [2e-4, 5e-5, 1e-7]}
    with pytest.raises(Exception, match="sweep.invariant_rows: 4 rows cannot step a batch of sweep.batch = 8"):
        params_from_dict({"sweep": {"batch": 8, "invariant_rows": 4},
                          "decode": {"cost": {"edge": per_call, "cloud": per_call}}})


def test_a_batch_needs_a_cost_model():
    with pytest.raises(Exception, match="sweep.batch.*decode.cost"):
        params_from_dict({"sweep": {"batch": 8}})
