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


def _params(tmp_path, **data):
    return params_from_dict({
        "data": {"raw_dir": str(tmp_path / "raw"), "processed_dir": str(tmp_path / "processed"),
                 "synthetic": {"train_per_language": 4, "val_per_language": 2, "test_per_language": 3,
                               "workers": 2}, **data},
        "features": {"hop_length": 320, "workers": 1}})


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
    root = tmp_path / "mer"
    root.mkdir()
    pd.DataFrame([{"name": "sample_00000000", "chinese": "在视频中，微笑；在音频中，语气轻快。", "english":
                   "In the video, a smile. In the audio, a light tone. Therefore, happy."}]).to_csv(
        root / "final-EMER-reason.csv", index=False)
    sf.write(str(root / "sample_00000000.wav"), tone(200, 1.0, sr=48000), 48000)
    p = _params(tmp_path, source="mer2024", mer2024={"path": str(root)})
    report = prepare(p, progress=False)
    assert report["manifests"] == {"test.en": 1, "test.zh": 1}
    en = read_manifest(manifest_path(p.data.processed_dir, "test", "en"))[0]
    assert en["references"] == ["In the audio, a light tone. Therefore, happy."]
    assert sf.info(en["path"]).samplerate == 16000


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


@pytest.mark.parametrize("sig", [__import__("signal").SIGKILL, __import__("signal").SIGSEGV])
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
