import dataclasses
import shutil

import pytest
import yaml

from speccap.config import load_params
from speccap.data.emotions import detect_emotion
from speccap.data.featurize import load_clip_features
from speccap.data.manifest import ManifestError, manifest_path, read_manifest
from speccap.decoding.engine import cloud_only
from speccap.decoding.link import Link
from speccap.models.loading import load_role
from speccap.pipeline.trace_refs import build_trace_refs, refs_dir, training_clips
from speccap.pipeline.workers import Pool


def _copy(tiny_project, tmp_path, **data):
    """The tiny project's params on a copy of its processed data (trace_refs writes there)."""
    params, _, params_file = tiny_project
    raw = yaml.safe_load(params_file.read_text())
    shutil.copytree(params.data.processed_dir, tmp_path / "proc")
    shutil.rmtree(tmp_path / "proc" / "trace_refs", ignore_errors=True)
    raw["data"] |= {"processed_dir": str(tmp_path / "proc"), **data}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_params(path), path


def test_human_references_pass_through_untouched(tiny_project, tmp_path):
    params, _ = _copy(tiny_project, tmp_path)
    report = build_trace_refs(params, None)
    for lang in params.data.languages:
        clips = training_clips(params, "train", lang)
        manifest = read_manifest(manifest_path(params.data.processed_dir, "train", lang))
        assert [c["references"] for c in clips] == [m["references"] for m in manifest]
        assert [c["emotion"] for c in clips] == [m["emotion"] for m in manifest]
        assert {c["references_from"] for c in clips} == {"human"}
    assert all(s["cloud_referenced"] == 0 for s in report["splits"].values())


def test_cloud_references_are_the_cloud_only_caption_and_its_emotion(tiny_project, tmp_path):
    params, path = _copy(tiny_project, tmp_path, trace_references="cloud")
    pool = Pool(str(path), workers=0, threads=1, stage="trace_refs")
    try:
        report = build_trace_refs(params, pool)
    finally:
        pool.close()
    cloud = load_role(params, "cloud")
    for split in ("train", "val"):
        clips = training_clips(params, split, "en")
        assert clips and {c["references_from"] for c in clips} == {"cloud"}
        for c in clips:
            mel, _ = load_clip_features(params.data.processed_dir, c["id"])
            want = cloud_only(cloud, mel, "en", Link(params.link, seed=params.seed), params.models.max_new_tokens).caption
            assert c["references"] == [want] and c["emotion"] == detect_emotion(want, "en")
    stats = report["splits"]["train.en"]
    assert stats["cloud_referenced"] + stats["empty_cloud_captions"] == 4
    assert stats["cloud_emotion_agrees_with_human"] is not None
    # a rerun captions nothing again (the captions are kept per clip under the models' fingerprint)
    kept = {p.name: p.read_text() for p in (refs_dir(params) / "cloud_captions").rglob("*.jsonl")}
    build_trace_refs(params, None)
    assert {p.name: p.read_text() for p in (refs_dir(params) / "cloud_captions").rglob("*.jsonl")} == kept


def test_mer2024_without_a_pool_learns_from_folds_of_the_referenced_clips(tiny_project, tmp_path):
    params, _ = _copy(tiny_project, tmp_path, cross_fit={"when": "never"})
    with pytest.raises(ManifestError, match="run the trace_refs stage"):
        training_clips(params, "train", "en")
    for lang in params.data.languages:  # like MER2024: referenced clips only, all of them test clips
        for split in ("train", "val"):
            manifest_path(params.data.processed_dir, split, lang).unlink()
    mer = dataclasses.replace(params, data=dataclasses.replace(params.data, source="mer2024"))
    with pytest.raises(ManifestError, match="^data.cross_fit.when: never, data.trace_pool.path: not set"):
        build_trace_refs(mer, None)
    auto = dataclasses.replace(mer, data=dataclasses.replace(
        mer.data, cross_fit=dataclasses.replace(mer.data.cross_fit, when="auto", folds=3)))
    report = build_trace_refs(auto, None)
    assert report["cross_fit_folds"] == 3
    for lang in params.data.languages:
        test = read_manifest(manifest_path(params.data.processed_dir, "test", lang))
        train, val = training_clips(auto, "train", lang), training_clips(auto, "val", lang)
        assert {c["fold"] for c in val} == {0} and {c["fold"] for c in train} == {1, 2}
        assert sorted(c["id"] for c in train + val) == sorted(c["id"] for c in test)
        assert {c["references_from"] for c in train + val} == {"human"}
