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
from speccap.pipeline.sweep import Pool
from speccap.pipeline.trace_refs import build_trace_refs, missing_split_error, refs_dir, training_clips


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


def test_mer2024_without_a_pool_names_the_param(tiny_project, tmp_path):
    params, _ = _copy(tiny_project, tmp_path)
    mer = dataclasses.replace(params, data=dataclasses.replace(params.data, source="mer2024"))
    err = missing_split_error(mer, "train", "en")
    assert str(err).startswith("data.trace_pool.path: not set")
    with pytest.raises(ManifestError, match="run the trace_refs stage"):
        training_clips(params, "train", "en")
