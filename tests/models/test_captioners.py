import json

import pytest

from speccap.cli import main
from speccap.config import params_from_dict
from speccap.data.featurize import featurize, load_clip_features
from speccap.data.manifest import manifest_path, read_manifest
from speccap.data.prepare import prepare
from speccap.models.captioners import train_captioners
from speccap.models.generate import generate
from speccap.models.loading import load_role

TINY = {"text_hidden": 32, "text_layers": 1, "text_heads": 2, "text_kv_heads": 1, "text_ffn": 64, "audio_d": 32,
        "audio_layers": 1, "audio_heads": 2, "audio_ffn": 64}
STEPS = {"max_steps": 6, "batch_size": 4, "eval_every": 3, "warmup_steps": 2, "threads": 1}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    raw = {"data": {"raw_dir": str(root / "raw"), "processed_dir": str(root / "proc"),
                    "synthetic": {"train_per_language": 4, "val_per_language": 2, "test_per_language": 2, "workers": 1}},
           "features": {"hop_length": 320, "workers": 1},
           "models": {"dir": str(root / "models"), "tokenizer_vocab": 200, "max_new_tokens": 8,
                      "edge": {"size": TINY, "train": STEPS},
                      "cloud": {"family": "qwen3_omni_moe", "size": TINY | {"text_hidden": 48}, "train": STEPS}}}
    params = params_from_dict(raw)
    prepare(params, progress=False)
    featurize(params, progress=False)
    report = train_captioners(params, progress=False)
    params_file = root / "params.yaml"
    import yaml
    params_file.write_text(yaml.safe_dump(raw))
    return params, report, params_file


def test_train_stage_writes_both_captioners_and_the_tokenizer(trained):
    params, report, _ = trained
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
        assert not (params.models.dir and __import__("pathlib").Path(models, role, "checkpoint.pt").exists())


def test_caption_command_on_a_wav(trained, capsys):
    params, _, params_file = trained
    wav = read_manifest(manifest_path(params.data.processed_dir, "test", "en"))[0]["path"]
    assert main(["--params", str(params_file), "caption", wav, "--mode", "cloud", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "cloud" and isinstance(out["caption"], str) and out["tokens"] <= 128
    assert main(["--params", str(params_file), "caption", wav, "--mode", "ugsd", "--gate", "always", "--block-len",
                 "3", "--rule", "greedy", "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["rho"] == 1.0 and spec["rounds"] >= 1 and spec["bytes_up"] > 0
    assert spec["caption"] == out["caption"]  # always + greedy = cloud-only
    assert main(["--params", str(params_file), "caption", wav + ".missing"]) == 2
    assert "file not found" in capsys.readouterr().err
