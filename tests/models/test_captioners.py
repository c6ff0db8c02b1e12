import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

from speccap.cli import main
from speccap.data.featurize import load_clip_features
from speccap.data.manifest import manifest_path, read_manifest
from speccap.decoding.engine import cloud_only
from speccap.decoding.link import Link
from speccap.models.captioners import train_captioners
from speccap.models.generate import generate
from speccap.models.loading import load_role
from speccap.params_uplink import LearnedUplinkParams, UplinkParams


def test_train_stage_writes_both_captioners_and_the_tokenizer(tiny_project):
    params, report, _ = tiny_project
    models = params.models.dir
    assert report["edge"]["parameters"] < report["cloud"]["parameters"]
    assert report["edge"]["steps"] == 6 and len(report["edge"]["history"]) == 2
    saved = json.loads(open(f"{models}/train_report.json").read())
    assert saved["cloud"]["family"] == "qwen3_omni_moe"
    for role in ("edge", "cloud"):
        lm = load_role(params, role)
        rec = read_manifest(manifest_path(params.data.processed_dir, "test", "zh"))[0]
        mel, _ = load_clip_features(params.data.processed_dir, rec["id"])
        g = generate(lm, mel, "zh", 8)
        assert 0 < g.n_tokens <= 8 or g.caption == ""
        # the finished run leaves no resume point behind
        assert not Path(models, role, "checkpoint.pt").exists()


def test_caption_command_on_a_wav(tiny_project, capsys):
    params, _, params_file = tiny_project
    wav = read_manifest(manifest_path(params.data.processed_dir, "test", "en"))[0]["path"]
    assert main(["--params", str(params_file), "caption", wav, "--mode", "cloud", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "cloud" and isinstance(out["caption"], str) and out["tokens"] <= 128
    assert main(["--params", str(params_file), "caption", wav, "--mode", "ugsd", "--gate", "always", "--block-len",
                 "3", "--rule", "greedy", "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["rho"] == 1.0 and spec["rounds"] >= 1 and spec["bytes_up"] > 0
    assert spec["caption"] == out["caption"]  # always + greedy = cloud-only
    assert main(["--params", str(params_file), "caption", wav, "--mode", "ugsd", "--gate", "always", "--block-len",
                 "3", "--rule", "greedy", "--in-flight", "2", "--json"]) == 0
    piped = json.loads(capsys.readouterr().out)
    assert piped["caption"] == out["caption"] and piped["in_flight"] == 2 and "wasted" in piped
    assert main(["--params", str(params_file), "caption", wav + ".missing"]) == 2
    assert "file not found" in capsys.readouterr().err


def test_roles_train_side_by_side_only_when_the_cores_hold_their_threads(tiny_project, monkeypatch):
    import dataclasses

    from speccap.models.captioners import side_by_side
    params = tiny_project[0]

    def at(threads):
        m = params.models
        return dataclasses.replace(params, models=dataclasses.replace(
            m, edge=dataclasses.replace(m.edge, train=dataclasses.replace(m.edge.train, threads=threads)),
            cloud=dataclasses.replace(m.cloud, train=dataclasses.replace(m.cloud.train, threads=threads))))
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1})
    assert side_by_side(at(1), ["edge", "cloud"]) == 2
    assert side_by_side(at(2), ["edge", "cloud"]) == 1  # 4 threads on 2 cores: one after the other
    assert side_by_side(at(2), ["cloud"]) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(8)))
    assert side_by_side(at(2), ["edge", "cloud"]) == 2


@pytest.mark.e2e
def test_two_trainings_with_the_same_seed_give_bit_identical_models(tiny_project, tmp_path, monkeypatch):
    """Each role trains in its own process with a fixed thread count: a second run from the same seed
    reproduces the first byte for byte, even when the roles take turns in one worker where the first
    run trained them side by side."""
    import dataclasses

    from speccap.models import captioners
    from speccap.models.captioners import train_captioners
    params, first, _ = tiny_project
    assert captioners.side_by_side(params, ["edge", "cloud"]) == 2 or len(os.sched_getaffinity(0)) < 2
    again = dataclasses.replace(params, models=dataclasses.replace(params.models, dir=str(tmp_path / "models")))
    monkeypatch.setattr(captioners, "side_by_side", lambda *_: 1)
    second = train_captioners(again, progress=False)
    for role in ("edge", "cloud"):
        a = Path(params.models.dir, role, "model.safetensors").read_bytes()
        b = Path(tmp_path, "models", role, "model.safetensors").read_bytes()
        assert a == b, role
        assert first[role]["best_val_loss"] == second[role]["best_val_loss"]
    # a different seed trains different weights (the comparison above can fail)
    other = dataclasses.replace(again, seed=1, models=dataclasses.replace(params.models, dir=str(tmp_path / "m1")))
    train_captioners(other, progress=False, roles=("edge",))
    assert Path(tmp_path, "m1", "edge", "model.safetensors").read_bytes() != \
        Path(params.models.dir, "edge", "model.safetensors").read_bytes()


def test_training_examples_carry_every_auxiliary_label_of_a_synthetic_clip(tiny_project):
    from speccap.data.emotions import EMOTIONS
    from speccap.data.sentences import sentence_index
    from speccap.models.aux_targets import cue_vector
    from speccap.models.captioners import load_examples
    from speccap.models.tokenizer import load_tokenizer
    params, _, _ = tiny_project
    examples = load_examples(params, "val", load_tokenizer(Path(params.models.dir, "tokenizer")))
    assert examples
    records = {r["id"]: r for lang in params.data.languages
               for r in read_manifest(manifest_path(params.data.processed_dir, "val", lang))}
    for e in examples:
        rec = records[e.clip_id]
        assert EMOTIONS[e.emotion] == rec["emotion"]
        assert e.sentence == sentence_index(rec["cues"]["text_en"]) >= 0
        assert e.cues is not None and e.cues == cue_vector(rec["cues"])


@pytest.mark.e2e
def test_a_cloud_trained_on_a_coarse_uplink_reads_what_the_edge_sends(tiny_project, tmp_path, capsys):
    """uplink params: the cloud trains on the pooled, normalised view, says so beside its weights,
    and every caption path gives it that view (the edge keeps reading its own log-mel)."""
    import dataclasses
    import shutil

    import numpy as np
    import yaml

    from speccap.data.uplink import Uplink
    from speccap.decoding.engine import cloud_only
    from speccap.decoding.link import Link
    from speccap.models.captioners import train_captioners
    from speccap.params_uplink import UplinkParams
    params, _, params_file = tiny_project
    models = tmp_path / "models"
    shutil.copytree(params.models.dir, models)  # the tokenizer and the edge as trained
    coarse = dataclasses.replace(params, uplink=UplinkParams(16, 4, "clip"),
                                 models=dataclasses.replace(params.models, dir=str(models)))
    report = train_captioners(coarse, progress=False, roles=("cloud",))
    assert report["cloud"]["uplink"] == {"bands": 16, "merge": 4, "normalize": "clip", "bits": 16}
    cloud, edge = load_role(coarse, "cloud"), load_role(coarse, "edge")
    assert cloud.uplink == Uplink(16, 4, "clip") and edge.uplink.identity
    assert cloud.model.config.audio_config.num_mel_bins == 16
    rec = read_manifest(manifest_path(params.data.processed_dir, "test", "en"))[0]
    mel, _ = load_clip_features(params.data.processed_dir, rec["id"])
    up = [p["bytes"] for p in cloud_only(cloud, mel, "en", Link(params.link), 4).packets if p["kind"] == "features"]
    assert up == [12 + 8 + 2 * 16 * -(-mel.shape[1] // 4)]  # header, shape, float16 values
    # the plain log-mel is not what this cloud reads: its audio tower refuses 128 bands
    with pytest.raises(RuntimeError):
        cloud.start(mel, "en")
    # a later training on the log-mel leaves no stale uplink behind
    train_captioners(dataclasses.replace(coarse, uplink=UplinkParams()), progress=False, roles=("cloud",))
    assert load_role(coarse, "cloud").uplink.identity and not (models / "cloud" / "uplink.json").exists()
    train_captioners(coarse, progress=False, roles=("cloud",))
    raw = yaml.safe_load(params_file.read_text())
    raw["models"]["dir"], raw["uplink"] = str(models), {"bands": 16, "merge": 4, "normalize": "clip"}
    coarse_file = tmp_path / "params.yaml"
    coarse_file.write_text(yaml.safe_dump(raw))
    wav = rec["path"]
    assert main(["--params", str(coarse_file), "caption", wav, "--mode", "ugsd", "--gate", "always",
                 "--block-len", "3", "--rule", "greedy", "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert main(["--params", str(coarse_file), "caption", wav, "--mode", "cloud", "--json"]) == 0
    assert spec["caption"] == json.loads(capsys.readouterr().out)["caption"]  # always + greedy = cloud-only
    assert np.isfinite(spec["bytes_up"]) and spec["bytes_up"] < 2 * 128 * mel.shape[1]


@pytest.mark.e2e
def test_a_cloud_trained_with_a_learned_uplink_ships_its_encoder_with_the_edge(tiny_project, tmp_path):
    """uplink.learned: the encoder trains with the cloud (and a speaker adversary), is saved beside the
    cloud and shipped with the edge model, names itself by digest, and is what every caption path
    sends; the edge's seconds include it. Training again on the log-mel takes it away."""
    params, _, _ = tiny_project
    models = tmp_path / "models"
    shutil.copytree(params.models.dir, models)
    learned = dataclasses.replace(params, uplink=UplinkParams(None, 4, "clip", LearnedUplinkParams(8, 16, 0.5)),
                                  models=dataclasses.replace(params.models, dir=str(models)))
    report = train_captioners(learned, progress=False, roles=("cloud",))
    assert report["cloud"]["uplink"]["learned"] == {"n_mels": 128, "rows": 8, "hidden": 16, "merge": 4,
                                                    "normalize": "clip"}
    assert report["cloud"]["uplink_parameters"] == 128 * 16 * 3 + 16 + 16 * 8 * 4 + 8
    cloud, edge = load_role(learned, "cloud"), load_role(learned, "edge")
    assert cloud.uplink.learned and edge.sends == cloud.uplink and edge.uplink.identity
    assert cloud.model.config.audio_config.num_mel_bins == 8
    assert not any(k.startswith("_") for k in cloud.model.state_dict())  # the training aids left no weights
    rec = read_manifest(manifest_path(params.data.processed_dir, "test", "en"))[0]
    mel, _ = load_clip_features(params.data.processed_dir, rec["id"])
    got = cloud_only(cloud, mel, "en", Link(params.link), 4)
    assert [p["bytes"] for p in got.packets if p["kind"] == "features"] == [12 + 8 + 2 * 8 * -(-mel.shape[1] // 4)]
    assert got.edge_compute > 0 and got.cloud_compute > 0
    # the same settings train the same encoder: the digest is reproducible
    digest = cloud.uplink.digest
    shutil.rmtree(models / "cloud")
    train_captioners(learned, progress=False, roles=("cloud",))
    assert load_role(learned, "cloud").uplink.digest == digest
    # as 4-bit codes: the encoder trains through them, and they are what is sent
    coded = dataclasses.replace(learned, uplink=dataclasses.replace(learned.uplink, bits=4))
    train_captioners(coded, progress=False, roles=("cloud",))
    cloud = load_role(coded, "cloud")
    assert cloud.uplink.bits == 4 and cloud.uplink.digest != digest and load_role(coded, "edge").sends == cloud.uplink
    got = cloud_only(cloud, mel, "en", Link(params.link), 4)
    size = 8 * -(-mel.shape[1] // 4)
    assert [p["bytes"] for p in got.packets if p["kind"] == "features"] == [12 + 8 + 1 + 5 * 8 + -(-size * 4 // 8)]
    train_captioners(dataclasses.replace(learned, uplink=UplinkParams()), progress=False, roles=("cloud",))
    assert load_role(learned, "cloud").uplink.identity and not load_role(learned, "edge").sends.learned
    assert not (models / "edge" / "uplink").exists() and not (models / "cloud" / "uplink_encoder.safetensors").exists()
