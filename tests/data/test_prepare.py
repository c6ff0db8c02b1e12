import json

import numpy as np
import pandas as pd
import pytest
import soundfile as sf

from speccap.config import params_from_dict
from speccap.data.featurize import featurize, load_clip_features
from speccap.data.manifest import append_jsonl, manifest_path, read_manifest
from speccap.data.mer2024 import Mer2024Error
from speccap.data.prepare import prepare

# MER2024 runs with real checkpoints (params refuse embedded roles there); prepare never loads them
REAL_MODELS = {"edge": {"backend": "qwen2_5_omni", "path": "/ckpt/edge"},
               "cloud": {"backend": "qwen2_5_omni", "path": "/ckpt/cloud"}}


def _params(tmp_path, **data):
    models = REAL_MODELS if data.get("source") == "mer2024" else {}
    return params_from_dict({
        "data": {"raw_dir": str(tmp_path / "raw"), "processed_dir": str(tmp_path / "processed"),
                 "synthetic": {"train_per_language": 4, "val_per_language": 2, "test_per_language": 3,
                               "workers": 2}, **data},
        "models": models, "features": {"hop_length": 320, "workers": 1}})


def _mer_folder(root, tone, names, sr=16000):
    """A folder in MER2024's layout: the caption CSV and one WAV per name."""
    root.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"name": n, "chinese": "在视频中，微笑；在音频中，语气轻快。", "english":
                   "In the video, a smile. In the audio, a light tone. Therefore, happy."} for n in names]).to_csv(
        root / "final-EMER-reason.csv", index=False)
    for k, n in enumerate(names):
        sf.write(str(root / f"{n}.wav"), tone(150 + 20 * k, 1.0, sr=sr), sr)
    return root


def test_prepare_and_featurize_the_synthetic_corpus(tmp_path):
    p = _params(tmp_path)
    report = prepare(p, progress=False)
    assert report["manifests"] == {"train.en": 4, "train.zh": 4, "val.en": 2, "val.zh": 2, "test.en": 3, "test.zh": 3}
    test_zh = read_manifest(manifest_path(p.data.processed_dir, "test", "zh"))
    assert all(r["language"] == "zh" and r["speech_language"] == "zh" for r in test_zh)
    assert all(r["references"][0].startswith("在音频中") for r in test_zh)
    assert json.loads((tmp_path / "processed" / "prepare_report.json").read_text())["clips"] == 18
    f = featurize(p, progress=False)
    assert f["clips"] == 18 and f["skipped"] == []
    mel, pros = load_clip_features(p.data.processed_dir, test_zh[0]["id"])
    assert mel.shape[0] == 128 and abs(mel.shape[1] - test_zh[0]["duration"] * 50) <= 1
    table = pd.read_parquet(tmp_path / "processed" / "features.parquet")
    assert len(table) == 18 and (table["f0_mean"] > 60).all()


def test_prepare_resumes_from_its_journal(tmp_path):
    p = _params(tmp_path)
    first = prepare(p, progress=False)
    corpus = [json.loads(line) for line in (tmp_path / "raw" / "synthetic" / "corpus.jsonl").open()]
    # simulate a run that died after 5 clips: journal with 5 records, the other WAVs gone
    journal = tmp_path / "raw" / "synthetic" / "corpus.partial.jsonl"
    kept = {r["id"] for r in corpus[:5]}
    for r in corpus[:5]:
        append_jsonl(journal, r)
    for r in corpus[5:]:
        (tmp_path / "raw" / "synthetic" / "wav" / f"{r['id']}.wav").unlink()
    mtimes = {i: (tmp_path / "raw" / "synthetic" / "wav" / f"{i}.wav").stat().st_mtime_ns for i in kept}
    again = prepare(p, progress=False)
    assert again["manifests"] == first["manifests"] and not journal.exists()
    assert all((tmp_path / "raw" / "synthetic" / "wav" / f"{i}.wav").stat().st_mtime_ns == m for i, m in mtimes.items())
    assert [json.loads(line) for line in (tmp_path / "raw" / "synthetic" / "corpus.jsonl").open()] == corpus


def test_featurize_skips_bad_clips_and_keeps_the_rest(tmp_path):
    p = _params(tmp_path)
    prepare(p, progress=False)
    featurize(p, progress=False)
    recs = read_manifest(manifest_path(p.data.processed_dir, "train", "en"))
    feat_dir = tmp_path / "processed" / "features"
    before = {f.name: f.stat().st_mtime_ns for f in feat_dir.iterdir()}
    # one clip becomes silent, one truncated (after its features were made once)
    sf.write(recs[0]["path"], np.zeros(16000, np.float32), 16000)
    data = open(recs[1]["path"], "rb").read()
    open(recs[1]["path"], "wb").write(data[: len(data) // 2])
    (feat_dir / f"{recs[0]['id']}.npz").unlink()
    (feat_dir / f"{recs[1]['id']}.npz").unlink()
    report = featurize(p, progress=False)
    skipped = {s["id"]: s["skip"] for s in report["skipped"]}
    assert "silent audio" in skipped[recs[0]["id"]] and "truncated WAV" in skipped[recs[1]["id"]]
    assert report["clips"] == 16
    after = {f.name: f.stat().st_mtime_ns for f in feat_dir.iterdir()}
    assert all(after[k] == v for k, v in before.items() if k in after)  # finished work not redone


def test_mer2024_without_a_path_names_the_param(tmp_path):
    with pytest.raises(Mer2024Error, match="data.mer2024.path"):
        prepare(_params(tmp_path, source="mer2024"), progress=False)


def test_mer2024_prepare_writes_test_manifests(tmp_path, tone):
    root = _mer_folder(tmp_path / "mer", tone, ["sample_00000000"], sr=48000)
    p = _params(tmp_path, source="mer2024", mer2024={"path": str(root)})
    report = prepare(p, progress=False)
    assert report["manifests"] == {"test.en": 1, "test.zh": 1}
    en = read_manifest(manifest_path(p.data.processed_dir, "test", "en"))[0]
    assert en["references"] == ["In the audio, a light tone. Therefore, happy."]
    assert sf.info(en["path"]).samplerate == 16000


def test_mer2024_already_16k_mono_is_used_in_place_and_the_raw_output_exists(tmp_path, tone):
    """What the organisers' ffmpeg step makes: nothing to convert, and data/raw (a DVC output) still
    exists, naming where each clip was read from."""
    root = _mer_folder(tmp_path / "mer", tone, ["sample_00000000", "sample_00000001"])
    p = _params(tmp_path, source="mer2024", mer2024={"path": str(root)})
    prepare(p, progress=False)
    en = read_manifest(manifest_path(p.data.processed_dir, "test", "en"))
    assert [r["path"] for r in en] == [str(root / "sample_00000000.wav"), str(root / "sample_00000001.wav")]
    sources = json.loads((tmp_path / "raw" / "mer2024" / "sources.json").read_text())
    assert sources == {"sample_00000000": str(root / "sample_00000000.wav"),
                       "sample_00000001": str(root / "sample_00000001.wav")}
    assert not manifest_path(p.data.processed_dir, "train", "en").exists()


def test_mer2024_with_a_trace_pool_splits_it_and_never_trains_on_a_test_clip(tmp_path, tone):
    root = _mer_folder(tmp_path / "mer", tone, ["sample_00000000"])
    pool = tmp_path / "pool"
    (pool / "sub").mkdir(parents=True)
    for k in range(12):
        sf.write(str(pool / ("sub" if k % 2 else "") / f"clip{k:02d}.wav"), tone(120 + 10 * k, 1.0, sr=22050), 22050)
    sf.write(str(pool / "sample_00000000.wav"), tone(200, 1.0), 16000)  # a referenced clip: left out
    sf.write(str(pool / "quiet.wav"), np.zeros(16000, np.float32), 16000)  # no speech: skipped, said why
    p = _params(tmp_path, source="mer2024", mer2024={"path": str(root)},
                trace_pool={"path": str(pool), "val_share": 0.25})
    report = prepare(p, progress=False)
    train = read_manifest(manifest_path(p.data.processed_dir, "train", "zh"))
    val = read_manifest(manifest_path(p.data.processed_dir, "val", "zh"))
    assert len(train) + len(val) == 12 == report["pool_clips"] and train and val
    assert all(r["references"] == [] and r["references_from"] == "cloud" for r in train + val)
    assert {r["id"] for r in train} & {r["id"] for r in val} == set()
    assert "pool-sub__clip01" in {r["id"] for r in train + val}
    assert all(sf.info(r["path"]).samplerate == 16000 for r in train)  # 22.05 kHz: a converted copy
    reasons = {s["id"]: s["reason"] for s in report["skipped"]}
    assert "never trained on" in reasons["pool-sample_00000000"] and "silent" in reasons["pool-quiet"]
    # the split follows the names alone: a second run (and a bigger pool) keeps every clip where it was
    sf.write(str(pool / "clip99.wav"), tone(300, 1.0), 16000)
    prepare(p, progress=False)
    again = {r["id"]: r["split"] for s in ("train", "val")
             for r in read_manifest(manifest_path(p.data.processed_dir, s, "zh"))}
    assert all(again[r["id"]] == r["split"] for r in train + val) and "pool-clip99" in again


def test_a_trace_pool_is_checked_in_params_and_on_disk(tmp_path, tone):
    from speccap.config import ConfigError
    from speccap.data.trace_pool import TracePoolError
    with pytest.raises(ConfigError, match="data.trace_pool.path: a trace pool is for data.source mer2024"):
        _params(tmp_path, trace_pool={"path": str(tmp_path)})
    with pytest.raises(ConfigError, match="data.trace_pool.val_share"):
        _params(tmp_path, source="mer2024", trace_pool={"val_share": 1.0})
    with pytest.raises(ConfigError, match="models.edge.backend: embedded captioners train on the synthetic"):
        params_from_dict({"data": {"source": "mer2024"}})
    root = _mer_folder(tmp_path / "mer", tone, ["sample_00000000"])
    with pytest.raises(TracePoolError, match="data.trace_pool.path: trace pool folder .*nope not found"):
        prepare(_params(tmp_path, source="mer2024", mer2024={"path": str(root)},
                        trace_pool={"path": str(tmp_path / "nope")}), progress=False)
    (tmp_path / "one").mkdir()
    sf.write(str(tmp_path / "one" / "a.wav"), tone(200, 1.0), 16000)
    with pytest.raises(TracePoolError, match="at least 2 usable clips"):
        prepare(_params(tmp_path, source="mer2024", mer2024={"path": str(root)},
                        trace_pool={"path": str(tmp_path / "one")}), progress=False)


def test_features_are_byte_identical_across_runs(tmp_path):
    """DVC hashes the features: a rerun with the same inputs must not look like new data."""
    p = _params(tmp_path)
    prepare(p, progress=False)
    featurize(p, progress=False)
    feat = tmp_path / "processed" / "features"
    first = {f.name: f.read_bytes() for f in feat.iterdir()}
    for f in feat.iterdir():
        f.unlink()
    import time
    time.sleep(2.1)  # the zip timestamp resolution
    featurize(p, progress=False)
    assert {f.name: f.read_bytes() for f in feat.iterdir()} == first


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [__import__("signal").SIGSEGV])  # both signals: tests/test_fanout.py
def test_a_killed_worker_stops_prepare_clearly_and_a_rerun_finishes(tmp_path, sig):
    import signal
    import subprocess
    import sys

    import yaml

    from ..conftest import run_and_kill_a_worker
    raw = {"data": {"raw_dir": str(tmp_path / "raw"), "processed_dir": str(tmp_path / "processed"),
                    "synthetic": {"train_per_language": 24, "val_per_language": 4, "test_per_language": 4, "workers": 2}}}
    pfile = tmp_path / "params.yaml"
    pfile.write_text(yaml.safe_dump(raw))
    run = ("import sys; from speccap.config import load_params; from speccap.data.prepare import prepare; "
           "prepare(load_params(sys.argv[1]), progress=False)")
    journal = tmp_path / "raw" / "synthetic" / "corpus.partial.jsonl"
    lines = lambda: len(journal.read_text().splitlines()) if journal.exists() else 0  # noqa: E731
    rc, err, after = run_and_kill_a_worker([sys.executable, "-c", run, str(pfile)], lambda: lines() >= 3, sig)
    assert rc != 0 and after < 30, (rc, after, err[-2000:])
    last = err.strip().splitlines()[-1]
    assert "WorkerDied: prepare: worker process" in last and f"killed by {signal.Signals(sig).name}" in last
    assert "while working on clip" in last or "between two items (the last one it finished: clip" in last
    kept = lines()
    assert 3 <= kept < 64  # the journal keeps every clip rendered before the death
    subprocess.run([sys.executable, "-c", run, str(pfile)], check=True, capture_output=True)
    assert not journal.exists()
    assert len((tmp_path / "raw" / "synthetic" / "corpus.jsonl").read_text().splitlines()) == 64
